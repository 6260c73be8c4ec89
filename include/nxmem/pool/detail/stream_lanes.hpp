// stream_ordered_pool's lanes: one per stream seen, each the records released on that stream and
// still pending (held from the layer below, not handed out), listed by size bin (four per
// doubling, pool_classes::bin_of), behind the lane's own lock. A thread working on one stream
// takes only its lane's lock. Lanes are claimed once, by open addressing on the stream's hash,
// and never given up: at most `capacity` streams.
#pragma once

#include <nxmem/detail/spin_lock.hpp>
#include <nxmem/pool/detail/stream_records.hpp>
#include <nxmem/pool/size_classes.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

namespace nxmem::pool_detail {

template <class Stream> struct stream_lane {
    stream_lane() { heads.fill(no_record); }

    nxmem::detail::spin_lock lock;
    std::atomic<bool> claimed{false};
    Stream stream{}; // written once, before `claimed` is published
    // Below, the lock's.
    std::array<std::uint32_t, pool_classes::bin_count> heads;
    std::uint64_t pending_blocks = 0;
    std::uint64_t pending_bytes = 0;
};

template <class Stream, class Table> class stream_lanes {
public:
    using lane = stream_lane<Stream>;
    static constexpr std::uint32_t capacity = 64;
    // A fit reads the request's bin and the four above (one doubling: a record handed out is less
    // than twice the request), at most this many records a bin.
    static constexpr std::uint32_t bins_searched = 5;
    static constexpr std::uint32_t records_per_bin = 4;

    explicit stream_lanes(Table& table) : table_(table) {}

    lane& operator[](std::uint32_t index) noexcept { return lanes_[index]; }
    const lane& operator[](std::uint32_t index) const noexcept { return lanes_[index]; }
    bool claimed(std::uint32_t index) const noexcept { return lanes_[index].claimed.load(std::memory_order_acquire); }

    static constexpr std::uint32_t no_lane = capacity;

    // The lane of `stream`, claimed on first sight; no_lane when every lane is taken.
    std::uint32_t lane_of(const Stream& stream) noexcept {
        const std::uint32_t start = start_of(stream);
        if (const lane& first = lanes_[start]; first.claimed.load(std::memory_order_acquire) && first.stream == stream) [[likely]] {
            return start;
        }
        return find_or_claim(stream);
    }

    // With the lane's lock held: the record last released in the request's bin when it holds
    // `size` at `alignment` and is fenced on the lane's stream alone, taken off its list (the
    // common case of a stream taking back what it released); else no_record.
    std::uint32_t take_latest(std::uint32_t index, std::uint64_t size, std::uint64_t alignment) noexcept {
        lane& owner = lanes_[index];
        const std::uint32_t slot = owner.heads[pool_classes::bin_of(size)];
        if (slot == no_record) {
            return no_record;
        }
        auto& record = table_[slot];
        if (record.below.size < size || (record.wire & (alignment - 1)) != 0 || record.retiring || record.fenced_elsewhere) {
            return no_record;
        }
        owner.heads[record.bin] = record.next;
        if (record.next != no_record) [[unlikely]] {
            table_[record.next].previous = no_record;
        }
        --owner.pending_blocks;
        owner.pending_bytes -= record.below.size;
        return slot;
    }

    // With the lane's lock held: lists a pending record.
    template <class Record> void link(std::uint32_t index, std::uint32_t slot, Record& record) noexcept {
        lane& owner = lanes_[index];
        const std::uint32_t bin = record.bin;
        record.previous = no_record;
        record.next = owner.heads[bin];
        if (record.next != no_record) {
            table_[record.next].previous = slot;
        }
        owner.heads[bin] = slot;
        ++owner.pending_blocks;
        owner.pending_bytes += record.below.size;
    }

    // With the lane's lock held: takes a pending record off its list.
    void unlink(std::uint32_t index, std::uint32_t slot) noexcept {
        unlink_record(index, table_[slot]);
    }

    // With the lane's lock held: the first pending record that holds `size` at `alignment` and
    // that `usable(record)` accepts, taken off its list; no_record when none.
    template <class Usable>
    std::uint32_t take_fitting(std::uint32_t index, std::uint64_t size, std::uint64_t alignment, Usable&& usable) {
        lane& owner = lanes_[index];
        const std::uint32_t own_bin = pool_classes::bin_of(size);
        for (std::uint32_t bin = own_bin; bin < own_bin + bins_searched && bin < pool_classes::bin_count; ++bin) {
            std::uint32_t slot = owner.heads[bin];
            for (std::uint32_t read = 0; slot != no_record && read < records_per_bin; ++read) {
                auto& record = table_[slot];
                if (record.below.size >= size && (record.wire & (alignment - 1)) == 0 && !record.retiring &&
                    usable(record)) [[likely]] {
                    unlink_record(index, record);
                    return slot;
                }
                slot = record.next;
            }
        }
        return no_record;
    }

    // With the lane's lock held: calls visit(slot) for every pending record (visit must not
    // unlink it; it collects the slot to unlink afterwards).
    template <class Visit> void for_each_pending(std::uint32_t index, Visit&& visit) const {
        for (const std::uint32_t head : lanes_[index].heads) {
            for (std::uint32_t slot = head; slot != no_record; slot = table_[slot].next) {
                visit(slot);
            }
        }
    }

private:
    template <class Record> void unlink_record(std::uint32_t index, Record& record) noexcept {
        lane& owner = lanes_[index];
        const std::uint32_t bin = record.bin;
        if (record.previous != no_record) {
            table_[record.previous].next = record.next;
        } else {
            owner.heads[bin] = record.next;
        }
        if (record.next != no_record) {
            table_[record.next].previous = record.previous;
        }
        --owner.pending_blocks;
        owner.pending_bytes -= record.below.size;
    }

    [[gnu::noinline]] std::uint32_t find_or_claim(const Stream& stream) noexcept {
        if (const std::uint32_t found = probe(stream); found != no_lane) {
            return found;
        }
        std::lock_guard<nxmem::detail::spin_lock> hold(claim_lock_);
        if (const std::uint32_t found = probe(stream); found != no_lane) {
            return found;
        }
        const std::uint32_t start = start_of(stream);
        for (std::uint32_t step = 0; step < capacity; ++step) {
            lane& candidate = lanes_[(start + step) % capacity];
            if (!candidate.claimed.load(std::memory_order_relaxed)) {
                candidate.stream = stream;
                candidate.claimed.store(true, std::memory_order_release);
                return (start + step) % capacity;
            }
        }
        return no_lane;
    }

    // Fibonacci hashing: a stream handle that is a pointer has its low bits all zero.
    static std::uint32_t start_of(const Stream& stream) noexcept {
        static_assert(capacity == 64);
        return static_cast<std::uint32_t>((std::uint64_t{std::hash<Stream>{}(stream)} * 0x9e3779b97f4a7c15ULL) >> 58);
    }

    std::uint32_t probe(const Stream& stream) const noexcept {
        const std::uint32_t start = start_of(stream);
        for (std::uint32_t step = 0; step < capacity; ++step) {
            const lane& candidate = lanes_[(start + step) % capacity];
            if (!candidate.claimed.load(std::memory_order_acquire)) {
                return no_lane; // lanes are never given up: the stream has none yet
            }
            if (candidate.stream == stream) [[likely]] {
                return (start + step) % capacity;
            }
        }
        return no_lane;
    }

    Table& table_;
    std::array<lane, capacity> lanes_; // in place: a lane is reached without loading a pointer
    nxmem::detail::spin_lock claim_lock_;
};

} // namespace nxmem::pool_detail
