// owned_allocation: one allocation that releases itself. plugin_allocator's allocate / release stay
// for engines that manage lifetimes themselves (a governor, a pool); an owned_allocation makes an
// early return or an exception unable to leak one.
#pragma once

#include <nxmem/host/owner.hpp>
#include <nxmem/host/plugin_allocator.hpp>

namespace nxmem::host {

namespace detail {
struct allocation_release {
    template <Device D>
    static result<release_report> release(plugin_allocator<D>& allocator, const allocation<D>& live) {
        return allocator.release(live);
    }
    static result<release_report> nothing_held() { return release_report{}; }
};
} // namespace detail

// Adopt a live allocation with owned_allocation(allocator, live), or make one here. reset()
// reports how the release ended (complete or quarantined).
template <Device D>
class owned_allocation : public owner<plugin_allocator<D>, allocation<D>, detail::allocation_release> {
public:
    using owner<plugin_allocator<D>, allocation<D>, detail::allocation_release>::owner;

    static result<owned_allocation> allocate(plugin_allocator<D> allocator, std::uint64_t size,
                                             std::uint64_t alignment) {
        NXMEM_TRY(made, allocator.allocate(size, alignment));
        return owned_allocation(std::move(allocator), made);
    }
};

} // namespace nxmem::host
