// The host's checks of an allocator table after read_prefix, on tables built here: required
// slots, capability flags against their slots, and locating the release slot of a refused table.
#include <nxmem/abi/request.hpp>
#include <nxmem/host/detail/table_checks.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

using nxmem::status_code;
namespace nxabi = nxmem::abi; // plain `abi` is taken by <cxxabi.h>
namespace checks = nxmem::host::detail;

namespace {

NxmemStatusCode stub_status(NxmemAllocatorVtable*, const NxmemAllocation*, NxmemStatus*) { return 0; }
NxmemStatusCode stub_allocate(NxmemAllocatorVtable*, const NxmemAllocRequest*, NxmemAllocResult*,
                              NxmemStatus*) { return 0; }
void stub_void(NxmemAllocatorVtable*) {}
NxmemStatusCode stub_enqueue(NxmemAllocatorVtable*, const NxmemAllocation*, uint64_t, NxmemStatus*) { return 0; }
NxmemStatusCode stub_drain(NxmemAllocatorVtable*, uint64_t*, NxmemStatus*) { return 0; }
NxmemStatusCode stub_release_allocation(NxmemAllocatorVtable*, const NxmemAllocation*,
                                        NxmemReleaseOutcome*, NxmemStatus*) { return 0; }

// A well-formed table at `declared` minor with the required slots, read at `ceiling`.
nxabi::table_copy<NxmemAllocatorVtable> copy_of(NxmemAllocatorVtable table, std::uint32_t ceiling) {
    auto copy = nxabi::read_prefix<NxmemAllocatorVtable>(&table, ceiling);
    REQUIRE(copy);
    return copy.value();
}

NxmemAllocatorVtable minimal_table(std::uint32_t minor) {
    auto table = nxabi::make_struct<NxmemAllocatorVtable>();
    table.struct_size = static_cast<std::uint32_t>(nxabi::bytes_required<NxmemAllocatorVtable>(minor));
    table.abi_minor = minor;
    table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
    table.allocate = &stub_allocate;
    table.deallocate = &stub_status;
    table.retain = &stub_void;
    table.release = &stub_void;
    return table;
}

} // namespace

TEST_CASE("a table missing any required slot is refused, naming the slot", "[table-checks]") {
    CHECK(checks::check_required_slots(copy_of(minimal_table(1), 1)));
    for (const char* slot : {"allocate", "deallocate", "retain", "release"}) {
        NxmemAllocatorVtable table = minimal_table(1);
        const nxabi::field_info* field = nxabi::find_field<NxmemAllocatorVtable>(slot);
        REQUIRE(field != nullptr);
        std::memset(reinterpret_cast<unsigned char*>(&table) + field->offset, 0, field->size);
        auto refused = checks::check_required_slots(copy_of(table, 1));
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Catch::Contains(std::string("'") + slot + "'"));
    }
}

TEST_CASE("capability flags must agree with their slots and tables", "[table-checks]") {
    SECTION("no flags, no optional slots: accepted") {
        auto copy = copy_of(minimal_table(1), 1);
        CHECK(checks::check_capabilities(copy));
    }
    SECTION("a flag with its slots: accepted") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.capabilities = NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE;
        table.enqueue_release = &stub_enqueue;
        table.drain_releases = &stub_drain;
        table.release_allocation = &stub_release_allocation;
        auto copy = copy_of(table, 1);
        CHECK(checks::check_capabilities(copy));
        CHECK(copy.table.capabilities == (NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE));
    }
    SECTION("a set flag with a NULL slot is refused") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.capabilities = NXMEM_CAP_DEFERRED_RELEASE;
        table.enqueue_release = &stub_enqueue; // drain_releases missing
        auto copy = copy_of(table, 1);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message, Catch::Contains("NXMEM_CAP_DEFERRED_RELEASE is set") &&
                                                Catch::Contains("drain_releases"));
    }
    SECTION("a non-NULL slot behind a clear flag is refused") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.release_allocation = &stub_release_allocation;
        auto copy = copy_of(table, 1);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message, Catch::Contains("NXMEM_CAP_STRUCTURED_RELEASE is clear"));
    }
    SECTION("a capability table behind a clear flag is refused") {
        static const NxmemVirtualBackingVtable backing = nxabi::make_struct<NxmemVirtualBackingVtable>();
        NxmemAllocatorVtable table = minimal_table(1);
        table.virtual_backing = &backing;
        auto copy = copy_of(table, 1);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message, Catch::Contains("virtual_backing"));
    }
    SECTION("unknown capability bits are refused") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.capabilities = 1ull << 40;
        auto copy = copy_of(table, 1);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message, Catch::Contains("unknown capability bits 0x10000000000"));
    }
    SECTION("a flag whose slot the table's own level lacks is refused") {
        NxmemAllocatorVtable table = minimal_table(0);
        table.capabilities = NXMEM_CAP_STRUCTURED_RELEASE;
        auto copy = copy_of(table, 1);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message, Catch::Contains("declares minor 0"));
    }
    SECTION("a flag whose slot lies above the negotiated level is cleared, not refused") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.capabilities = NXMEM_CAP_STRUCTURED_RELEASE;
        table.release_allocation = &stub_release_allocation;
        auto copy = copy_of(table, 0); // an older host
        REQUIRE(copy.effective_minor == 0);
        CHECK(checks::check_capabilities(copy));
        CHECK(copy.table.capabilities == 0);
        CHECK(copy.table.release_allocation == nullptr);
    }
}

TEST_CASE("a refused table's release slot is located only within its own struct_size",
          "[table-checks]") {
    alignas(8) NxmemAllocatorVtable table = minimal_table(0);
    CHECK(checks::locate_release_slot(&table) == &stub_void);
    CHECK(checks::locate_release_slot(nullptr) == nullptr);

    NxmemAllocatorVtable short_table = table;
    short_table.struct_size = offsetof(NxmemAllocatorVtable, release) + 7; // ends inside the slot
    CHECK(checks::locate_release_slot(&short_table) == nullptr);
    short_table.struct_size = offsetof(NxmemAllocatorVtable, release) + 8;
    CHECK(checks::locate_release_slot(&short_table) == &stub_void);

    NxmemAllocatorVtable wrong_tag = table;
    wrong_tag.type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
    CHECK(checks::locate_release_slot(&wrong_tag) == nullptr);

    NxmemAllocatorVtable oversized = table;
    oversized.struct_size = NXMEM_MAX_STRUCT_SIZE + 1;
    CHECK(checks::locate_release_slot(&oversized) == nullptr);

    std::vector<unsigned char> bytes(sizeof table + 8);
    std::memcpy(bytes.data() + 1, &table, sizeof table); // misaligned
    CHECK(checks::locate_release_slot(bytes.data() + 1) == nullptr);
}
