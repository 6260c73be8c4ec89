// What one allocator holds now: the numbers an engine's memory governor needs without walking its
// own records. Reported by a mechanism (minor 2's usage query) and read by the host alike.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <cstdint>

namespace nxmem {

struct allocator_usage {
    std::uint64_t live_allocations = 0;    // not yet released; queued releases not yet retired included
    std::uint64_t reserved_bytes = 0;      // usable bytes of those allocations (address space)
    std::uint64_t mapped_bytes = 0;        // bytes they cost now, shared prefixes excluded
    std::uint64_t shared_prefix_bytes = 0; // live shared prefixes, each counted once
    std::uint64_t quarantined_bytes = 0;   // kept by quarantined releases, never refunded
    std::uint64_t live_imports = 0;        // minor 3: imports from other processes not yet closed
    std::uint64_t imported_bytes = 0;      // minor 3: bytes they map here, counted in no field above
    friend bool operator==(const allocator_usage&, const allocator_usage&) = default;

    NxmemAllocatorUsage to_wire() const noexcept {
        NxmemAllocatorUsage wire{};
        wire.struct_size = sizeof wire;
        wire.live_allocations = live_allocations;
        wire.reserved_bytes = reserved_bytes;
        wire.mapped_bytes = mapped_bytes;
        wire.shared_prefix_bytes = shared_prefix_bytes;
        wire.quarantined_bytes = quarantined_bytes;
        wire.live_imports = live_imports;
        wire.imported_bytes = imported_bytes;
        return wire;
    }
    static allocator_usage from_wire(const NxmemAllocatorUsage& wire) noexcept {
        // A mechanism below minor 3 writes a shorter record: the host zeroed the rest (no imports).
        return {wire.live_allocations, wire.reserved_bytes, wire.mapped_bytes,
                wire.shared_prefix_bytes, wire.quarantined_bytes, wire.live_imports,
                wire.imported_bytes};
    }
};

} // namespace nxmem
