// nxmem's benchmarks: what a round trip through the host adapter, the plugin's table, the posix
// mechanism alone, malloc and nxmem::heap_allocator cost, how they scale, what they keep per
// allocation, what the posix plugin's memory operations cost against the same system calls made
// raw, and a KV-cache trace replay. Every figure that matters is a ratio of two runs of this one
// process (printed after the benchmark table, or as the "ratios" member of the JSON document with
// --benchmark_format=json). NXMEM_POSIX_PLUGIN overrides the plugin built alongside;
// NXMEM_BENCH_LIVE the allocations held for the bookkeeping and many-live figures (1M);
// NXMEM_BENCH_RELEASES the releases timed with many live (200000).
#include "kv_cache_replay.hpp"
#include "ratio_summary.hpp"

#include <measure/bookkeeping.hpp>
#include <measure/ranges.hpp>
#include <measure/routes.hpp>
#include <measure/system.hpp>

#include "eager.hpp" // plugins/posix: the eager mechanism, measured without the kit

#include <nxmem/host.hpp>

#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace nxmem::measure;
using nxmem::cpu_device;
using nxmem::host::plugin_allocator;

// ---- the posix plugin, loaded once ----

struct posix_plugin {
    std::string problem; // empty when everything opened
    std::shared_ptr<nxmem::host::plugin_module> module;
    std::unique_ptr<plugin_allocator<cpu_device>> eager;
    std::unique_ptr<plugin_allocator<cpu_device>> second_eager; // the second allocator of the 2-thread runs
    std::unique_ptr<plugin_allocator<cpu_device>> lazy;
};

std::unique_ptr<plugin_allocator<cpu_device>> open_or_note(posix_plugin& loaded, const char* name) {
    auto opened = nxmem::host::open_allocator<cpu_device>(loaded.module, name, 0);
    if (!opened) {
        loaded.problem = "cannot open " + std::string(name) + ": " + opened.error().describe();
        return nullptr;
    }
    return std::make_unique<plugin_allocator<cpu_device>>(std::move(opened).value());
}

posix_plugin& posix() {
    static posix_plugin loaded = [] {
        posix_plugin made;
        const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
        auto module = nxmem::host::plugin_module::load(path != nullptr ? path : NXMEM_BENCH_POSIX_PLUGIN);
        if (!module) {
            made.problem = module.error().describe();
            return made;
        }
        made.module = std::move(module).value();
        made.eager = open_or_note(made, "posix-eager");
        made.second_eager = open_or_note(made, "posix-eager");
        made.lazy = open_or_note(made, "posix-lazy");
        return made;
    }();
    return loaded;
}

// Skips the benchmark (with the reason) when the plugin did not open.
bool posix_ready(benchmark::State& state) {
    if (!posix().problem.empty()) {
        state.SkipWithError(posix().problem.c_str());
        return false;
    }
    return true;
}

std::uint64_t live_count() { return count_from_environment("NXMEM_BENCH_LIVE", 1000000); }

std::uint64_t table_id_base(unsigned route) { return (1ull << 62) + (std::uint64_t{route} << 48); }

// ---- round trips ----

template <class Route> void time_round_trips(benchmark::State& state, Route& route, std::uint64_t size) {
    for (auto _ : state) {
        if (!round_trip(route, size, round_trip_alignment)) {
            state.SkipWithError("a round trip failed");
            break;
        }
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

// A route to posix-eager by name: adapter or table (through `allocator`, by default the shared
// one), mechanism, malloc, heap_allocator.
template <class Body>
void with_eager_route(benchmark::State& state, const std::string& route, Body&& body,
                      plugin_allocator<cpu_device>* allocator = nullptr) {
    if (!posix_ready(state)) {
        return;
    }
    if (allocator == nullptr) {
        allocator = posix().eager.get();
    }
    if (route == "adapter") {
        adapter_route through(*allocator);
        body(through);
    } else if (route == "table") {
        table_route through(*allocator, table_id_base(0));
        body(through);
    } else if (route == "mechanism") {
        auto opened = mechanism_route<nxmem::posix::eager_mechanism>::open();
        if (!opened) {
            state.SkipWithError(opened.error().describe().c_str());
            return;
        }
        body(opened.value());
    } else if (route == "malloc") {
        malloc_route through;
        body(through);
    } else {
        heap_route through;
        body(through);
    }
}

void round_trip_benchmark(benchmark::State& state, std::string route, std::uint64_t size) {
    with_eager_route(state, route, [&](auto& through) { time_round_trips(state, through, size); });
}

void raw_mmap_round_trip(benchmark::State& state, std::uint64_t size) {
    for (auto _ : state) {
        void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED) {
            state.SkipWithError("mmap failed");
            break;
        }
        ::munmap(mapped, size);
    }
}

// ---- the same code between system calls ----

// How much slower the boundary's own code runs right after a system call than in a tight loop. A
// 64 B round trip through the adapter (no system call of its own) is timed alone, and between the
// mmap and munmap of 2 MiB against the pair without it, in interleaved blocks. Where entering the
// kernel evicts caches and branch predictors (speculation mitigations, virtual machines), the
// ratios against raw system calls (eager at 2 MiB, commit + decommit, the lazy cycle) are set by
// this factor times the path's warm cost, not by its instruction count alone.
void between_system_calls(benchmark::State& state) {
    with_eager_route(state, "adapter", [&](auto& through) {
        constexpr std::size_t mapped_bytes = 2u << 20;
        constexpr int blocks = 15;
        constexpr int per_block = 2000;
        using clock = std::chrono::steady_clock;
        bool ok = true;
        auto timed = [](auto&& loop) {
            const auto start = clock::now();
            for (int i = 0; i < per_block; ++i) {
                loop();
            }
            return std::chrono::duration<double, std::nano>(clock::now() - start).count() / per_block;
        };
        auto path = [&] { ok = round_trip(through, 64, round_trip_alignment) && ok; };
        auto pair = [&](bool with_path) {
            void* mapped = ::mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            ok = mapped != MAP_FAILED && ok;
            if (with_path) {
                path();
            }
            if (mapped != MAP_FAILED) {
                ::munmap(mapped, mapped_bytes);
            }
        };
        // Per block: the path's cost between the calls and alone; the medians over the blocks
        // keep one disturbed block from setting the figure.
        std::vector<double> between, warm;
        for (auto _ : state) {
            for (int block = 0; block < blocks && ok; ++block) {
                const double raw_ns = timed([&] { pair(false); });
                between.push_back(timed([&] { pair(true); }) - raw_ns);
                warm.push_back(timed(path));
            }
        }
        if (!ok) {
            state.SkipWithError("an mmap or a round trip failed");
            return;
        }
        auto median = [](std::vector<double>& values) {
            std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
            return values[values.size() / 2];
        };
        state.counters["path_ns_warm"] = median(warm);
        state.counters["path_ns_between_system_calls"] = median(between);
    });
}

// Figures noted during the runs and printed with the ratios.
nxmem::bench::context_notes& run_notes() {
    static nxmem::bench::context_notes notes;
    return notes;
}

// ---- threads: one allocator shared, or one each ----

void threads_benchmark(benchmark::State& state, std::string kind) {
    if (kind != "malloc" && !posix_ready(state)) {
        return;
    }
    plugin_allocator<cpu_device>* allocator =
        kind == "one_allocator" || state.thread_index() == 0 ? posix().eager.get() : posix().second_eager.get();
    adapter_route through(*allocator);
    malloc_route heap;
    for (auto _ : state) {
        const bool ok = kind == "malloc" ? round_trip(heap, 64, round_trip_alignment)
                                         : round_trip(through, 64, round_trip_alignment);
        if (!ok) {
            state.SkipWithError("a round trip failed");
            break;
        }
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
    if (state.thread_index() == 0 && state.threads() == 2) {
        // A ratio of thread counts means little on a busy machine: say how busy it was.
        run_notes()["load_average_at_threads_" + kind] = load_average().value_or(-1);
    }
}

// ---- release with many live: random victims, each replaced at once ----

template <class Route> void release_random_victims(benchmark::State& state, Route& route, std::uint64_t live) {
    std::vector<typename Route::handle> held;
    held.reserve(live);
    for (std::uint64_t i = 0; i < live; ++i) {
        auto made = route.allocate(64, round_trip_alignment);
        if (!made) {
            state.SkipWithError("filling the live set failed");
            break;
        }
        held.push_back(*made);
    }
    std::mt19937_64 random(7);
    if (held.size() == live) {
        for (auto _ : state) {
            const std::size_t victim = static_cast<std::size_t>(random() % live);
            auto replacement = route.release(held[victim]) ? route.allocate(64, round_trip_alignment) : std::nullopt;
            if (!replacement) {
                state.SkipWithError("a release or its replacement failed");
                break;
            }
            held[victim] = *replacement;
        }
    }
    for (const auto& each : held) {
        (void)route.release(each);
    }
}

void release_benchmark(benchmark::State& state, std::string route, std::uint64_t live) {
    if (!posix_ready(state)) {
        return;
    }
    if (route == "adapter") {
        adapter_route through(*posix().eager);
        release_random_victims(state, through, live);
    } else {
        table_route through(*posix().eager, table_id_base(1));
        release_random_victims(state, through, live);
    }
}

// ---- heap bytes per live allocation ----

// On an allocator of its own: the host's and the kit's tables start empty, as they would not on
// the shared allocator after the many-live runs.
void heap_benchmark(benchmark::State& state, std::string route) {
    if (!posix_ready(state)) {
        return;
    }
    auto fresh = nxmem::host::open_allocator<cpu_device>(posix().module, "posix-eager", 0);
    if (!fresh) {
        state.SkipWithError(fresh.error().describe().c_str());
        return;
    }
    with_eager_route(state, route, [&](auto& through) {
        for (auto _ : state) {
            auto footprint = measure_heap_footprint(through, live_count(), 64);
            if (!footprint) {
                state.SkipWithError(footprint.error().describe().c_str());
                break;
            }
            state.counters["bytes_per_live"] = footprint.value().bytes_per_live;
            state.counters["kept_after_release"] = static_cast<double>(footprint.value().kept_after_release);
        }
    }, &fresh.value());
}

// ---- posix-lazy ranges: through the view, the table, and raw system calls ----

constexpr std::uint64_t reservation_bytes = 2u << 20;
constexpr std::uint64_t range_bytes = 64 * 1024;

// The system calls posix-lazy makes, made raw: a reservation, a commit (mprotect), a decommit
// (the range reserved again over itself, one MAP_FIXED mmap that drops the pages; see
// plugins/posix/lazy.hpp), so a ratio compares the same calls with and without the layers.
constexpr int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
void* raw_reserve() { return ::mmap(nullptr, reservation_bytes, PROT_NONE, reserve_flags, -1, 0); }
void raw_commit_decommit(void* at, std::uint64_t length) {
    ::mprotect(at, length, PROT_READ | PROT_WRITE);
    ::mmap(at, length, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0);
}
// The decommit an application would otherwise write: madvise(DONTNEED) + mprotect(NONE).
void raw_commit_madvise_decommit(void* at, std::uint64_t length) {
    ::mprotect(at, length, PROT_READ | PROT_WRITE);
    ::madvise(at, length, MADV_DONTNEED);
    ::mprotect(at, length, PROT_NONE);
}

// posix-lazy's virtual-backing view; nullopt (the benchmark skipped, with the reason) without it.
std::optional<nxmem::host::virtual_backing_view<cpu_device>> lazy_backing(benchmark::State& state) {
    if (!posix_ready(state)) {
        return std::nullopt;
    }
    auto view = posix().lazy->virtual_backing();
    if (!view) {
        state.SkipWithError(view.error().describe().c_str());
        return std::nullopt;
    }
    return std::move(view).value();
}

void range_benchmark(benchmark::State& state, std::string route) {
    if (route == "raw" || route == "raw_madvise") {
        void* reserved = raw_reserve();
        const auto pair = route == "raw" ? raw_commit_decommit : raw_commit_madvise_decommit;
        for (auto _ : state) {
            pair(reserved, range_bytes);
        }
        ::munmap(reserved, reservation_bytes);
        return;
    }
    auto view = lazy_backing(state);
    if (!view) {
        return;
    }
    plugin_allocator<cpu_device>& lazy = *posix().lazy;
    auto live = lazy.allocate(reservation_bytes, 4096);
    if (!live) {
        state.SkipWithError(live.error().describe().c_str());
        return;
    }
    const nxmem::byte_range range = commit_range(view->commit_granularity(), range_bytes);
    view_range_route through_view(*view, live.value(), range);
    auto through_table = table_range_route::open(lazy, live.value(), range);
    for (auto _ : state) {
        const bool ok = route == "view" ? through_view.commit_decommit()
                                        : through_table && through_table.value().commit_decommit();
        if (!ok) {
            state.SkipWithError("commit or decommit failed");
            break;
        }
    }
    (void)lazy.release(live.value());
}

// posix-lazy's whole life of a 2 MiB allocation: allocate, commit all, decommit all, release.
void lazy_cycle_benchmark(benchmark::State& state, std::string route) {
    if (route == "raw") {
        for (auto _ : state) {
            void* reserved = raw_reserve();
            raw_commit_decommit(reserved, reservation_bytes);
            ::munmap(reserved, reservation_bytes);
        }
        return;
    }
    auto view = lazy_backing(state);
    if (!view) {
        return;
    }
    plugin_allocator<cpu_device>& lazy = *posix().lazy;
    const nxmem::byte_range all{0, reservation_bytes};
    for (auto _ : state) {
        auto live = lazy.allocate(reservation_bytes, 4096);
        if (!live || !view->commit(live.value(), all) || !view->decommit(live.value(), all) ||
            !lazy.release(live.value())) {
            state.SkipWithError("the allocate, commit, decommit, release cycle failed");
            break;
        }
    }
}

// ---- shared prefixes: PSS of N allocations sharing one prefix against N private copies ----

void shared_prefix_pss(benchmark::State& state) {
    if (!posix_ready(state)) {
        return;
    }
    constexpr unsigned sharers = 16;
    constexpr std::uint64_t prefix_bytes = 4u << 20;
    plugin_allocator<cpu_device>& lazy = *posix().lazy;
    auto view = lazy.virtual_backing();
    auto mapping = lazy.shared_mapping();
    if (!view || !mapping) {
        state.SkipWithError("posix-lazy offers no view");
        return;
    }
    for (auto _ : state) {
        const std::uint64_t before = pss_bytes().value_or(0);
        auto prefix = mapping.value().create_prefix(prefix_bytes);
        std::vector<nxmem::allocation<cpu_device>> shared;
        for (unsigned i = 0; prefix && i < sharers; ++i) {
            auto live = lazy.allocate(2 * prefix_bytes, 4096);
            if (live && mapping.value().commit_prefix(live.value(), prefix.value())) {
                std::memset(live.value().address, 1, prefix_bytes); // touched by every sharer
                shared.push_back(live.value());
            }
        }
        const std::uint64_t with_shared = pss_bytes().value_or(0);
        std::vector<nxmem::allocation<cpu_device>> copies;
        for (unsigned i = 0; i < sharers; ++i) {
            auto live = lazy.allocate(2 * prefix_bytes, 4096);
            if (live && view.value().commit(live.value(), {0, prefix_bytes})) {
                std::memset(live.value().address, 1, prefix_bytes);
                copies.push_back(live.value());
            }
        }
        const std::uint64_t with_copies = pss_bytes().value_or(0);
        for (const auto& each : shared) {
            (void)lazy.release(each);
        }
        for (const auto& each : copies) {
            (void)lazy.release(each);
        }
        if (prefix) {
            (void)mapping.value().release_prefix(prefix.value());
        }
        if (shared.size() != sharers || copies.size() != sharers) {
            state.SkipWithError("allocating, committing or mapping failed");
            break;
        }
        state.counters["pss_shared"] = static_cast<double>(with_shared - before);
        state.counters["pss_private"] = static_cast<double>(with_copies - with_shared);
        state.counters["sharers"] = sharers;
    }
}

// ---- the KV-cache trace replay ----

template <class Store> void replay(benchmark::State& state, Store& store) {
    const nxmem::bench::kv_trace_shape shape;
    for (auto _ : state) {
        auto outcome = nxmem::bench::replay_kv_trace(store, shape);
        if (!outcome) {
            state.SkipWithError(outcome.error().describe().c_str());
            break;
        }
        state.SetIterationTime(outcome.value().seconds);
        state.counters["blocks_per_second"] = static_cast<double>(outcome.value().blocks) / outcome.value().seconds;
        state.counters["peak_rss"] = static_cast<double>(outcome.value().peak_rss);
        state.counters["peak_pss"] = static_cast<double>(outcome.value().peak_pss);
    }
}

void kv_replay_benchmark(benchmark::State& state, std::string store_name) {
    const nxmem::bench::kv_trace_shape shape;
    if (store_name == "heap") {
        nxmem::heap_allocator heap;
        nxmem::bench::block_kv_store<nxmem::heap_allocator> store(heap, shape);
        replay(state, store);
        return;
    }
    if (!posix_ready(state)) {
        return;
    }
    auto store = nxmem::bench::lazy_kv_store::open(*posix().lazy, shape);
    if (!store) {
        state.SkipWithError(store.error().describe().c_str());
        return;
    }
    replay(state, store.value());
}

// ---- registration and the ratios ----

struct size_label {
    std::uint64_t bytes;
    const char* label;
};
constexpr size_label sizes[] = {{64, "64B"}, {4096, "4KiB"}, {2u << 20, "2MiB"}};

std::vector<nxmem::bench::ratio_spec> register_benchmarks() {
    using nxmem::bench::ratio_spec;
    std::vector<ratio_spec> ratios;
    for (const size_label& size : sizes) {
        const std::string at = std::string("/") + size.label;
        for (const char* route : {"adapter", "table", "mechanism", "malloc", "heap_allocator"}) {
            benchmark::RegisterBenchmark((std::string("round_trip/") + route + at).c_str(), round_trip_benchmark,
                                         std::string(route), size.bytes);
        }
        auto name = [&](const char* route) { return std::string("round_trip/") + route + at; };
        ratios.push_back({std::string("whole_path_vs_malloc") + at, "adapter / malloc+free", name("adapter"), name("malloc")});
        ratios.push_back({std::string("table_vs_malloc") + at, "plugin table / malloc+free", name("table"), name("malloc")});
        ratios.push_back({std::string("mechanism_vs_malloc") + at, "posix-eager alone / malloc+free", name("mechanism"), name("malloc")});
        ratios.push_back({std::string("adapter_vs_table") + at, "adapter / plugin table", name("adapter"), name("table")});
        ratios.push_back({std::string("host_ns") + at, "host's share: adapter - table, ns", name("adapter"), name("table"), "ns", true});
        ratios.push_back({std::string("kit_ns") + at, "kit's share: table - mechanism, ns", name("table"), name("mechanism"), "ns", true});
        ratios.push_back({std::string("heap_allocator_vs_malloc") + at, "nxmem::heap_allocator / malloc+free", name("heap_allocator"), name("malloc")});
    }
    benchmark::RegisterBenchmark("round_trip/raw_mmap/2MiB", raw_mmap_round_trip, std::uint64_t{2u << 20});
    ratios.push_back({"eager_vs_raw_mmap/2MiB", "adapter / raw mmap+munmap at 2 MiB", "round_trip/adapter/2MiB", "round_trip/raw_mmap/2MiB"});
    benchmark::RegisterBenchmark("between_system_calls/adapter_64B", between_system_calls)->Iterations(1);
    ratios.push_back({"path_slowdown_between_system_calls",
                      "a 64 B adapter round trip between mmap and munmap / the same alone (warm), ns",
                      "between_system_calls/adapter_64B", "between_system_calls/adapter_64B",
                      "path_ns_between_system_calls", false, "path_ns_warm"});

    for (const char* kind : {"one_allocator", "two_allocators", "malloc"}) {
        benchmark::RegisterBenchmark((std::string("threads/") + kind).c_str(), threads_benchmark, std::string(kind))
            ->Threads(1)->Threads(2)->UseRealTime();
        const std::string base = std::string("threads/") + kind + "/threads:";
        ratios.push_back({std::string("two_threads_vs_one/") + kind, "throughput of 2 threads / 1, 64 B round trips",
                          base + "2", base + "1", "items_per_second"});
    }

    const std::uint64_t many = live_count();
    const std::string many_label = many == 1000000 ? "1M" : std::to_string(many);
    for (const char* route : {"adapter", "table"}) {
        for (auto [live, label] : {std::pair<std::uint64_t, std::string>{1000, "1k"}, {many, many_label}}) {
            benchmark::RegisterBenchmark((std::string("release_random/") + route + "/" + label).c_str(),
                                         release_benchmark, std::string(route), live)
                ->Iterations(static_cast<benchmark::IterationCount>(
                    count_from_environment("NXMEM_BENCH_RELEASES", 200000)));
        }
    }
    ratios.push_back({"release_adapter_vs_table/1k", "adapter / table, release + replace a random victim of 1k live",
                      "release_random/adapter/1k", "release_random/table/1k"});
    ratios.push_back({"release_adapter_vs_table/" + many_label, "the same with " + many_label + " live",
                      "release_random/adapter/" + many_label + "",
                      "release_random/table/" + many_label + ""});

    for (const char* route : {"adapter", "table", "mechanism", "malloc"}) {
        benchmark::RegisterBenchmark((std::string("heap_bytes/") + route).c_str(), heap_benchmark, std::string(route))
            ->Iterations(1);
    }
    ratios.push_back({"host_bytes_per_live", "heap bytes the host keeps per live 64 B allocation (adapter - table)",
                      "heap_bytes/adapter", "heap_bytes/table", "bytes_per_live", true});
    ratios.push_back({"kit_bytes_per_live", "heap bytes the kit keeps per live 64 B allocation (table - mechanism)",
                      "heap_bytes/table", "heap_bytes/mechanism", "bytes_per_live", true});
    ratios.push_back({"host_kept_after_release", "heap bytes host + kit still hold after a mass release (minus the kit's)",
                      "heap_bytes/adapter", "heap_bytes/table", "kept_after_release", true});
    ratios.push_back({"kit_kept_after_release", "heap bytes the kit still holds after a mass release (minus malloc's)",
                      "heap_bytes/table", "heap_bytes/malloc", "kept_after_release", true});

    for (const char* route : {"view", "table", "raw", "raw_madvise"}) {
        benchmark::RegisterBenchmark((std::string("range/") + route).c_str(), range_benchmark, std::string(route));
    }
    ratios.push_back({"commit_decommit_view_vs_raw", "posix-lazy commit + decommit of 64 KiB: view / raw mprotect + MAP_FIXED mmap",
                      "range/view", "range/raw"});
    ratios.push_back({"commit_decommit_view_vs_table", "the same, view / plugin table", "range/view", "range/table"});
    ratios.push_back({"commit_decommit_view_vs_madvise", "the same, view / raw mprotect + madvise(DONTNEED) + mprotect",
                      "range/view", "range/raw_madvise"});
    for (const char* route : {"adapter", "raw"}) {
        benchmark::RegisterBenchmark((std::string("lazy_cycle/") + route).c_str(), lazy_cycle_benchmark, std::string(route));
    }
    ratios.push_back({"lazy_cycle_vs_raw", "posix-lazy 2 MiB allocate+commit+decommit+release / the same calls raw",
                      "lazy_cycle/adapter", "lazy_cycle/raw"});

    benchmark::RegisterBenchmark("shared_prefix/pss", shared_prefix_pss)->Iterations(1);
    ratios.push_back({"shared_prefix_pss_vs_private", "PSS of 16 sharers of a 4 MiB prefix / 16 private copies",
                      "shared_prefix/pss", "shared_prefix/pss", "pss_shared", false,
                      "pss_private"});

    for (const char* store : {"posix_lazy", "heap"}) {
        benchmark::RegisterBenchmark((std::string("kv_replay/") + store).c_str(), kv_replay_benchmark, std::string(store))
            ->Iterations(1)->UseManualTime();
    }
    ratios.push_back({"kv_replay_throughput", "KV trace: posix-lazy with shared prefixes / heap, blocks per second",
                      "kv_replay/posix_lazy", "kv_replay/heap", "blocks_per_second"});
    ratios.push_back({"kv_replay_peak_rss", "KV trace: peak RSS, posix-lazy / heap",
                      "kv_replay/posix_lazy", "kv_replay/heap", "peak_rss"});
    ratios.push_back({"kv_replay_peak_pss", "KV trace: peak PSS, posix-lazy / heap",
                      "kv_replay/posix_lazy", "kv_replay/heap", "peak_pss"});
    return ratios;
}

} // namespace

int main(int argc, char** argv) {
    return nxmem::bench::run_with_ratios(argc, argv, register_benchmarks(), run_notes());
}
