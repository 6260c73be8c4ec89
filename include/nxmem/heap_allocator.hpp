// The engine's own in-process allocator for host memory: the built-in DeviceAllocator that plugin
// allocators stand beside, and the baseline the benchmarks measure them against.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>

#include <atomic>
#include <bit>
#include <cstdint>
#include <new>
#include <string>

namespace nxmem {

class heap_allocator {
public:
    using device_type = cpu_device;

    device_id device() const noexcept { return {NXMEM_DEVICE_CPU, 0}; }

    result<allocation<cpu_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        if (size == 0 || alignment == 0 || !std::has_single_bit(alignment)) {
            return fail(status_code::invalid_argument,
                        "size must be non-zero and alignment a power of two (size " +
                            std::to_string(size) + ", alignment " + std::to_string(alignment) + ")");
        }
        void* address = ::operator new(size, std::align_val_t{alignment}, std::nothrow);
        if (address == nullptr) {
            return fail(status_code::out_of_memory,
                        "the C++ heap refused " + std::to_string(size) + " bytes");
        }
        return allocation<cpu_device>{address, size, alignment,
                                      next_id_.fetch_add(1, std::memory_order_relaxed), 0, device()};
    }

    // The heap keeps no records: releasing is trusted, as with operator delete.
    result<release_report> release(const allocation<cpu_device>& live) {
        ::operator delete(live.address, std::align_val_t{live.alignment});
        return release_report{release_state::complete, live.size, 0};
    }

private:
    std::atomic<std::uint64_t> next_id_{1};
};

static_assert(assert_device_allocator<heap_allocator>());

} // namespace nxmem
