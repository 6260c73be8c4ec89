// How a pool_allocator carves and keeps memory: the chunk it takes from its upstream, the size
// above which requests pass straight through, and how much idle memory it may keep.
#pragma once

#include <cstdint>
#include <limits>

namespace nxmem {

// How the pool grows when it needs a chunk.
enum class pool_growth : std::uint32_t {
    // By commit when the upstream offers virtual backing (pool/virtual_upstream.hpp) and the
    // reservation succeeds: reserve once, commit chunk by chunk, decommit on trim. Else by
    // allocation.
    automatic = 0,
    by_allocation = 1, // one upstream allocation per chunk, whatever the upstream offers
};

// Two 2 MiB pieces a thread, and no piece larger than 4 MiB (see span_cache_bytes).
inline constexpr std::uint64_t pool_default_span_cache_bytes = std::uint64_t{4} << 20;

struct pool_options {
    // The bytes of one chunk taken from the upstream for small allocations. 0: max(2 MiB, the
    // upstream's commit granularity when it offers virtual backing). Rounded up to a multiple of
    // the pool's 64 KiB slab.
    std::uint64_t chunk_bytes = 0;
    // Requests larger than this go straight to the upstream, one upstream allocation each, given
    // back at release. 0: 256 MiB.
    std::uint64_t pass_through_bytes = 0;
    // The idle bytes (cached chunks and free slabs) the pool keeps at most; beyond, a release
    // gives the excess back to the upstream. The default keeps everything until trim().
    std::uint64_t retain_limit_bytes = std::numeric_limits<std::uint64_t>::max();
    // Growth by commit: how the pool grows, and how much address space it reserves once when it
    // grows by commit (0: 64 GiB). A reservation that fails makes the pool grow by allocation.
    pool_growth growth = pool_growth::automatic;
    std::uint64_t reserve_bytes = 0;
    // The bytes of released span pieces (requests above 16 KiB, up to pass_through_bytes) each
    // of the pool's sixteen thread shards may park for its thread's next request of the same
    // size bin, served without the pool's span lock (docs/HOST.md "Pools", Threads). Parked
    // pieces count as idle; they go back to the span free lists before the pool grows, at trim()
    // and under the retention limit. 0: no cache, every span takes the span lock.
    std::uint64_t span_cache_bytes = pool_default_span_cache_bytes;
};

// The defaults that 0 stands for, in one place for the pool and its documentation.
inline constexpr std::uint64_t pool_default_chunk_bytes = std::uint64_t{2} << 20;
inline constexpr std::uint64_t pool_default_pass_through_bytes = std::uint64_t{256} << 20;
inline constexpr std::uint64_t pool_default_reserve_bytes = std::uint64_t{64} << 30;

} // namespace nxmem
