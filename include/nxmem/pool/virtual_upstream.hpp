// How a pool learns that its upstream can grow by commit: the upstream offers
// `virtual_backing()`, returning a result of a VirtualBacking for the same device type (a
// plugin_allocator does: UNSUPPORTED_CAPABILITY when its mechanism lacks the capability). A
// native allocator opts in by offering the same member; the backing may state its unit of
// commit with `commit_granularity()`, else the pool commits whole pages.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/concepts/virtual_backing.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace nxmem {

// "the allocator may offer a VirtualBacking over its own allocations"
template <class A>
concept offers_virtual_backing = DeviceAllocator<A> && requires(const A& allocator) {
    { allocator.virtual_backing().has_value() } -> std::convertible_to<bool>;
    requires VirtualBacking<std::remove_cvref_t<decltype(allocator.virtual_backing().value())>>;
    requires std::same_as<
        typename std::remove_cvref_t<decltype(allocator.virtual_backing().value())>::device_type,
        typename A::device_type>;
};

template <offers_virtual_backing A>
using virtual_backing_of = std::remove_cvref_t<decltype(std::declval<const A&>().virtual_backing().value())>;

// "the backing states the unit it commits in"
template <class V>
concept states_commit_granularity = requires(const V& backing) {
    { backing.commit_granularity() } -> std::convertible_to<std::uint64_t>;
};

} // namespace nxmem
