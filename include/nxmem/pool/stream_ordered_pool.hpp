// stream_ordered_pool<Below, Policy>: memory released on a stream while that stream's queued work
// may still use it, reused in the stream's order (docs/HOST.md "Pools", "Stream-ordered reuse").
// A GPU engine frees a tensor as soon as it has queued the kernels that use it; handing that
// memory to another stream before those kernels ran would let the new owner's work and theirs
// overwrite each other. So, as RMM's per-stream free lists and PyTorch's record_stream do:
//   - a release on stream S leaves the block here, pending, in S's lane, and records a fence on
//     every other stream record_stream named; on S itself it records none yet;
//   - S takes it back at once (its own later work is ordered after the work before the release);
//   - another stream T takes it only once the work before the release on S, and every fence on
//     a stream other than T, has completed, or, where the policy can make T wait for a fence, at
//     once with those waits inserted on T. The fence on S is recorded when T (or collect) first
//     asks, one for every release on S so far (detail/lane_fences.hpp): a stream that takes back
//     what it released never records one;
//   - it goes back to the layer below (a pool_allocator, which knows no streams) only once every
//     fence has completed: collect() polls them, trim() collects then trims the layer below.
// A layer over any DeviceAllocator, itself a DeviceAllocator (allocate and release on the
// policy's default stream, stream_type{}). Thread-safe: a thread working on one stream takes only
// that stream's lane lock; no lock is held across a call into the layer below.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/pool/detail/lane_fences.hpp>
#include <nxmem/pool/detail/pool_errors.hpp>
#include <nxmem/pool/detail/stream_lanes.hpp>
#include <nxmem/pool/detail/stream_records.hpp>
#include <nxmem/pool/size_classes.hpp>
#include <nxmem/pool/stream_policy.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace nxmem {

struct stream_pool_options {
    // A request that no lane can serve collects first (polls every pending fence, giving what
    // completed back below) when more than this many bytes are pending, so memory released in
    // sizes nobody asks for again does not pile up until the next trim.
    std::uint64_t collect_above_bytes = std::uint64_t{64} << 20;
};

struct stream_pool_usage {
    std::uint64_t pending_allocations = 0; // released, held here until their fences complete or reuse
    std::uint64_t pending_bytes = 0;       // their sizes as the layer below handed them out
    std::uint64_t streams = 0;             // lanes: streams that allocated or released here
    std::uint64_t failed_give_backs = 0;   // releases below that failed (kept allocated below)
};

template <DeviceAllocator Below, StreamPolicy Policy> class stream_ordered_pool {
public:
    using device_type = typename Below::device_type;
    using address_type = typename device_type::address_type;
    using stream_type = typename Policy::stream_type;
    using fence_type = typename Policy::fence_type;
    // Whether a stream can take another stream's pending memory at once, waiting on the device.
    static constexpr bool inserts_waits = stream_policy_waits<Policy>;

    explicit stream_ordered_pool(Below below, Policy policy = {}, stream_pool_options options = {})
        : below_(std::move(below)), policy_(std::move(policy)), options_(options), device_(below_.device()) {}

    // Constructs the layer below in place (a pool_allocator cannot be moved).
    template <class... Arguments>
    explicit stream_ordered_pool(std::in_place_t, Policy policy, stream_pool_options options, Arguments&&... arguments)
        : below_(std::forward<Arguments>(arguments)...), policy_(std::move(policy)), options_(options),
          device_(below_.device()) {}

    stream_ordered_pool(const stream_ordered_pool&) = delete;
    stream_ordered_pool& operator=(const stream_ordered_pool&) = delete;

    // Gives below what completed. Memory whose fences are still pending stays allocated in the
    // layer below (which may still be in use on the device): synchronise the streams first.
    ~stream_ordered_pool() {
        collect();
        for (std::uint32_t index = 0; index < lanes_type::capacity; ++index) {
            if (lanes_.claimed(index)) {
                lanes_.for_each_pending(index, [&](std::uint32_t slot) { retire_fences(table_[slot]); });
                own_fences_[index].retire_all(policy_);
            }
        }
    }

    device_id device() const noexcept { return device_; }

    // An allocation for work on `stream`: a block pending on the stream itself first, then one
    // pending on another stream that `stream` may take (fences complete, or waited on), then the
    // layer below.
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment, const stream_type& stream) {
        if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) [[unlikely]] {
            return pool_detail::refused_request(size, alignment);
        }
        const std::uint32_t lane = lanes_.lane_of(stream);
        if (lane == lanes_type::no_lane) [[unlikely]] {
            return too_many_streams();
        }
        std::uint32_t slot = pool_detail::no_record;
        {
            std::lock_guard<nxmem::detail::spin_lock> hold(lanes_[lane].lock);
            // Released on this stream and used on no other: ordered by the stream itself.
            slot = lanes_.take_latest(lane, size, alignment);
        }
        if (slot != pool_detail::no_record) [[likely]] {
            return hand_out(slot, stream, lane, size, alignment);
        }
        return allocate_elsewhere(size, alignment, stream, lane);
    }
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        return allocate(size, alignment, stream_type{});
    }

    // Releases `live` on `stream` (the stream it was allocated on, for PyTorch's and RMM's
    // callers): a fence is recorded on the allocation's stream if another, and on every stream
    // record_stream named, and the block stays pending here, in `stream`'s lane (whose own fence
    // is recorded when another stream needs it). Checked as pool_allocator checks a release; a
    // refused release, or a fence the policy could not record, changes nothing. Reports COMPLETE
    // with unmapped_bytes 0.
    result<release_report> deallocate(const allocation<device_type>& live, const stream_type& stream) {
        return release_on(live, &stream);
    }
    // Releases `live` on the stream it was allocated on.
    result<release_report> release(const allocation<device_type>& live) { return release_on(live, nullptr); }

    // `live` is used on `stream` too (PyTorch's record_stream): its release records a fence on
    // `stream` as well, and no other stream reuses it before that fence completes. UNKNOWN_ALLOCATION
    // when it is not live, INVALID_ARGUMENT when misdescribed.
    result<void> record_stream(const allocation<device_type>& live, const stream_type& stream) {
        record_type* record = table_.find(pool_detail::stream_record_slot(live.allocation_id));
        if (record == nullptr) {
            return pool_detail::refused_as_unknown(live);
        }
        std::lock_guard<nxmem::detail::spin_lock> hold(record->guard);
        const auto described = record->ticket.live_description();
        if (!described.has_value() || described->generation != pool_detail::stream_record_generation(live.allocation_id)) {
            return pool_detail::refused_as_unknown(live);
        }
        if (record->wire != device_type::to_wire(live.address) || described->size != live.size ||
            described->alignment != live.alignment) {
            return pool_detail::refused_release(status_code::invalid_argument, live);
        }
        if (stream == record->stream || std::find(record->used_on.begin(), record->used_on.end(), stream) != record->used_on.end()) {
            return boost::outcome_v2::success();
        }
        try {
            record->used_on.push_back(stream);
        } catch (const std::bad_alloc&) {
            return pool_detail::out_of_memory("no host memory to record a stream");
        }
        return boost::outcome_v2::success();
    }

    // Polls every pending fence and gives each block whose fences all completed back to the
    // layer below. Returns the bytes given back.
    std::uint64_t collect() {
        std::uint64_t given = 0;
        for (std::uint32_t index = 0; index < lanes_type::capacity; ++index) {
            if (!lanes_.claimed(index)) {
                continue;
            }
            for (bool more = true; more;) {
                std::array<std::uint32_t, 32> done{};
                std::uint32_t count = 0;
                {
                    std::lock_guard<nxmem::detail::spin_lock> hold(lanes_[index].lock);
                    auto& own = own_fences_[index];
                    if (lanes_[index].pending_blocks != 0) {
                        own.cover_all(policy_, lanes_[index].stream);
                    }
                    lanes_.for_each_pending(index, [&](std::uint32_t slot) {
                        const record_type& record = table_[slot];
                        if (count < done.size() && own.known_completed(record.released_number) && all_completed(record)) {
                            done[count++] = slot;
                        }
                    });
                    for (std::uint32_t at = 0; at < count; ++at) {
                        lanes_.unlink(index, done[at]);
                    }
                }
                for (std::uint32_t at = 0; at < count; ++at) {
                    given += give_below(done[at]);
                }
                more = count == done.size();
            }
        }
        return given;
    }

    // collect(), then the layer below's trim(keep_bytes), whose result it returns: memory still
    // pending is never given back below, so never upstream.
    std::uint64_t trim(std::uint64_t keep_bytes = 0)
        requires requires(Below& below) { { below.trim(keep_bytes) } -> std::same_as<std::uint64_t>; }
    {
        collect();
        return below_.trim(keep_bytes);
    }

    stream_pool_usage usage() const {
        stream_pool_usage figures;
        for (std::uint32_t index = 0; index < lanes_type::capacity; ++index) {
            if (lanes_.claimed(index)) {
                auto& lane = const_cast<lanes_type&>(lanes_)[index];
                std::lock_guard<nxmem::detail::spin_lock> hold(lane.lock);
                figures.pending_allocations += lane.pending_blocks;
                figures.pending_bytes += lane.pending_bytes;
                ++figures.streams;
            }
        }
        figures.failed_give_backs = failed_give_backs_.load(std::memory_order_relaxed);
        return figures;
    }

    Below& below() noexcept { return below_; }
    const Below& below() const noexcept { return below_; }
    Policy& policy() noexcept { return policy_; }

private:
    using record_type = pool_detail::stream_record<device_type, Policy>;
    using table_type = pool_detail::stream_record_table<record_type>;
    using lanes_type = pool_detail::stream_lanes<stream_type, table_type>;

    // Whether `stream` may take `record`, pending in lane `lane`, now (with that lane's lock
    // held): the work before its release on the lane's stream, and every fence on another
    // stream, has completed, or (a policy that waits) `stream` now waits for what has not. A
    // wait that failed leaves the record pending; one inserted before it only delays the stream.
    [[gnu::noinline]] bool usable_by(record_type& record, const stream_type& stream, std::uint32_t lane) {
        const stream_type& released_on = lanes_[lane].stream;
        auto& own = own_fences_[lane];
        if (!(released_on == stream) && !own.known_completed(record.released_number)) {
            const fence_type* covering = own.covering(policy_, released_on, record.released_number);
            if (covering == nullptr) {
                return false;
            }
            if (!own.completed(policy_, record.released_number)) {
                if constexpr (inserts_waits) {
                    if (!policy_.wait(stream, *covering)) {
                        return false;
                    }
                } else {
                    return false;
                }
            }
        }
        const auto pending_elsewhere = [&](const pool_detail::stream_fence<Policy>& fenced) {
            return !(fenced.stream == stream) && !policy_.completed(fenced.fence);
        };
        if (!record.any_fence(pending_elsewhere)) {
            return true;
        }
        if constexpr (inserts_waits) {
            return !record.any_fence([&](const pool_detail::stream_fence<Policy>& fenced) {
                return pending_elsewhere(fenced) && !policy_.wait(stream, fenced.fence);
            });
        } else {
            return false;
        }
    }

    bool all_completed(const record_type& record) {
        return !record.any_fence([&](const pool_detail::stream_fence<Policy>& fenced) { return !policy_.completed(fenced.fence); });
    }

    // Its fences and the streams record_stream named: after them, the record was used on its
    // stream alone (how a record leaves the lanes, handed out or given below).
    void forget_other_streams(record_type& record) noexcept {
        retire_fences(record);
        record.used_on.clear();
        record.fenced_elsewhere = false;
    }

    void retire_fences(record_type& record) noexcept {
        for (auto& fenced : record.fences) {
            policy_.retire(std::move(fenced.fence));
        }
        record.fences.clear();
    }

    allocation<device_type> hand_out(std::uint32_t slot, const stream_type& stream, std::uint32_t lane, std::uint64_t size,
                                     std::uint64_t alignment) noexcept {
        record_type& record = table_[slot];
        if (record.fenced_elsewhere) [[unlikely]] {
            forget_other_streams(record); // a record used on no other stream has nothing to forget
        }
        record.stream = stream;
        record.home_lane = lane;
        const std::uint32_t generation = record.ticket.publish(record.wire, size, alignment);
        record.retiring = generation >= pool_detail::generation_limit;
        return allocation<device_type>{record.below.address, size, alignment, pool_detail::stream_record_id(generation, slot),
                                       record.below.mechanism_id, record.below.device};
    }

    // Missed the stream's own lane: another lane's pending block this stream may take, else the
    // layer below (collecting first past the threshold, and once more if the layer below fails).
    [[gnu::noinline]] result<allocation<device_type>> allocate_elsewhere(std::uint64_t size, std::uint64_t alignment,
                                                                         const stream_type& stream, std::uint32_t own) {
        std::uint64_t pending = 0;
        {
            // Any of its own lane's that fits: released here, maybe used on other streams too.
            std::uint32_t slot = pool_detail::no_record;
            {
                std::lock_guard<nxmem::detail::spin_lock> hold(lanes_[own].lock);
                slot = lanes_.take_fitting(own, size, alignment, [&](record_type& record) {
                    return !record.fenced_elsewhere || usable_by(record, stream, own);
                });
                pending += lanes_[own].pending_bytes;
            }
            if (slot != pool_detail::no_record) {
                return hand_out(slot, stream, own, size, alignment);
            }
        }
        for (std::uint32_t index = 0; index < lanes_type::capacity; ++index) {
            if (index == own || !lanes_.claimed(index)) {
                continue;
            }
            std::uint32_t slot = pool_detail::no_record;
            {
                std::lock_guard<nxmem::detail::spin_lock> hold(lanes_[index].lock);
                slot = lanes_.take_fitting(index, size, alignment,
                                           [&](record_type& record) { return usable_by(record, stream, index); });
                pending += lanes_[index].pending_bytes;
            }
            if (slot != pool_detail::no_record) {
                return hand_out(slot, stream, own, size, alignment);
            }
        }
        if (pending > options_.collect_above_bytes) {
            collect();
        }
        result<allocation<device_type>> made = below_.allocate(size, alignment);
        if (!made && made.error().code == status_code::out_of_memory && collect() != 0) {
            made = below_.allocate(size, alignment);
        }
        if (!made) {
            return std::move(made).error();
        }
        const std::optional<std::uint32_t> slot = table_.take();
        if (slot.has_value()) {
            record_type& record = table_[*slot];
            try {
                record.below = made.value();
                record.wire = device_type::to_wire(record.below.address);
                record.bin = pool_classes::bin_of(record.below.size);
                return hand_out(*slot, stream, own, size, alignment);
            } catch (const std::bad_alloc&) {
                table_.give(*slot);
            }
        }
        (void)below_.release(made.value());
        return pool_detail::out_of_memory("no host memory for a stream-ordered record");
    }

    [[gnu::cold, gnu::noinline]] static error too_many_streams() {
        return pool_detail::out_of_memory("more than " + std::to_string(lanes_type::capacity) + " streams");
    }

    result<release_report> release_on(const allocation<device_type>& live, const stream_type* given) {
        record_type* record = table_.find(pool_detail::stream_record_slot(live.allocation_id));
        if (record == nullptr) [[unlikely]] {
            return pool_detail::refused_as_unknown(live);
        }
        const std::uint32_t generation = pool_detail::stream_record_generation(live.allocation_id);
        switch (record->ticket.claim(generation, device_type::to_wire(live.address), live.size, live.alignment)) {
        case pool_detail::span_ticket::verdict::claimed: break;
        case pool_detail::span_ticket::verdict::not_live: return pool_detail::refused_as_unknown(live);
        case pool_detail::span_ticket::verdict::misdescribed:
            return pool_detail::refused_release(status_code::invalid_argument, live);
        }
        // Claimed: this thread alone holds the record now.
        if (live.mechanism_id != record->below.mechanism_id || live.device != device_) [[unlikely]] {
            record->ticket.restore(generation);
            return pool_detail::refused_release(
                live.mechanism_id != record->below.mechanism_id ? status_code::wrong_mechanism : status_code::wrong_device, live);
        }
        // The common case: released on the stream it was allocated on, whose lane it knows.
        std::uint32_t lane = record->home_lane;
        const stream_type stream = given != nullptr ? *given : record->stream;
        if (given != nullptr && !(stream == record->stream)) {
            lane = lanes_.lane_of(stream);
            if (lane == lanes_type::no_lane) [[unlikely]] {
                record->ticket.restore(generation);
                return too_many_streams();
            }
        }
        {
            std::lock_guard<nxmem::detail::spin_lock> guard(record->guard); // after record_stream in flight
            if (!record->used_on.empty() || !(stream == record->stream)) [[unlikely]] {
                if (auto fenced = fence_other_streams(*record, stream); !fenced) {
                    record->ticket.restore(generation);
                    return std::move(fenced).error();
                }
            }
        }
        std::lock_guard<nxmem::detail::spin_lock> hold(lanes_[lane].lock);
        record->released_number = own_fences_[lane].number_release();
        lanes_.link(lane, pool_detail::stream_record_slot(live.allocation_id), *record);
        return release_report{release_state::complete, 0, 0};
    }

    // Records a fence on the allocation's stream, when released on another, and on the streams
    // record_stream named; on a failure none is kept.
    [[gnu::noinline]] result<void> fence_other_streams(record_type& record, const stream_type& stream) {
        auto add = [&](const stream_type& on) -> result<void> {
            result<fence_type> fence = policy_.record(on);
            if (!fence) [[unlikely]] {
                return std::move(fence).error();
            }
            try {
                record.fences.push_back({on, std::move(fence).value()});
            } catch (const std::bad_alloc&) {
                return pool_detail::out_of_memory("no host memory to record a fence");
            }
            return boost::outcome_v2::success();
        };
        result<void> done = boost::outcome_v2::success();
        if (record.stream != stream) {
            done = add(record.stream);
        }
        for (std::size_t at = 0; done && at < record.used_on.size(); ++at) {
            if (record.used_on[at] != stream) {
                done = add(record.used_on[at]);
            }
        }
        if (!done) [[unlikely]] {
            retire_fences(record);
            return done;
        }
        record.fenced_elsewhere = !record.fences.empty();
        return done;
    }

    // Gives a record that left its lane back below; its slot is reused unless retired.
    std::uint64_t give_below(std::uint32_t slot) {
        record_type& record = table_[slot];
        forget_other_streams(record);
        const std::uint64_t bytes = record.below.size;
        if (!below_.release(record.below)) {
            failed_give_backs_.fetch_add(1, std::memory_order_relaxed);
            return 0; // allocated below for good; the record's slot is not reused
        }
        if (!record.retiring) {
            table_.give(slot);
        }
        return bytes;
    }

    Below below_;
    Policy policy_;
    stream_pool_options options_;
    device_id device_;
    table_type table_;
    lanes_type lanes_{table_};
    std::array<pool_detail::lane_fences<Policy>, lanes_type::capacity> own_fences_{}; // each its lane's lock's
    std::atomic<std::uint64_t> failed_give_backs_{0};
};

} // namespace nxmem
