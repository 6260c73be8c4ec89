// What the host keeps per allocation (issue 10): bookkeeping_bytes follows the live count up and
// back down, ids stay unique when threads allocate from one allocator, and the host's tally of
// allocations (summed over allocators when asked) stays exact.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <thread>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("bookkeeping_bytes grows with the live allocations and shrinks after their release",
          "[bookkeeping]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto allocator = open_or_fail<cpu_device>(module, "eager");
        const std::size_t idle = allocator.bookkeeping_bytes();
        CHECK(idle > 0);       // the table's shards
        CHECK(idle < 4096);    // and no slot array before the first allocation
        constexpr std::size_t live_count = 20'000;
        std::vector<allocation<cpu_device>> live;
        live.reserve(live_count);
        for (std::size_t i = 0; i < live_count; ++i) {
            live.push_back(value_or_fail(allocator.allocate(16, 8)));
        }
        CHECK(value_or_fail(module->readiness()).host.allocations == live_count);
        const std::size_t full = allocator.bookkeeping_bytes();
        const double per_allocation = static_cast<double>(full - idle) / live_count;
        INFO("host bytes per live allocation: " << per_allocation);
        CHECK(per_allocation >= 24.0); // a 24-byte slot per allocation, at most 90% full
        CHECK(per_allocation <= 24.0 / 0.6);
        for (const auto& allocated : live) {
            REQUIRE(allocator.release(allocated));
        }
        CHECK(value_or_fail(module->readiness()).host.allocations == 0);
        const std::size_t after = allocator.bookkeeping_bytes();
        INFO("bytes after the release: " << after);
        CHECK(after < idle + 16 * 16 * 24); // at most a minimal array per shard
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("M3: two threads allocating from one allocator never get the same id", "[bookkeeping][rules]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto allocator = open_or_fail<cpu_device>(module, "eager");
        constexpr std::size_t per_thread = 3000; // more than one block of ids each
        std::vector<std::uint64_t> ids[2];
        auto work = [&](std::vector<std::uint64_t>& mine) {
            for (std::size_t i = 0; i < per_thread; ++i) {
                auto made = allocator.allocate(8, 8);
                if (!made) {
                    return;
                }
                mine.push_back(made.value().allocation_id);
                if (i % 2 == 1 && !allocator.release(made.value())) {
                    return;
                }
            }
        };
        std::thread other(work, std::ref(ids[1]));
        work(ids[0]);
        other.join();
        REQUIRE(ids[0].size() == per_thread);
        REQUIRE(ids[1].size() == per_thread);
        for (const auto& mine : ids) {
            CHECK(std::is_sorted(mine.begin(), mine.end())); // increasing in each thread's order
        }
        std::vector<std::uint64_t> all = ids[0];
        all.insert(all.end(), ids[1].begin(), ids[1].end());
        std::sort(all.begin(), all.end());
        CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
        CHECK(value_or_fail(module->readiness()).host.allocations == per_thread); // the even ones
    }
    CHECK(value_or_fail(module->readiness()).host.allocations == 0); // released with the allocator
    REQUIRE(module->try_unload());
}

TEST_CASE("a size the host cannot record is refused before the plugin is called", "[bookkeeping]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto allocator = open_or_fail<cpu_device>(module, "eager");
        auto refused = allocator.allocate(std::uint64_t{1} << 57, 8);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("'eager'"));
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
    }
    REQUIRE(module->try_unload());
}
