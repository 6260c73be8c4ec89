// The mechanism concepts take exactly the documented signatures: one near miss per requirement,
// each breaking only that one, is rejected (a call that would compile is not enough), and the
// kit's alternatives (usage completing the kit's counts, a commit that leaves C8's figures to
// the kit, retirement through release_allocation) are accepted.
#include <nxmem/plugin.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <optional>

// A named namespace: clang warns of static members of classes in an anonymous one that nothing
// reads, and these exist only to be inspected by the concepts.
namespace near_misses {

using namespace nxmem;
using namespace nxmem::plugin;

// Every requirement met; each near miss below changes one member. A class deriving from another
// declares its own open: the inherited one would open the base, and the concept says so.
struct base {
    static constexpr const char* name = "base";
    static constexpr std::uint64_t mechanism_id = 1;
    static constexpr std::uint64_t device_types = device_bit(NXMEM_DEVICE_CPU);
};
#define NXMEM_TEST_OPEN(M)                                                                         \
    static result<std::unique_ptr<M>> open(open_context&) { return std::make_unique<M>(); }
#define NXMEM_TEST_ALLOCATE                                                                        \
    result<block> allocate(std::uint64_t, std::uint64_t) { return block{}; }
#define NXMEM_TEST_DEALLOCATE                                                                      \
    result<void> deallocate(const allocation_record&) { return success(); }

struct good : base {
    NXMEM_TEST_OPEN(good)
    NXMEM_TEST_ALLOCATE
    NXMEM_TEST_DEALLOCATE
};

struct open_inherited : good {}; // good::open makes a good, not an open_inherited

struct no_name {
    static constexpr std::uint64_t mechanism_id = 1;
    static constexpr std::uint64_t device_types = 1;
    NXMEM_TEST_OPEN(no_name)
    NXMEM_TEST_ALLOCATE
    NXMEM_TEST_DEALLOCATE
};
struct open_takes_const_context : base {
    static result<std::unique_ptr<open_takes_const_context>> open(const open_context&) {
        return std::make_unique<open_takes_const_context>();
    }
    NXMEM_TEST_ALLOCATE
    NXMEM_TEST_DEALLOCATE
};
// The near miss of the issue: compiles when called, truncates alignments of 2^32 and more.
struct allocate_with_narrow_alignment : base {
    NXMEM_TEST_OPEN(allocate_with_narrow_alignment)
    result<block> allocate(std::uint64_t, std::uint32_t) { return block{}; }
    NXMEM_TEST_DEALLOCATE
};
struct allocate_with_narrow_size : base {
    NXMEM_TEST_OPEN(allocate_with_narrow_size)
    result<block> allocate(std::size_t, unsigned) { return block{}; }
    NXMEM_TEST_DEALLOCATE
};
struct deallocate_by_value : base {
    NXMEM_TEST_OPEN(deallocate_by_value)
    NXMEM_TEST_ALLOCATE
    result<void> deallocate(allocation_record) { return success(); }
};
struct release_allocation_returning_void : base {
    NXMEM_TEST_OPEN(release_allocation_returning_void)
    NXMEM_TEST_ALLOCATE
    result<void> release_allocation(const allocation_record&) { return success(); }
};

struct virtual_backing : good {
    NXMEM_TEST_OPEN(virtual_backing)
    result<void> commit(const allocation_record&, byte_range) { return success(); }
    result<void> decommit(const allocation_record&, byte_range) { return success(); }
    result<std::uint64_t> mapped_bytes(const allocation_record&) { return 0; }
    std::uint64_t commit_granularity() const noexcept { return 4096; }
};
struct commit_by_offset : good {
    NXMEM_TEST_OPEN(commit_by_offset)
    result<void> commit(const allocation_record&, std::uint64_t, std::uint64_t) { return success(); }
    result<void> decommit(const allocation_record&, byte_range) { return success(); }
    result<std::uint64_t> mapped_bytes(const allocation_record&) { return 0; }
};
struct mapped_bytes_as_int : good {
    NXMEM_TEST_OPEN(mapped_bytes_as_int)
    result<void> commit(const allocation_record&, byte_range) { return success(); }
    result<void> decommit(const allocation_record&, byte_range) { return success(); }
    result<int> mapped_bytes(const allocation_record&) { return 0; }
};
struct granularity_not_const : virtual_backing {
    NXMEM_TEST_OPEN(granularity_not_const)
    std::uint64_t commit_granularity() { return 4096; }
};

struct shared_mapping : good {
    NXMEM_TEST_OPEN(shared_mapping)
    result<std::uint64_t> create_shared_prefix(std::uint64_t) { return 1; }
    result<prefix_commit> commit_shared_prefix(const allocation_record&, std::uint64_t) {
        return prefix_commit{};
    }
    void destroy_shared_prefix(std::uint64_t) {}
};
struct shared_mapping_costed_by_kit : good {
    NXMEM_TEST_OPEN(shared_mapping_costed_by_kit)
    result<std::uint64_t> create_shared_prefix(std::uint64_t) { return 1; }
    result<void> commit_shared_prefix(const allocation_record&, std::uint64_t) { return success(); }
    void destroy_shared_prefix(std::uint64_t) {}
};
struct prefix_size_narrow : good {
    NXMEM_TEST_OPEN(prefix_size_narrow)
    result<std::uint64_t> create_shared_prefix(std::uint32_t) { return 1; }
    result<void> commit_shared_prefix(const allocation_record&, std::uint64_t) { return success(); }
    void destroy_shared_prefix(std::uint64_t) {}
};
struct destroy_returning_result : good {
    NXMEM_TEST_OPEN(destroy_returning_result)
    result<std::uint64_t> create_shared_prefix(std::uint64_t) { return 1; }
    result<void> commit_shared_prefix(const allocation_record&, std::uint64_t) { return success(); }
    result<void> destroy_shared_prefix(std::uint64_t) { return success(); }
};

struct sharing : shared_mapping {
    NXMEM_TEST_OPEN(sharing)
    result<void> export_shared_prefix(std::uint64_t, std::uint32_t, NxmemIpcHandle&) { return success(); }
    result<imported_prefix> import_shared_prefix(const NxmemIpcHandle&, std::uint32_t) {
        return imported_prefix{};
    }
};
struct sharing_decided_at_open : sharing {
    NXMEM_TEST_OPEN(sharing_decided_at_open)
    bool ipc_available() const { return false; }
};
struct sharing_decided_by_non_const : sharing {
    NXMEM_TEST_OPEN(sharing_decided_by_non_const)
    bool ipc_available() { return false; }
};

struct retiring : good {
    NXMEM_TEST_OPEN(retiring)
    result<std::optional<release_outcome>> retire(const allocation_record&) { return std::nullopt; }
};
struct retire_without_optional : good {
    NXMEM_TEST_OPEN(retire_without_optional)
    result<release_outcome> retire(const allocation_record&) { return release_outcome{}; }
};
struct retiring_through_release : base {
    static constexpr bool retires_through_release_allocation = true;
    NXMEM_TEST_OPEN(retiring_through_release)
    NXMEM_TEST_ALLOCATE
    result<release_outcome> release_allocation(const allocation_record&) { return release_outcome{}; }
};
struct retiring_through_missing_release : good {
    NXMEM_TEST_OPEN(retiring_through_missing_release)
    static constexpr bool retires_through_release_allocation = true;
};

struct usage_whole : good {
    NXMEM_TEST_OPEN(usage_whole)
    result<allocator_usage> usage() const { return allocator_usage{}; }
};
struct usage_completing_kit : good {
    NXMEM_TEST_OPEN(usage_completing_kit)
    result<allocator_usage> usage(allocator_usage counted) { return counted; }
};
struct usage_by_reference : good {
    NXMEM_TEST_OPEN(usage_by_reference)
    result<allocator_usage> usage(allocator_usage& counted) { return counted; }
};
struct usage_returning_wire : good {
    NXMEM_TEST_OPEN(usage_returning_wire)
    result<NxmemAllocatorUsage> usage() { return NxmemAllocatorUsage{}; }
};

} // namespace near_misses

using namespace near_misses;

TEST_CASE("the mechanism concept accepts exactly the documented signatures", "[plugin-kit][concepts]") {
    STATIC_REQUIRE(mechanism<good>);
    STATIC_REQUIRE(assert_mechanism<good>());
    STATIC_REQUIRE(!mechanism<no_name>);
    STATIC_REQUIRE(!mechanism<open_inherited>);
    STATIC_REQUIRE(!mechanism<open_takes_const_context>);
    STATIC_REQUIRE(!mechanism<allocate_with_narrow_alignment>);
    STATIC_REQUIRE(!mechanism<allocate_with_narrow_size>);
    STATIC_REQUIRE(!mechanism<deallocate_by_value>);
    STATIC_REQUIRE(!mechanism<release_allocation_returning_void>);
    STATIC_REQUIRE(exportable_mechanism<good>);
    STATIC_REQUIRE(!exportable_mechanism<allocate_with_narrow_alignment>);
}

TEST_CASE("each capability concept rejects a near miss of each of its members", "[plugin-kit][concepts]") {
    STATIC_REQUIRE(offers_virtual_backing<virtual_backing>);
    STATIC_REQUIRE(states_commit_granularity<virtual_backing>);
    STATIC_REQUIRE(!offers_virtual_backing<commit_by_offset>);
    STATIC_REQUIRE(!offers_virtual_backing<mapped_bytes_as_int>);
    STATIC_REQUIRE(!states_commit_granularity<granularity_not_const>);

    STATIC_REQUIRE(offers_shared_mapping<shared_mapping>);
    STATIC_REQUIRE(commit_reports_prefix_cost<shared_mapping>);
    STATIC_REQUIRE(offers_shared_mapping<shared_mapping_costed_by_kit>);
    STATIC_REQUIRE(commit_leaves_prefix_cost_to_kit<shared_mapping_costed_by_kit>);
    STATIC_REQUIRE(!offers_shared_mapping<prefix_size_narrow>);
    STATIC_REQUIRE(!offers_shared_mapping<destroy_returning_result>);

    STATIC_REQUIRE(offers_deferred_release<retiring>);
    STATIC_REQUIRE(!offers_deferred_release<retire_without_optional>);
    STATIC_REQUIRE(offers_deferred_release<retiring_through_release>);
    STATIC_REQUIRE(offers_structured_release<retiring_through_release>);
    STATIC_REQUIRE(!offers_deferred_release<retiring_through_missing_release>);
    STATIC_REQUIRE(!offers_structured_release<good>);

    STATIC_REQUIRE(offers_usage_query<usage_whole>);
    STATIC_REQUIRE(offers_usage_query<usage_completing_kit>);
    STATIC_REQUIRE(usage_completes_kit_counts<usage_completing_kit>);
    STATIC_REQUIRE(!offers_usage_query<usage_by_reference>);
    STATIC_REQUIRE(!offers_usage_query<usage_returning_wire>);

    STATIC_REQUIRE(offers_ipc<sharing>);
    STATIC_REQUIRE(!decides_ipc_at_open<sharing>);
    STATIC_REQUIRE(decides_ipc_at_open<sharing_decided_at_open>);
    STATIC_REQUIRE(!decides_ipc_at_open<sharing_decided_by_non_const>);

    // Their capability flags follow.
    STATIC_REQUIRE(capabilities_of<good>() == 0);
    STATIC_REQUIRE(capabilities_of<retiring_through_release>() ==
                   (NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE));
    STATIC_REQUIRE(capabilities_of<usage_completing_kit>() == NXMEM_CAP_USAGE_QUERY);
}
