// Threads sharing one pool (suite 'concurrency', run under ThreadSanitizer by scripts/test):
// each allocates, writes its pattern, hands some allocations to a neighbour thread to release
// (releases land in another thread's shard), releases by handle and by address, while another
// thread trims and reads usage. Checks: no two live allocations overlap (every pattern intact at
// release), every release succeeds exactly once, and the pool ends empty with the upstream
// holding nothing.
#include "test_upstreams.hpp"

#include <nxmem/pool.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

using namespace nxmem;

namespace {

// A hand-over box between two threads.
struct mailbox {
    std::mutex mutex;
    std::vector<allocation<cpu_device>> letters;
};

bool pattern_intact(const allocation<cpu_device>& live, unsigned char pattern) {
    const auto* bytes = static_cast<const unsigned char*>(live.address);
    for (std::uint64_t i = 0; i < live.size; ++i) {
        if (bytes[i] != pattern) {
            return false;
        }
    }
    return true;
}

unsigned char pattern_of(const allocation<cpu_device>& live) {
    return static_cast<unsigned char>(live.allocation_id * 31 + 7);
}

template <class Upstream> void threads_share_one_pool() {
    constexpr int threads = 4;
    constexpr int rounds = 2000;
    constexpr bool by_commit = std::is_same_v<Upstream, test::committing_upstream>;
    Upstream upstream;
    auto ledger = upstream.ledger();
    pool_options options;
    options.retain_limit_bytes = 4 << 20; // releases also trim now and then
    options.reserve_bytes = 1ull << 30;
    {
        pool_allocator<Upstream> pool(upstream, options);
        REQUIRE(pool.grows_by_commit() == by_commit);
        std::vector<mailbox> boxes(threads);
        std::atomic<int> failures{0};
        std::atomic<bool> done{false};
        std::atomic<int> finished{0};
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                std::vector<allocation<cpu_device>> mine;
                std::uint64_t seed = static_cast<std::uint64_t>(t) * 7919 + 1;
                auto next = [&seed] {
                    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                    return seed >> 33;
                };
                static constexpr std::uint64_t sizes[] = {8, 64, 200, 4096, 10000, 40000, 300000};
                for (int round = 0; round < rounds; ++round) {
                    const std::uint64_t size = sizes[next() % std::size(sizes)];
                    auto made = pool.allocate(size, std::uint64_t{1} << (next() % 8));
                    if (!made.has_value()) {
                        ++failures;
                        continue;
                    }
                    std::memset(made.value().address, pattern_of(made.value()), size);
                    if (next() % 4 == 0) {
                        mailbox& box = boxes[static_cast<std::size_t>((t + 1) % threads)];
                        std::lock_guard lock(box.mutex);
                        box.letters.push_back(made.value());
                    } else {
                        mine.push_back(made.value());
                    }
                    if (mine.size() > 32 || next() % 3 == 0) {
                        while (!mine.empty()) {
                            const auto live = mine.back();
                            mine.pop_back();
                            if (!pattern_intact(live, pattern_of(live))) {
                                ++failures;
                            }
                            auto released = next() % 2 == 0 ? pool.release(live) : pool.release_by_address(live.address);
                            failures += released.has_value() ? 0 : 1;
                        }
                    }
                    std::vector<allocation<cpu_device>> received;
                    {
                        std::lock_guard lock(boxes[static_cast<std::size_t>(t)].mutex);
                        received.swap(boxes[static_cast<std::size_t>(t)].letters);
                    }
                    for (const auto& live : received) {
                        if (!pattern_intact(live, pattern_of(live))) {
                            ++failures;
                        }
                        failures += pool.release(live).has_value() ? 0 : 1;
                    }
                }
                for (const auto& live : mine) {
                    failures += pool.release(live).has_value() ? 0 : 1;
                }
                finished.fetch_add(1);
            });
        }
        std::thread trimmer([&] {
            while (!done.load()) {
                pool.trim(1 << 20);
                (void)pool.usage();
                std::this_thread::yield();
            }
        });
        for (auto& worker : workers) {
            worker.join();
        }
        done = true;
        trimmer.join();
        for (auto& box : boxes) { // letters posted after their receiver finished
            for (const auto& live : box.letters) {
                failures += pool.release(live).has_value() ? 0 : 1;
            }
        }
        CHECK(failures.load() == 0);
        CHECK(pool.usage().live_allocations == 0);
        CHECK(pool.usage().in_use_bytes == 0);
        pool.trim(0);
        CHECK(pool.usage().held_bytes == 0);
        if constexpr (by_commit) {
            CHECK(upstream.commits->committed_bytes == 0);
            CHECK(upstream.commits->bad_calls == 0);
            CHECK(ledger->live_count() == 1); // the reservation
        } else {
            CHECK(ledger->live_count() == 0);
        }
    }
    CHECK(ledger->live_count() == 0);
    CHECK(ledger->bad_releases == 0);
}

} // namespace

TEST_CASE("threads allocate, release across threads, by address, while another trims", "[pool][concurrency]") {
    threads_share_one_pool<test::heap_upstream>();
}

// Spans are pieces of one arena: threads grow its top at once, commit with the span lock
// dropped, and release into neighbours that another thread is committing or trim decommitting.
TEST_CASE("threads share a pool growing by commit (the span arena) while another trims", "[pool][concurrency]") {
    threads_share_one_pool<test::committing_upstream>();
}

TEST_CASE("two threads releasing the same allocation: exactly one succeeds", "[pool][concurrency]") {
    pool_allocator<test::fake_device_upstream> pool{test::fake_device_upstream{}};
    for (int round = 0; round < 200; ++round) {
        const std::uint64_t size = round % 2 == 0 ? 64 : 100000;
        auto live = pool.allocate(size, 8).value();
        std::atomic<int> succeeded{0};
        std::thread first([&] { succeeded += pool.release(live).has_value() ? 1 : 0; });
        std::thread second([&] { succeeded += pool.release_by_address(live.address).has_value() ? 1 : 0; });
        first.join();
        second.join();
        REQUIRE(succeeded.load() == 1);
    }
    CHECK(pool.usage().live_allocations == 0);
}
