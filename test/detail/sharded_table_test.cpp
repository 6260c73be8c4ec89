// nxmem::detail::sharded_table, the open-addressing table behind the host's live table, the kit's
// allocation registry and cuda-vmm's reservations: checked against a std::map model, for growth,
// shrinking after a mass release, allocation failure during growth, and take_each. This executable
// replaces the global operator new (counting_new.cpp) so a test can make allocations fail.
#include "counting_new.hpp"

#include <nxmem/detail/allocation_id_source.hpp>
#include <nxmem/detail/sharded_table.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <algorithm>
#include <latch>
#include <map>
#include <memory>
#include <new>
#include <utility>
#include <random>
#include <set>
#include <thread>
#include <vector>

using nxmem::test::allocations;
using nxmem::test::fail_allocations;

namespace {

using nxmem::result;
using nxmem::status_code;
using table = nxmem::detail::sharded_table<std::uint64_t>;

// Accepts any record that exists.
auto present() {
    return [](const std::uint64_t* record) -> result<void> {
        if (record == nullptr) {
            return nxmem::error{status_code::unknown_allocation, {}};
        }
        return boost::outcome_v2::success();
    };
}

void require_same(table& under_test, const std::map<std::uint64_t, std::uint64_t>& model,
                  const std::vector<std::uint64_t>& absent) {
    REQUIRE(under_test.size() == model.size());
    for (const auto& [key, value] : model) {
        auto found = under_test.find(key, present());
        REQUIRE(found);
        CHECK(found.value() == value);
    }
    for (std::uint64_t key : absent) {
        if (model.count(key) == 0) {
            CHECK_FALSE(under_test.find(key, present()));
        }
    }
}

} // namespace

TEST_CASE("the table agrees with a std::map under random inserts and removals", "[table]") {
    // Keys from a small range so removals hit present keys and probes cross removed slots; key 0
    // (the table's empty marker, kept beside the array) and aligned addresses included.
    for (std::uint64_t stride : {std::uint64_t{1}, std::uint64_t{4096}}) {
        INFO("key stride " << stride);
        table under_test;
        std::map<std::uint64_t, std::uint64_t> model;
        std::mt19937_64 random(stride);
        std::vector<std::uint64_t> touched;
        for (int step = 0; step < 60000; ++step) {
            const std::uint64_t key = (random() % 3000) * stride;
            touched.push_back(key);
            switch (random() % 4) {
            case 0:
            case 1: {
                const std::uint64_t value = random();
                under_test.insert(key, value);
                model[key] = value;
                break;
            }
            case 2: {
                auto taken = under_test.take(key, present());
                auto expected = model.find(key);
                REQUIRE(static_cast<bool>(taken) == (expected != model.end()));
                if (taken) {
                    CHECK(taken.value() == expected->second);
                    model.erase(expected);
                }
                break;
            }
            default:
                CHECK(under_test.erase(key) == (model.erase(key) == 1));
            }
            if (step % 5000 == 0) {
                require_same(under_test, model, touched);
                touched.clear();
            }
        }
        require_same(under_test, model, touched);
    }
}

TEST_CASE("a refused take changes nothing and update/modify change in place", "[table]") {
    table under_test;
    under_test.insert(7, 70);
    auto refused = under_test.take(7, [](const std::uint64_t*) -> result<void> {
        return nxmem::error{status_code::invalid_argument, "no"};
    });
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::invalid_argument);
    CHECK(under_test.size() == 1);
    CHECK(under_test.update(7, [](std::uint64_t& value) { value = 71; }));
    CHECK_FALSE(under_test.update(8, [](std::uint64_t& value) { value = 81; }));
    auto changed = under_test.modify(7, present(), [](std::uint64_t& value) { value += 1; });
    REQUIRE(changed);
    CHECK(changed.value() == 72);
    CHECK_FALSE(under_test.modify(8, present(), [](std::uint64_t& value) { value += 1; }));
    under_test.insert(7, 5); // replaces
    CHECK(under_test.find(7, present()).value() == 5);
    CHECK(under_test.size() == 1);
}

TEST_CASE("the table grows with the live count and shrinks after a mass release", "[table]") {
    table under_test;
    const std::size_t empty_bytes = under_test.bytes();
    CHECK(empty_bytes == sizeof(table)); // nothing allocated before the first insert
    STATIC_REQUIRE(table::slot_bytes == 16);
    constexpr std::uint64_t live = 1'000'000;
    for (std::uint64_t key = 1; key <= live; ++key) {
        under_test.insert(key, key);
    }
    REQUIRE(under_test.size() == live);
    // Between 1/0.9 and 1/0.36 slots per record.
    const double per_record = static_cast<double>(under_test.bytes()) / live;
    INFO("bytes per record at 1M: " << per_record);
    CHECK(per_record >= table::slot_bytes / 0.9 - 0.01);
    CHECK(per_record <= table::slot_bytes / 0.6);
    for (std::uint64_t key = 1; key <= live; ++key) {
        REQUIRE(under_test.erase(key));
    }
    CHECK(under_test.size() == 0);
    INFO("bytes after the mass release: " << under_test.bytes());
    CHECK(under_test.bytes() <= empty_bytes + table::shard_count * 16 * table::slot_bytes);
    CHECK(under_test.bytes() < (std::size_t{1} << 20));
    // It grows again from there.
    for (std::uint64_t key = 1; key <= 1000; ++key) {
        under_test.insert(key, key);
    }
    CHECK(under_test.size() == 1000);
}

TEST_CASE("taking records one by one also gives the memory back", "[table]") {
    table under_test;
    for (std::uint64_t key = 1; key <= 200'000; ++key) {
        under_test.insert(key * 64, key);
    }
    const std::size_t full = under_test.bytes();
    for (std::uint64_t key = 1; key <= 200'000; ++key) {
        REQUIRE(under_test.take(key * 64, present()));
    }
    CHECK(under_test.bytes() * 100 < full);
}

TEST_CASE("an allocation failure while growing leaves the table as it was", "[table]") {
    table under_test;
    std::uint64_t key = 1;
    // Fill until the next insert must grow some shard, then make that growth fail.
    for (;; ++key) {
        const std::size_t before = allocations;
        fail_allocations = true;
        bool threw = false;
        try {
            under_test.insert(key, key * 3);
        } catch (const std::bad_alloc&) {
            threw = true;
        }
        fail_allocations = false;
        if (threw) {
            CHECK(allocations == before + 1);
            break;
        }
        REQUIRE(key < 100'000);
    }
    CHECK(under_test.size() == key - 1);
    for (std::uint64_t earlier = 1; earlier < key; ++earlier) {
        auto found = under_test.find(earlier, present());
        REQUIRE(found);
        CHECK(found.value() == earlier * 3);
    }
    CHECK_FALSE(under_test.find(key, present()));
    under_test.insert(key, key * 3); // memory is back: the insert succeeds
    CHECK(under_test.size() == key);
}

TEST_CASE("removals never allocate, even when the table would shrink", "[table]") {
    table under_test;
    for (std::uint64_t key = 1; key <= 50'000; ++key) {
        under_test.insert(key, key);
    }
    const std::size_t full = under_test.bytes();
    fail_allocations = true;
    bool all_removed = true;
    for (std::uint64_t key = 1; key <= 50'000; ++key) {
        all_removed = all_removed && under_test.erase(key);
    }
    fail_allocations = false;
    CHECK(all_removed);
    CHECK(under_test.size() == 0);
    CHECK(under_test.bytes() == full); // the shrink was skipped, nothing lost
    // With memory back, the next removal from a shard shrinks that shard.
    under_test.insert(1, 1);
    CHECK(under_test.erase(1));
    CHECK(under_test.bytes() < full - full / table::shard_count / 2);
}

TEST_CASE("take_each hands every record over once, allocating nothing", "[table]") {
    nxmem::detail::sharded_table<std::shared_ptr<int>> under_test;
    std::map<std::uint64_t, int> model;
    for (int value = 0; value < 5000; ++value) {
        const std::uint64_t key = static_cast<std::uint64_t>(value) * 4096; // key 0 included
        under_test.insert(key, std::make_shared<int>(value));
        model[key] = value;
    }
    std::vector<std::pair<std::uint64_t, int>> seen;
    seen.reserve(model.size() + 1);
    bool sole_owner = true;
    const std::size_t before = allocations;
    fail_allocations = true;
    under_test.take_each([&](std::uint64_t key, std::shared_ptr<int>&& record) {
        sole_owner = sole_owner && record.use_count() == 1;
        seen.emplace_back(key, *record); // within the reserved room
    });
    fail_allocations = false;
    CHECK(allocations == before);
    CHECK(sole_owner);
    CHECK(under_test.size() == 0);
    CHECK(std::map<std::uint64_t, int>(seen.begin(), seen.end()) == model);
    CHECK(seen.size() == model.size());
}

TEST_CASE("a lane-sharded table agrees with a std::map, erasing at the positions visit saw",
          "[table]") {
    using lane_table = nxmem::detail::sharded_table<std::uint64_t, nxmem::detail::shard_by_lane>;
    lane_table under_test;
    std::map<std::uint64_t, std::uint64_t> model;
    std::map<std::uint64_t, lane_table::position> seen; // positions go stale as the table changes
    std::mt19937_64 random(11);
    for (int step = 0; step < 60000; ++step) {
        // Mostly ids of a few lanes, as threads draw them; key 0 and other keys too.
        const std::uint64_t key = random() % 8 == 0 ? random() % 50 : 1 + (random() % 4) + 16 * (random() % 800);
        switch (random() % 4) {
        case 0:
        case 1: {
            const std::uint64_t value = random();
            under_test.insert(key, value);
            model[key] = value;
            break;
        }
        case 2: {
            lane_table::position at;
            const bool found = under_test.visit(
                key, [](std::uint64_t* record) { return record != nullptr; }, at);
            CHECK(found == (model.count(key) == 1));
            seen[key] = at;
            break;
        }
        default: {
            const auto hint = seen.find(key);
            const bool erased = hint != seen.end() ? under_test.erase(key, hint->second)
                                                   : under_test.erase(key);
            CHECK(erased == (model.erase(key) == 1));
        }
        }
        if (step % 5000 == 0) {
            REQUIRE(under_test.size() == model.size());
            for (const auto& [present_key, value] : model) {
                const std::uint64_t* found = nullptr;
                under_test.visit(present_key, [&](std::uint64_t* record) { found = record; });
                REQUIRE(found != nullptr); // read under the lock, compared after: single-threaded here
                CHECK(*found == value);
            }
        }
    }
    CHECK(under_test.size() == model.size());
}

TEST_CASE("a stale position never erases another record", "[table]") {
    using lane_table = nxmem::detail::sharded_table<std::uint64_t, nxmem::detail::shard_by_lane>;
    lane_table under_test;
    under_test.insert(1, 10);
    lane_table::position at;
    under_test.visit(1, [](std::uint64_t*) {}, at);
    CHECK(under_test.erase(1, at));
    under_test.insert(17, 170); // same lane, may take the slot key 1 had
    CHECK_FALSE(under_test.erase(1, at));
    CHECK(under_test.size() == 1);
    for (std::uint64_t key = 33; key < 33 + 16 * 1000; key += 16) { // grows the shard: slots move
        under_test.insert(key, key);
    }
    lane_table::position moved;
    under_test.visit(17, [](std::uint64_t*) {}, moved);
    for (std::uint64_t key = 33; key < 33 + 16 * 1000; key += 16) {
        REQUIRE(under_test.erase(key, moved)); // someone else's position: looked up instead
    }
    CHECK(under_test.size() == 1);
    CHECK(under_test.erase(17, moved));
    CHECK(under_test.size() == 0);
}

TEST_CASE("shard_by_lane gives each thread drawing allocation ids a shard of its own", "[table]") {
    using nxmem::detail::shard_by_lane;
    nxmem::detail::allocation_id_source ids;
    std::set<std::size_t> shards[2];
    auto draw = [&](std::set<std::size_t>& mine) {
        for (int i = 0; i < 1000; ++i) {
            mine.insert(shard_by_lane::shard(ids.next()));
        }
    };
    // Both threads alive while they draw: a lane is held until its thread exits.
    std::atomic<bool> drawn{false};
    std::thread other([&] {
        draw(shards[1]);
        while (!drawn.load()) {
            std::this_thread::yield();
        }
    });
    draw(shards[0]);
    drawn = true;
    other.join();
    REQUIRE(shards[0].size() == 1);
    REQUIRE(shards[1].size() == 1);
    CHECK(*shards[0].begin() != *shards[1].begin());
}

TEST_CASE("a new thread never lands on the lane of a thread still running", "[table]") {
    using nxmem::detail::shard_by_lane;
    nxmem::detail::allocation_id_source ids;
    const std::size_t mine = shard_by_lane::shard(ids.next());
    // Threads come and go one at a time while this one keeps its lane (as a program's main thread
    // does while a benchmark starts helper threads run after run): none may share it.
    for (int started = 0; started < 40; ++started) {
        std::size_t theirs = mine;
        std::thread([&] { theirs = shard_by_lane::shard(ids.next()); }).join();
        REQUIRE(theirs != mine);
    }
}

TEST_CASE("a steady insert/erase loop never reallocates, whatever the live count", "[table]") {
    // One record in, one out, with 0, 1, 5 or 40 others live: the shard must settle at a size
    // that fits both counts, not shrink on each erase and grow on the next insert.
    for (const std::uint64_t live : {0, 1, 5, 40}) {
        for (const bool warmed : {false, true}) {
            nxmem::detail::sharded_table<std::uint64_t, nxmem::detail::shard_by_lane> lanes;
            table hashed;
            std::uint64_t id = 1; // one lane: ids 1, 17, 33, ... (what one thread draws)
            if (warmed) { // a shard grown large and shrunk back down first
                for (std::uint64_t i = 0; i < 5000; ++i) {
                    lanes.insert(1 + 16 * i, i);
                    hashed.insert(64 * (i + 1), i);
                }
                for (std::uint64_t i = 0; i < 5000; ++i) {
                    lanes.erase(1 + 16 * i);
                    hashed.erase(64 * (i + 1));
                }
            }
            for (std::uint64_t i = 0; i < live; ++i, id += 16) {
                lanes.insert(id, i);
                hashed.insert(id * 64, i);
            }
            // Let both settle, then count.
            for (int cycle = 0; cycle < 100; ++cycle, id += 16) {
                lanes.insert(id, 0);
                lanes.erase(id);
                hashed.insert(id * 64, 0);
                REQUIRE(hashed.take(id * 64, present()));
            }
            bool all_taken = true;
            const std::size_t before = allocations;
            for (int cycle = 0; cycle < 1000; ++cycle, id += 16) {
                lanes.insert(id, 0);
                lanes.erase(id);
                hashed.insert(id * 64, 0);
                all_taken = hashed.take(id * 64, present()).has_value() && all_taken;
            }
            const std::size_t after = allocations; // before Catch's own allocations
            INFO("live " << live << (warmed ? ", after a mass release" : ""));
            CHECK(all_taken);
            CHECK(after == before);
            CHECK(lanes.size() == live);
        }
    }
}

TEST_CASE("allocation ids stay unique when more threads draw at once than there are lanes", "[ids]") {
    // Fifteen threads own a lane each and add without a locked instruction; the rest share the
    // last lane with atomic adds. All alive together, so no lane is handed over meanwhile.
    constexpr std::size_t threads = nxmem::detail::allocation_id_source::lanes + 8;
    constexpr int per_thread = 2000;
    nxmem::detail::allocation_id_source ids;
    std::vector<std::vector<std::uint64_t>> drawn(threads);
    std::latch all_alive(static_cast<std::ptrdiff_t>(threads));
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
            all_alive.arrive_and_wait();
            for (int i = 0; i < per_thread; ++i) {
                drawn[t].push_back(ids.next());
            }
        });
    }
    for (std::thread& worker : workers) {
        worker.join();
    }
    std::set<std::uint64_t> unique;
    for (const auto& mine : drawn) {
        CHECK(std::is_sorted(mine.begin(), mine.end())); // increasing per thread (M3)
        unique.insert(mine.begin(), mine.end());
    }
    CHECK(unique.size() == threads * per_thread);
    CHECK(unique.count(0) == 0);
}
