// Allocation-failure injection (issues 12 and 23): for every N, a forked child runs the standard
// sequence (tools/nxmem/oom_sequence.hpp: load, pin, open, allocate, commit, shared-prefix
// create/retain/commit/release, release, enqueue, drain, usage, readiness, unload) with the N-th
// allocation of one side failing: the host's own (issue 12) or the plugin's (issue 23, including
// what the plugin allocates while dlopen runs its initialisers). Each call either succeeds or
// returns OUT_OF_MEMORY with the counts unchanged and then succeeds when called again; nothing
// throws; afterwards both tallies are zero, the module unloads and is unmapped, none of the
// plugin's allocations is left, and (in AddressSanitizer builds) LeakSanitizer finds nothing.
// Beside the sweep: the two load-time defects issue 23 found, each pinned by a test of its own.
#include "../../tools/nxmem/allocation_failure.hpp"
#include "../../tools/nxmem/oom_sequence.hpp"

#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

using namespace nxmem;

namespace {

std::string describe_exit(int status) {
    if (WIFEXITED(status)) {
        return "exit status " + std::to_string(WEXITSTATUS(status));
    }
    if (WIFSIGNALED(status)) {
        return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
               strsignal(WTERMSIG(status)) + ")";
    }
    return "status " + std::to_string(status);
}

// Fails each allocation of `counted` from the first (or, unless `fails_load`, the first after
// those of the load, the same for every mechanism of a plugin) to the last the clean sequence
// made, one child each (fault::sweep).
void check_sweep(const std::filesystem::path& path, const char* mechanism, fault::side counted,
                 bool fails_load) {
    INFO("mechanism " << mechanism << " of " << path);
    fault::sequence_subject subject;
    subject.path = path;
    subject.mechanism = mechanism;
    static fault::sweep_report report; // a few KiB: not on the stack
    fault::sweep(subject, counted, !fails_load, report);
    INFO("the sequence without a failure: " << report.clean_failure);
    REQUIRE(std::string(report.clean_failure).empty());
    for (std::uint64_t each = 0; each < report.unclean && each < fault::sweep_report::kept; ++each) {
        UNSCOPED_INFO(report.first_unclean[each]);
    }
    INFO(report.allocations << " allocations, " << report.allocations_to_load
                            << " of them loading; allocations " << report.failed_at_first << " to "
                            << report.allocations << " each failed once");
    CHECK(report.unclean == 0);
}

// Runs `body` in a forked child with the runtime learnt: "" when it passed, else why not.
std::string in_child(const std::function<std::string()>& body) {
    int channel[2];
    REQUIRE(::pipe(channel) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(channel[0]);
        std::string failure;
        try {
            failure = body();
        } catch (const std::exception& escaped) {
            failure = std::string("an exception escaped: ") + escaped.what();
        }
        (void)!::write(channel[1], failure.data(), failure.size());
        ::_exit(0);
    }
    ::close(channel[1]);
    std::string failure;
    char buffer[512];
    for (ssize_t got; (got = ::read(channel[0], buffer, sizeof buffer)) > 0;) {
        failure.append(buffer, static_cast<std::size_t>(got));
    }
    ::close(channel[0]);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        failure += " (child: " + describe_exit(status) + ")";
    }
    return failure;
}

// One sweep: the plugin (by the variable naming its path), the mechanism opened, and whether the
// sweep fails the allocations made while the plugin is loaded (the first mechanism of each plugin).
struct subject {
    const char* variable;
    const char* mechanism;
    bool fails_load;
};

} // namespace

TEST_CASE("every host allocation of the sequence can fail: a status, nothing lost, the module "
          "unloads",
          "[fault-injection]") {
    fault::learn_runtime_objects();
    // Loading a plugin makes the same host allocations whichever mechanism is then opened: the
    // first mechanism of each plugin fails them, the others start after them (this halves the
    // children, which matters under AddressSanitizer).
    const subject tried = GENERATE(subject{"NXMEM_TESTPLUGIN", "eager", true},
                                   subject{"NXMEM_TESTPLUGIN", "lazy", false},
                                   subject{"NXMEM_TESTPLUGIN", "legacy-1-0", false},
                                   subject{"NXMEM_TESTPLUGIN", "quarantining", false},
                                   subject{"NXMEM_POSIX_PLUGIN", "posix-eager", true},
                                   subject{"NXMEM_POSIX_PLUGIN", "posix-lazy", false});
    check_sweep(test::plugin_path(tried.variable), tried.mechanism, fault::side::host,
                tried.fails_load);
}

// Those made while the library is opened included: OUT_OF_MEMORY, counts unchanged, nothing
// leaked, the library unmapped.
TEST_CASE("every plugin allocation of the sequence can fail",
          "[fault-injection]") {
    fault::learn_runtime_objects();
    const subject tried = GENERATE(subject{"NXMEM_POSIX_PLUGIN", "posix-eager", true},
                                   subject{"NXMEM_POSIX_PLUGIN", "posix-lazy", false},
                                   subject{"NXMEM_TESTPLUGIN", "eager", true},
                                   subject{"NXMEM_TESTPLUGIN", "lazy", false},
                                   subject{"NXMEM_TESTPLUGIN", "legacy-1-0", false},
                                   subject{"NXMEM_TESTPLUGIN", "quarantining", false},
                                   subject{"NXMEM_MINIMAL_C_PLUGIN", "minimal-c", true});
    check_sweep(test::plugin_path(tried.variable), tried.mechanism, fault::side::plugin,
                tried.fails_load);
}

TEST_CASE("the kit's plugins allocate nothing while dlopen runs their initialisers",
          "[fault-injection]") {
    fault::learn_runtime_objects();
    const std::string path =
        test::plugin_path(GENERATE("NXMEM_POSIX_PLUGIN", "NXMEM_TESTPLUGIN"));
    INFO(path);
    const std::string failure = in_child([&]() -> std::string {
        fault::aim_at_plugin(path.c_str());
        fault::arm(fault::side::plugin, 0);
        void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        fault::disarm();
        if (library == nullptr) {
            return std::string("cannot load: ") + ::dlerror();
        }
        ::dlclose(library);
        const std::uint64_t made = fault::allocations_counted();
        return made == 0 ? "" : std::to_string(made) + " allocation(s) while the library was opened";
    });
    CHECK(failure == "");
}

// Refused as OUT_OF_MEMORY, the library unmapped, nothing leaked, and this thread still loads
// plugins.
TEST_CASE("a failed allocation in a plugin's initialiser is a clean refusal",
          "[fault-injection]") {
    fault::learn_runtime_objects();
    const std::string path = test::plugin_path("NXMEM_ALLOCATING_INITIALISER_PLUGIN");
    const std::string posix = test::plugin_path("NXMEM_POSIX_PLUGIN");
    const std::string failure = in_child([&]() -> std::string {
        fault::aim_at_plugin(path.c_str());
        // Without a failure it loads, and its initialiser allocates (else this tests nothing).
        fault::arm(fault::side::plugin, 0);
        {
            auto clean = host::plugin_module::load(path);
            if (!clean) {
                return "the fixture does not load: " + clean.error().describe();
            }
            if (fault::allocations_counted() == 0) {
                return "the fixture's initialiser allocated nothing";
            }
            if (!clean.value()->try_unload()) {
                return "the fixture does not unload";
            }
        }
        fault::arm(fault::side::plugin, 1);
        auto refused = host::plugin_module::load(path);
        fault::disarm();
        if (refused) {
            return "the load succeeded although the initialiser's allocation failed";
        }
        if (refused.error().code != status_code::out_of_memory ||
            refused.error().message.find("static initialiser") == std::string::npos) {
            return "refused as " + refused.error().describe();
        }
        if (fault::is_mapped(path)) {
            return "the library stays mapped";
        }
        if (fault::plugin_allocations_live() != 0) {
            return std::to_string(fault::plugin_allocations_live()) + " allocation(s) leaked";
        }
        // This thread still loads and unloads plugins.
        auto other = host::plugin_module::load(posix);
        if (!other || !other.value()->try_unload()) {
            return "the host cannot load another plugin afterwards";
        }
        return "";
    });
    CHECK(failure == "");
}

TEST_CASE("a plugin whose initialiser throws is refused as CONTRACT_VIOLATION, unmapped",
          "[fault-injection]") {
    const std::string path = test::plugin_path("NXMEM_ALLOCATING_INITIALISER_PLUGIN");
    const std::string failure = in_child([&]() -> std::string {
        ::setenv("NXMEM_TEST_INITIALISER_THROWS", "1", 1);
        auto refused = host::plugin_module::load(path);
        if (refused) {
            return "the load succeeded although the initialiser threw";
        }
        if (refused.error().code != status_code::contract_violation ||
            refused.error().message.find("static initialiser threw") == std::string::npos) {
            return "refused as " + refused.error().describe();
        }
        return fault::is_mapped(path) ? "the library stays mapped" : "";
    });
    CHECK(failure == "");
}

// The first factory is released, nothing leaked.
TEST_CASE("NxmemCreateAllocatorFactories out of memory at its second factory answers OUT_OF_MEMORY",
          "[fault-injection]") {
    fault::learn_runtime_objects();
    const std::string path = test::plugin_path("NXMEM_POSIX_PLUGIN");
    const std::string failure = in_child([&]() -> std::string {
        void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) {
            return std::string("cannot load: ") + ::dlerror();
        }
        auto* create = reinterpret_cast<NxmemCreateAllocatorFactoriesFn>(
            ::dlsym(library, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES));
        NxmemAllocatorFactoryVtable* factories[NXMEM_MAX_FACTORIES] = {};
        std::uint32_t count = 0;
        NxmemStatus status = abi::make_status();
        fault::aim_at_plugin(path.c_str());
        fault::arm(fault::side::plugin, 2);
        const NxmemStatusCode code = create(factories, NXMEM_MAX_FACTORIES, &count, &status);
        fault::disarm();
        std::string problem;
        if (!fault::injected()) {
            problem = "the plugin made fewer than two allocations";
        } else if (code != NXMEM_STATUS_OUT_OF_MEMORY) {
            problem = "answered " + std::string(status_code_name(static_cast<status_code>(code))) +
                      ": " + status.message;
        } else if (fault::plugin_allocations_live() != 0) {
            problem = std::to_string(fault::plugin_bytes_live()) + " bytes leaked";
        } else if (factories[0] != nullptr) {
            problem = "a factory was written although the call failed";
        }
        ::dlclose(library);
        return problem;
    });
    CHECK(failure == "");
}
