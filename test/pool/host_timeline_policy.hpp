// A StreamPolicy for tests: streams are numbered host timelines, like ABI 1.4's HOST_TIMELINE
// fences. Queuing work on a stream advances its submitted count; the test says when work has
// run (complete), so which fences are pending is exactly what the test decided. A fence is the
// stream's submitted count when it was recorded; it has completed once the stream's completed
// count reached it. host_timeline_policy<true> also makes a stream wait for a fence (counted,
// as cuStreamWaitEvent would queue it); both can be told to refuse to record. Streams 0 to 7.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/pool/stream_policy.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>

namespace nxmem::test {

class host_timeline {
public:
    static constexpr std::uint32_t stream_count = 8;

    // Queues one unit of work on `stream`; returns its number (the stream's submitted count).
    std::uint64_t submit(std::uint32_t stream) noexcept { return submitted_[stream].fetch_add(1, std::memory_order_acq_rel) + 1; }
    // Every unit queued on `stream` so far has run.
    void complete(std::uint32_t stream) noexcept { complete_through(stream, submitted(stream)); }
    // The units up to `count` have run (a device running its queue in order).
    void complete_through(std::uint32_t stream, std::uint64_t count) noexcept {
        completed_[stream].store(count, std::memory_order_release);
    }
    std::uint64_t submitted(std::uint32_t stream) const noexcept { return submitted_[stream].load(std::memory_order_acquire); }
    std::uint64_t completed(std::uint32_t stream) const noexcept { return completed_[stream].load(std::memory_order_acquire); }

    std::atomic<std::uint64_t> fences_recorded{0};
    std::atomic<std::uint64_t> fences_retired{0};
    std::atomic<std::uint64_t> waits_inserted{0};
    std::atomic<bool> refuse_records{false};

private:
    std::array<std::atomic<std::uint64_t>, stream_count> submitted_{};
    std::array<std::atomic<std::uint64_t>, stream_count> completed_{};
};

struct host_timeline_fence {
    std::uint32_t stream = 0;
    std::uint64_t count = 0; // the stream's submitted count when recorded
};

class host_timeline_policy_base {
public:
    using stream_type = std::uint32_t;
    using fence_type = host_timeline_fence;

    explicit host_timeline_policy_base(std::shared_ptr<host_timeline> timeline) : timeline_(std::move(timeline)) {}

    result<fence_type> record(std::uint32_t stream) {
        if (timeline_->refuse_records.load(std::memory_order_relaxed)) [[unlikely]] {
            return fail(status_code::internal_error, "host timeline: refused to record a fence");
        }
        timeline_->fences_recorded.fetch_add(1, std::memory_order_relaxed);
        return fence_type{stream, timeline_->submitted(stream)};
    }
    bool completed(const fence_type& fence) const noexcept { return timeline_->completed(fence.stream) >= fence.count; }
    void retire(fence_type&&) noexcept { timeline_->fences_retired.fetch_add(1, std::memory_order_relaxed); }

    host_timeline& timeline() const noexcept { return *timeline_; }

protected:
    std::shared_ptr<host_timeline> timeline_;
};

class host_timeline_policy : public host_timeline_policy_base {
public:
    using host_timeline_policy_base::host_timeline_policy_base;
};

class host_timeline_waiting_policy : public host_timeline_policy_base {
public:
    using host_timeline_policy_base::host_timeline_policy_base;
    result<void> wait(std::uint32_t, const fence_type&) {
        timeline_->waits_inserted.fetch_add(1, std::memory_order_relaxed);
        return boost::outcome_v2::success();
    }
};

static_assert(StreamPolicy<host_timeline_policy> && !stream_policy_waits<host_timeline_policy>);
static_assert(stream_policy_waits<host_timeline_waiting_policy>);

} // namespace nxmem::test
