// The host's checks of an allocator table after read_prefix, on tables built here: required
// slots, capability flags against their slots, and locating the release slot of a refused table;
// for every kind of table, that none is accepted with a required slot read as NULL (R13, S9).
#include <nxmem/abi/request.hpp>
#include <nxmem/host/detail/table_checks.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <tuple>
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
NxmemStatusCode stub_query_usage(NxmemAllocatorVtable*, NxmemAllocatorUsage*, NxmemStatus*) { return 0; }

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
    SECTION("a flag of a later minor than the table declares is refused, slot or no slot") {
        NxmemAllocatorVtable table = minimal_table(1);
        table.capabilities = NXMEM_CAP_USAGE_QUERY;
        auto copy = copy_of(table, 2);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK_THAT(refused.error().message,
                   Catch::Contains("NXMEM_CAP_USAGE_QUERY is set but the table declares minor 1"));
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

TEST_CASE("capability flags are versioned like slots", "[table-checks]") {
    SECTION("a table declaring a newer minor than the reader knows loses the bits it does not know") {
        NxmemAllocatorVtable table = minimal_table(NXMEM_ABI_MINOR + 1);
        const std::uint64_t next_minor_flag = 1ull << 9; // what the next minor might add
        table.capabilities = NXMEM_CAP_USAGE_QUERY | NXMEM_CAP_HOST_RECLAIM | next_minor_flag;
        table.query_usage = &stub_query_usage;
        auto copy = copy_of(table, NXMEM_ABI_MINOR);
        REQUIRE(checks::check_capabilities(copy));
        CHECK(copy.table.capabilities == (NXMEM_CAP_USAGE_QUERY | NXMEM_CAP_HOST_RECLAIM));
        CHECK(copy.table.query_usage == &stub_query_usage);
        CHECK(table.capabilities == (NXMEM_CAP_USAGE_QUERY | NXMEM_CAP_HOST_RECLAIM | next_minor_flag));
    }
    SECTION("the same bit in a table declaring a minor the reader knows is refused") {
        NxmemAllocatorVtable table = minimal_table(NXMEM_ABI_MINOR);
        table.capabilities = 1ull << 9;
        auto copy = copy_of(table, NXMEM_ABI_MINOR);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Catch::Contains("unknown capability bits 0x200"));
    }
    SECTION("every minor's flags, read at every lower ceiling, keep only the flags of that ceiling") {
        for (std::uint32_t minor = 0; minor <= NXMEM_ABI_MINOR; ++minor) {
            for (std::uint32_t ceiling = 0; ceiling <= minor; ++ceiling) {
                NxmemAllocatorVtable table = minimal_table(minor);
                table.capabilities = NXMEM_CAPS_AT_MINOR(minor) &
                                     ~(NXMEM_CAP_VIRTUAL_BACKING | NXMEM_CAP_SHARED_MAPPING |
                                       NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_IPC |
                                       NXMEM_CAP_FENCED_RELEASE | NXMEM_CAP_COPY); // tables not stubbed
                table.release_allocation = minor >= 1 ? &stub_release_allocation : nullptr;
                table.query_usage = minor >= 2 ? &stub_query_usage : nullptr;
                auto copy = copy_of(table, ceiling);
                INFO("table minor " << minor << ", ceiling " << ceiling);
                REQUIRE(checks::check_capabilities(copy));
                CHECK(copy.table.capabilities == (table.capabilities & NXMEM_CAPS_AT_MINOR(ceiling)));
            }
        }
    }
    SECTION("the per-minor sets are cumulative and NXMEM_CAP_ALL_V1 is the newest") {
        STATIC_REQUIRE(NXMEM_CAP_VIRTUAL_BACKING == 0x1);
        STATIC_REQUIRE(NXMEM_CAP_SHARED_MAPPING == 0x2);
        STATIC_REQUIRE(NXMEM_CAP_DEFERRED_RELEASE == 0x4);
        STATIC_REQUIRE(NXMEM_CAP_STRUCTURED_RELEASE == 0x8);
        STATIC_REQUIRE(NXMEM_CAP_HOST_RECLAIM == 0x10);
        STATIC_REQUIRE(NXMEM_CAP_USAGE_QUERY == 0x20);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1_0 == 0x17);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1_1 == 0x1F);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1_2 == 0x3F);
        STATIC_REQUIRE(NXMEM_CAP_IPC == 0x40);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1_3 == 0x7F);
        STATIC_REQUIRE(NXMEM_CAP_FENCED_RELEASE == 0x80);
        STATIC_REQUIRE(NXMEM_CAP_COPY == 0x100);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1_4 == 0x1FF);
        STATIC_REQUIRE(NXMEM_CAP_ALL_V1 == NXMEM_CAP_ALL_V1_4);
        STATIC_REQUIRE(NXMEM_CAPS_AT_MINOR(0u) == NXMEM_CAP_ALL_V1_0);
        STATIC_REQUIRE(NXMEM_CAPS_AT_MINOR(9u) == NXMEM_CAP_ALL_V1);
    }
}

TEST_CASE("a fenced release needs deferred release, and minor-4 tables name known fence kinds",
          "[table-checks][streams]") {
    SECTION("NXMEM_CAP_FENCED_RELEASE without NXMEM_CAP_DEFERRED_RELEASE is refused (F2)") {
        static const NxmemFencedReleaseVtable fenced = [] {
            auto table = nxabi::make_struct<NxmemFencedReleaseVtable>();
            table.abi_minor = 4;
            table.type_tag = NXMEM_TYPE_TAG_FENCED_RELEASE;
            return table;
        }();
        NxmemAllocatorVtable table = minimal_table(4);
        table.capabilities = NXMEM_CAP_FENCED_RELEASE;
        table.fenced_release = &fenced;
        auto copy = copy_of(table, 4);
        auto refused = checks::check_capabilities(copy);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Catch::Contains("without NXMEM_CAP_DEFERRED_RELEASE"));
    }
    SECTION("kind bits (F6): unknown ones refused at a known minor, cleared from a newer one") {
        auto fenced = nxabi::make_struct<NxmemFencedReleaseVtable>();
        fenced.type_tag = NXMEM_TYPE_TAG_FENCED_RELEASE;
        fenced.enqueue_fenced_release = [](NxmemAllocatorVtable*, const NxmemFencedReleaseRequest*,
                                           NxmemStatus*) -> NxmemStatusCode { return 0; };
        const auto kinds = [&](std::uint32_t declared, std::uint64_t bits, bool zero_allowed) {
            fenced.abi_minor = declared;
            fenced.fence_kinds = bits;
            auto copy = nxabi::read_prefix<NxmemFencedReleaseVtable>(&fenced, NXMEM_ABI_MINOR);
            REQUIRE(copy);
            return checks::checked_kinds(copy.value(), bits, "fence_kinds", zero_allowed);
        };
        const std::uint64_t timeline = 1ull << NXMEM_FENCE_HOST_TIMELINE;
        const std::uint64_t next_kind = 1ull << 4;
        CHECK(kinds(4, timeline, false).value() == timeline);
        CHECK(kinds(4, timeline | next_kind, false).error().code == status_code::contract_violation);
        CHECK(kinds(4, next_kind, false).error().code == status_code::contract_violation);
        CHECK(kinds(4, 0, false).error().code == status_code::contract_violation);
        CHECK(kinds(4, 0, true).value() == 0); // stream_kinds 0: synchronous copies only
        CHECK(kinds(5, timeline | next_kind, false).value() == timeline);
        CHECK(kinds(5, next_kind, false).value() == 0); // nothing usable: the host keeps its own queue
    }
}

TEST_CASE("the commit granularity is the table's from minor 2 on, else the page", "[table-checks]") {
    auto table = nxabi::make_struct<NxmemVirtualBackingVtable>();
    table.abi_minor = 2;
    table.type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
    table.commit = [](NxmemAllocatorVtable*, const NxmemRangeRequest*, NxmemStatus*) -> NxmemStatusCode { return 0; };
    table.decommit = table.commit;
    table.mapped_bytes = [](NxmemAllocatorVtable*, const NxmemAllocation*, uint64_t*, NxmemStatus*) -> NxmemStatusCode { return 0; };
    auto read = [&](std::uint32_t ceiling) {
        auto copy = nxabi::read_prefix<NxmemVirtualBackingVtable>(&table, ceiling);
        REQUIRE(copy);
        return checks::commit_granularity_of(copy.value());
    };
    table.commit_granularity = 2u << 20;
    CHECK(read(2).value() == (2u << 20));
    CHECK(read(1).value() == nxmem::detail::system_page_bytes()); // an older host: the page
    for (std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{4097}}) {
        table.commit_granularity = bad;
        auto refused = read(2);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Catch::Contains("is not a power of two"));
        CHECK(read(1)); // invisible below minor 2
    }
    table.struct_size = static_cast<std::uint32_t>(nxabi::bytes_required<NxmemVirtualBackingVtable>(0));
    table.abi_minor = 0; // a minor-0 table: the field is not there at all
    CHECK(read(2).value() == nxmem::detail::system_page_bytes());
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

namespace {

// A table of kind T declaring `declared`, as large as this header's T, with every slot and
// capability table pointer non-NULL (the attack of issue 31: an ipc table filling its three
// minor-3 slots and declaring minor 0). read_prefix and the checks never call a slot.
template <class T> T every_slot_filled(std::uint32_t declared) {
    T table{};
    table.struct_size = sizeof(T);
    table.abi_minor = declared;
    table.type_tag = nxabi::struct_traits<T>::type_tag;
    static int some_target = 0;
    void* filled = &some_target;
    for (const nxabi::field_info& field : nxabi::struct_traits<T>::fields) {
        if (field.role == nxabi::field_role::required_slot || field.role == nxabi::field_role::optional_slot ||
            field.role == nxabi::field_role::capability_table) {
            std::memcpy(reinterpret_cast<unsigned char*>(&table) + field.offset, &filled, sizeof filled);
        }
    }
    return table;
}

// Reads `table` at `negotiated` as the host reads a capability table: read_prefix, then the
// required slots. Returns the copy when both accept it.
template <class T>
nxmem::result<nxabi::table_copy<T>> read_as_host(const T& table, std::uint32_t negotiated) {
    NXMEM_TRY(copy, nxabi::read_prefix<T>(&table, negotiated));
    NXMEM_TRY_VOID(checks::check_required_slots(copy));
    return copy;
}

// R13 for one kind: a table is accepted exactly when it declares, and is read at, a level at or
// above the one that introduced its kind; and no accepted table reads a required slot as NULL.
template <class T> std::size_t check_introduction_rule() {
    constexpr std::uint32_t introduced = nxabi::introduced_minor<T>();
    constexpr std::uint32_t known = nxabi::known_minor<T>();
    const std::string name(nxabi::struct_traits<T>::name);
    for (std::uint32_t declared = 0; declared <= known + 1; ++declared) {
        for (std::uint32_t negotiated = 0; negotiated <= NXMEM_ABI_MINOR + 1; ++negotiated) {
            INFO(name << " declaring minor " << declared << ", read at negotiated minor " << negotiated);
            const T table = every_slot_filled<T>(declared);
            auto read = read_as_host(table, negotiated);
            if (declared < introduced || negotiated < introduced) {
                REQUIRE_FALSE(read);
                CHECK(read.error().code == status_code::contract_violation);
                CHECK_THAT(read.error().message,
                           Catch::Contains(name) &&
                               Catch::Contains("below minor " + std::to_string(introduced) + ", which introduced it"));
                continue;
            }
            REQUIRE(read);
            for (const nxabi::field_info& field : nxabi::struct_traits<T>::fields) {
                if (field.role == nxabi::field_role::required_slot) {
                    INFO("required slot " << field.name);
                    CHECK(checks::slot_is_set(read.value().table, field));
                }
            }
        }
    }
    return 1;
}

template <class... Structs> std::size_t check_every_table_kind(std::tuple<Structs...>*) {
    std::size_t kinds = 0;
    ((kinds += [] {
         if constexpr (nxabi::growable_table<Structs>) {
             return check_introduction_rule<Structs>();
         } else {
             return std::size_t{0};
         }
     }()),
     ...);
    return kinds;
}

NxmemStatusCode stub_export(NxmemAllocatorVtable*, const NxmemExportRequest*, NxmemIpcHandle*, NxmemStatus*) {
    return 0;
}

} // namespace

TEST_CASE("R13: a table declaring, or read at, a minor below the one that introduced its kind is "
          "refused; no accepted table of any kind reads a required slot as NULL",
          "[table-checks][R13]") {
    // Every growable table of the header, found from the layout table (a kind added later is
    // checked without being listed here): the allocator, factory, virtual-backing, shared-mapping,
    // ipc, fenced-release and copy tables the host reads, and the host callback table the plugin
    // kit reads.
    STATIC_REQUIRE(nxabi::introduced_minor<NxmemIpcVtable>() == 3);
    STATIC_REQUIRE(nxabi::introduced_minor<NxmemFencedReleaseVtable>() == 4);
    STATIC_REQUIRE(nxabi::introduced_minor<NxmemCopyVtable>() == 4);
    STATIC_REQUIRE(nxabi::introduced_minor<NxmemHostCallbacks>() == 0);
    const std::size_t kinds = check_every_table_kind(static_cast<nxabi::all_structs*>(nullptr));
    CHECK(kinds == 8);
}

TEST_CASE("S9: a call finds every slot it uses non-NULL before making it", "[table-checks][S9]") {
    auto ipc = nxabi::make_struct<NxmemIpcVtable>();
    CHECK(checks::slots_present(ipc)); // no slot used: nothing to find NULL
    CHECK_FALSE(checks::slots_present(ipc, &NxmemIpcVtable::export_handle));
    ipc.export_handle = &stub_export;
    CHECK(checks::slots_present(ipc, &NxmemIpcVtable::export_handle));
    CHECK_FALSE(checks::slots_present(ipc, &NxmemIpcVtable::export_handle, &NxmemIpcVtable::close_import));
}
