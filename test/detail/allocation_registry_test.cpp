// The kit's allocation registry: 24 bytes a slot, prefixes in a side table only allocations with a
// mapping pay for, sizes of 2^57 bytes or more (and usable sizes other than the size asked for)
// kept whole, memory given back after a release, and the records' usable bytes summed.
#include "counting_new.hpp"

#include <nxmem/plugin/allocation_registry.hpp>

#include <catch2/catch.hpp>

#include <vector>

using nxmem::plugin::allocation_record;
using nxmem::plugin::allocation_registry;

namespace {

NxmemAllocation describe(const allocation_record& record) {
    NxmemAllocation described{};
    described.struct_size = sizeof described;
    described.allocation_id = record.allocation_id;
    described.address = record.address;
    described.size = record.size;
    described.alignment = record.alignment;
    return described;
}

} // namespace

TEST_CASE("the registry keeps 24 bytes a slot and gives the memory back", "[registry]") {
    STATIC_REQUIRE(allocation_registry::slot_bytes == 24);
    allocation_registry registry;
    const std::size_t idle = registry.bytes();
    constexpr std::uint64_t live = 100'000;
    for (std::uint64_t i = 1; i <= live; ++i) {
        registry.insert({i * 4096, 64, 16, i, {}});
    }
    const double per_allocation = static_cast<double>(registry.bytes() - idle) / live;
    INFO("kit bytes per live allocation: " << per_allocation);
    CHECK(per_allocation >= 24.0);
    CHECK(per_allocation <= 24.0 / 0.72 + 0.5); // grown, never shrunk: between 0.72 and 0.9 full
    const std::size_t before = nxmem::test::allocations;
    for (std::uint64_t i = 1; i <= live; ++i) {
        REQUIRE(registry.take(describe({i * 4096, 64, 16, i, {}})));
    }
    CHECK(nxmem::test::allocations - before < 200); // only the shrinking shards' new arrays
    CHECK(registry.size() == 0);
    CHECK(registry.bytes() <= idle + 16 * 8 * 24);
}

TEST_CASE("a record comes back as it went in, and a misdescription is refused", "[registry]") {
    allocation_registry registry;
    const allocation_record record{0x10000, 100, 4096, 7, {}};
    registry.insert(record);
    auto found = registry.find(describe(record));
    REQUIRE(found);
    CHECK(found.value().address == record.address);
    CHECK(found.value().size == 100);
    CHECK(found.value().alignment == 4096);
    CHECK(found.value().allocation_id == 7);
    allocation_record wrong = record;
    wrong.alignment = 2048;
    auto refused = registry.take(describe(wrong));
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == nxmem::status_code::invalid_argument);
    CHECK_THAT(refused.error().message, Catch::Contains("alignment 4096"));
    CHECK(registry.size() == 1);
}

TEST_CASE("prefixes live beside the record and leave with it", "[registry]") {
    allocation_registry registry;
    const allocation_record plain{0x20000, 64, 8, 1, {}};
    const allocation_record mapped{0x30000, 64, 8, 2, {}};
    registry.insert(plain);
    registry.insert(mapped);
    const std::size_t without = registry.bytes();
    CHECK(registry.add_prefix(mapped.address, 11));
    CHECK(registry.add_prefix(mapped.address, 12));
    CHECK_FALSE(registry.add_prefix(0x40000, 13)); // no such allocation
    CHECK(registry.bytes() > without);              // only the mapped one pays
    CHECK(registry.find(describe(mapped)).value().prefixes == std::vector<std::uint64_t>{11, 12}); // records carry their prefixes
    auto taken = registry.take(describe(mapped));
    REQUIRE(taken);
    CHECK(taken.value().prefixes == std::vector<std::uint64_t>{11, 12});
    auto other = registry.take(describe(plain));
    REQUIRE(other);
    CHECK(other.value().prefixes.empty());
    // Put back after a refused release, with its prefixes: they are there at the next take.
    registry.insert(taken.value());
    CHECK(registry.take(describe(mapped)).value().prefixes == std::vector<std::uint64_t>{11, 12});
}

TEST_CASE("a size that does not fit the packed word is kept whole", "[registry]") {
    allocation_registry registry;
    const allocation_record huge{0x50000, std::uint64_t{1} << 60, 64, 9, {}};
    registry.insert(huge);
    registry.insert({0x60000, 32, 32, 10, {}});
    auto found = registry.find(describe(huge));
    REQUIRE(found);
    CHECK(found.value().size == huge.size);
    CHECK(registry.add_prefix(huge.address, 5));
    std::vector<allocation_record> all = registry.take_all();
    REQUIRE(all.size() == 2);
    for (const allocation_record& left : all) {
        if (left.address == huge.address) {
            CHECK(left.size == huge.size);
            CHECK(left.prefixes == std::vector<std::uint64_t>{5});
        } else {
            CHECK(left.size == 32);
        }
    }
    CHECK(registry.size() == 0);
}

TEST_CASE("the registry sums its records' usable bytes, whole or packed, and a refused take "
          "changes nothing",
          "[registry]") {
    allocation_registry registry;
    CHECK(registry.reserved_bytes() == 0);
    registry.insert(0x10000, 100, 16, 1, 100);     // packed: the size asked for is usable
    registry.insert(0x20000, 5000, 16, 2, 8192);   // whole: rounded up by the mechanism
    const allocation_record huge{0x30000, std::uint64_t{1} << 58, 64, 3, {}, std::uint64_t{1} << 58};
    registry.insert(huge);                         // whole: too large for the word
    const std::uint64_t all = 100 + 8192 + (std::uint64_t{1} << 58);
    CHECK(registry.reserved_bytes() == all);

    NxmemAllocation rounded = describe({0x20000, 5000, 16, 2, {}, 0});
    CHECK(registry.find(rounded).value().usable_size == 8192);
    NxmemAllocation misdescribed = rounded;
    misdescribed.size = 8192; // the usable size is not what the host asked for
    CHECK_FALSE(registry.take(misdescribed));
    CHECK(registry.reserved_bytes() == all);

    const allocation_record taken = registry.take(rounded).value();
    CHECK(taken.usable_size == 8192);
    CHECK(registry.reserved_bytes() == all - 8192);
    registry.insert(taken); // put back (a refused release): counted again, still whole
    CHECK(registry.reserved_bytes() == all);
    CHECK(registry.take(describe({0x10000, 100, 16, 1, {}, 0})).value().usable_size == 100);
    CHECK(registry.reserved_bytes() == all - 100);
    CHECK(registry.take_all().size() == 2);
    CHECK(registry.reserved_bytes() == 0);
}
