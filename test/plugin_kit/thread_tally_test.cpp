// The kit's per-thread counts (thread_tally, allocator_counts): what threads add is summed exactly,
// also where one thread adds and another subtracts, and for threads beyond those that own a cell;
// the module's report sums every allocator's counts and keeps what a dying allocator left counted.
// In the suite 'concurrency', so it also runs under TSan.
#include <nxmem/plugin/module_state.hpp>
#include <nxmem/plugin/thread_tally.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

using nxmem::plugin::allocator_counts;
using nxmem::plugin::this_module;
using nxmem::plugin::thread_tally;

namespace {

constexpr int rounds = 20000;

// Runs `body(index)` on `count` threads that start together.
template <class Body> void on_threads(int count, Body body) {
    std::latch start(count);
    std::vector<std::thread> threads;
    for (int index = 0; index < count; ++index) {
        threads.emplace_back([&, index] {
            start.arrive_and_wait();
            body(index);
        });
    }
    for (std::thread& thread : threads) {
        thread.join();
    }
}

} // namespace

TEST_CASE("two threads' counts on one tally sum exactly", "[kit][tally]") {
    thread_tally<2> tally;
    on_threads(2, [&](int index) {
        for (int round = 0; round < rounds; ++round) {
            tally.add(0, 1);
            tally.add(1, index == 0 ? 3 : -1);
        }
    });
    CHECK(tally.sum(0) == 2 * rounds);
    CHECK(tally.sum(1) == 2 * rounds);
}

TEST_CASE("a count added on one thread and taken back on another sums to zero", "[kit][tally]") {
    thread_tally<1> tally;
    std::thread adder([&] {
        for (int round = 0; round < rounds; ++round) {
            tally.add(0, 1);
        }
    });
    adder.join(); // the handoff a real allocation makes: allocated here, released there
    CHECK(tally.sum(0) == rounds);
    std::thread taker([&] {
        for (int round = 0; round < rounds; ++round) {
            tally.add(0, -1);
        }
    });
    taker.join();
    CHECK(tally.sum(0) == 0);
}

TEST_CASE("threads beyond those that own a cell share the last one and lose nothing",
          "[kit][tally]") {
    // More threads than cells: at least the last few share the shared cell, concurrently.
    constexpr int threads = static_cast<int>(nxmem::plugin::detail::tally_cells) + 16;
    thread_tally<1> tally;
    on_threads(threads, [&](int) {
        for (int round = 0; round < 1000; ++round) {
            tally.add(0, 1);
        }
    });
    CHECK(tally.sum(0) == threads * 1000);
    CHECK(nxmem::plugin::detail::this_thread_tally_cell() < nxmem::plugin::detail::tally_cells);
}

TEST_CASE("threads alive together never own the same cell, and keep theirs", "[kit][tally]") {
    // The cell comes from the thread pointer, not a thread_local: check what that must still
    // give, a cell of its own to each live thread that does not share the last one.
    constexpr int threads = 40;
    std::vector<std::size_t> first(threads), again(threads);
    std::latch all_chose(threads);
    on_threads(threads, [&](int index) {
        first[static_cast<std::size_t>(index)] = nxmem::plugin::detail::this_thread_tally_cell();
        all_chose.arrive_and_wait(); // every thread is alive while the others choose
        again[static_cast<std::size_t>(index)] = nxmem::plugin::detail::this_thread_tally_cell();
    });
    CHECK(first == again);
    std::vector<std::size_t> owned;
    for (std::size_t cell : first) {
        REQUIRE(cell < nxmem::plugin::detail::tally_cells);
        if (cell != nxmem::plugin::detail::shared_tally_cell) {
            owned.push_back(cell);
        }
    }
    std::sort(owned.begin(), owned.end());
    CHECK(std::adjacent_find(owned.begin(), owned.end()) == owned.end());
}

// Stands in for an allocator's registry: the records it holds, readable from any thread.
struct fake_registry {
    std::atomic<std::size_t> records{0};
    static std::size_t count(const void* registry) noexcept {
        return static_cast<const fake_registry*>(registry)->records.load(std::memory_order_relaxed);
    }
};

TEST_CASE("the module's report sums every allocator's counts, from any thread",
          "[kit][tally][module]") {
    const NxmemUnloadReport before = this_module().report();
    {
        fake_registry first_records;
        fake_registry second_records;
        auto first = std::make_unique<allocator_counts>(&first_records, &fake_registry::count);
        auto second = std::make_unique<allocator_counts>(&second_records, &fake_registry::count);
        on_threads(2, [&](int index) {
            allocator_counts& mine = index == 0 ? *first : *second;
            for (int round = 0; round < rounds; ++round) {
                mine.add(allocator_counts::views, 1);
            }
            mine.add(allocator_counts::unrecorded_allocations, 1); // a queued release, out of the registry
            mine.add(allocator_counts::queued_releases, 1);
        });
        first_records.records = 5;
        second_records.records = 7;
        NxmemUnloadReport during = this_module().report();
        // Live allocations: what the registries record, and the unrecorded ones (here the queued
        // releases, which have left their registry but not their mechanism).
        CHECK(during.live_allocations - before.live_allocations == 5 + 7 + 2);
        CHECK(during.live_views - before.live_views == 2 * rounds);
        CHECK(during.queued_releases - before.queued_releases == 2);

        // Uncounted on the other thread than the one that counted them.
        on_threads(2, [&](int index) {
            allocator_counts& theirs = index == 0 ? *second : *first;
            for (int round = 0; round < rounds; ++round) {
                theirs.add(allocator_counts::views, -1);
            }
            theirs.add(allocator_counts::unrecorded_allocations, -1);
            theirs.add(allocator_counts::queued_releases, -1);
        });
        first_records.records = 0;
        second_records.records = 0;
        NxmemUnloadReport after = this_module().report();
        CHECK(after.live_allocations == before.live_allocations);
        CHECK(after.live_views == before.live_views);
        CHECK(after.queued_releases == before.queued_releases);

        // An allocator that goes with allocations still recorded or queued leaves them in the
        // report, so the module does not look ready to unload.
        first_records.records = 3;
        first->add(allocator_counts::unrecorded_allocations, 1);
        first->add(allocator_counts::queued_releases, 1);
        first.reset();
        NxmemUnloadReport left = this_module().report();
        CHECK(left.live_allocations == before.live_allocations + 3 + 1);
        CHECK(left.queued_releases == before.queued_releases + 1);
        second->add(allocator_counts::unrecorded_allocations, -1); // and taken back by another
        second->add(allocator_counts::queued_releases, -1);
        CHECK(this_module().report().live_allocations == before.live_allocations + 3);
    }
    // What the gone allocator left recorded stays in the report for good.
    CHECK(this_module().report().live_allocations == before.live_allocations + 3);
    CHECK(this_module().report().queued_releases == before.queued_releases);
}

TEST_CASE("a queued release still in its registry counts once as an allocation", "[kit][tally][module]") {
    // A mechanism that queues releases itself and leaves the allocation in the kit's registry
    // until it retires (test/conform/fixtures/broken_callbacks_plugin.cpp does) counts the queued
    // release alone: the allocation is counted where it is recorded, not a second time.
    const NxmemUnloadReport before = this_module().report();
    fake_registry records;
    allocator_counts counts(&records, &fake_registry::count);
    records.records = 1;
    counts.add(allocator_counts::queued_releases, 1);
    const NxmemUnloadReport queued = this_module().report();
    CHECK(queued.live_allocations - before.live_allocations == 1);
    CHECK(queued.queued_releases - before.queued_releases == 1);
    counts.add(allocator_counts::queued_releases, -1);
    records.records = 0;
    const NxmemUnloadReport retired = this_module().report();
    CHECK(retired.live_allocations == before.live_allocations);
    CHECK(retired.queued_releases == before.queued_releases);
}
