// What a conformance check runs against (a plugin file, one of its mechanisms, one device) and
// the host session most checks open on it: the plugin loaded as a host loads it, the mechanism
// opened with a reclaim hook that always succeeds, and everything given back at the end.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/rules.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/device.hpp>
#include <nxmem/host.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace nxmem::conform {

struct subject {
    subject() = default;
    // A constructor, not an aggregate: the three-field form stays valid as fields are added.
    subject(std::filesystem::path plugin, std::string name, device_id on, std::string open_options = {})
        : path(std::move(plugin)), mechanism(std::move(name)), device(on),
          options(std::move(open_options)) {}

    std::filesystem::path path;
    std::string mechanism;
    device_id device{NXMEM_DEVICE_CPU, 0};
    std::string options; // the open options every check passes (`nxmem conform --options`)

    std::string describe() const {
        return "'" + mechanism + "' on " + std::string(device_type_name(device.type)) + ":" +
               std::to_string(device.index);
    }
};

// How hard the suite pushes.
struct suite_options {
    unsigned threads = 4;         // concurrency.threads
    unsigned iterations = 200;    // per thread
    unsigned drain_attempts = 64; // drain_releases calls before queued releases count as stuck
    std::string mechanism_options;     // key=value open options for the mechanism (subject::options)
    unsigned reentry_wait_ms = 5000;   // how long a call re-entering the plugin may take (callbacks.*)
    std::uint64_t model_seed = 1;      // model.sequences: RapidCheck's seed (`nxmem conform --seed`)
    unsigned model_steps = 5000;       // model.sequences: about this many operations (`--steps`)
    // The rules the plugin is judged by (`--rules` sets as_of; run_mechanism_checks fills in the
    // minor the plugin declares when it is not given).
    rule_set rules;
};

// A loaded module and, when the mechanism opened, an allocator of it on the subject's device.
template <Device D> class session {
public:
    session() = default;
    session(session&&) noexcept = default;
    session& operator=(session&&) noexcept = default;
    session(const session&) = delete;
    session& operator=(const session&) = delete;
    ~session() { (void)close(); }

    // Loads the plugin; the caller opens the mechanism (or checks why it cannot).
    static result<session> load(const subject& target) {
        announce_step("load the plugin");
        NXMEM_TRY(module, host::plugin_module::load(target.path));
        session made;
        made.module_ = std::move(module);
        return made;
    }

    // Loads the plugin and opens the mechanism; a failure names the step.
    static result<session> open(const subject& target) {
        NXMEM_TRY(made, load(target));
        NXMEM_TRY_VOID(made.open_allocator(target));
        return made;
    }

    result<void> open_allocator(const subject& target) {
        announce_step("open " + target.describe());
        auto reclaim_hook = [](const host::reclaim_request&) -> result<void> {
            return boost::outcome_v2::success(); // nothing to evict; the plugin may retry
        };
        result<host::plugin_allocator<D>> opened = host::open_allocator<D>(
            module_, target.mechanism, target.device.index, target.options, reclaim_hook);
        if (!opened) {
            return std::move(opened).error();
        }
        allocator_ = std::make_unique<host::plugin_allocator<D>>(std::move(opened).value());
        return boost::outcome_v2::success();
    }

    host::plugin_allocator<D>& allocator() { return *allocator_; }
    bool has_allocator() const noexcept { return allocator_ != nullptr; }
    const std::shared_ptr<host::plugin_module>& module() const noexcept { return module_; }

    // The plugin's own report of what it holds.
    result<host::plugin_counts> plugin_counts() const {
        NXMEM_TRY(both, module_->readiness());
        return both.plugin;
    }

    // Closes the allocator only.
    void close_allocator() { allocator_.reset(); }

    // Closes the allocator and tries to unload; the result says whether the module went.
    result<void> close() {
        announce_step("close the allocator and unload the plugin");
        allocator_.reset();
        if (module_ == nullptr || !module_->loaded()) {
            module_.reset();
            return boost::outcome_v2::success();
        }
        result<void> unloaded = module_->try_unload();
        module_.reset();
        return unloaded;
    }

private:
    std::shared_ptr<host::plugin_module> module_;
    std::unique_ptr<host::plugin_allocator<D>> allocator_; // a pointer: no optional to confuse -Wmaybe-uninitialized
};

// Calls `body.template operator()<D>()` for the device tag of `type`; nullopt when this host has
// no tag for it.
template <class Body> std::optional<finding> with_device_tag(NxmemDeviceType type, Body&& body) {
    switch (type) {
    case NXMEM_DEVICE_CPU: return body.template operator()<cpu_device>();
    case NXMEM_DEVICE_CUDA: return body.template operator()<cuda_device>();
    case NXMEM_DEVICE_HIP: return body.template operator()<hip_device>();
    default: return std::nullopt;
    }
}

// Runs Check::run<D>(target, options) for the subject's device tag.
template <class Check> finding run_for_device(const subject& target, const suite_options& options) {
    std::optional<finding> found = with_device_tag(target.device.type, [&]<Device D>() {
        return Check::template run<D>(target, options);
    });
    if (!found) {
        return not_applicable("this host has no device tag for device type " +
                              std::string(device_type_name(target.device.type)));
    }
    return std::move(*found);
}

// "WRONG_DEVICE: ..." for a failed result.
inline std::string describe_error(const error& failure) { return failure.describe(); }

// "CODE" of a wire status code.
inline std::string code_name(NxmemStatusCode code) {
    return std::string(status_code_name(status_code_from_wire(code)));
}

} // namespace nxmem::conform

// NXMEM_CONFORM_TRY(name, "what the check needs", expression): evaluates a result; on failure the
// enclosing check fails, expecting what it needed and reporting the error; else declares `name`.
#define NXMEM_CONFORM_TRY(name, needed, ...)                                                       \
    auto&& NXMEM_DETAIL_TRY_RESULT = (__VA_ARGS__);                                                \
    if (!NXMEM_DETAIL_TRY_RESULT.has_value())                                                      \
        return ::nxmem::conform::failed(needed, NXMEM_DETAIL_TRY_RESULT.error().describe());       \
    auto name = std::move(NXMEM_DETAIL_TRY_RESULT).value()
