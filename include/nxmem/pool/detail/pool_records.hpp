// The pool's out-of-band records: everything it knows about the memory it hands out lives here,
// on the host, so it never reads or writes that memory (which may be a GPU's).
#pragma once

#include <nxmem/allocation.hpp>
#include <nxmem/device.hpp>
#include <nxmem/detail/spin_lock.hpp>
#include <nxmem/pool/detail/span_ticket.hpp>
#include <nxmem/pool/size_classes.hpp>

#include <array>
#include <bit>
#include <type_traits>
#include <atomic>
#include <cstdint>
#include <memory>

namespace nxmem::pool_detail {

inline constexpr std::uint32_t none = 0xffffffffU;
inline constexpr std::uint32_t shard_count = 16;

// The shard a thread uses in every pool: threads take 0, 1, 2, ... in the order they first
// allocate from any pool, so threads share a shard only beyond sixteen alive. Trivially
// destructible: nothing runs at thread exit.
// (Constant-initialised, so reading it costs no guard: 0 means "not chosen yet".)
[[gnu::noinline]] inline std::uint32_t choose_shard(std::uint32_t& chosen) noexcept {
    static std::atomic<std::uint32_t> next_shard{0};
    chosen = next_shard.fetch_add(1, std::memory_order_relaxed) % shard_count + 1;
    return chosen - 1;
}
inline std::uint32_t& this_thread_shard_plus_one() noexcept {
    thread_local constinit std::uint32_t shard_plus_one = 0;
    return shard_plus_one;
}
inline std::uint32_t this_thread_shard() noexcept {
    std::uint32_t& chosen = this_thread_shard_plus_one();
    return chosen != 0 ? chosen - 1 : choose_shard(chosen);
}
// The thread's shard, or none (a large index) before it has one.
inline std::uint32_t this_thread_shard_if_chosen() noexcept { return this_thread_shard_plus_one() - 1; }

// Two devices compared as one 64-bit word (a type and an index, no padding).
inline bool same_device(const device_id& left, const device_id& right) noexcept {
    static_assert(sizeof(device_id) == sizeof(std::uint64_t) && std::has_unique_object_representations_v<device_id>);
    return std::bit_cast<std::uint64_t>(left) == std::bit_cast<std::uint64_t>(right);
}

// One block of a slab: its generation, and the request it serves while live (the next free
// block while free).
struct block_record {
    std::uint32_t generation = 0;
    std::uint32_t size_or_next = none;
    std::uint8_t alignment_log2 = 0;
    bool live = false;
};

// A 64 KiB piece of a chunk, carved into blocks of one class while a shard owns it. Its fields
// change only under its owner's lock (and `owner` only with both the owner's and the pool's).
// Cache-line aligned: neighbouring slabs owned by two threads' shards share no line.
struct alignas(64) slab {
    std::atomic<std::uint32_t> owner{none}; // the shard whose lock guards it; none while free
    std::uint32_t index = 0;
    std::uint32_t class_index = pool_classes::not_small;
    std::uint32_t block_count = 0;
    std::uint32_t free_count = 0;
    std::uint32_t free_head = none;
    std::uint32_t previous = none; // in its shard's list of partly used slabs
    std::uint32_t next = none;     // the same list, or the pool's list of free slabs
    bool listed = false;           // in its shard's partly used list
    std::uint32_t generation_floor = 0; // every generation this slab ever issued is at most this
    std::uint32_t record_capacity = 0;
    std::uint64_t base = 0;        // wire address
    std::uint64_t block_bytes = 0;
    std::unique_ptr<block_record[]> records;
};

// busy: out of every list while one thread commits or decommits its granules with the span lock
// dropped; neighbours do not merge with it. leaving: on its way back to the upstream.
enum class span_state : std::uint8_t { unused, live, free, spent, leaving, busy };

// A piece of a span segment (one upstream allocation, or a pass-through) or of the span arena
// (growth by commit): live, free (listed by size bin), or spent (its ids used up: never handed
// out again nor merged). Its neighbours in the segment or arena, by address, are `lower` and
// `higher`. Guarded by the pool's span lock, but for its ticket; "live" is the span lock's view:
// out of the free lists, handed out or parked in a shard's span cache (the ticket tells which).
template <class D> struct alignas(64) span_record {
    std::uint32_t index = 0;
    std::uint32_t next = none;     // in its bin's free list, the pool's free index list, or a trim's list
    std::uint32_t previous = none; // in its bin's free list
    std::uint32_t lower = none;    // the piece just below it in its segment; none for the first
    std::uint32_t higher = none;   // the piece just above it; none for the last
    span_state state = span_state::unused;
    bool pass_through = false;
    bool in_arena = false;   // a piece of the arena, not of a segment of its own
    std::uint64_t base = 0;  // wire address
    std::uint64_t bytes = 0; // the piece's, a multiple of the pool's granule
    std::uint64_t committed_bytes = 0; // of `bytes`; fewer only in the arena (which: the chunk source's granule records)
    allocation<D> segment{}; // the upstream allocation it is part of
    span_ticket ticket;      // live or not, its generation and request: read and claimed unlocked
};

// A chunk a chunk source hands up to the small-block layer: its slot (chunk i of the source's
// table, so slab i * slabs_per_chunk + k is its k-th) and wire base address.
struct chunk_grant {
    std::uint32_t slot = 0;
    std::uint64_t base = 0;
    std::uint64_t mechanism_id = 0;
};

// A thread's share of the pool, guarded by its own lock on its own cache lines.
struct alignas(64) shard {
    nxmem::detail::spin_lock lock;
    std::array<slab*, pool_classes::small_class_count> current{};
    std::array<std::uint32_t, pool_classes::small_class_count> partial;
    std::uint64_t live_allocations = 0;
    std::uint64_t in_use_bytes = 0;     // requested
    std::uint64_t handed_out_bytes = 0; // blocks
    shard() noexcept {
        partial.fill(none);
    }
};

} // namespace nxmem::pool_detail
