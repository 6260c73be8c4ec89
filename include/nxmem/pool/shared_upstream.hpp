// shared_upstream<A>: pools an allocator that cannot be copied or moved (or that the engine
// keeps using beside the pool). The pool owns its upstream; this upstream is a shared_ptr to the
// real allocator, forwarding to it, so the pool owns a reference and the allocator lives until
// the last owner lets go.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/pool/virtual_upstream.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace nxmem {

template <DeviceAllocator A> class shared_upstream {
public:
    using device_type = typename A::device_type;

    explicit shared_upstream(std::shared_ptr<A> allocator) noexcept : allocator_(std::move(allocator)) {}

    device_id device() const noexcept { return allocator_->device(); }
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        return allocator_->allocate(size, alignment);
    }
    result<release_report> release(const allocation<device_type>& live) { return allocator_->release(live); }

    // Growth by commit passes through when the allocator offers it.
    auto virtual_backing() const
        requires offers_virtual_backing<A>
    {
        return allocator_->virtual_backing();
    }

    A& get() const noexcept { return *allocator_; }

private:
    std::shared_ptr<A> allocator_;
};

} // namespace nxmem
