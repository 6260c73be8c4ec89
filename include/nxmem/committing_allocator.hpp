// committing_allocator<A, V>: memory usable at once from an allocator whose allocations only
// reserve address space (a VirtualBacking mechanism such as posix-lazy): every allocation is
// committed whole before it is handed out. For engines that expect allocate() to return usable
// memory (PyTorch's c10::Allocator); a pool over the same mechanism commits chunk by chunk instead.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/concepts/virtual_backing.hpp>

#include <utility>

namespace nxmem {

template <DeviceAllocator A, VirtualBacking V>
    requires std::same_as<typename A::device_type, typename V::device_type>
class committing_allocator {
public:
    using device_type = typename A::device_type;

    committing_allocator(A upstream, V backing)
        : upstream_(std::move(upstream)), backing_(std::move(backing)) {}

    device_id device() const noexcept { return upstream_.device(); }

    // Reserve, then commit the whole range; a failed commit releases the reservation.
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        auto reserved = upstream_.allocate(size, alignment);
        if (!reserved) [[unlikely]] {
            return reserved;
        }
        if (auto committed = backing_.commit(reserved.value(), byte_range{0, size}); !committed)
            [[unlikely]] {
            (void)upstream_.release(reserved.value());
            return std::move(committed).error();
        }
        return reserved;
    }

    // The mechanism's release frees committed pages with the reservation.
    result<release_report> release(const allocation<device_type>& live) {
        return upstream_.release(live);
    }

    A& upstream() noexcept { return upstream_; }
    const A& upstream() const noexcept { return upstream_; }

private:
    A upstream_;
    V backing_;
};

} // namespace nxmem
