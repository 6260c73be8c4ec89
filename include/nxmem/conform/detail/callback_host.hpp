// The suite as a host that answers the plugin's callbacks itself: an allocator opened past the
// host library (its own dlopen handle, factories and open request) with a callback table whose
// request_reclaim and release_completed re-enter the plugin; and the watchdogs that turn a plugin
// which blocks there into a finding instead of a hung run.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/host/callback_guard.hpp>
#include <nxmem/host/tally.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace nxmem::conform::detail {

// Tickets as a failure prints them: "101 102 103", or "none".
inline std::string describe_tickets(const std::vector<std::uint64_t>& tickets) {
    std::string text;
    for (std::uint64_t ticket : tickets) {
        text += (text.empty() ? "" : " ") + std::to_string(ticket);
    }
    return text.empty() ? "none" : text;
}

// Tickets are the host's uint64_t (D1): these cross 2^32, so a plugin that keeps them in 32 bits
// retires 0, 1 and 2 for the last three, which the host never issued.
inline std::vector<std::uint64_t> tickets_across_2_32(std::uint64_t count) {
    std::vector<std::uint64_t> tickets;
    for (std::uint64_t at = 0; at < count; ++at) {
        tickets.push_back((std::uint64_t{1} << 32) - 2 + at);
    }
    return tickets;
}

// The host callback table the suite hands to a plugin, calling back into `on_reclaim` and
// `on_completed`. Each is offered only when set; both run inside the host's guard.
class callback_host {
public:
    std::function<NxmemStatusCode(const NxmemReclaimRequest&, NxmemStatus*)> on_reclaim;
    std::function<void(const NxmemReleaseCompletion&)> on_completed;

    callback_host() = default;
    callback_host(const callback_host&) = delete;
    callback_host& operator=(const callback_host&) = delete;

    // The table, filled for the callbacks set now; valid as long as this object.
    const NxmemHostCallbacks* table() {
        table_ = abi::make_struct<NxmemHostCallbacks>();
        table_.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        table_.host_context = this;
        table_.request_reclaim = on_reclaim ? &reclaim_entry : nullptr;
        table_.release_completed = on_completed ? &completed_entry : nullptr;
        return &table_;
    }

private:
    static NxmemStatusCode reclaim_entry(void* context, const NxmemReclaimRequest* request,
                                         NxmemStatus* status) noexcept {
        return host::guard_status(status, [&] {
            return static_cast<callback_host*>(context)->on_reclaim(*request, status);
        });
    }
    static void completed_entry(void* context, const NxmemReleaseCompletion* completion) noexcept {
        host::guard_void([&] { static_cast<callback_host*>(context)->on_completed(*completion); });
    }

    NxmemHostCallbacks table_{};
};

// The tickets release_completed reported, in the order reported; a completion may come from the
// plugin's own thread (D7).
class retired_tickets {
public:
    void listen(callback_host& callbacks) {
        callbacks.on_completed = [this](const NxmemReleaseCompletion& completion) {
            const std::lock_guard lock(mutex_);
            tickets_.push_back(completion.ticket);
        };
    }
    std::vector<std::uint64_t> now() const {
        const std::lock_guard lock(mutex_);
        return tickets_;
    }

private:
    mutable std::mutex mutex_;
    std::vector<std::uint64_t> tickets_;
};

// An allocator of the subject's mechanism opened directly through its factory, with the suite's
// callback table; the library stays mapped, and the allocator referenced, until this goes away.
class callback_allocator {
public:
    callback_allocator(const callback_allocator&) = delete;
    callback_allocator& operator=(const callback_allocator&) = delete;
    ~callback_allocator() {
        while (references_ > 0) {
            release_reference();
        }
    }

    static result<std::unique_ptr<callback_allocator>> open(const subject& target,
                                                       const NxmemHostCallbacks* callbacks) {
        NXMEM_TRY(library, raw_library::open(target.path));
        NXMEM_TRY(factories, raw_factories::create(library));
        std::unique_ptr<callback_allocator> made(new callback_allocator(std::move(library), std::move(factories)));
        NXMEM_TRY_VOID(made->open_allocator(target, callbacks));
        return made;
    }

    raw_slots slots() const { return raw_slots(self_, table_, device_); }
    NxmemCapabilities capabilities() const noexcept { return table_.capabilities; }

    // The plugin's own report of what it holds.
    result<host::plugin_counts> counts() const {
        NxmemQueryUnloadReadinessFn query = library_.query_unload_readiness();
        auto report = abi::make_struct<NxmemUnloadReport>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = query(&report, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code), abi::read_status_message(status));
        }
        return host::plugin_counts::from_wire(report);
    }

    // One more reference (the allocator's retain slot), and one less (its release slot).
    void retain() {
        table_.retain(self_);
        ++references_;
    }
    void release_reference() {
        --references_;
        table_.release(self_);
    }
    // The plugin freed the allocator early: the suite holds no reference it could still drop.
    void forget_references() noexcept { references_ = 0; }

private:
    callback_allocator(raw_library library, raw_factories factories)
        : library_(std::move(library)), factories_(std::move(factories)) {}

    result<void> open_allocator(const subject& target, const NxmemHostCallbacks* callbacks) {
        NxmemAllocatorFactoryVtable* factory = factories_.find(target.mechanism);
        if (factory == nullptr) {
            return fail(status_code::invalid_argument,
                        "the plugin has no mechanism called '" + target.mechanism + "'");
        }
        NXMEM_TRY(factory_copy, abi::read_prefix<NxmemAllocatorFactoryVtable>(
                                    factory, factories_.negotiated_minor()));
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = target.device.to_wire();
        request.callbacks = callbacks;
        request.options = target.options.data();
        request.options_length = target.options.size();
        NxmemAllocatorVtable* opened = nullptr;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            factory_copy.table.open_allocator(factory, &request, &opened, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        "open_allocator: " + abi::read_status_message(status));
        }
        NXMEM_TRY(copy, abi::read_prefix<NxmemAllocatorVtable>(opened, factories_.negotiated_minor()));
        self_ = opened;
        table_ = copy.table;
        references_ = 1;
        device_ = target.device;
        return boost::outcome_v2::success();
    }

    // Declared first: destroyed last, after the factories and the allocator are released.
    raw_library library_;
    raw_factories factories_;
    NxmemAllocatorVtable* self_ = nullptr;
    NxmemAllocatorVtable table_{};
    device_id device_{NXMEM_DEVICE_CPU, 0};
    unsigned references_ = 0;
};

// The step a check has reached, readable from the watchdog while the check runs.
class step_log {
public:
    void at(std::string step) {
        std::lock_guard lock(mutex_);
        step_ = std::move(step);
    }
    std::string current() const {
        std::lock_guard lock(mutex_);
        return step_;
    }

private:
    mutable std::mutex mutex_;
    std::string step_ = "starting";
};

// Runs `body` on a thread of its own. When it has not returned within `limit` the check fails as
// hung, naming the step it reached; its thread is left behind with everything it holds (the
// plugin stays mapped under it), so the rest of the run goes on.
inline finding within_deadline(std::chrono::milliseconds limit,
                               std::function<finding(step_log&)> body) {
    struct shared_state {
        std::mutex mutex;
        std::condition_variable done;
        std::optional<finding> found;
        step_log steps;
    };
    auto state = std::make_shared<shared_state>();
    std::thread runner([state, body = std::move(body)] {
        finding found;
        try {
            found = body(state->steps);
        } catch (const std::exception& failure) {
            found = failed("the check runs to completion", std::string("exception: ") + failure.what());
        }
        std::lock_guard lock(state->mutex);
        state->found = std::move(found);
        state->done.notify_all();
    });
    std::unique_lock lock(state->mutex);
    if (!state->done.wait_for(lock, limit, [&] { return state->found.has_value(); })) {
        lock.unlock();
        runner.detach();
        return failed("every call returns within " + std::to_string(limit.count()) + " ms",
                      "hang: no return within " + std::to_string(limit.count()) + " ms at: " +
                          state->steps.current());
    }
    lock.unlock();
    runner.join();
    return std::move(*state->found);
}

// Calls into the plugin from another thread while this thread is inside one of its callbacks, so
// a plugin that holds its own lock across the callback is seen without deadlocking the suite: the
// call is given `limit` to return; the thread is joined by finish(), after the plugin's outer
// call has returned (and dropped whatever lock it held).
class side_call {
public:
    explicit side_call(std::function<void()> call)
        : finished_(std::make_shared<std::promise<void>>()) {
        std::future<void> done = finished_->get_future();
        thread_ = std::thread([call = std::move(call), finished = finished_] {
            call();
            finished->set_value();
        });
        done_ = std::move(done);
    }
    side_call(const side_call&) = delete;
    side_call& operator=(const side_call&) = delete;
    side_call(side_call&&) noexcept = default;
    side_call& operator=(side_call&&) noexcept = default;
    ~side_call() { finish(); }

    // Whether the call returned within `limit`.
    bool returned_within(std::chrono::milliseconds limit) {
        return done_.wait_for(limit) == std::future_status::ready;
    }
    void finish() {
        if (thread_.joinable()) {
            thread_.join();
        }
    }

private:
    std::shared_ptr<std::promise<void>> finished_;
    std::future<void> done_;
    std::thread thread_;
};

} // namespace nxmem::conform::detail
