// transfer_request: a read or a write in flight, polled or waited on.
#pragma once

#include <nxmem/transfer/detail/agent_core.hpp>

#include <chrono>
#include <memory>

namespace nxmem::transfer {

class agent;

// A read or write in flight. Dropping the handle does not cancel it (the agent finishes it).
class transfer_request {
public:
    transfer_request() = default;

    // Progresses once (unless the agent has its own thread) and says where the transfer is.
    transfer_status poll() {
        if (!state_->finished() && !core_->has_thread()) {
            (void)core_->progress();
        }
        return status();
    }
    transfer_status status() const noexcept {
        if (!state_->finished()) {
            return transfer_status::in_progress;
        }
        return state_->error.load() == UCS_OK ? transfer_status::done : transfer_status::failed;
    }
    // Success once every block is in place (and the notification sent); the transfer's failure;
    // or BUSY when `timeout` passed first (the transfer goes on: wait again, or disconnect).
    result<void> wait(std::chrono::nanoseconds timeout) {
        if (!core_->wait(*state_, timeout)) {
            return fail(status_code::busy, "transfer of " + std::to_string(state_->blocks) +
                                               " block(s) still in flight after " +
                                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
                                               " ms");
        }
        return outcome();
    }
    // The outcome of a finished transfer.
    result<void> outcome() const {
        const auto failure = static_cast<ucs_status_t>(state_->error.load());
        if (failure == UCS_OK) {
            return boost::outcome_v2::success();
        }
        return fail(status_code::internal_error,
                    "transfer of " + std::to_string(state_->blocks) + " block(s) failed: " + detail::ucx_text(failure) +
                        (state_->peer != nullptr && state_->peer->failed.load() ? " (peer '" + state_->peer->name + "' failed)" : ""));
    }
    std::uint64_t blocks() const noexcept { return state_->blocks; }
    std::uint64_t bytes() const noexcept { return state_->bytes; }

private:
    friend class agent;
    transfer_request(std::shared_ptr<detail::agent_core> core, std::shared_ptr<detail::transfer_state> state)
        : core_(std::move(core)), state_(std::move(state)) {}
    std::shared_ptr<detail::agent_core> core_;
    std::shared_ptr<detail::transfer_state> state_;
};

} // namespace nxmem::transfer
