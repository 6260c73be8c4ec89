// VirtualBacking: allocations that reserve address space and commit byte ranges on demand.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>

#include <concepts>
#include <cstdint>

namespace nxmem {

// "the backing names the device type it serves"
template <class V>
concept backing_names_its_device = requires { typename V::device_type; } &&
                                   Device<typename V::device_type>;

// "the backing commits and decommits byte ranges of an allocation"
template <class V>
concept backing_commits_ranges = backing_names_its_device<V> &&
    requires(V& backing, const allocation<typename V::device_type>& live, byte_range range) {
        { backing.commit(live, range) } -> std::same_as<result<void>>;
        { backing.decommit(live, range) } -> std::same_as<result<void>>;
    };

// "the backing reports the bytes of an allocation that are mapped now"
template <class V>
concept backing_reports_mapped_bytes = backing_names_its_device<V> &&
    requires(V& backing, const allocation<typename V::device_type>& live) {
        { backing.mapped_bytes(live) } -> std::same_as<result<std::uint64_t>>;
    };

template <class V>
concept VirtualBacking =
    backing_names_its_device<V> && backing_commits_ranges<V> && backing_reports_mapped_bytes<V>;

template <class V> constexpr bool assert_virtual_backing() {
    static_assert(backing_names_its_device<V>,
                  "a VirtualBacking names its device type: `using device_type = <a Device tag>`");
    static_assert(backing_commits_ranges<V>,
                  "a VirtualBacking commits and decommits: `result<void> commit(const "
                  "allocation<D>&, byte_range)` and `decommit` alike");
    static_assert(backing_reports_mapped_bytes<V>,
                  "a VirtualBacking reports mapped bytes: `result<uint64_t> mapped_bytes(const "
                  "allocation<D>&)`");
    return VirtualBacking<V>;
}

} // namespace nxmem
