// Threads sharing one pool (suite 'concurrency', run under ThreadSanitizer by scripts/test):
// each allocates, writes its pattern, hands some allocations to a neighbour thread to release
// (releases land in another thread's shard), releases by handle and by address, while another
// thread trims and reads usage. Checks: no two live allocations overlap (every pattern intact at
// release), every release succeeds exactly once, and the pool ends empty with the upstream
// holding nothing.
#include "host_timeline_policy.hpp"
#include "test_upstreams.hpp"

#include <nxmem/pool.hpp>
#include <nxmem/pool/stream_ordered_pool.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstring>
#include <limits>
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

// Its first `checked` bytes (all of them by default) hold `pattern`.
bool pattern_intact(const allocation<cpu_device>& live, unsigned char pattern,
                    std::uint64_t checked = std::numeric_limits<std::uint64_t>::max()) {
    const auto* bytes = static_cast<const unsigned char*>(live.address);
    for (std::uint64_t i = 0; i < std::min(live.size, checked); ++i) {
        if (bytes[i] != pattern) {
            return false;
        }
    }
    return true;
}

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

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

// Span pieces released on one thread park in that thread's shard cache (pool/detail/span_cache.hpp);
// the tests below race those releases against each other, against misdescribed releases, and
// against trims, and check that a piece parked by another thread serves a request before the
// pool grows.

TEST_CASE("a span released on another thread parks there and serves the owner's next request without growing", "[pool][concurrency]") {
    test::heap_upstream upstream;
    auto ledger = upstream.ledger();
    pool_allocator<test::heap_upstream> pool(upstream);
    for (int round = 0; round < 20; ++round) {
        auto live = pool.allocate(4 * mib, 64).value();
        std::memset(live.address, round, live.size);
        std::atomic<bool> released{false};
        std::thread releaser([&] { released = pool.release(live).has_value(); });
        releaser.join();
        REQUIRE(released.load());
        CHECK(pool.usage().idle_bytes == 4 * mib);
        // A smaller request of another bin: the pool flushes the releaser's cache, then splits.
        auto quarter = pool.allocate(1 * mib, 64).value();
        CHECK(quarter.address == live.address);
        REQUIRE(pool.release(quarter).has_value());
    }
    CHECK(ledger->allocations == 1);
    CHECK(pool.usage().held_bytes == 4 * mib);
    CHECK(pool.usage().live_allocations == 0);
}

TEST_CASE("two threads releasing the same span, a third misdescribing it: one succeeds, the rest change nothing", "[pool][concurrency]") {
    pool_allocator<test::fake_device_upstream> pool{test::fake_device_upstream{}};
    for (int round = 0; round < 300; ++round) {
        const std::uint64_t size = round % 3 == 0 ? 100000 : 2 * mib;
        auto live = pool.allocate(size, 64).value();
        auto misdescribed = live;
        misdescribed.size += 4096;
        std::atomic<int> succeeded{0};
        std::atomic<int> wrongly_refused{0};
        auto release_it = [&] {
            auto released = pool.release(live);
            if (released.has_value()) {
                ++succeeded;
            } else if (released.error().code != status_code::unknown_allocation) {
                ++wrongly_refused;
            }
        };
        std::thread first(release_it);
        std::thread second(release_it);
        std::thread third([&] {
            auto released = pool.release(misdescribed);
            // Live and misdescribed, or already released: never a success.
            if (released.has_value() || (released.error().code != status_code::invalid_argument &&
                                         released.error().code != status_code::unknown_allocation)) {
                ++wrongly_refused;
            }
        });
        first.join();
        second.join();
        third.join();
        REQUIRE(succeeded.load() == 1);
        REQUIRE(wrongly_refused.load() == 0);
        REQUIRE(pool.usage().live_allocations == 0);
    }
    pool.trim(0);
    CHECK(pool.usage().held_bytes == 0);
}

TEST_CASE("span round trips on several threads race trims and usage: figures stay whole, nothing is lost", "[pool][concurrency]") {
    constexpr int threads = 3;
    constexpr int rounds = 3000;
    test::heap_upstream upstream;
    auto ledger = upstream.ledger();
    {
        pool_allocator<test::heap_upstream> pool(upstream);
        std::atomic<int> failures{0};
        std::atomic<bool> done{false};
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                static constexpr std::uint64_t sizes[] = {20000, 64 * 1024, 300000, 2 * mib};
                std::vector<allocation<cpu_device>> mine;
                for (int round = 0; round < rounds; ++round) {
                    const std::uint64_t size = sizes[static_cast<std::size_t>(round + t) % std::size(sizes)];
                    auto made = pool.allocate(size, 4096);
                    if (!made.has_value()) {
                        ++failures;
                        continue;
                    }
                    std::memset(made.value().address, pattern_of(made.value()), 64);
                    mine.push_back(made.value());
                    if (mine.size() >= 3) {
                        for (const auto& live : mine) {
                            failures += pattern_intact(live, pattern_of(live), 64) ? 0 : 1;
                            failures += pool.release(live).has_value() ? 0 : 1;
                        }
                        mine.clear();
                    }
                }
                for (const auto& live : mine) {
                    failures += pool.release(live).has_value() ? 0 : 1;
                }
            });
        }
        std::thread trimmer([&] {
            while (!done.load()) {
                pool.trim(0);
                const pool_usage now = pool.usage();
                // At most three live a thread: a count that wrapped below zero would be huge.
                constexpr std::uint64_t most_live = 3 * threads;
                if (now.live_allocations > most_live || now.in_use_bytes > most_live * 2 * mib) {
                    ++failures;
                }
                std::this_thread::yield();
            }
        });
        for (auto& worker : workers) {
            worker.join();
        }
        done = true;
        trimmer.join();
        CHECK(failures.load() == 0);
        CHECK(pool.usage().live_allocations == 0);
        CHECK(pool.usage().in_use_bytes == 0);
        pool.trim(0);
        CHECK(pool.usage().held_bytes == 0);
        CHECK(pool.usage().idle_bytes == 0);
        CHECK(ledger->live_count() == 0);
    }
    CHECK(ledger->bad_releases == 0);
}

namespace {

// A host stand-in for a device: one thread per stream runs the stream's queued kernels in order,
// each after the one before, and marks it complete on the timeline when it has run.
class host_device {
public:
    host_device(std::shared_ptr<test::host_timeline> timeline, std::uint32_t streams) : timeline_(std::move(timeline)) {
        for (std::uint32_t stream = 0; stream < streams; ++stream) {
            queues_.emplace_back();
        }
        for (std::uint32_t stream = 0; stream < streams; ++stream) {
            runners_.emplace_back([this, stream] { run(stream); });
        }
    }
    ~host_device() { finish(); }

    // Queues `kernel` on `stream` (its number on the timeline is the stream's submitted count).
    void enqueue(std::uint32_t stream, std::function<void()> kernel) {
        std::lock_guard lock(mutex_);
        queues_[stream].push_back({timeline_->submit(stream), std::move(kernel)});
        changed_.notify_all();
    }
    // Queues on `stream` a wait for `fence` (what cuStreamWaitEvent queues).
    void enqueue_wait(std::uint32_t stream, test::host_timeline_fence fence) {
        enqueue(stream, [this, fence] {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] { return timeline_->completed(fence.stream) >= fence.count; });
        });
    }
    // Runs what is queued, then stops the runners.
    void finish() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
            changed_.notify_all();
        }
        for (auto& runner : runners_) {
            if (runner.joinable()) {
                runner.join();
            }
        }
    }

private:
    struct kernel_item {
        std::uint64_t number;
        std::function<void()> kernel;
    };
    void run(std::uint32_t stream) {
        for (;;) {
            kernel_item item;
            {
                std::unique_lock lock(mutex_);
                changed_.wait(lock, [&] { return stopping_ || !queues_[stream].empty(); });
                if (queues_[stream].empty()) {
                    return;
                }
                item = std::move(queues_[stream].front());
                queues_[stream].pop_front();
            }
            item.kernel();
            std::lock_guard lock(mutex_);
            timeline_->complete_through(stream, item.number);
            changed_.notify_all();
        }
    }

    std::shared_ptr<test::host_timeline> timeline_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<std::deque<kernel_item>> queues_;
    bool stopping_ = false;
    std::vector<std::thread> runners_;
};

// The waiting policy, its waits queued on the host device.
class host_device_waiting_policy : public test::host_timeline_policy_base {
public:
    host_device_waiting_policy(std::shared_ptr<test::host_timeline> timeline, host_device& device)
        : host_timeline_policy_base(std::move(timeline)), device_(&device) {}
    result<void> wait(std::uint32_t stream, const fence_type& fence) {
        timeline_->waits_inserted.fetch_add(1, std::memory_order_relaxed);
        device_->enqueue_wait(stream, fence);
        return boost::outcome_v2::success();
    }

private:
    host_device* device_;
};

// Host threads allocate on three streams in turn, queue a kernel that fills the block with their
// pattern and then checks it, sometimes a second stream's kernel that reads it after the fill
// (record_stream),
// and release it at once, while the kernels have not run; another thread collects. A block
// handed to a stream before the kernels of the stream that released it ran would be written by
// both: the checks fail (and ThreadSanitizer reports the writes).
template <class Policy, class MakePolicy> void streams_race_their_kernels(MakePolicy make_policy) {
    constexpr std::uint32_t streams = 3;
    constexpr int threads = 3;
    constexpr int rounds = 150;
    auto timeline = std::make_shared<test::host_timeline>();
    test::heap_upstream upstream;
    auto ledger = upstream.ledger();
    std::atomic<int> failures{0};
    {
        host_device device(timeline, streams);
        using pooled = pool_allocator<test::heap_upstream>;
        stream_ordered_pool<pooled, Policy> layer(std::in_place, make_policy(timeline, device), stream_pool_options{}, upstream);
        std::atomic<bool> done{false};
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                for (int round = 0; round < rounds; ++round) {
                    const auto stream = static_cast<std::uint32_t>((t + round) % streams);
                    const std::uint64_t size = (t + round) % 2 == 0 ? 512 : 8192;
                    auto made = layer.allocate(size, 64, stream);
                    if (!made.has_value()) {
                        ++failures;
                        continue;
                    }
                    const allocation<cpu_device> live = made.value();
                    const auto pattern = static_cast<unsigned char>(1 + (t * rounds + round) % 251);
                    device.enqueue(stream, [&failures, live, pattern] {
                        std::memset(live.address, pattern, live.size);
                        std::this_thread::yield();
                        failures += pattern_intact(live, pattern) ? 0 : 1;
                    });
                    if (round % 5 == 0) {
                        const std::uint32_t reader = (stream + 1) % streams;
                        failures += layer.record_stream(live, reader).has_value() ? 0 : 1;
                        // The reader is ordered after the fill, as an engine orders it (an event).
                        device.enqueue_wait(reader, {stream, timeline->submitted(stream)});
                        device.enqueue(reader, [&failures, live, pattern] {
                            failures += pattern_intact(live, pattern) ? 0 : 1;
                        });
                    }
                    failures += layer.deallocate(live, stream).has_value() ? 0 : 1;
                }
            });
        }
        std::thread collector([&] {
            while (!done.load()) {
                layer.collect();
                (void)layer.usage();
                std::this_thread::yield();
            }
        });
        for (auto& worker : workers) {
            worker.join();
        }
        done = true;
        collector.join();
        device.finish();
        layer.collect();
        CHECK(layer.usage().pending_allocations == 0);
        CHECK(layer.below().usage().live_allocations == 0);
    }
    CHECK(failures.load() == 0);
    CHECK(ledger->live_count() == 0);
    CHECK(timeline->fences_retired.load() == timeline->fences_recorded.load());
}

} // namespace

TEST_CASE("streams race their queued kernels through the stream-ordered layer: no block changes hands before "
          "its kernels ran",
          "[pool][concurrency][streams]") {
    SECTION("a policy that polls fences") {
        streams_race_their_kernels<test::host_timeline_policy>(
            [](std::shared_ptr<test::host_timeline> timeline, host_device&) { return test::host_timeline_policy(std::move(timeline)); });
    }
    SECTION("a policy that queues waits") {
        streams_race_their_kernels<host_device_waiting_policy>([](std::shared_ptr<test::host_timeline> timeline, host_device& device) {
            return host_device_waiting_policy(std::move(timeline), device);
        });
    }
}
