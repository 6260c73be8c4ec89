// What a pool holds from its upstream, region by region, for whoever must name that memory to
// someone else (a transfer engine registering it once, a residency layer putting it to sleep):
// pool_allocator::for_each_region lists them, pool_allocator::lease keeps them from moving.
#pragma once

#include <cstdint>

namespace nxmem {

enum class pool_region_kind : std::uint8_t {
    // The pool's one reservation (growth by commit): address space, committed piece by piece; the
    // committed chunks and arena runs inside it are listed after it.
    reservation = 0,
    chunk = 1,        // a chunk of small blocks: an upstream allocation, or a committed range of the reservation
    arena_run = 2,    // a run of committed granules of the span arena (inside the reservation)
    segment = 3,      // an upstream allocation holding span pieces (growth by allocation, or a span the arena cannot hold)
    pass_through = 4, // an upstream allocation handed out whole (a request above pass_through_bytes)
};

struct pool_region {
    std::uint64_t address = 0; // wire address (device_type::to_wire)
    std::uint64_t bytes = 0;
    pool_region_kind kind = pool_region_kind::chunk;
    bool committed = false; // backed by memory now: false only for the reservation itself
};

} // namespace nxmem
