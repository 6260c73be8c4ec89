// The concepts, requirement by requirement: for each, a type that breaks only that requirement
// must fail the concept, and a type that meets them all must satisfy it.
#include <nxmem/concepts.hpp>
#include <nxmem/heap_allocator.hpp>
#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/plugin_allocator.hpp>

#include <catch2/catch.hpp>

#include <cstring>

using namespace nxmem;

namespace {

// ---- Device ----
struct good_device {
    static constexpr NxmemDeviceType type = 9;
    static constexpr std::string_view name = "good";
    using address_type = std::uint64_t;
    static address_type from_wire(std::uint64_t wire) noexcept { return wire; }
    static std::uint64_t to_wire(address_type address) noexcept { return address; }
};
struct device_without_type {
    [[maybe_unused]] static constexpr std::string_view name = "x";
    using address_type = std::uint64_t;
    static address_type from_wire(std::uint64_t wire) noexcept { return wire; }
    static std::uint64_t to_wire(address_type address) noexcept { return address; }
};
struct device_with_throwing_conversion : good_device {
    static address_type from_wire(std::uint64_t wire) { return wire; } // not noexcept
};
struct device_without_address_type {
    [[maybe_unused]] static constexpr NxmemDeviceType type = 9;
    [[maybe_unused]] static constexpr std::string_view name = "x";
};

// ---- DeviceAllocator ----
struct good_allocator {
    using device_type = cpu_device;
    device_id device() const { return {}; }
    result<allocation<cpu_device>> allocate(std::uint64_t, std::uint64_t) { return allocation<cpu_device>{}; }
    result<release_report> release(const allocation<cpu_device>&) { return release_report{}; }
};
struct allocator_without_device_type {
    device_id device() const { return {}; }
    result<allocation<cpu_device>> allocate(std::uint64_t, std::uint64_t) { return allocation<cpu_device>{}; }
    result<release_report> release(const allocation<cpu_device>&) { return release_report{}; }
};
struct allocator_with_a_non_device : good_allocator {
    using device_type = int;
};
struct allocator_without_device_report {
    using device_type = cpu_device;
    result<allocation<cpu_device>> allocate(std::uint64_t, std::uint64_t) { return allocation<cpu_device>{}; }
    result<release_report> release(const allocation<cpu_device>&) { return release_report{}; }
};
struct allocator_returning_raw_pointers {
    using device_type = cpu_device;
    device_id device() const { return {}; }
    void* allocate(std::uint64_t, std::uint64_t) { return nullptr; }
    result<release_report> release(const allocation<cpu_device>&) { return release_report{}; }
};
struct allocator_with_another_devices_allocations {
    using device_type = cpu_device;
    device_id device() const { return {}; }
    result<allocation<cuda_device>> allocate(std::uint64_t, std::uint64_t) { return allocation<cuda_device>{}; }
    result<release_report> release(const allocation<cpu_device>&) { return release_report{}; }
};
struct allocator_without_release_report {
    using device_type = cpu_device;
    device_id device() const { return {}; }
    result<allocation<cpu_device>> allocate(std::uint64_t, std::uint64_t) { return allocation<cpu_device>{}; }
    void release(const allocation<cpu_device>&) {}
};

// ---- VirtualBacking ----
struct good_backing {
    using device_type = cpu_device;
    result<void> commit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<void> decommit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<std::uint64_t> mapped_bytes(const allocation<cpu_device>&) { return std::uint64_t{0}; }
};
struct backing_without_decommit {
    using device_type = cpu_device;
    result<void> commit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<std::uint64_t> mapped_bytes(const allocation<cpu_device>&) { return std::uint64_t{0}; }
};
struct backing_without_mapped_bytes {
    using device_type = cpu_device;
    result<void> commit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<void> decommit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
};
struct backing_without_device_type {
    result<void> commit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<void> decommit(const allocation<cpu_device>&, byte_range) { return boost::outcome_v2::success(); }
    result<std::uint64_t> mapped_bytes(const allocation<cpu_device>&) { return std::uint64_t{0}; }
};

// ---- SharedMapping ----
struct prefix_handle {
    int id = 0;
};
struct good_mapping {
    using device_type = cpu_device;
    using prefix_type = prefix_handle;
    result<prefix_handle> create_prefix(std::uint64_t) { return prefix_handle{}; }
    result<void> retain_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
    result<void> release_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
    result<prefix_commit> commit_prefix(const allocation<cpu_device>&, const prefix_handle&) { return prefix_commit{}; }
};
struct mapping_without_prefix_type {
    using device_type = cpu_device;
    result<prefix_handle> create_prefix(std::uint64_t) { return prefix_handle{}; }
    result<void> retain_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
    result<void> release_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
    result<prefix_commit> commit_prefix(const allocation<cpu_device>&, const prefix_handle&) { return prefix_commit{}; }
};
struct mapping_without_retain : good_mapping {
    result<void> retain_prefix(const prefix_handle&) = delete;
};
struct mapping_without_commit {
    using device_type = cpu_device;
    using prefix_type = prefix_handle;
    result<prefix_handle> create_prefix(std::uint64_t) { return prefix_handle{}; }
    result<void> retain_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
    result<void> release_prefix(const prefix_handle&) { return boost::outcome_v2::success(); }
};

} // namespace

TEST_CASE("a device tag needs a type, a noexcept wire conversion and an address type", "[concepts]") {
    STATIC_REQUIRE(Device<good_device>);
    STATIC_REQUIRE(Device<cpu_device>);
    STATIC_REQUIRE(Device<cuda_device>);
    STATIC_REQUIRE(Device<hip_device>);
    STATIC_REQUIRE_FALSE(Device<device_without_type>);
    STATIC_REQUIRE_FALSE(Device<device_with_throwing_conversion>);
    STATIC_REQUIRE_FALSE(Device<device_without_address_type>);
    STATIC_REQUIRE_FALSE(Device<int>);
}

TEST_CASE("DeviceAllocator fails for each requirement broken alone", "[concepts]") {
    STATIC_REQUIRE(DeviceAllocator<good_allocator>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_without_device_type>);
    STATIC_REQUIRE_FALSE(allocator_names_its_device<allocator_without_device_type>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_with_a_non_device>);
    STATIC_REQUIRE_FALSE(allocator_names_its_device<allocator_with_a_non_device>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_without_device_report>);
    STATIC_REQUIRE_FALSE(allocator_reports_its_device<allocator_without_device_report>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_returning_raw_pointers>);
    STATIC_REQUIRE_FALSE(allocator_allocates<allocator_returning_raw_pointers>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_with_another_devices_allocations>);
    STATIC_REQUIRE_FALSE(allocator_allocates<allocator_with_another_devices_allocations>);
    STATIC_REQUIRE_FALSE(DeviceAllocator<allocator_without_release_report>);
    STATIC_REQUIRE_FALSE(allocator_releases<allocator_without_release_report>);
}

TEST_CASE("VirtualBacking fails for each requirement broken alone", "[concepts]") {
    STATIC_REQUIRE(VirtualBacking<good_backing>);
    STATIC_REQUIRE_FALSE(VirtualBacking<backing_without_decommit>);
    STATIC_REQUIRE_FALSE(backing_commits_ranges<backing_without_decommit>);
    STATIC_REQUIRE_FALSE(VirtualBacking<backing_without_mapped_bytes>);
    STATIC_REQUIRE_FALSE(backing_reports_mapped_bytes<backing_without_mapped_bytes>);
    STATIC_REQUIRE_FALSE(VirtualBacking<backing_without_device_type>);
}

TEST_CASE("SharedMapping fails for each requirement broken alone", "[concepts]") {
    STATIC_REQUIRE(SharedMapping<good_mapping>);
    STATIC_REQUIRE_FALSE(SharedMapping<mapping_without_prefix_type>);
    STATIC_REQUIRE_FALSE(mapping_names_its_types<mapping_without_prefix_type>);
    STATIC_REQUIRE_FALSE(SharedMapping<mapping_without_retain>);
    STATIC_REQUIRE_FALSE(mapping_counts_prefix_references<mapping_without_retain>);
    STATIC_REQUIRE_FALSE(SharedMapping<mapping_without_commit>);
    STATIC_REQUIRE_FALSE(mapping_commits_prefixes<mapping_without_commit>);
}

TEST_CASE("plugin adapters and the built-in allocator satisfy the same concepts per device tag",
          "[concepts]") {
    STATIC_REQUIRE(DeviceAllocator<heap_allocator>);
    STATIC_REQUIRE(DeviceAllocator<host::plugin_allocator<cpu_device>>);
    STATIC_REQUIRE(DeviceAllocator<host::plugin_allocator<cuda_device>>);
    STATIC_REQUIRE(DeviceAllocator<host::plugin_allocator<hip_device>>);
    STATIC_REQUIRE(VirtualBacking<host::virtual_backing_view<cpu_device>>);
    STATIC_REQUIRE(VirtualBacking<host::virtual_backing_view<cuda_device>>);
    STATIC_REQUIRE(SharedMapping<host::shared_mapping_view<cpu_device>>);
    STATIC_REQUIRE(SharedMapping<host::shared_mapping_view<cuda_device>>);
    STATIC_REQUIRE_FALSE(VirtualBacking<heap_allocator>);
}

TEST_CASE("the built-in heap allocator allocates aligned, writable memory and refuses bad requests",
          "[heap-allocator]") {
    heap_allocator heap;
    auto first = heap.allocate(1000, 256);
    REQUIRE(first);
    CHECK(reinterpret_cast<std::uintptr_t>(first.value().address) % 256 == 0);
    std::memset(first.value().address, 0x5A, 1000);
    auto second = heap.allocate(16, 16);
    REQUIRE(second);
    CHECK(second.value().allocation_id > first.value().allocation_id);
    CHECK(heap.release(first.value()).value().unmapped_bytes == 1000);
    CHECK(heap.release(second.value()).value().state == release_state::complete);
    for (auto [size, alignment] : {std::pair{0ull, 8ull}, std::pair{8ull, 3ull}, std::pair{8ull, 0ull}}) {
        auto refused = heap.allocate(size, alignment);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
    }
    auto huge = heap.allocate(1ull << 62, 64);
    REQUIRE_FALSE(huge);
    CHECK(huge.error().code == status_code::out_of_memory);
}
