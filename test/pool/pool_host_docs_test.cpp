// What docs/HOST.md "Pools" tells an engine author, run over the posix plugin: the KV example with
// a shared prefix beside a pool, the reservation reported apart from the memory held, a lease
// that keeps the reclaim hook from taking the pool's memory, and an engine hook beside a pool
// that succeeds when it evicts nothing.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>
#include <nxmem/host/pooled_allocator.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

using namespace nxmem;
using test::value_or_fail;

namespace {
constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

std::string posix_path() { return test::plugin_path("NXMEM_POSIX_PLUGIN"); }

// HOST.md's KV example: the prompt's KV is one shared prefix mapped at the start of each
// sequence's own plugin allocation; each sequence's later blocks come from the pool.
result<void> serve_sequences(host::pooled_plugin_allocator<cpu_device>& pool, std::uint64_t prompt_bytes,
                             std::uint64_t block_bytes, int sequences) {
    auto& plugin = pool.upstream(); // host::plugin_allocator<cpu_device>&
    NXMEM_TRY(mapping, plugin.shared_mapping());
    NXMEM_TRY(prompt, mapping.create_prefix(prompt_bytes));
    std::vector<allocation<cpu_device>> heads;
    std::vector<allocation<cpu_device>> blocks;
    std::uint64_t newly_mapped = 0;
    for (int sequence = 0; sequence < sequences; ++sequence) {
        NXMEM_TRY(head, plugin.allocate(prompt_bytes, 4096)); // the plugin's: a prefix maps only there
        NXMEM_TRY(cost, mapping.commit_prefix(head, prompt));
        newly_mapped += cost.newly_mapped_bytes;
        if (sequence == 0) {
            std::memset(head.address, 0x6b, prompt_bytes); // the prompt's KV, written once
        }
        heads.push_back(head);
        NXMEM_TRY(block, pool.allocate(block_bytes, 256)); // the sequence's own tokens: pooled
        std::memset(block.address, sequence, block_bytes);
        blocks.push_back(block);
    }
    CHECK(newly_mapped == prompt_bytes); // costed once
    for (const auto& head : heads) {
        CHECK(static_cast<const unsigned char*>(head.address)[prompt_bytes - 1] == 0x6b); // shared
    }
    CHECK(pool.usage().live_allocations == static_cast<std::uint64_t>(sequences));
    for (const auto& block : blocks) {
        NXMEM_TRY(released, pool.release(block));
        (void)released;
    }
    for (const auto& head : heads) {
        NXMEM_TRY(released, plugin.release(head)); // drops its mapping's reference
        (void)released;
    }
    NXMEM_TRY_VOID(mapping.release_prefix(prompt));
    return boost::outcome_v2::success();
}
} // namespace

TEST_CASE("HOST.md Pools: a KV cache with a shared prompt prefix beside a pool", "[pool][posix][docs]") {
    auto module = test::load_or_fail(posix_path());
    pool_options pooling;
    pooling.reserve_bytes = 1ull << 30;
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy", 0, {}, pooling));
    value_or_fail(serve_sequences(*pool, 256 * kib, 64 * kib, 8));
    CHECK(pool->usage().live_allocations == 0);
    pool->trim(0);
    pool.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("HOST.md Pools: the reservation is reported apart from the memory held", "[pool][posix][docs]") {
    auto module = test::load_or_fail(posix_path());
    pool_options pooling;
    pooling.reserve_bytes = 1ull << 30;
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy", 0, {}, pooling));
    REQUIRE(pool->grows_by_commit());
    CHECK(pool->reserved_bytes() == 1ull << 30);
    auto span = value_or_fail(pool->allocate(1 * mib, 64));
    auto block = value_or_fail(pool->allocate(64, 16));
    const pool_usage held = pool->usage();
    const allocator_usage plugin = value_or_fail(pool->upstream().query_usage());
    CHECK(held.held_bytes == 1 * mib + pool->chunk_bytes());
    CHECK(plugin.mapped_bytes == held.held_bytes);          // memory: the same figure both sides
    CHECK(plugin.reserved_bytes >= pool->reserved_bytes()); // address space: the reservation
    CHECK(plugin.live_allocations == 1);
    REQUIRE(pool->release(span));
    REQUIRE(pool->release(block));
    pool_options by_allocation;
    by_allocation.growth = pool_growth::by_allocation;
    auto eager = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-lazy", 0, {}, by_allocation));
    CHECK(eager->reserved_bytes() == 0);
}

TEST_CASE("HOST.md Pools: under a lease the reclaim hook takes nothing from the pool; an engine hook that "
          "evicts nothing succeeds beside it",
          "[pool][posix][docs]") {
    auto module = test::load_or_fail(posix_path());
    int evictions = 0;
    host::reclaim_function evict = [&](const host::reclaim_request&) -> result<void> {
        ++evictions; // nothing to evict here
        return boost::outcome_v2::success();
    };
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager", 0, "budget=4M", {}, evict));
    std::vector<allocation<cpu_device>> spans;
    for (int i = 0; i < 3; ++i) {
        spans.push_back(value_or_fail(pool->allocate(1 * mib, 64)));
    }
    for (const auto& span : spans) {
        REQUIRE(pool->release(span));
    }
    REQUIRE(pool->usage().idle_bytes == 3 * mib);
    {
        pool_lease lease = pool->lease();
        auto refused = pool->allocate(2 * mib, 64); // 3 + 2 > 4 MiB, and the pool may not give back
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK(pool->usage().idle_bytes == 3 * mib);
        CHECK(pool->usage().upstream_releases == 0);
    }
    const int before = evictions;
    auto larger = value_or_fail(pool->allocate(2 * mib, 64)); // the pool's trim frees enough
    CHECK(evictions == before + 1);
    CHECK(pool->usage().upstream_releases == 3);
    REQUIRE(pool->release(larger));
    pool.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("HOST.md Pools: an engine hook that fails when it evicts nothing refuses the plugin only when the "
          "pool's trim gave nothing back either",
          "[pool][posix][docs]") {
    auto module = test::load_or_fail(posix_path());
    int evictions = 0;
    host::reclaim_function evict = [&](const host::reclaim_request&) -> result<void> {
        ++evictions;
        return fail(status_code::host_refused, "nothing left to evict");
    };
    auto pool = value_or_fail(host::open_pooled_allocator<cpu_device>(module, "posix-eager", 0, "budget=4M", {}, evict));
    std::vector<allocation<cpu_device>> spans;
    for (int i = 0; i < 3; ++i) {
        spans.push_back(value_or_fail(pool->allocate(1 * mib, 64)));
    }
    REQUIRE(pool->release(spans.back()));
    spans.pop_back();
    // 2 MiB live, 1 MiB idle: 2 + 2 > 4 MiB, and the pool's trim of its idle 1 MiB frees enough.
    auto larger = value_or_fail(pool->allocate(2 * mib, 64));
    CHECK(evictions == 1);
    CHECK(pool->usage().upstream_releases == 1);
    // Nothing idle now: 4 MiB live, the trim gives nothing, and the hook's refusal is the answer.
    auto refused = pool->allocate(1 * mib, 64);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::out_of_memory);
    CHECK(evictions == 2);
    for (const auto& span : spans) {
        REQUIRE(pool->release(span));
    }
    REQUIRE(pool->release(larger));
    pool.reset();
    REQUIRE(module->try_unload());
}
