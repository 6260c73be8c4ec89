// stream_ordered_pool's fences on a lane's own stream, recorded lazily. A release on a stream
// records nothing: the stream's own later work is ordered after the work queued before it, so a
// block taken back by the stream that released it needs no fence (the common case, and an
// event record per free is what a CUDA caching allocator avoids). The lane numbers its
// releases instead; when another stream, or collect(), first needs to know whether release n's
// work is done, one fence is recorded on the stream then, covering every release numbered so
// far (recorded later than the releases, it completes no earlier than their work did). Fences
// on one stream complete in order, so those that completed advance a mark and are given back.
// Everything here is the lane lock's.
#pragma once

#include <nxmem/pool/stream_policy.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <utility>

namespace nxmem::pool_detail {

template <StreamPolicy P> class lane_fences {
public:
    using stream_type = typename P::stream_type;
    using fence_type = typename P::fence_type;
    // Fences outstanding at once; past them a release stays pending until the oldest completed.
    static constexpr std::uint32_t most_outstanding = 4;

    // The number of a release made now on the lane's stream.
    std::uint64_t number_release() noexcept { return ++released_; }

    // Whether release `number`'s work is known to have completed, without asking the policy.
    bool known_completed(std::uint64_t number) const noexcept { return number <= completed_through_; }

    // Whether release `number`'s work has completed: polls the outstanding fences.
    bool completed(P& policy, std::uint64_t number) {
        if (known_completed(number)) {
            return true;
        }
        poll(policy);
        return known_completed(number);
    }

    // A fence that covers release `number`, recorded on `stream` (the lane's) when none does yet;
    // nullptr when the policy refused to record one or most_outstanding are pending. Valid until
    // the fence completes (poll gives back only completed fences).
    const fence_type* covering(P& policy, const stream_type& stream, std::uint64_t number) {
        for (std::uint32_t at = 0; at < count_; ++at) {
            auto& outstanding = ring_[(head_ + at) % most_outstanding];
            if (outstanding->covers_through >= number) {
                return &outstanding->fence;
            }
        }
        if (count_ == most_outstanding) {
            poll(policy);
            if (count_ == most_outstanding) {
                return nullptr;
            }
        }
        result<fence_type> recorded = policy.record(stream);
        if (!recorded) {
            return nullptr;
        }
        auto& slot = ring_[(head_ + count_) % most_outstanding];
        slot.emplace(outstanding_fence{std::move(recorded).value(), released_});
        ++count_;
        return &slot->fence;
    }

    // For collect(): every release so far is covered by a fence (one is recorded if not and the
    // policy can), and the outstanding ones are polled.
    void cover_all(P& policy, const stream_type& stream) {
        if (released_ > completed_through_) {
            (void)covering(policy, stream, released_);
        }
        poll(policy);
    }

    // Gives back, oldest first, every fence that completed, advancing the mark.
    void poll(P& policy) {
        while (count_ != 0) {
            auto& oldest = ring_[head_];
            if (!policy.completed(oldest->fence)) {
                return;
            }
            completed_through_ = oldest->covers_through;
            policy.retire(std::move(oldest->fence));
            oldest.reset();
            head_ = (head_ + 1) % most_outstanding;
            --count_;
        }
    }

    // The pool is going away: gives back every outstanding fence.
    void retire_all(P& policy) noexcept {
        for (; count_ != 0; --count_) {
            policy.retire(std::move(ring_[head_]->fence));
            ring_[head_].reset();
            head_ = (head_ + 1) % most_outstanding;
        }
    }

private:
    struct outstanding_fence {
        fence_type fence;
        std::uint64_t covers_through; // the last release numbered when it was recorded
    };

    std::uint64_t released_ = 0;
    std::uint64_t completed_through_ = 0;
    std::array<std::optional<outstanding_fence>, most_outstanding> ring_{};
    std::uint32_t head_ = 0;
    std::uint32_t count_ = 0;
};

} // namespace nxmem::pool_detail
