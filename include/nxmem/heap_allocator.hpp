// The engine's own in-process allocator for host memory: the built-in DeviceAllocator that plugin
// allocators stand beside, and the baseline the benchmarks measure them against.
//
// It costs what malloc costs: within malloc's own alignment it is malloc and free; allocation ids
// come from the allocator's sixteen padded counters (nxmem/detail/allocation_id_source.hpp), a
// thread always from the same one, so threads on different counters share no cache line.
// A thread holds its counter in a thread_local whose destructor frees it at thread exit: code that
// must unload (a plugin's .so) should not use heap_allocator, as glibc keeps a module with live
// thread_local destructors mapped until those threads exit.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/detail/allocation_id_source.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

namespace nxmem {

class heap_allocator {
public:
    using device_type = cpu_device;

    device_id device() const noexcept { return {NXMEM_DEVICE_CPU, 0}; }

    // Ids are unique within the allocator and increase within each thread (not across threads).
    result<allocation<cpu_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) [[unlikely]] {
            return refused(size, alignment);
        }
        void* address = within_malloc_alignment(alignment)
                            ? std::malloc(static_cast<std::size_t>(size))
                            : ::operator new(size, std::align_val_t{alignment}, std::nothrow);
        if (address == nullptr) [[unlikely]] {
            return fail(status_code::out_of_memory,
                        "the C++ heap refused " + std::to_string(size) + " bytes");
        }
        return allocation<cpu_device>{address, size, alignment, ids_.next(), 0, device()};
    }

    // The heap keeps no records: releasing is trusted, as with operator delete.
    result<release_report> release(const allocation<cpu_device>& live) {
        if (within_malloc_alignment(live.alignment)) {
            std::free(live.address);
        } else {
            ::operator delete(live.address, std::align_val_t{live.alignment});
        }
        return release_report{release_state::complete, live.size, 0};
    }

private:
    static constexpr bool within_malloc_alignment(std::uint64_t alignment) noexcept {
        return alignment <= alignof(std::max_align_t);
    }

    [[gnu::cold]] static error refused(std::uint64_t size, std::uint64_t alignment) {
        return {status_code::invalid_argument,
                "size must be non-zero and alignment a power of two (size " +
                    std::to_string(size) + ", alignment " + std::to_string(alignment) + ")"};
    }

    nxmem::detail::allocation_id_source ids_;
};

static_assert(assert_device_allocator<heap_allocator>());

} // namespace nxmem
