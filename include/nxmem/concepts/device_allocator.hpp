// DeviceAllocator: what the engine's governor needs of any allocator, built-in or plugin.
// Built from named requirements so a failure reads as the sentence that is not true.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>
#include <nxmem/device.hpp>

#include <concepts>
#include <cstdint>

namespace nxmem {

// "the allocator names the device type it serves"
template <class A>
concept allocator_names_its_device = requires { typename A::device_type; } &&
                                     Device<typename A::device_type>;

// "the allocator says which device it serves"
template <class A>
concept allocator_reports_its_device = requires(const A& allocator) {
    { allocator.device() } -> std::same_as<device_id>;
};

// "the allocator allocates a size at an alignment, as a result"
template <class A>
concept allocator_allocates = allocator_names_its_device<A> &&
    requires(A& allocator, std::uint64_t size, std::uint64_t alignment) {
        { allocator.allocate(size, alignment) }
            -> std::same_as<result<allocation<typename A::device_type>>>;
    };

// "the allocator releases what it allocated and reports how the release ended"
template <class A>
concept allocator_releases = allocator_names_its_device<A> &&
    requires(A& allocator, const allocation<typename A::device_type>& live) {
        { allocator.release(live) } -> std::same_as<result<release_report>>;
    };

template <class A>
concept DeviceAllocator = allocator_names_its_device<A> && allocator_reports_its_device<A> &&
                          allocator_allocates<A> && allocator_releases<A>;

// Asserts DeviceAllocator<A> one requirement at a time, so the compiler names the one missing.
template <class A> constexpr bool assert_device_allocator() {
    static_assert(allocator_names_its_device<A>,
                  "a DeviceAllocator names its device type: `using device_type = <a Device tag>`");
    static_assert(allocator_reports_its_device<A>,
                  "a DeviceAllocator reports its device: `device_id device() const`");
    static_assert(allocator_allocates<A>,
                  "a DeviceAllocator allocates: `result<allocation<D>> allocate(size, alignment)`");
    static_assert(allocator_releases<A>,
                  "a DeviceAllocator releases: `result<release_report> release(const allocation<D>&)`");
    return DeviceAllocator<A>;
}

} // namespace nxmem
