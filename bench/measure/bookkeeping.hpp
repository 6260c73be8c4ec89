// Bytes of C heap a route keeps per live allocation, from mallinfo2 deltas: `count` allocations
// made and held, the heap measured before and after, then all released and the heap measured
// again (what the tables keep after a mass release). Subtracting one route from the next gives
// the host's share (adapter - table) and the kit's (table - mechanism, or table - malloc for a
// mechanism that takes its memory from the C heap as malloc would).
#pragma once

#include "routes.hpp"
#include "system.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace nxmem::measure {

struct heap_footprint {
    double bytes_per_live = 0;         // heap growth per held allocation
    std::int64_t kept_after_release = 0; // heap growth still there once every one is released
};

template <class Route>
result<heap_footprint> measure_heap_footprint(Route& route, std::uint64_t count, std::uint64_t size,
                                              std::uint64_t alignment = round_trip_alignment) {
    std::vector<typename Route::handle> held;
    held.reserve(count); // before the first reading: the vector is not the route's
    const std::uint64_t before = heap_bytes_in_use();
    for (std::uint64_t i = 0; i < count; ++i) {
        std::optional<typename Route::handle> made = route.allocate(size, alignment);
        if (!made) {
            for (const auto& live : held) {
                (void)route.release(live);
            }
            return fail(status_code::out_of_memory, "allocation " + std::to_string(i + 1) + " of " +
                                                        std::to_string(count) + " failed");
        }
        held.push_back(std::move(*made));
    }
    const std::uint64_t with_live = heap_bytes_in_use();
    bool released = true;
    for (const auto& live : held) {
        released = route.release(live) && released;
    }
    const std::uint64_t after = heap_bytes_in_use();
    if (!released) {
        return fail(status_code::internal_error, "a release failed");
    }
    heap_footprint footprint;
    footprint.bytes_per_live = (static_cast<double>(with_live) - static_cast<double>(before)) /
                               static_cast<double>(count);
    footprint.kept_after_release = static_cast<std::int64_t>(after) - static_cast<std::int64_t>(before);
    return footprint;
}

} // namespace nxmem::measure
