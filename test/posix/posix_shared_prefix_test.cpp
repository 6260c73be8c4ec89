// posix-lazy's shared prefixes, checked against the kernel: one memfd's pages mapped at the start
// of many allocations, so a write through one is read through another and the memory is paid
// for once however many allocations share it.
#include "posix_support.hpp"

#include <cstring>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::mib;
using nxmem::test::open_or_fail;
using nxmem::test::page_size;
using nxmem::test::process_memory;
using nxmem::test::resident_pages;
using nxmem::test::value_or_fail;

TEST_CASE("a write through one allocation's prefix is read through another",
          "[posix][shared-mapping]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());
        const std::uint64_t prefix_size = 4 * page + 10; // mapped as five whole pages
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        CHECK(prefix.size == prefix_size);

        const auto first = value_or_fail(lazy.allocate(16 * page, page));
        const auto second = value_or_fail(lazy.allocate(16 * page, page));
        // The second allocation had private pages committed where the prefix goes: mapping the
        // prefix replaces them, and they stop counting.
        REQUIRE(backing.commit(second, {0, 8 * page}));
        std::memset(second.address, 0x77, 8 * page);
        CHECK(value_or_fail(backing.mapped_bytes(second)) == 8 * page);

        auto one = value_or_fail(mapping.commit_prefix(first, prefix));
        CHECK(one.shared_bytes == prefix_size);
        CHECK(one.newly_mapped_bytes == 5 * page); // the first mapping pays its whole pages (C8)
        CHECK(one.sharers == 1);
        auto two = value_or_fail(mapping.commit_prefix(second, prefix));
        CHECK(two.newly_mapped_bytes == 0); // the second shares
        CHECK(two.sharers == 2);
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 0); // the prefix is costed apart
        CHECK(value_or_fail(backing.mapped_bytes(second)) == 3 * page); // pages 5..7 stay

        auto* a = static_cast<unsigned char*>(first.address);
        auto* b = static_cast<unsigned char*>(second.address);
        CHECK(b[0] == 0); // the prefix's pages, not the private ones it replaced
        CHECK(b[5 * page] == 0x77);
        std::memcpy(a, "shared prefix", 14);
        a[prefix_size - 1] = 0xEE;
        a[5 * page - 1] = 0xEF; // the prefix's last page, past its size: still the prefix's
        CHECK(std::memcmp(b, "shared prefix", 14) == 0);
        CHECK(b[prefix_size - 1] == 0xEE);
        CHECK(b[5 * page - 1] == 0xEF);
        CHECK(resident_pages(b, 1) == 1); // the same page, already resident

        // Pages under the prefix belong to it: commit and decommit leave them alone.
        REQUIRE(backing.commit(first, {0, 16 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 11 * page);
        REQUIRE(backing.decommit(first, {0, 16 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 0);
        CHECK(std::memcmp(a, "shared prefix", 14) == 0);
        CHECK(std::memcmp(b, "shared prefix", 14) == 0);

        // One prefix per allocation; a prefix larger than the allocation does not fit.
        auto again = mapping.commit_prefix(first, prefix);
        REQUIRE_FALSE(again);
        CHECK(again.error().code == status_code::invalid_argument);
        const auto small = value_or_fail(lazy.allocate(2 * page, page));
        auto too_big = mapping.commit_prefix(small, prefix);
        REQUIRE_FALSE(too_big);
        CHECK(too_big.error().code == status_code::invalid_argument);
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.views == 2);
        CHECK(readiness.plugin.shared_prefixes == 1);

        // The creator lets go; the mappings keep the prefix alive until their allocations go.
        REQUIRE(mapping.release_prefix(prefix));
        CHECK(b[prefix_size - 1] == 0xEE);
        auto report = value_or_fail(lazy.release(first));
        CHECK(report.unmapped_bytes == 0);
        CHECK(b[prefix_size - 1] == 0xEE); // the other sharer still reads it
        CHECK(value_or_fail(module->readiness()).plugin.shared_prefixes == 1);
        report = value_or_fail(lazy.release(second));
        CHECK(report.unmapped_bytes == 3 * page);
        REQUIRE(lazy.release(small));
        auto after = value_or_fail(module->readiness());
        CHECK(after.plugin.shared_prefixes == 0); // the last mapping's release closed the memfd
        CHECK(after.plugin.views == 0);
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("a prefix shared by eight allocations is paid for once", "[posix][shared-mapping][rss]") {
    const std::uint64_t page = page_size();
    constexpr std::uint64_t prefix_size = 32 * mib;
    constexpr int sharers = 8;
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());

        // Shared: one 32 MiB prefix written through the first allocation and read, every page,
        // through all eight.
        const process_memory before = process_memory::now();
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        std::vector<allocation<cpu_device>> sequences;
        std::uint64_t newly_mapped = 0;
        for (int i = 0; i < sharers; ++i) {
            sequences.push_back(value_or_fail(lazy.allocate(prefix_size + 16 * page, page)));
            newly_mapped += value_or_fail(mapping.commit_prefix(sequences.back(), prefix)).newly_mapped_bytes;
        }
        CHECK(newly_mapped == prefix_size);
        std::memset(sequences.front().address, 0x3C, prefix_size);
        std::uint64_t checksum = 0;
        for (const auto& sequence : sequences) {
            const auto* bytes = static_cast<const volatile unsigned char*>(sequence.address);
            for (std::uint64_t offset = 0; offset < prefix_size; offset += page) {
                checksum += bytes[offset];
            }
            CHECK(resident_pages(sequence.address, prefix_size / page) == prefix_size / page);
        }
        CHECK(checksum == 0x3Cu * sharers * (prefix_size / page));
        const process_memory shared = process_memory::now();
        const auto spans_of = [](const std::vector<allocation<cpu_device>>& made) {
            std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
            for (const auto& one : made) {
                spans.emplace_back(cpu_device::to_wire(one.address),
                                   cpu_device::to_wire(one.address) + one.size);
            }
            return spans;
        };
        const process_memory shared_mappings = test::mapped_memory(spans_of(sequences));

        // Private, for comparison: eight allocations each committing and writing 32 MiB.
        std::vector<allocation<cpu_device>> privates;
        for (int i = 0; i < sharers; ++i) {
            privates.push_back(value_or_fail(lazy.allocate(prefix_size, page)));
            REQUIRE(backing.commit(privates.back(), {0, prefix_size}));
            std::memset(privates.back().address, 0x3C, prefix_size);
        }
        const process_memory unshared = process_memory::now();
        const process_memory private_mappings = test::mapped_memory(spans_of(privates));

        const auto grew = [](std::uint64_t from, std::uint64_t to) {
            return to > from ? to - from : 0;
        };
        const std::uint64_t shared_pss = grew(before.pss, shared.pss);
        const std::uint64_t shared_rss = grew(before.rss, shared.rss);
        const std::uint64_t private_pss = grew(shared.pss, unshared.pss);
        const std::uint64_t private_rss = grew(shared.rss, unshared.rss);
        std::ostringstream figures;
        figures << "prefix of " << prefix_size / mib << " MiB shared by " << sharers
                << " allocations: process PSS (anon+shmem) +" << shared_pss / mib
                << " MiB, process RSS (anon+shmem) +" << shared_rss / mib
                << " MiB; the allocations' own mappings: PSS " << shared_mappings.pss / mib
                << " MiB, RSS " << shared_mappings.rss / mib << " MiB\n"
                << sharers << " private allocations of " << prefix_size / mib
                << " MiB: process PSS +" << private_pss / mib << " MiB, process RSS +"
                << private_rss / mib << " MiB; their mappings: PSS " << private_mappings.pss / mib
                << " MiB, RSS " << private_mappings.rss / mib << " MiB\n";
        std::cout << figures.str();
        INFO(figures.str());
        // The shared prefix is paid for once (PSS divides each page among its mappings) ...
        CHECK(shared_mappings.pss >= prefix_size * 9 / 10);
        CHECK(shared_mappings.pss < 2 * prefix_size);
        // ... where eight private copies cost eight times as much.
        CHECK(private_mappings.pss >= 6 * prefix_size);
        // RSS counts every mapping of a page, so it shows each sharer's view of the same pages:
        // it is not a measure of what sharing costs.
        CHECK(shared_mappings.rss >= 6 * prefix_size);
        // The same seen from the whole process, where nothing but this test allocates much. Under
        // ThreadSanitizer every access also writes shadow memory per address, which swamps it.
        if (!test::thread_sanitizer) {
            CHECK(shared_pss >= prefix_size * 9 / 10);
            CHECK(shared_pss < 2 * prefix_size);
            CHECK(private_pss >= 6 * prefix_size);
        }

        for (const auto& sequence : privates) {
            CHECK(value_or_fail(lazy.release(sequence)).unmapped_bytes == prefix_size);
        }
        for (const auto& sequence : sequences) {
            CHECK(value_or_fail(lazy.release(sequence)).unmapped_bytes == 0);
        }
        REQUIRE(mapping.release_prefix(prefix));
        const process_memory after = process_memory::now();
        std::cout << "after release: PSS " << after.pss / mib << " MiB (was " << before.pss / mib
                  << " MiB before the prefix)\n";
        // Process-wide, so only where no sanitizer keeps shadow pages of the unmapped memory
        // (ASan keeps 1/8 of everything the test touched, whether or not it was freed; the
        // allocations' own mappings above are measured exactly under every build).
        if (!test::thread_sanitizer && !test::address_sanitizer) {
            CHECK(after.pss < before.pss + prefix_size / 4); // the memfd's pages went with it
        }
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}
