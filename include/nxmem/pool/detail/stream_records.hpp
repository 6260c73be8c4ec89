// stream_ordered_pool's records: one per allocation it holds from the layer below, live or
// pending, in a stable directory, so an id finds its record in constant time. An id is
// [generation: 32 bits][slot: 32 bits]; a record's generation grows each time it is handed out
// (span_ticket), and a record whose generations are spent is retired, so ids are never reused.
#pragma once

#include <nxmem/allocation.hpp>
#include <nxmem/detail/spin_lock.hpp>
#include <nxmem/pool/detail/pooled_id.hpp>
#include <nxmem/pool/detail/span_ticket.hpp>
#include <nxmem/pool/detail/stable_directory.hpp>
#include <nxmem/pool/stream_policy.hpp>

#include <cstdint>
#include <mutex>
#include <new>
#include <optional>
#include <vector>

namespace nxmem::pool_detail {

inline constexpr std::uint32_t no_record = ~std::uint32_t{0};

constexpr std::uint64_t stream_record_id(std::uint32_t generation, std::uint32_t slot) noexcept {
    return (std::uint64_t{generation} << 32) | slot;
}
constexpr std::uint32_t stream_record_slot(std::uint64_t id) noexcept { return static_cast<std::uint32_t>(id); }
constexpr std::uint32_t stream_record_generation(std::uint64_t id) noexcept {
    return static_cast<std::uint32_t>(id >> 32);
}

template <StreamPolicy P> struct stream_fence {
    typename P::stream_type stream;
    typename P::fence_type fence;
};

// Aligned to a cache line: records of two streams' lanes share none.
template <Device D, StreamPolicy P> struct alignas(64) stream_record {
    using stream_type = typename P::stream_type;

    span_ticket ticket;             // the caller's description and generation, claimed lock-free
    nxmem::detail::spin_lock guard; // orders record_stream before the release that claims it
    allocation<D> below{};          // what the layer below handed out
    std::uint64_t wire = 0;         // its address on the wire
    stream_type stream{};           // the stream it was last handed to
    std::vector<stream_type> used_on;        // record_stream's other streams (capacity kept)
    // Recorded at release on every stream it was used on other than the one released on (whose
    // fence is its lane's, lane_fences.hpp: recorded only when needed).
    std::vector<stream_fence<P>> fences;
    std::uint64_t released_number = 0; // its release's number in its lane (lane_fences)
    bool fenced_elsewhere = false;  // a fence on a stream other than the one it was released on
    bool retiring = false;          // generations spent: given below once complete, never reused
    std::uint32_t home_lane = no_record; // the lane of `stream`, so a release there finds it at once
    std::uint32_t bin = 0;               // the size bin of `below`, listed in while pending
    // While pending: its links in its lane's bin (the lane's lock).
    std::uint32_t previous = no_record;
    std::uint32_t next = no_record;

    // Whether `test` holds for any of its fences on other streams.
    template <class Test> bool any_fence(Test&& test) const {
        for (const auto& fenced : fences) {
            if (test(fenced)) {
                return true;
            }
        }
        return false;
    }
};

// The directory and its free slots. Slots are taken and returned under a lock of their own: only
// an allocation the layer below serves, and a record given back below, reach it.
template <class Record> class stream_record_table {
public:
    static constexpr std::uint64_t max_leaves = 4096; // 4 Mi records of 1024 a leaf

    Record* find(std::uint32_t slot) const noexcept { return directory_.find(slot); }
    Record& operator[](std::uint32_t slot) const noexcept { return directory_[slot]; }

    // A slot for a new record; none when the host has no memory for it or the table is full.
    std::optional<std::uint32_t> take() noexcept {
        std::lock_guard<nxmem::detail::spin_lock> hold(lock_);
        if (!free_.empty()) {
            const std::uint32_t slot = free_.back();
            free_.pop_back();
            return slot;
        }
        if (next_ >= decltype(directory_)::capacity || !directory_.make_leaves_for(next_, next_ + 1)) {
            return std::nullopt;
        }
        try {
            free_.reserve(next_ + 1); // so give() never allocates
        } catch (const std::bad_alloc&) {
            return std::nullopt;
        }
        return next_++;
    }

    // Returns a slot for reuse; a retired record's slot is never returned (its ids are spent).
    void give(std::uint32_t slot) noexcept {
        std::lock_guard<nxmem::detail::spin_lock> hold(lock_);
        free_.push_back(slot);
    }

private:
    stable_directory<Record, max_leaves> directory_;
    nxmem::detail::spin_lock lock_;
    std::vector<std::uint32_t> free_;
    std::uint32_t next_ = 0;
};

} // namespace nxmem::pool_detail
