// Measuring a pool (nxmem::pool_allocator): a route through it, the touched cycle (allocate,
// write every page, release) with the page faults it costs, and the upstream crossings a pool
// makes for many live allocations. Shared by bench/nxmem_pool_bench and `nxmem bench --pool`.
#pragma once

#include "routes.hpp"
#include "system.hpp"

#include <nxmem/pool.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::measure {

// Allocate + release through a pool (any pool_allocator over a cpu upstream).
template <class Pool> class pool_route {
public:
    using handle = allocation<cpu_device>;
    explicit pool_route(Pool& pool) : pool_(&pool) {}

    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        result<handle> made = pool_->allocate(size, alignment);
        if (!made) {
            return std::nullopt;
        }
        return made.value();
    }
    bool release(const handle& live) { return pool_->release(live).has_value(); }
    // As an engine holds a pool allocation: the result itself, no optional copied from it.
    bool round_trip(std::uint64_t size, std::uint64_t alignment) {
        result<handle> made = pool_->allocate(size, alignment);
        return made.has_value() && pool_->release(made.assume_value()).has_value();
    }

private:
    Pool* pool_;
};

// The first byte of what a route handed out, for the routes whose memory the host can touch.
inline unsigned char* bytes_of(void* address) noexcept { return static_cast<unsigned char*>(address); }
inline unsigned char* bytes_of(const allocation<cpu_device>& live) noexcept { return bytes_of(live.address); }

inline constexpr std::uint64_t touched_page_bytes = 4096;

// What an engine does with a tensor: allocate, write every page, release. False on failure.
template <class Route> bool touched_cycle(Route& route, std::uint64_t size, std::uint64_t alignment = 64) {
    std::optional<typename Route::handle> made = route.allocate(size, alignment);
    if (!made) {
        return false;
    }
    volatile unsigned char* bytes = bytes_of(*made);
    for (std::uint64_t offset = 0; offset < size; offset += touched_page_bytes) {
        bytes[offset] = 1;
    }
    bytes[size - 1] = 1;
    return route.release(*made);
}

// Minor page faults per call of `operation` over `calls` calls (after one uncounted call, so a
// cache that keeps memory has it); nullopt when a call failed.
template <class Operation> std::optional<double> faults_per_call(Operation&& operation, std::uint64_t calls) {
    if (!operation()) {
        return std::nullopt;
    }
    const std::uint64_t before = minor_faults();
    for (std::uint64_t i = 0; i < calls; ++i) {
        if (!operation()) {
            return std::nullopt;
        }
    }
    return static_cast<double>(minor_faults() - before) / static_cast<double>(calls);
}

// What a pool asked of its upstream to hold `live` allocations of `size` bytes at once, and what
// it held then, after releasing them all, and after trim(0).
struct crossing_figures {
    std::uint64_t live = 0;
    std::uint64_t upstream_calls = 0;  // allocations + commits, while filling
    std::uint64_t held_bytes = 0;      // at the peak
    std::uint64_t in_use_bytes = 0;    // at the peak
    std::uint64_t held_after_release = 0;
    std::uint64_t held_after_trim = 0;
    std::uint64_t trimmed_bytes = 0;   // what trim(0) reported giving back
};

template <class Pool>
result<crossing_figures> count_crossings(Pool& pool, std::uint64_t live, std::uint64_t size,
                                         std::uint64_t alignment = round_trip_alignment) {
    std::vector<allocation<cpu_device>> held;
    held.reserve(live);
    const pool_usage before = pool.usage();
    std::optional<error> failed;
    for (std::uint64_t i = 0; i < live && !failed; ++i) {
        result<allocation<cpu_device>> made = pool.allocate(size, alignment);
        if (made) {
            held.push_back(made.value());
        } else {
            failed = made.error();
        }
    }
    const pool_usage peak = pool.usage();
    for (const allocation<cpu_device>& each : held) {
        (void)pool.release(each);
    }
    if (failed) {
        return fail(failed->code, "allocation " + std::to_string(held.size() + 1) + " of " +
                                      std::to_string(live) + " failed: " + failed->describe());
    }
    crossing_figures figures;
    figures.live = live;
    figures.upstream_calls = (peak.upstream_allocations - before.upstream_allocations) +
                             (peak.upstream_commits - before.upstream_commits);
    figures.held_bytes = peak.held_bytes;
    figures.in_use_bytes = peak.in_use_bytes;
    figures.held_after_release = pool.usage().held_bytes;
    figures.trimmed_bytes = pool.trim(0);
    figures.held_after_trim = pool.usage().held_bytes;
    return figures;
}

} // namespace nxmem::measure
