// Allocation ids (docs/ABI.md M3): unique across their source (a host module, a heap_allocator),
// never reused, never derived from an address, and increasing in the order each thread allocates.
// A source owns sixteen counters,
// each on its own cache line; counter i issues i + 1, i + 1 + 16, i + 1 + 32, ... so no two
// counters ever issue the same id. A thread always draws from the same counter, so threads that
// draw from different counters write no cache line they share. The ids live in the module, not
// in a process-wide variable: code that includes the host twice (two shared objects built with
// hidden visibility) still draws one source's ids from one place.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace nxmem::detail {

class allocation_id_source {
public:
    static constexpr std::size_t lanes = 16;

    allocation_id_source() noexcept {
        for (std::size_t lane = 0; lane < lanes; ++lane) {
            lanes_[lane].next.store(lane + 1, std::memory_order_relaxed);
        }
    }

    std::uint64_t next() noexcept {
        return lanes_[lane_of_this_thread()].next.fetch_add(lanes, std::memory_order_relaxed);
    }

private:
    // Threads are dealt lanes in turn as they first allocate. The deal counter is per program
    // (or per copy of this code): it only spreads threads, uniqueness never depends on it.
    static std::size_t lane_of_this_thread() noexcept {
        static std::atomic<std::size_t> dealt{0};
        thread_local const std::size_t lane = dealt.fetch_add(1, std::memory_order_relaxed) % lanes;
        return lane;
    }

    struct alignas(64) lane {
        std::atomic<std::uint64_t> next{0};
    };
    std::array<lane, lanes> lanes_;
};

} // namespace nxmem::detail
