// The pool over the posix plugin: posix-eager (growth by allocation), posix-lazy (growth by
// commit through its virtual backing), the reclaim hook that trims the pool when the plugin's
// budget runs out, and unload once the pool is gone.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>
#include <nxmem/host/pooled_allocator.hpp>

#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <cstring>
#include <vector>

using namespace nxmem;

namespace {
constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

std::string posix_path() { return test::plugin_path("NXMEM_POSIX_PLUGIN"); }

template <class T> T value_or_fail(result<T> made) {
    if (!made.has_value()) {
        FAIL(made.error().describe());
    }
    return std::move(made).value();
}

template <class Pool> allocator_usage plugin_usage(Pool& pool) {
    return value_or_fail(pool.upstream().query_usage());
}
} // namespace

TEST_CASE("pooled posix-eager: one crossing per chunk, and after trim(0) the plugin holds nothing and unloads", "[pool][posix]") {
    {
        auto module = test::load_or_fail(posix_path());
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager"));
        CHECK_FALSE(pool->grows_by_commit());
        std::vector<allocation<cpu_device>> live;
        for (int i = 0; i < 20000; ++i) { // 1.25 MiB of 64 B blocks: one 2 MiB chunk
            live.push_back(value_or_fail(pool->allocate(64, 16)));
            std::memset(live.back().address, 0xab, 64);
        }
        CHECK(pool->usage().upstream_allocations == 1);
        CHECK(plugin_usage(*pool).live_allocations == 1);
        for (const auto& one : live) {
            REQUIRE(pool->release(one));
        }
        // 2 MiB allocate + write + release, again and again: one upstream allocation in all.
        for (int cycle = 0; cycle < 20; ++cycle) {
            auto span = value_or_fail(pool->allocate(2 * mib, 64));
            std::memset(span.address, cycle, span.size);
            REQUIRE(pool->release(span));
        }
        CHECK(pool->usage().upstream_allocations == 2);
        CHECK(pool->trim(0) > 0);
        CHECK(pool->usage().held_bytes == 0);
        CHECK(plugin_usage(*pool).live_allocations == 0);
        CHECK(plugin_usage(*pool).mapped_bytes == 0);
        CHECK_FALSE(module->try_unload()); // the pool still holds the allocator open
        pool.reset();
        REQUIRE(module->try_unload());
    }
    CHECK_FALSE(test::is_mapped(posix_path()));
}

TEST_CASE("destroying a pool with idle memory gives it back, and the module unloads", "[pool][posix]") {
    {
        auto module = test::load_or_fail(posix_path());
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager"));
        auto small = value_or_fail(pool->allocate(100, 8));
        auto large = value_or_fail(pool->allocate(300 * kib, 8));
        REQUIRE(pool->release(small));
        REQUIRE(pool->release(large));
        CHECK(pool->usage().idle_bytes > 0);
        pool.reset();
        REQUIRE(module->try_unload());
    }
    CHECK_FALSE(test::is_mapped(posix_path()));
}

TEST_CASE("pooled posix-lazy grows by commit: one reservation, chunks committed as it grows, decommitted by trim", "[pool][posix]") {
    auto module = test::load_or_fail(posix_path());
    pool_options pooling;
    pooling.reserve_bytes = 1ull << 30;
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy", 0, {}, pooling));
    REQUIRE(pool->grows_by_commit());
    const std::uint64_t chunk = pool->chunk_bytes();
    std::vector<allocation<cpu_device>> live;
    for (std::uint64_t made = 0; made <= chunk; made += 4 * kib) { // one block past a chunk
        live.push_back(value_or_fail(pool->allocate(4 * kib, 64)));
        std::memset(live.back().address, 0x3c, live.back().size); // committed: writable
    }
    CHECK(pool->usage().upstream_allocations == 1); // the reservation only
    CHECK(pool->usage().upstream_commits == 2);
    CHECK(plugin_usage(*pool).mapped_bytes == 2 * chunk);
    for (const auto& one : live) {
        REQUIRE(pool->release_by_address(one.address));
    }
    CHECK(pool->trim(0) == 2 * chunk);
    CHECK(pool->usage().upstream_decommits == 2);
    CHECK(plugin_usage(*pool).mapped_bytes == 0);
    // Spans are pieces of the reservation's arena: committed once, and reused.
    for (int cycle = 0; cycle < 10; ++cycle) {
        auto span = value_or_fail(pool->allocate(2 * mib, 64));
        std::memset(span.address, cycle, span.size);
        REQUIRE(pool->release(span));
    }
    CHECK(pool->usage().upstream_allocations == 1);
    CHECK(pool->usage().upstream_commits == 3);
    CHECK(plugin_usage(*pool).mapped_bytes == 2 * mib);
    // Spans of mixed sizes, some released in between: the arena grows by what it lacks, and
    // trim(0) with nothing live leaves the plugin holding nothing but the reservation.
    std::vector<allocation<cpu_device>> spans;
    for (std::uint64_t size : {300 * kib, 2 * mib, 5 * mib, 64 * kib, 1 * mib}) {
        spans.push_back(value_or_fail(pool->allocate(size, 64)));
        std::memset(spans.back().address, 0x5e, size);
    }
    REQUIRE(pool->release(spans[1]));
    spans.erase(spans.begin() + 1);
    CHECK(pool->trim(0) == 2 * mib);
    spans.push_back(value_or_fail(pool->allocate(1536 * kib, 64))); // in the decommitted hole
    std::memset(spans.back().address, 0x5f, spans.back().size);
    CHECK(pool->usage().held_bytes == plugin_usage(*pool).mapped_bytes);
    for (const auto& span : spans) {
        REQUIRE(pool->release_by_address(span.address));
    }
    pool->trim(0);
    CHECK(pool->usage().held_bytes == 0);
    CHECK(plugin_usage(*pool).mapped_bytes == 0);
    CHECK(plugin_usage(*pool).live_allocations == 1); // the reservation
    CHECK(pool->usage().upstream_allocations == 1);
    pool.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("reclaim under a posix budget trims the pool before an allocation fails", "[pool][posix]") {
    auto module = test::load_or_fail(posix_path());
    auto fill_cache = [](auto& pool) {
        std::vector<allocation<cpu_device>> spans;
        for (int i = 0; i < 3; ++i) {
            spans.push_back(value_or_fail(pool.allocate(1 * mib, 64)));
        }
        for (const auto& span : spans) {
            REQUIRE(pool.release(span));
        }
        REQUIRE(pool.usage().idle_bytes == 3 * mib);
    };
    SECTION("pooled with the hook: the cached spans go back and the allocation succeeds") {
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager", 0, "budget=4M"));
        fill_cache(*pool);
        auto larger = value_or_fail(pool->allocate(2 * mib, 64)); // another bin: 3 + 2 > 4 MiB
        CHECK(pool->usage().idle_bytes == 0);
        CHECK(pool->usage().upstream_releases == 3);
        CHECK(pool->usage().held_bytes == 2 * mib);
        REQUIRE(pool->release(larger));
        pool.reset();
        REQUIRE(module->try_unload());
    }
    SECTION("the engine's hook runs after the pool's trim") {
        int engine_calls = 0;
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(
            module, "posix-eager", 0, "budget=4M", {}, [&](const host::reclaim_request& request) -> result<void> {
                ++engine_calls;
                CHECK(request.bytes_needed > 0);
                return boost::outcome_v2::success();
            }));
        fill_cache(*pool);
        auto larger = value_or_fail(pool->allocate(2 * mib, 64));
        CHECK(engine_calls == 1);
        REQUIRE(pool->release(larger));
    }
    SECTION("without a hook, the same allocation fails with OUT_OF_MEMORY and changes nothing") {
        pool_allocator pool(value_or_fail(host::open_allocator<cpu_device>(module, "posix-eager", 0, "budget=4M")));
        fill_cache(pool);
        const pool_usage before = pool.usage();
        auto refused = pool.allocate(2 * mib, 64);
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget"));
        CHECK(pool.usage() == before);
    }
    SECTION("growing by commit (posix-lazy): a commit past the budget decommits free arena pieces first") {
        pool_options pooling;
        pooling.reserve_bytes = 1ull << 30;
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy", 0, "budget=4M", pooling));
        REQUIRE(pool->grows_by_commit());
        auto lower = value_or_fail(pool->allocate(1 * mib, 64));
        auto upper = value_or_fail(pool->allocate(2 * mib, 64));
        REQUIRE(pool->release(lower)); // 1 MiB free, committed, below a live piece
        auto more = value_or_fail(pool->allocate(2 * mib, 64)); // 1 + 2 + 2 > 4 MiB: reclaim first
        std::memset(more.address, 0x4d, more.size);
        CHECK(pool->usage().upstream_decommits == 1);
        CHECK(pool->usage().held_bytes == 4 * mib);
        CHECK(plugin_usage(*pool).mapped_bytes == 4 * mib);
        REQUIRE(pool->release(upper));
        REQUIRE(pool->release(more));
        pool->trim(0);
        CHECK(plugin_usage(*pool).mapped_bytes == 0);
        pool.reset();
        REQUIRE(module->try_unload());
    }
    SECTION("nothing idle to give: the hook refuses and the allocation fails with OUT_OF_MEMORY") {
        auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager", 0, "budget=4M"));
        auto held = value_or_fail(pool->allocate(3 * mib, 64));
        auto refused = pool->allocate(2 * mib, 64);
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        REQUIRE(pool->release(held));
    }
}

TEST_CASE("a pooled 2 MiB allocate + write every page + release faults no page in steady state", "[pool][posix]") {
    auto module = test::load_or_fail(posix_path());
    auto minor_faults = [] {
        rusage now{};
        ::getrusage(RUSAGE_SELF, &now);
        return now.ru_minflt;
    };
    auto cycle = [](auto& allocator) {
        auto span = value_or_fail(allocator.allocate(2 * mib, 64));
        std::memset(span.address, 0x11, span.size);
        REQUIRE(allocator.release(span));
    };
    constexpr int cycles = 32;
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager"));
    cycle(*pool); // the first cycle faults the span in
    const long pooled_before = minor_faults();
    for (int i = 0; i < cycles; ++i) {
        cycle(*pool);
    }
    const long pooled = minor_faults() - pooled_before;
    // Unpooled, every cycle maps fresh pages and faults each of the 512 in again.
    auto direct = value_or_fail(host::open_allocator<cpu_device>(module, "posix-eager"));
    const long direct_before = minor_faults();
    for (int i = 0; i < cycles; ++i) {
        cycle(direct);
    }
    const long unpooled = minor_faults() - direct_before;
    INFO("minor faults over " << cycles << " cycles: pooled " << pooled << ", unpooled " << unpooled);
    CHECK(pooled < cycles); // fewer than one a cycle (the process's other faults included)
    CHECK(unpooled >= cycles * 256);
}
