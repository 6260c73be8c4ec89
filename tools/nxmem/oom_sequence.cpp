#include "oom_sequence.hpp"

#include <nxmem/host.hpp>

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

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

namespace nxmem::fault {

void sequence_run::note(const char* step, const char* what, const char* detail) noexcept {
    if (!failed_) {
        failed_ = true;
        std::snprintf(first_failure_, sizeof first_failure_, "%s: %s: %s", step, what, detail);
    }
}

bool is_mapped(const std::filesystem::path& path) noexcept {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

namespace {

// The sequence for one device type, with the module the steps' counts are read from.
template <Device D> class sequence {
public:
    sequence(sequence_run& run, const std::filesystem::path& path) : run_(run), path_(path) {}

    void run(std::string_view mechanism, std::int32_t device_index, std::string_view options) {
        auto loaded = step("load", [&] { return host::plugin_module::load(path_); });
        run_.allocations_to_load = allocations_counted();
        if (!loaded) {
            return;
        }
        module_ = loaded.value();
        {
            auto pin = step("pin", [&] { return module_->pin(); });
            auto opened = step("open", [&] {
                return host::open_allocator<D>(module_, mechanism, device_index, options);
            });
            if (opened) {
                use(opened.value());
            }
        } // the engine lets go of everything
        auto readiness = step("readiness", [&] { return module_->readiness(); });
        if (readiness && !readiness.value().ready()) {
            run_.note("readiness", "is not idle", "a tally is not zero after the engine let go");
        }
        (void)step("try_unload", [&] { return module_->try_unload(); });
        module_.reset();
        if (is_mapped(path_)) {
            run_.note("unload", "left the library mapped", path_.c_str());
        }
        if (plugin_allocations_live() != 0) {
            char detail[128];
            std::snprintf(detail, sizeof detail,
                          "%llu allocation(s) of the plugin, %llu bytes, never freed",
                          static_cast<unsigned long long>(plugin_allocations_live()),
                          static_cast<unsigned long long>(plugin_bytes_live()));
            run_.note("unload", "leaked", detail);
        }
    }

private:
    // Both tallies, read without counting (or failing) what reading them allocates; "" before
    // the module is loaded.
    std::string counts() {
        uncounted bookkeeping;
        if (!module_) {
            return {};
        }
        auto now = module_->readiness();
        return now ? now.value().describe() : "(readiness failed: " + now.error().describe() + ")";
    }

    // Runs `call`; OUT_OF_MEMORY (or `tolerated`) is an answer. After OUT_OF_MEMORY the counts
    // must be as they were (unless `keeps_counts` is false: a drain that fails has already
    // applied what the plugin retired, docs/HOST.md), a refused load must leave nothing mapped,
    // and the call, repeated once, must succeed.
    template <class Call>
    auto step(const char* name, Call&& call, std::optional<status_code> tolerated = std::nullopt,
              bool keeps_counts = true) -> decltype(call()) {
        const std::string before = counts();
        const bool mapped_before = is_mapped(path_);
        auto first = call();
        if (first || first.error().code == tolerated) {
            return first;
        }
        if (first.error().code != status_code::out_of_memory) {
            note(name, "failed with", first.error());
            return first;
        }
        const std::string after = counts();
        if (keeps_counts && after != before) {
            uncounted bookkeeping;
            const std::string detail = "before: " + before + "; after: " + after;
            run_.note(name, "answered OUT_OF_MEMORY but changed the counts", detail.c_str());
        }
        if (!mapped_before && is_mapped(path_)) {
            run_.note(name, "answered OUT_OF_MEMORY but left the library mapped", path_.c_str());
        }
        auto second = call();
        if (!second && second.error().code != tolerated) {
            note(name, "failed again after OUT_OF_MEMORY with", second.error());
        }
        return second;
    }

    void note(const char* step, const char* what, const error& failure) {
        uncounted bookkeeping;
        try {
            run_.note(step, what, failure.describe().c_str());
        } catch (...) {
            run_.note(step, what, status_code_name(failure.code).data());
        }
    }

    void use(host::plugin_allocator<D>& allocator) {
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
                (void)step("decommit",
                           [&] { return view.value().decommit(first.value(), {0, 4096}); });
            }
        }
        if ((capabilities & NXMEM_CAP_SHARED_MAPPING) != 0) {
            auto view = step("shared_mapping", [&] { return allocator.shared_mapping(); });
            if (view) {
                auto& mapping = view.value();
                auto prefix = step("create_prefix", [&] { return mapping.create_prefix(4096); });
                if (prefix) {
                    (void)step("retain_prefix",
                               [&] { return mapping.retain_prefix(prefix.value()); });
                    (void)step("commit_prefix", [&] {
                        return mapping.commit_prefix(second.value(), prefix.value());
                    });
                    (void)step("release_prefix",
                               [&] { return mapping.release_prefix(prefix.value()); });
                    // The creator's reference is left to go with the allocator.
                }
            }
        }
        (void)step("release", [&] { return allocator.release(first.value()); });
        if ((capabilities & NXMEM_CAP_DEFERRED_RELEASE) != 0) {
            auto ticket =
                step("enqueue_release", [&] { return allocator.enqueue_release(second.value()); });
            bool retired = !ticket;
            for (int attempt = 0; attempt < 4 && !retired; ++attempt) {
                auto completions = step(
                    "drain_releases", [&] { return allocator.drain_releases(); }, std::nullopt,
                    false);
                if (!completions) {
                    break;
                }
                for (const host::release_completion& completion : completions.value()) {
                    retired = retired || completion.ticket == ticket.value();
                }
            }
            if (!retired) {
                run_.note("drain_releases", "did not report", "the enqueued ticket's completion");
            }
        } else {
            (void)step("release", [&] { return allocator.release(second.value()); });
        }
        (void)step("query_usage", [&] { return allocator.query_usage(); },
                   status_code::unsupported_capability);
    }

    sequence_run& run_;
    const std::filesystem::path& path_;
    std::shared_ptr<host::plugin_module> module_;
};

} // namespace

void run_sequence(sequence_run& run, const std::filesystem::path& path, std::string_view mechanism,
                  device_id device, std::string_view options) {
    try {
        switch (device.type) {
        case NXMEM_DEVICE_CPU:
            sequence<cpu_device>(run, path).run(mechanism, device.index, options);
            break;
        case NXMEM_DEVICE_CUDA:
            sequence<cuda_device>(run, path).run(mechanism, device.index, options);
            break;
        case NXMEM_DEVICE_HIP:
            sequence<hip_device>(run, path).run(mechanism, device.index, options);
            break;
        default: run.note("open", "cannot run", "this host has no device tag for the device type");
        }
    } catch (const std::exception& escaped) {
        run.note("sequence", "an exception escaped the API", escaped.what());
    } catch (...) {
        run.note("sequence", "an exception escaped the API", "(not a std::exception)");
    }
}

namespace {

// One child's report, sent whole down a pipe.
struct child_report {
    std::uint64_t allocations = 0;
    std::uint64_t allocations_to_load = 0;
    char failure[1024] = {};
};

// Runs the sequence in a forked child failing `counted`'s `fail_at`-th allocation (0: none);
// fills `report` (failure "" when the child ended cleanly). Allocates nothing in this process.
void run_child(const sequence_subject& subject, side counted, std::uint64_t fail_at,
               child_report& report) {
    report = child_report{};
    int channel[2];
    if (::pipe(channel) != 0) {
        std::snprintf(report.failure, sizeof report.failure, "pipe: %s", std::strerror(errno));
        return;
    }
    const pid_t child = ::fork();
    if (child < 0) {
        std::snprintf(report.failure, sizeof report.failure, "fork: %s", std::strerror(errno));
        ::close(channel[0]);
        ::close(channel[1]);
        return;
    }
    if (child == 0) {
        ::close(channel[0]);
        ::alarm(subject.timeout_seconds);
        sequence_run run;
        aim_at_plugin(subject.path.c_str());
        arm(counted, fail_at);
        run_sequence(run, subject.path, subject.mechanism, subject.device, subject.options);
        disarm();
        if (fail_at != 0 && !injected()) {
            run.note("injection", "was never reached", "the sequence made fewer allocations");
        }
#ifdef NXMEM_WITH_LSAN
        if (__lsan_do_recoverable_leak_check() != 0) {
            run.note("LeakSanitizer", "found leaks", "(its report is on standard error)");
        }
#endif
        child_report sent;
        sent.allocations = allocations_counted();
        sent.allocations_to_load = run.allocations_to_load;
        std::snprintf(sent.failure, sizeof sent.failure, "%s", run.failed() ? run.first_failure() : "");
        (void)!::write(channel[1], &sent, sizeof sent);
        ::_exit(0);
    }
    ::close(channel[1]);
    std::size_t got = 0;
    for (ssize_t part; got < sizeof report &&
                       (part = ::read(channel[0], reinterpret_cast<char*>(&report) + got,
                                      sizeof report - got)) != 0;) {
        if (part < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        got += static_cast<std::size_t>(part);
    }
    ::close(channel[0]);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (got != sizeof report) {
        report = child_report{};
        if (WIFSIGNALED(status)) {
            std::snprintf(report.failure, sizeof report.failure, "the child was killed by %s%s",
                          strsignal(WTERMSIG(status)),
                          WTERMSIG(status) == SIGALRM ? " (timed out)" : "");
        } else {
            std::snprintf(report.failure, sizeof report.failure,
                          "the child ended (status %d) without reporting", status);
        }
    }
}

} // namespace

void sweep(const sequence_subject& subject, side counted, bool skip_load, sweep_report& report) {
    report = sweep_report{};
    static child_report child; // static: the report is 1 KiB, the stack may be small
    run_child(subject, counted, 0, child);
    report.allocations = child.allocations;
    report.allocations_to_load = child.allocations_to_load;
    std::memcpy(report.clean_failure, child.failure, sizeof report.clean_failure);
    if (report.clean_failure[0] != '\0') {
        return;
    }
    report.failed_at_first = skip_load ? report.allocations_to_load + 1 : 1;
    for (std::uint64_t fail_at = report.failed_at_first; fail_at <= report.allocations; ++fail_at) {
        run_child(subject, counted, fail_at, child);
        ++report.runs;
        if (child.failure[0] == '\0') {
            continue;
        }
        if (report.unclean < sweep_report::kept) {
            std::snprintf(report.first_unclean[report.unclean], sizeof report.first_unclean[0],
                          "allocation %llu: %.990s", static_cast<unsigned long long>(fail_at),
                          child.failure);
        }
        ++report.unclean;
    }
}

} // namespace nxmem::fault
