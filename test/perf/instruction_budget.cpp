// Instruction budgets of an allocate + release round trip (posix-eager), counted by callgrind:
// deterministic, so they can be asserted where wall time cannot. The program runs itself under
// `valgrind --tool=callgrind --collect-atstart=no`; the child counts only its measured loops
// (CALLGRIND_TOGGLE_COLLECT around each) and dumps one file per loop (CALLGRIND_DUMP_STATS_AT),
// and the parent reads the dumps and checks:
//   the host's share  (adapter - plugin table called directly)  <= host_share_budget
//   the kit's share   (plugin table - mechanism object directly) <= kit_share_budget
// (regression budgets; issue 10's targets, printed beside them, are lower)
// per round trip, at 64 B and 4 KiB, and reports the whole path and nxmem::heap_allocator
// against malloc + free; a pooled round trip (nxmem::pool_allocator over posix-eager, steady
// state) must cost at most pooled_budget x malloc + free (issue 21), and a same-stream round trip
// through the stream-ordered layer over that pool (nxmem::stream_ordered_pool, a host-timeline
// policy whose fences never complete: every block comes back from its stream's lane) at most
// same_stream_budget x the pooled one (issue 32's target, no more than the pooled one, printed
// beside it, is not reached).
// Exit 77 (skipped) without valgrind, or in a sanitizer build (callgrind cannot run those).
// Environment: NXMEM_POSIX_PLUGIN (the plugin), NXMEM_VALGRIND (else `valgrind` on PATH).
#include <measure/routes.hpp>

#include "eager.hpp" // plugins/posix
#include "../pool/host_timeline_policy.hpp"

#include <nxmem/host.hpp>
#include <nxmem/host/pooled_allocator.hpp>
#include <nxmem/pool/stream_ordered_pool.hpp>

#include <valgrind/callgrind.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

// Issue 10's targets, in instructions per allocate + release round trip: not reached yet (the
// hot-path reworks took the host from 1046 to 573 to 371 and the kit from 1341 to 764 to 444 to
// 415).
constexpr double host_share_target = 150;
constexpr double kit_share_target = 150;
// What the test enforces until the targets are reached: the shares measured (GCC 12,
// debugoptimized) when the rework landed plus 10%, so a change that makes either side heavier fails here. Lower them (towards
// the targets) whenever the path gets cheaper; never raise them to let a change through.
constexpr double host_share_budget = 405;
constexpr double kit_share_budget = 457;
// nxmem::heap_allocator against malloc + free, the engine's own allocator beside plugin ones:
// reported, not enforced (issue 10's target; its round trip is ~40 instructions over malloc's,
// a third of them the result it returns, and moves by about as much with the compiler's inlining).
constexpr double heap_allocator_target = 1.2;
// A pooled round trip (nxmem::pool_allocator over posix-eager, in steady state: the block comes
// from the pool's chunk, no crossing) against malloc + free: issue 21's target, enforced.
constexpr double pooled_budget = 1.5;
// A same-stream round trip through the stream-ordered layer over that pool against the pooled
// round trip (which it replaces: in steady state the layer serves it from the stream's lane and
// never calls the pool). Issue 32's target is 1.0x; the budget is what the layer measures since
// a release on its own stream records no fence (GCC 12, debugoptimized: 297 against 197 at 64 B,
// 1.51x; 1.42x at 4 KiB; 331 and 1.68x before) plus 10%.
// Lower it towards the target whenever the path gets cheaper; never raise it to let a change
// through.
constexpr double same_stream_target = 1.0;
constexpr double same_stream_budget = 1.65;

constexpr int exit_skip = 77;
constexpr unsigned round_trips = 2000; // per route and size: callgrind runs ~50x slower
constexpr unsigned warm_up = 200;      // first, uncounted: tables reach their steady size

struct size_point {
    std::uint64_t bytes;
    const char* label;
};
constexpr size_point sizes[] = {{64, "64B"}, {4096, "4KiB"}};
constexpr const char* routes[] = {"adapter", "table", "mechanism", "malloc", "heap_allocator", "pooled", "same_stream"};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

// ---- the child, under callgrind ----

// A pool over the plugin allocator: the handle is the pool's allocation.
class pooled_route {
public:
    using handle = nxmem::allocation<nxmem::cpu_device>;
    explicit pooled_route(nxmem::host::pooled_plugin_allocator<nxmem::cpu_device>& pool) : pool_(&pool) {}
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        nxmem::result<handle> made = pool_->allocate(size, alignment);
        if (!made) {
            return std::nullopt;
        }
        return made.value();
    }
    bool release(const handle& live) { return pool_->release(live).has_value(); }

private:
    nxmem::host::pooled_plugin_allocator<nxmem::cpu_device>* pool_;
};

// The plugin allocator under the layer's pool, as a type of its own: were the layer's pool
// pooled_route's type, GCC would see a second caller of the same pool_allocator functions and
// inline them differently into pooled_route (197 instead of 233 instructions at 64 B), and the
// budget would measure the neighbour, not the pool.
struct layer_upstream : nxmem::host::plugin_allocator<nxmem::cpu_device> {
    layer_upstream(const nxmem::host::plugin_allocator<nxmem::cpu_device>& plugin) // NOLINT: converts, as the layer constructs its pool from the plugin allocator
        : nxmem::host::plugin_allocator<nxmem::cpu_device>(plugin) {}
};

// The stream-ordered layer over a pool over the plugin allocator, on stream 0 of a host timeline
// whose work never completes.
class same_stream_route {
public:
    using handle = nxmem::allocation<nxmem::cpu_device>;
    using pooled = nxmem::pool_allocator<layer_upstream>;
    explicit same_stream_route(const nxmem::host::plugin_allocator<nxmem::cpu_device>& plugin)
        : layer_(std::in_place, nxmem::test::host_timeline_policy(std::make_shared<nxmem::test::host_timeline>()),
                 nxmem::stream_pool_options{}, plugin) {}
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        nxmem::result<handle> made = layer_.allocate(size, alignment, 0);
        if (!made) {
            return std::nullopt;
        }
        return made.value();
    }
    bool release(const handle& live) { return layer_.deallocate(live, 0).has_value(); }

private:
    nxmem::stream_ordered_pool<pooled, nxmem::test::host_timeline_policy> layer_;
};

template <class Route> bool count_loop(Route& route, const size_point& size, const std::string& name) {
    for (unsigned i = 0; i < warm_up; ++i) {
        if (!nxmem::measure::round_trip(route, size.bytes, nxmem::measure::round_trip_alignment)) {
            return false;
        }
    }
    bool ok = true;
    CALLGRIND_TOGGLE_COLLECT;
    for (unsigned i = 0; i < round_trips; ++i) {
        ok = nxmem::measure::round_trip(route, size.bytes, nxmem::measure::round_trip_alignment) && ok;
    }
    CALLGRIND_TOGGLE_COLLECT;
    CALLGRIND_DUMP_STATS_AT(name.c_str());
    return ok;
}

int measure(const char* plugin) {
    auto module = nxmem::host::plugin_module::load(plugin);
    if (!module) {
        std::cerr << "cannot load " << plugin << ": " << module.error().describe() << '\n';
        return 1;
    }
    auto allocator = nxmem::host::open_allocator<nxmem::cpu_device>(module.value(), "posix-eager", 0);
    auto mechanism = nxmem::measure::mechanism_route<nxmem::posix::eager_mechanism>::open();
    if (!allocator || !mechanism) {
        std::cerr << "cannot open posix-eager\n";
        return 1;
    }
    nxmem::measure::adapter_route adapter(allocator.value());
    nxmem::measure::table_route table(allocator.value(), 1ull << 62);
    nxmem::measure::malloc_route heap;
    nxmem::measure::heap_route heap_allocator;
    auto pool = nxmem::host::open_pooled_allocator<nxmem::cpu_device>(module.value(), "posix-eager");
    if (!pool) {
        std::cerr << "cannot open posix-eager pooled\n";
        return 1;
    }
    pooled_route pooled(*pool.value());
    same_stream_route same_stream(allocator.value());
    bool ok = true;
    for (const size_point& size : sizes) {
        const std::string at = std::string("/") + size.label;
        ok = count_loop(adapter, size, std::string("adapter") + at) && ok;
        ok = count_loop(table, size, std::string("table") + at) && ok;
        ok = count_loop(mechanism.value(), size, std::string("mechanism") + at) && ok;
        ok = count_loop(heap, size, std::string("malloc") + at) && ok;
        ok = count_loop(heap_allocator, size, std::string("heap_allocator") + at) && ok;
        ok = count_loop(pooled, size, std::string("pooled") + at) && ok;
        ok = count_loop(same_stream, size, std::string("same_stream") + at) && ok;
    }
    return ok ? 0 : 1;
}

// ---- the parent ----

// The instructions each dump counted, by the name it was dumped at. A dump file names its
// trigger on a "desc: Trigger: Client Request: NAME" line and its count on "totals:" (or
// "summary:", older callgrind).
std::map<std::string, double> read_dumps(const std::filesystem::path& directory) {
    std::map<std::string, double> counts;
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
        std::ifstream file(entry.path());
        std::string line;
        std::string name;
        std::optional<double> total;
        const std::string trigger = "desc: Trigger: Client Request: ";
        while (std::getline(file, line)) {
            if (line.rfind(trigger, 0) == 0) {
                name = line.substr(trigger.size());
            } else if (line.rfind("totals:", 0) == 0 || (!total && line.rfind("summary:", 0) == 0)) {
                total = std::strtod(line.c_str() + line.find(':') + 1, nullptr);
            }
        }
        if (!name.empty() && total) {
            counts[name] = *total;
        }
    }
    return counts;
}

std::string find_valgrind() {
    if (const char* given = std::getenv("NXMEM_VALGRIND"); given != nullptr && *given != '\0') {
        return given;
    }
    const char* path = std::getenv("PATH");
    std::string rest = path != nullptr ? path : "";
    while (!rest.empty()) {
        const std::size_t colon = rest.find(':');
        const std::filesystem::path candidate = std::filesystem::path(rest.substr(0, colon)) / "valgrind";
        if (::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
        rest = colon == std::string::npos ? "" : rest.substr(colon + 1);
    }
    return {};
}

int run_under_callgrind(const std::string& valgrind, const char* self, const char* plugin,
                        const std::filesystem::path& directory) {
    const std::string out_file = "--callgrind-out-file=" + (directory / "callgrind.out").string();
    const pid_t child = ::fork();
    if (child == 0) {
        ::execl(valgrind.c_str(), valgrind.c_str(), "--tool=callgrind", "--collect-atstart=no",
                "--quiet", out_file.c_str(), self, "--measure", plugin, static_cast<char*>(nullptr));
        std::perror("exec valgrind");
        std::_Exit(127);
    }
    int status = 0;
    if (child < 0 || ::waitpid(child, &status, 0) != child) {
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--measure") {
        return measure(argv[2]);
    }
    if (sanitized) {
        std::cout << "skipped: built with a sanitizer, which callgrind cannot run\n";
        return exit_skip;
    }
#if defined(__clang__)
    // Instruction counts depend on the compiler's code; the budgets are GCC 12's (scripts/test's
    // gcc build), where clang's code measures ~10% more on the host's side.
    std::cout << "skipped: the budgets are calibrated for GCC 12's code, and this is a clang build\n";
    return exit_skip;
#endif
    const char* plugin = std::getenv("NXMEM_POSIX_PLUGIN");
    if (plugin == nullptr) {
        std::cerr << "NXMEM_POSIX_PLUGIN is not set\n";
        return 1;
    }
    const std::string valgrind = find_valgrind();
    if (valgrind.empty()) {
        std::cout << "skipped: valgrind not found (set NXMEM_VALGRIND or put it on PATH)\n";
        return exit_skip;
    }
    char directory_template[] = "/tmp/nxmem-callgrind-XXXXXX";
    if (::mkdtemp(directory_template) == nullptr) {
        std::perror("mkdtemp");
        return 1;
    }
    const std::filesystem::path directory = directory_template;
    const int status = run_under_callgrind(valgrind, std::filesystem::read_symlink("/proc/self/exe").c_str(), plugin, directory);
    std::map<std::string, double> counts = read_dumps(directory);
    std::filesystem::remove_all(directory);
    if (status != 0) {
        std::cerr << "the measuring run under callgrind exited with status " << status << '\n';
        return 1;
    }

    bool within = true;
    std::printf("instructions per allocate + release round trip (posix-eager, %u round trips each):\n",
                round_trips);
    for (const size_point& size : sizes) {
        std::map<std::string, double> per;
        for (const char* route : routes) {
            const std::string name = std::string(route) + "/" + size.label;
            if (counts.find(name) == counts.end()) {
                std::cerr << "no callgrind dump for " << name << '\n';
                return 1;
            }
            per[route] = counts[name] / round_trips;
        }
        const double host_share = per["adapter"] - per["table"];
        const double kit_share = per["table"] - per["mechanism"];
        std::printf("  %-4s  adapter %7.0f  table %7.0f  mechanism %7.0f  malloc+free %5.0f  heap_allocator %5.0f "
                    "(%.2fx malloc+free, target %.1fx)\n",
                    size.label, per["adapter"], per["table"], per["mechanism"], per["malloc"],
                    per["heap_allocator"], per["heap_allocator"] / per["malloc"], heap_allocator_target);
        std::printf("        host's share %6.0f (budget %.0f, target %.0f)  kit's share %6.0f (budget %.0f, "
                    "target %.0f)  whole path %.1fx malloc+free\n",
                    host_share, host_share_budget, host_share_target, kit_share, kit_share_budget,
                    kit_share_target, per["adapter"] / per["malloc"]);
        std::printf("        pooled (pool_allocator over posix-eager, steady state) %5.0f: %.2fx malloc+free "
                    "(budget %.1fx)\n",
                    per["pooled"], per["pooled"] / per["malloc"], pooled_budget);
        if (per["pooled"] > pooled_budget * per["malloc"]) {
            std::printf("FAIL: at %s a pooled round trip costs %.0f instructions, over %.1fx malloc+free's %.0f\n",
                        size.label, per["pooled"], pooled_budget, per["malloc"]);
            within = false;
        }
        std::printf("        same stream (stream_ordered_pool over that pool) %5.0f: %.2fx the pooled round trip "
                    "(budget %.2fx, target %.1fx)\n",
                    per["same_stream"], per["same_stream"] / per["pooled"], same_stream_budget, same_stream_target);
        if (per["same_stream"] > same_stream_budget * per["pooled"]) {
            std::printf("FAIL: at %s a same-stream round trip costs %.0f instructions, over %.2fx the pooled %.0f\n",
                        size.label, per["same_stream"], same_stream_budget, per["pooled"]);
            within = false;
        }
        if (host_share > host_share_budget) {
            std::printf("FAIL: at %s the host adds %.0f instructions per round trip, over its budget of %.0f\n",
                        size.label, host_share, host_share_budget);
            within = false;
        }
        if (kit_share > kit_share_budget) {
            std::printf("FAIL: at %s the kit adds %.0f instructions per round trip, over its budget of %.0f\n",
                        size.label, kit_share, kit_share_budget);
            within = false;
        }
    }
    return within ? 0 : 1;
}
