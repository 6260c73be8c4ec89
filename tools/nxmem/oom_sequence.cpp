#include "oom_sequence.hpp"

#include "allocation_failure.hpp"

#include <nxmem/host.hpp>

#include <dlfcn.h>

#include <cstdio>
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

} // namespace nxmem::fault
