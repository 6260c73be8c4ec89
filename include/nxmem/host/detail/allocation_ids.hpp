// Allocation ids (docs/ABI.md M3): unique in the process, never reused, never derived from an
// address, and increasing in the order each thread allocates. Each thread takes a block of ids
// from one process-wide counter and hands them out alone, so an allocation writes no cache line
// that other threads share; ids left in a block when its thread exits are never issued.
#pragma once

#include <atomic>
#include <cstdint>

namespace nxmem::host::detail {

inline constexpr std::uint64_t allocation_id_block = 1024;

// The next id never issued in this process (inline: one counter per program, as long as the host
// code is not copied into several shared objects with hidden visibility).
inline std::atomic<std::uint64_t> next_allocation_id_block{1};

inline std::uint64_t next_allocation_id() noexcept {
    struct id_block {
        std::uint64_t next = 0;
        std::uint64_t end = 0;
    };
    thread_local id_block mine;
    if (mine.next == mine.end) [[unlikely]] {
        mine.next = next_allocation_id_block.fetch_add(allocation_id_block, std::memory_order_relaxed);
        mine.end = mine.next + allocation_id_block;
    }
    return mine.next++;
}

} // namespace nxmem::host::detail
