// What a pool holds and what it cost its upstream: the numbers a governor reads from a pool.
#pragma once

#include <cstdint>

namespace nxmem {

struct pool_usage {
    std::uint64_t held_bytes = 0;           // memory held from the upstream now (committed, when growing by commit;
                                            // never the reservation's address space: pool_allocator::reserved_bytes)
    std::uint64_t in_use_bytes = 0;         // bytes of live pooled allocations (requested sizes)
    std::uint64_t idle_bytes = 0;           // held but not handed out (cached chunks, free blocks)
    std::uint64_t live_allocations = 0;
    std::uint64_t upstream_allocations = 0; // upstream calls made since construction
    std::uint64_t upstream_releases = 0;
    std::uint64_t upstream_commits = 0;     // growth by commit (VirtualBacking upstreams)
    std::uint64_t upstream_decommits = 0;
    friend bool operator==(const pool_usage&, const pool_usage&) = default;
};

} // namespace nxmem
