// Threads allocate, commit, release and enqueue through one allocator while another polls the
// unload gate. Run under ThreadSanitizer by scripts/test. Bounded by iteration counts, never by
// sleeping.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <latch>
#include <string>
#include <thread>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;

namespace {

constexpr int worker_count = 3;
constexpr int iterations = 400;

// One worker's loop; returns the number of operations that failed.
int work(host::plugin_allocator<cpu_device>& lazy, host::virtual_backing_view<cpu_device>& backing,
         host::shared_mapping_view<cpu_device>& mapping, const host::shared_prefix& prefix,
         int seed) {
    int failures = 0;
    std::vector<allocation<cpu_device>> held;
    for (int i = 0; i < iterations; ++i) {
        const std::uint64_t pages = 1 + static_cast<std::uint64_t>((seed + i) % 4);
        auto made = lazy.allocate(pages * 4096 + 4096, 4096);
        if (!made) {
            ++failures;
            continue;
        }
        failures += backing.commit(made.value(), {0, pages * 4096}).has_value() ? 0 : 1;
        if (i % 5 == 0) {
            failures += mapping.commit_prefix(made.value(), prefix).has_value() ? 0 : 1;
        }
        failures += backing.decommit(made.value(), {0, 4096}).has_value() ? 0 : 1;
        switch (i % 3) {
        case 0:
            failures += lazy.release(made.value()).has_value() ? 0 : 1;
            break;
        case 1:
            failures += lazy.enqueue_release(made.value()).has_value() ? 0 : 1;
            failures += lazy.drain_releases().has_value() ? 0 : 1;
            break;
        default:
            held.push_back(made.value());
            break;
        }
    }
    for (const auto& made : held) {
        failures += lazy.release(made).has_value() ? 0 : 1;
    }
    return failures;
}

} // namespace

TEST_CASE("concurrent allocate, commit, release and enqueue leave every counter at zero",
          "[concurrency]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto backing = test::value_or_fail(lazy.virtual_backing());
        auto mapping = test::value_or_fail(lazy.shared_mapping());
        auto prefix = test::value_or_fail(mapping.create_prefix(4096));

        std::atomic<int> failures{0};
        std::atomic<int> finished{0};
        std::atomic<int> unload_granted{0};
        std::atomic<int> polls{0};
        std::latch start(worker_count + 1); // everyone begins together
        std::vector<std::thread> workers;
        for (int seed = 0; seed < worker_count; ++seed) {
            workers.emplace_back([&, seed] {
                start.arrive_and_wait();
                failures += work(lazy, backing, mapping, prefix, seed);
                finished.fetch_add(1);
            });
        }
        std::thread poller([&] {
            // Polls until every worker is done: the gate must stay shut all the while.
            start.arrive_and_wait();
            do {
                auto readiness = module->readiness();
                if (!readiness) {
                    failures.fetch_add(1);
                }
                if (module->try_unload()) {
                    unload_granted.fetch_add(1);
                }
                polls.fetch_add(1);
            } while (finished.load() < worker_count);
        });
        for (auto& worker : workers) {
            worker.join();
        }
        poller.join();
        CHECK(failures.load() == 0);
        CHECK(unload_granted.load() == 0);
        INFO("the poller checked the gate " << polls.load() << " times");

        // Everything queued retires; then only the allocator, its views and the prefix remain.
        REQUIRE(lazy.drain_releases());
        REQUIRE(mapping.release_prefix(prefix));
        auto readiness = test::value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocations == 0);
        CHECK(readiness.plugin.queued_releases == 0);
        CHECK(readiness.plugin.shared_prefixes == 0);
        CHECK(readiness.plugin.views == 0);
        CHECK(readiness.host.allocations == 0);
        CHECK(readiness.host.queued_releases == 0);
        CHECK(readiness.host.shared_prefixes == 0);
    }
    auto idle = test::value_or_fail(module->readiness());
    CHECK(idle.ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}
