// Two threads allocate, commit, write, decommit, map a shared prefix and release through one
// posix-lazy allocator (and one posix-eager allocator) at once, and then work on the same
// allocation; mapped_bytes must come out exact and every counter at zero, and the module must
// unload. Run under ThreadSanitizer by scripts/test. Bounded by iteration counts, never by sleeping.
#include "posix_support.hpp"

#include <atomic>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::page_size;
using nxmem::test::value_or_fail;

namespace {

constexpr int worker_count = 2;
constexpr int iterations = 300;

struct allocators {
    host::plugin_allocator<cpu_device>& lazy;
    host::virtual_backing_view<cpu_device>& backing;
    host::shared_mapping_view<cpu_device>& mapping;
    const host::shared_prefix& prefix;
    host::plugin_allocator<cpu_device>& eager;
};

// One worker's loop; returns the number of operations that failed or misreported.
int work(allocators& use, int seed) {
    const std::uint64_t page = page_size();
    int failures = 0;
    const auto count = [&failures](bool ok) { failures += ok ? 0 : 1; };
    std::vector<allocation<cpu_device>> held;
    for (int i = 0; i < iterations; ++i) {
        const std::uint64_t pages = 2 + static_cast<std::uint64_t>((seed * 7 + i) % 6);
        auto made = use.lazy.allocate(pages * page + 100, page);
        if (!made) {
            ++failures;
            continue;
        }
        const allocation<cpu_device> live = made.value();
        count(use.backing.commit(live, {0, pages * page}).has_value());
        std::memset(live.address, seed + 1, pages * page);
        count(use.backing.commit(live, {pages * page, 100}).has_value()); // the partial page
        count(use.backing.decommit(live, {page, page}).has_value());
        auto mapped = use.backing.mapped_bytes(live);
        count(mapped && mapped.value() == (pages - 1) * page + 100);
        if (i % 4 == 0) {
            count(use.mapping.commit_prefix(live, use.prefix).has_value());
        }
        auto eager = use.eager.allocate(1 + static_cast<std::uint64_t>(i % 3) * (200 << 10), 64);
        if (eager) {
            std::memset(eager.value().address, seed + 1, eager.value().size);
            count(use.eager.release(eager.value()).has_value());
        } else {
            ++failures;
        }
        switch (i % 3) {
        case 0:
            count(use.lazy.release(live).has_value());
            break;
        case 1:
            count(use.lazy.enqueue_release(live).has_value());
            count(use.lazy.drain_releases().has_value());
            break;
        default:
            held.push_back(live);
            break;
        }
    }
    for (const auto& live : held) {
        count(use.lazy.release(live).has_value());
    }
    return failures;
}

} // namespace

TEST_CASE("concurrent allocate, commit, decommit and release on posix allocators leave every "
          "counter at zero",
          "[posix][concurrency]") {
    const std::string path = test::posix_plugin_path();
    auto module = load_or_fail(path);
    {
        std::atomic<int> reclaims{0};
        auto accepting = [&reclaims](const host::reclaim_request&) -> result<void> {
            reclaims.fetch_add(1);
            return boost::outcome_v2::success();
        };
        // Budgets large enough never to refuse: the atomic charge path runs on every call.
        auto lazy = value_or_fail(
            host::open_allocator<cpu_device>(module, "posix-lazy", 0, "budget=1G", accepting));
        auto eager = value_or_fail(
            host::open_allocator<cpu_device>(module, "posix-eager", 0, "budget=1G", accepting));
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(page_size()));
        allocators use{lazy, backing, mapping, prefix, eager};

        std::atomic<int> failures{0};
        std::latch start(worker_count);
        std::vector<std::thread> workers;
        for (int seed = 0; seed < worker_count; ++seed) {
            workers.emplace_back([&, seed] {
                start.arrive_and_wait();
                failures += work(use, seed);
            });
        }
        for (auto& worker : workers) {
            worker.join();
        }
        CHECK(failures.load() == 0);
        CHECK(reclaims.load() == 0);
        REQUIRE(lazy.drain_releases());
        REQUIRE(mapping.release_prefix(prefix));
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocations == 0);
        CHECK(readiness.plugin.views == 0);
        CHECK(readiness.plugin.shared_prefixes == 0);
        CHECK(readiness.plugin.queued_releases == 0);
    }
    auto idle = value_or_fail(module->readiness());
    CHECK(idle.ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}

TEST_CASE("two threads committing and decommitting halves of one allocation keep mapped_bytes "
          "exact",
          "[posix][concurrency]") {
    const std::uint64_t page = page_size();
    const std::string path = test::posix_plugin_path();
    auto module = load_or_fail(path);
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        constexpr std::uint64_t half_pages = 16;
        const auto live = value_or_fail(lazy.allocate(2 * half_pages * page, page));
        std::atomic<int> failures{0};
        std::latch start(worker_count);
        std::vector<std::thread> workers;
        for (int half = 0; half < worker_count; ++half) {
            workers.emplace_back([&, half] {
                start.arrive_and_wait();
                const std::uint64_t base = static_cast<std::uint64_t>(half) * half_pages * page;
                auto* bytes = static_cast<unsigned char*>(live.address) + base;
                for (int i = 0; i < iterations; ++i) {
                    const std::uint64_t pages = 1 + static_cast<std::uint64_t>(i) % half_pages;
                    failures += backing.commit(live, {base, pages * page}) ? 0 : 1;
                    bytes[pages * page - 1] = static_cast<unsigned char>(i);
                    failures += backing.mapped_bytes(live) ? 0 : 1;
                    failures += backing.decommit(live, {base + page * (pages / 2), page}) ? 0 : 1;
                }
                // Leaves exactly its first page committed.
                failures += backing.decommit(live, {base, half_pages * page}) ? 0 : 1;
                failures += backing.commit(live, {base, page}) ? 0 : 1;
            });
        }
        for (auto& worker : workers) {
            worker.join();
        }
        CHECK(failures.load() == 0);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * page);
        CHECK(value_or_fail(lazy.release(live)).unmapped_bytes == 2 * page);
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}
