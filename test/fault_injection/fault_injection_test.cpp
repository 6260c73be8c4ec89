// Allocation-failure injection (issue 12): for every N, a forked child runs a sequence of load,
// pin, open, allocate, commit, shared-prefix create/retain/commit/release, release, enqueue,
// drain, usage, readiness and unload with the N-th allocation of the host failing. Each call
// either succeeds or returns OUT_OF_MEMORY and then succeeds when called again (the state was
// kept); nothing throws; afterwards both tallies are zero, the module unloads and is unmapped,
// and (in AddressSanitizer builds) LeakSanitizer finds nothing.
#include "allocation_failure.hpp"

#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#if defined(__SANITIZE_ADDRESS__)
#define NXMEM_WITH_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NXMEM_WITH_LSAN 1
#endif
#endif
#ifdef NXMEM_WITH_LSAN
#include <sanitizer/lsan_interface.h>
#endif

using namespace nxmem;

namespace {

// The child's first failure, written without allocating (the injector may be armed).
char first_failure[1024];
bool failed = false;
// How many host allocations loading the plugin made (the same for every mechanism of a plugin).
std::uint64_t allocations_to_load = 0;

void note(const char* what, const char* step, const char* detail) {
    if (!failed) {
        failed = true;
        std::snprintf(first_failure, sizeof first_failure, "%s: %s: %s", step, what, detail);
    }
}
void note(const char* what, const char* step, const error& failure) {
    if (!failed) {
        failed = true;
        std::snprintf(first_failure, sizeof first_failure, "%s: %s: %s %s", step, what,
                      status_code_name(failure.code).data(), failure.message.c_str());
    }
}

// Runs `call`; OUT_OF_MEMORY (or `tolerated`) is an answer, and after OUT_OF_MEMORY the call is
// repeated once and must then succeed: the failed call kept the state as it was.
template <class Call>
auto step(const char* name, Call&& call,
          std::optional<status_code> tolerated = std::nullopt) -> decltype(call()) {
    auto first = call();
    if (first || first.error().code == tolerated) {
        return first;
    }
    if (first.error().code != status_code::out_of_memory) {
        note("failed with", name, first.error());
        return first;
    }
    auto second = call();
    if (!second && second.error().code != tolerated) {
        note("failed again after OUT_OF_MEMORY with", name, second.error());
    }
    return second;
}

bool is_mapped(const char* path) {
    void* handle = ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

void use_allocator(host::plugin_allocator<cpu_device>& allocator) {
    auto first = step("allocate", [&] { return allocator.allocate(4096, 64); });
    auto second = step("allocate", [&] { return allocator.allocate(8192, 4096); });
    if (!first || !second) {
        return;
    }
    const NxmemCapabilities capabilities = allocator.capabilities();
    if ((capabilities & NXMEM_CAP_VIRTUAL_BACKING) != 0) {
        auto view = step("virtual_backing", [&] { return allocator.virtual_backing(); });
        if (view) {
            (void)step("commit", [&] { return view.value().commit(first.value(), {0, 4096}); });
            (void)step("mapped_bytes", [&] { return view.value().mapped_bytes(first.value()); });
            (void)step("decommit", [&] { return view.value().decommit(first.value(), {0, 4096}); });
        }
    }
    if ((capabilities & NXMEM_CAP_SHARED_MAPPING) != 0) {
        auto view = step("shared_mapping", [&] { return allocator.shared_mapping(); });
        if (view) {
            auto& mapping = view.value();
            auto prefix = step("create_prefix", [&] { return mapping.create_prefix(4096); });
            if (prefix) {
                (void)step("retain_prefix", [&] { return mapping.retain_prefix(prefix.value()); });
                (void)step("commit_prefix",
                     [&] { return mapping.commit_prefix(second.value(), prefix.value()); });
                (void)step("release_prefix", [&] { return mapping.release_prefix(prefix.value()); });
                // The creator's reference is left to go with the allocator.
            }
        }
    }
    (void)step("release", [&] { return allocator.release(first.value()); });
    if ((capabilities & NXMEM_CAP_DEFERRED_RELEASE) != 0) {
        auto ticket = step("enqueue_release", [&] { return allocator.enqueue_release(second.value()); });
        bool retired = !ticket;
        for (int attempt = 0; attempt < 4 && !retired; ++attempt) {
            auto completions = step("drain_releases", [&] { return allocator.drain_releases(); });
            if (!completions) {
                break;
            }
            for (const host::release_completion& completion : completions.value()) {
                retired = retired || completion.ticket == ticket.value();
            }
        }
        if (!retired) {
            note("did not report", "drain_releases", "the enqueued ticket's completion");
        }
    } else {
        (void)step("release", [&] { return allocator.release(second.value()); });
    }
    (void)step("query_usage", [&] { return allocator.query_usage(); }, status_code::unsupported_capability);
}

// The sequence, as the engine would run it; every failure is noted, none thrown.
void exercise(const std::filesystem::path& path, std::string_view mechanism) {
    auto loaded = step("load", [&] { return host::plugin_module::load(path); });
    allocations_to_load = test::fault::host_allocations_counted();
    if (!loaded) {
        return;
    }
    const std::shared_ptr<host::plugin_module>& module = loaded.value();
    {
        auto pin = step("pin", [&] { return module->pin(); });
        auto opened = step("open", [&] { return host::open_allocator<cpu_device>(module, mechanism); });
        if (opened) {
            use_allocator(opened.value());
        }
    } // the engine lets go of everything
    auto readiness = step("readiness", [&] { return module->readiness(); });
    if (readiness && !readiness.value().ready()) {
        note("is not idle", "readiness", "a tally is not zero after the engine let go");
    }
    (void)step("try_unload", [&] { return module->try_unload(); });
}

// In a forked child: runs the sequence failing the host's `fail_at`-th allocation (0: none),
// checks everything came back, and exits 0 (clean) or 1; `counted` receives the number of host
// allocations the sequence made and the number that loading the plugin made.
[[noreturn]] void run_child(const std::filesystem::path& path, std::string_view mechanism,
                            std::uint64_t fail_at, int counted) {
    test::fault::arm(fail_at);
    try {
        exercise(path, mechanism);
    } catch (const std::exception& escaped) {
        note("an exception escaped the API", "sequence", escaped.what());
    } catch (...) {
        note("an exception escaped the API", "sequence", "(not a std::exception)");
    }
    test::fault::disarm();
    const std::uint64_t allocations[2] = {test::fault::host_allocations_counted(),
                                          allocations_to_load};
    (void)!::write(counted, allocations, sizeof allocations);
    if (fail_at != 0 && !test::fault::injected()) {
        note("was never reached", "injection", "the sequence made fewer host allocations");
    }
    if (is_mapped(path.c_str())) {
        note("is still mapped", "unload", path.c_str());
    }
#ifdef NXMEM_WITH_LSAN
    if (__lsan_do_recoverable_leak_check() != 0) {
        note("found leaks", "LeakSanitizer", "(its report is above)");
    }
#endif
    if (failed) {
        std::fprintf(stderr, "failing host allocation %llu of %.*s: %s\n",
                     static_cast<unsigned long long>(fail_at), static_cast<int>(mechanism.size()),
                     mechanism.data(), first_failure);
    }
    std::fflush(stderr);
    ::_exit(failed ? 1 : 0);
}

struct child_result {
    int status = 0;
    std::uint64_t allocations = 0;
    std::uint64_t allocations_to_load = 0;
};

child_result fork_child(const std::filesystem::path& path, std::string_view mechanism,
                        std::uint64_t fail_at) {
    int channel[2];
    REQUIRE(::pipe(channel) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(channel[0]);
        run_child(path, mechanism, fail_at, channel[1]);
    }
    ::close(channel[1]);
    child_result result;
    std::uint64_t allocations[2] = {0, 0};
    if (::read(channel[0], allocations, sizeof allocations) ==
        static_cast<ssize_t>(sizeof allocations)) {
        result.allocations = allocations[0];
        result.allocations_to_load = allocations[1];
    }
    ::close(channel[0]);
    REQUIRE(::waitpid(child, &result.status, 0) == child);
    return result;
}

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

} // namespace

TEST_CASE("every host allocation of the sequence can fail: a status, nothing lost, the module "
          "unloads",
          "[fault-injection]") {
    test::fault::learn_runtime_objects();
    // Loading a plugin makes the same host allocations whichever mechanism is then opened: the
    // first mechanism of each plugin fails them, the others start after them (this halves the
    // children, which matters under AddressSanitizer).
    struct subject {
        const char* variable;
        const char* mechanism;
        bool fails_load;
    };
    const subject tried = GENERATE(subject{"NXMEM_TESTPLUGIN", "eager", true},
                                   subject{"NXMEM_TESTPLUGIN", "lazy", false},
                                   subject{"NXMEM_TESTPLUGIN", "legacy-1-0", false},
                                   subject{"NXMEM_TESTPLUGIN", "quarantining", false},
                                   subject{"NXMEM_POSIX_PLUGIN", "posix-eager", true},
                                   subject{"NXMEM_POSIX_PLUGIN", "posix-lazy", false});
    const std::filesystem::path path = test::plugin_path(tried.variable);
    INFO("mechanism " << tried.mechanism << " of " << path);

    const child_result clean = fork_child(path, tried.mechanism, 0);
    INFO("the sequence without a failure: " << describe_exit(clean.status));
    REQUIRE(clean.status == 0);
    REQUIRE(clean.allocations > 0);

    REQUIRE(clean.allocations_to_load > 0);
    std::uint64_t failures = 0;
    const std::uint64_t first = tried.fails_load ? 1 : clean.allocations_to_load + 1;
    for (std::uint64_t fail_at = first; fail_at <= clean.allocations; ++fail_at) {
        const child_result run = fork_child(path, tried.mechanism, fail_at);
        if (run.status != 0) {
            ++failures;
            UNSCOPED_INFO("failing host allocation " << fail_at << " of " << clean.allocations
                                                     << ": " << describe_exit(run.status));
        }
    }
    INFO(clean.allocations << " host allocations, " << clean.allocations_to_load
                           << " of them loading; allocations " << first << " to "
                           << clean.allocations << " each failed once");
    CHECK(failures == 0);
}
