// pool_allocator over native upstreams: size classes, the checks on release, release by
// address, trim, retention, usage, out of memory, growth by commit, and a pool that never
// touches the memory it hands out.
#include "test_upstreams.hpp"

#include <nxmem/heap_allocator.hpp>
#include <nxmem/pool.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

using namespace nxmem;
using test::fake_device_upstream;
using test::heap_upstream;
using test::inaccessible_upstream;

namespace {
constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

template <class T> T value_or_fail(result<T> made) {
    if (!made.has_value()) {
        FAIL(made.error().describe());
    }
    return std::move(made).value();
}

// Makes one 4 MiB segment (allocated and released), four 1 MiB pieces split from it in address
// order, and releases them; returns them.
template <class Pool> std::vector<allocation<cpu_device>> released_quarters(Pool& pool) {
    REQUIRE(pool.release(value_or_fail(pool.allocate(4 * mib, 64))));
    std::vector<allocation<cpu_device>> quarters;
    for (int i = 0; i < 4; ++i) {
        quarters.push_back(value_or_fail(pool.allocate(1 * mib, 64)));
    }
    for (const auto& quarter : quarters) {
        REQUIRE(pool.release(quarter));
    }
    return quarters;
}

// Growth by commit in a small reservation: 32 chunks of 1 MiB below, a 32 MiB span arena above.
pool_options small_reservation() {
    pool_options options;
    options.reserve_bytes = 64 * mib;
    options.chunk_bytes = 1 * mib;
    return options;
}
} // namespace


TEST_CASE("a pool is a DeviceAllocator for cpu and cuda upstreams, and pools compose", "[pool]") {
    STATIC_REQUIRE(DeviceAllocator<pool_allocator<heap_upstream>>);
    STATIC_REQUIRE(DeviceAllocator<pool_allocator<fake_device_upstream>>);
    STATIC_REQUIRE(DeviceAllocator<pool_allocator<pool_allocator<fake_device_upstream>>>);
    STATIC_REQUIRE(std::is_same_v<pool_allocator<fake_device_upstream>::device_type, cuda_device>);
    STATIC_REQUIRE(!std::is_copy_constructible_v<pool_allocator<heap_upstream>>);
    STATIC_REQUIRE(!std::is_move_constructible_v<pool_allocator<heap_upstream>>);
}

TEST_CASE("size classes: every request fits its class, aligned, wasting at most a fifth", "[pool]") {
    for (std::uint64_t size = 1; size <= pool_classes::small_limit_bytes; ++size) {
        for (std::uint64_t alignment = 1; alignment <= 8 * kib; alignment *= 2) {
            const std::uint32_t size_class = pool_classes::class_of(size, alignment);
            const std::uint64_t rounded = pool_classes::round_up(size, alignment);
            if (rounded > pool_classes::small_limit_bytes) {
                REQUIRE(size_class == pool_classes::not_small);
                continue;
            }
            REQUIRE(size_class < pool_classes::small_class_count);
            const std::uint64_t block = pool_classes::class_bytes(size_class);
            REQUIRE(block >= size);
            REQUIRE(block % alignment == 0); // blocks of the class start at multiples of it
            if (alignment <= 16 && size > 128) {
                REQUIRE(block * 4 <= size * 5);
            }
        }
    }
    STATIC_REQUIRE(pool_classes::class_bytes(pool_classes::small_class_count - 1) ==
                   pool_classes::small_limit_bytes);
    STATIC_REQUIRE(pool_classes::class_of(64, 8) == 3);
    STATIC_REQUIRE(pool_classes::class_of(20 * kib, 8) == pool_classes::not_small);
    STATIC_REQUIRE(pool_classes::class_of(64, 128 * kib) == pool_classes::not_small);
    for (std::uint64_t bytes = 16 * kib + 1; bytes < 64 * mib; bytes = bytes * 9 / 8 + 1) {
        const std::uint64_t binned = pool_classes::bin_bytes(bytes, 4096);
        REQUIRE(binned >= bytes);
        REQUIRE(binned % 4096 == 0);
        REQUIRE(binned * 4 <= bytes * 5 + 4 * 4096);
        REQUIRE(pool_classes::bin_of(binned) < pool_classes::bin_count);
        REQUIRE(pool_classes::bin_of(binned) == pool_classes::bin_of(pool_classes::bin_bytes(binned, 4096)));
    }
}

TEST_CASE("small allocations come from one chunk: one upstream call for many", "[pool]") {
    heap_upstream upstream;
    auto ledger = upstream.ledger();
    pool_allocator pool(upstream);
    std::vector<allocation<cpu_device>> live;
    for (int i = 0; i < 1000; ++i) {
        live.push_back(value_or_fail(pool.allocate(64, 16)));
    }
    CHECK(ledger->allocations == 1);
    CHECK(pool.usage().upstream_allocations == 1);
    CHECK(pool.usage().held_bytes == pool.chunk_bytes());
    CHECK(pool.usage().in_use_bytes == 64000);
    CHECK(pool.usage().live_allocations == 1000);
    for (const auto& one : live) {
        REQUIRE(value_or_fail(pool.release(one)).state == release_state::complete);
    }
    CHECK(pool.usage().live_allocations == 0);
    CHECK(pool.usage().idle_bytes == pool.chunk_bytes());
    CHECK(pool.trim(0) == pool.chunk_bytes());
    CHECK(ledger->live_count() == 0);
    CHECK(pool.usage().held_bytes == 0);
    CHECK(ledger->bad_releases == 0);
}

TEST_CASE("ids are unique and never reused, even when the same block is handed out again", "[pool]") {
    pool_allocator pool(heap_upstream{});
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < 100; ++i) {
        auto one = value_or_fail(pool.allocate(64, 8));
        ids.push_back(one.allocation_id);
        auto large = value_or_fail(pool.allocate(100 * kib, 8));
        ids.push_back(large.allocation_id);
        REQUIRE(pool.release(one));
        REQUIRE(pool.release(large));
    }
    std::sort(ids.begin(), ids.end());
    CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
    CHECK(std::find(ids.begin(), ids.end(), 0u) == ids.end());
}

TEMPLATE_TEST_CASE("releases are checked as the host adapter checks them, and a refusal changes nothing",
                   "[pool]", heap_upstream, fake_device_upstream) {
    using D = typename TestType::device_type;
    pool_allocator<TestType> pool{TestType{}};
    const std::uint64_t size = GENERATE(64, 4096, 100 * 1024, 400 * 1024 * 1024ULL);
    auto live = value_or_fail(pool.allocate(size, 64));
    const pool_usage before = pool.usage();
    auto refused_with = [&](allocation<D> changed, status_code code) {
        auto released = pool.release(changed);
        REQUIRE_FALSE(released.has_value());
        CHECK(released.error().code == code);
        CHECK(pool.usage() == before);
    };
    SECTION("another mechanism") {
        auto other = live;
        other.mechanism_id += 1;
        refused_with(other, status_code::wrong_mechanism);
    }
    SECTION("another device") {
        auto other = live;
        other.device.index = 3;
        refused_with(other, status_code::wrong_device);
    }
    SECTION("a size or alignment no allocation has") {
        auto other = live;
        other.alignment = 3;
        refused_with(other, status_code::invalid_argument);
    }
    SECTION("an id never handed out") {
        auto other = live;
        other.allocation_id ^= std::uint64_t{1} << 40; // another generation
        refused_with(other, status_code::unknown_allocation);
        other.allocation_id = (std::uint64_t{1} << 33) | 0xfffff000ULL; // a slab never made
        refused_with(other, status_code::unknown_allocation);
    }
    SECTION("misdescribed: size, alignment or address") {
        auto other = live;
        other.size += 1;
        refused_with(other, status_code::invalid_argument);
        other = live;
        other.alignment = 128;
        refused_with(other, status_code::invalid_argument);
        other = live;
        other.address = D::from_wire(D::to_wire(live.address) + 64);
        refused_with(other, status_code::invalid_argument);
    }
    SECTION("twice") {
        REQUIRE(pool.release(live));
        const pool_usage after = pool.usage();
        auto again = pool.release(live);
        REQUIRE_FALSE(again.has_value());
        CHECK(again.error().code == status_code::unknown_allocation);
        CHECK(pool.usage() == after);
        auto by_address = pool.release_by_address(live.address);
        REQUIRE_FALSE(by_address.has_value());
        CHECK(by_address.error().code == status_code::unknown_allocation);
        return;
    }
    REQUIRE(pool.release(live));
    CHECK(pool.usage().live_allocations == 0);
}

TEST_CASE("a stale handle to a block handed out again is refused and does not release the new one", "[pool]") {
    pool_allocator pool(heap_upstream{});
    auto first = value_or_fail(pool.allocate(64, 8));
    REQUIRE(pool.release(first));
    auto second = value_or_fail(pool.allocate(64, 8));
    REQUIRE(second.address == first.address); // the same block, again
    REQUIRE(second.allocation_id != first.allocation_id);
    auto stale = pool.release(first);
    REQUIRE_FALSE(stale.has_value());
    CHECK(stale.error().code == status_code::unknown_allocation);
    CHECK(pool.usage().live_allocations == 1);
    REQUIRE(pool.release(second));
}

TEST_CASE("release by address finds small, large and pass-through allocations; interior addresses are refused", "[pool]") {
    pool_options options;
    options.pass_through_bytes = 1 * mib;
    pool_allocator pool(fake_device_upstream{}, options);
    auto small = value_or_fail(pool.allocate(48, 16));
    auto large = value_or_fail(pool.allocate(200 * kib, 4096));
    auto direct = value_or_fail(pool.allocate(3 * mib, 64));
    for (const auto& live : {small, large, direct}) {
        auto inside = pool.release_by_address(cuda_device::from_wire(cuda_device::to_wire(live.address) + 16));
        REQUIRE_FALSE(inside.has_value());
        CHECK(inside.error().code == status_code::unknown_allocation);
    }
    auto nowhere = pool.release_by_address(cuda_device::from_wire(16));
    REQUIRE_FALSE(nowhere.has_value());
    CHECK(nowhere.error().code == status_code::unknown_allocation);
    CHECK(pool.usage().live_allocations == 3);
    REQUIRE(pool.release_by_address(small.address));
    REQUIRE(pool.release_by_address(large.address));
    auto direct_report = value_or_fail(pool.release_by_address(direct.address));
    CHECK(direct_report.unmapped_bytes == 3 * mib); // the upstream's own report
    CHECK(pool.usage().live_allocations == 0);
    pool.trim(0);
    CHECK(pool.upstream().ledger()->live_count() == 0);
    CHECK(pool.upstream().ledger()->bad_releases == 0);
}

TEST_CASE("a released span is reused without calling the upstream", "[pool]") {
    pool_allocator pool(heap_upstream{});
    auto ledger = pool.upstream().ledger();
    for (int cycle = 0; cycle < 50; ++cycle) {
        auto span = value_or_fail(pool.allocate(2 * mib, 64));
        std::memset(span.address, cycle, span.size);
        REQUIRE(pool.release(span));
    }
    CHECK(ledger->allocations == 1);
    CHECK(pool.usage().upstream_allocations == 1);
    CHECK(pool.usage().idle_bytes == 2 * mib);
    CHECK(pool.trim(0) == 2 * mib);
    CHECK(ledger->live_count() == 0);
}

TEST_CASE("a free span piece is split for smaller requests and merged again when they come back", "[pool]") {
    pool_allocator pool(heap_upstream{});
    auto ledger = pool.upstream().ledger();
    REQUIRE(pool.release(value_or_fail(pool.allocate(4 * mib, 64))));
    REQUIRE(ledger->allocations == 1);
    // Three requests of other sizes, from the one idle 4 MiB segment.
    auto low = value_or_fail(pool.allocate(1 * mib, 64));
    auto middle = value_or_fail(pool.allocate(2 * mib, 64));
    auto high = value_or_fail(pool.allocate(1 * mib, 64));
    CHECK(ledger->allocations == 1);
    CHECK(static_cast<char*>(middle.address) == static_cast<char*>(low.address) + 1 * mib);
    CHECK(static_cast<char*>(high.address) == static_cast<char*>(middle.address) + 2 * mib);
    CHECK(pool.usage().idle_bytes == 0);
    std::memset(middle.address, 0x5a, middle.size);
    // The outer pieces come back first; the middle one, by address, merges with both free
    // neighbours: the segment is one piece again, and a request for all of it fits.
    REQUIRE(pool.release(high));
    REQUIRE(pool.release(low));
    CHECK(pool.usage().idle_bytes == 2 * mib);
    REQUIRE(pool.release_by_address(middle.address));
    CHECK(pool.release(middle).error().code == status_code::unknown_allocation);
    auto whole = value_or_fail(pool.allocate(4 * mib, 64));
    CHECK(whole.address == low.address);
    CHECK(ledger->allocations == 1);
    REQUIRE(pool.release(whole));
    CHECK(pool.trim(0) == 4 * mib);
    CHECK(ledger->live_count() == 0);
}

TEST_CASE("a released span parks in the thread's cache: idle, refused by its old id, taken back by the bin's next request", "[pool]") {
    pool_allocator pool(heap_upstream{});
    auto ledger = pool.upstream().ledger();
    auto first = value_or_fail(pool.allocate(1 * mib + 64 * kib, 64));
    REQUIRE(pool.release(first));
    CHECK(pool.usage().idle_bytes == 1 * mib + 64 * kib);
    CHECK(pool.usage().live_allocations == 0);
    CHECK(pool.usage().in_use_bytes == 0);
    // Parked, it is not live: its last id and its address are refused.
    CHECK(pool.release(first).error().code == status_code::unknown_allocation);
    CHECK(pool.release_by_address(first.address).error().code == status_code::unknown_allocation);
    // A smaller request of the same bin (1 MiB to 1.25 MiB) takes the parked piece whole.
    auto again = value_or_fail(pool.allocate(1 * mib + 16 * kib, 4096));
    CHECK(again.address == first.address);
    CHECK(again.allocation_id != first.allocation_id);
    CHECK(pool.usage().idle_bytes == 0);
    CHECK(pool.usage().in_use_bytes == 1 * mib + 16 * kib);
    auto stale = first;
    stale.size = again.size;
    stale.alignment = again.alignment;
    CHECK(pool.release(stale).error().code == status_code::unknown_allocation);
    auto misdescribed = again;
    misdescribed.size += 1;
    CHECK(pool.release(misdescribed).error().code == status_code::invalid_argument);
    CHECK(pool.usage().live_allocations == 1);
    REQUIRE(pool.release_by_address(again.address));
    CHECK(ledger->allocations == 1);
    CHECK(pool.trim(0) == 1 * mib + 64 * kib);
    CHECK(ledger->live_count() == 0);
}

TEST_CASE("parked spans go back to the free lists, merged, before the pool grows: caching never makes it hold more", "[pool]") {
    pool_allocator pool(heap_upstream{});
    auto ledger = pool.upstream().ledger();
    const auto quarters = released_quarters(pool); // each parks, unmerged
    CHECK(pool.usage().idle_bytes == 4 * mib);
    // No parked piece is of its bin, nor any free piece: the pool flushes, merges and serves it.
    auto whole = value_or_fail(pool.allocate(4 * mib, 64));
    CHECK(whole.address == quarters.front().address);
    CHECK(ledger->allocations == 1);
    CHECK(pool.usage().held_bytes == 4 * mib);
    REQUIRE(pool.release(whole));
}

TEST_CASE("a thread's next request takes the piece it parked last; span_cache_bytes caps what it parks, 0 nothing", "[pool]") {
    struct setting {
        std::uint64_t cap;
        std::size_t served_by; // which quarter the next 1 MiB request gets
    };
    // Default: all four park, the last comes back. 3 MiB: the fourth finds the cache full and
    // goes to the free lists; the third comes back. 0: none parks, the four merge, and the
    // request splits the merged segment at its start.
    const setting expected = GENERATE(setting{pool_default_span_cache_bytes, 3}, setting{3 * mib, 2}, setting{0, 0});
    pool_options options;
    options.span_cache_bytes = expected.cap;
    pool_allocator pool(heap_upstream{}, options);
    auto ledger = pool.upstream().ledger();
    const auto quarters = released_quarters(pool);
    CHECK(pool.usage().idle_bytes == 4 * mib);
    auto next = value_or_fail(pool.allocate(1 * mib, 64));
    CHECK(next.address == quarters[expected.served_by].address);
    CHECK(ledger->allocations == 1);
    REQUIRE(pool.release(next));
    CHECK(pool.trim(0) == 4 * mib);
    CHECK(ledger->live_count() == 0);
}

TEST_CASE("requests above pass_through_bytes go straight to the upstream and back", "[pool]") {
    pool_options options;
    options.pass_through_bytes = 1 * mib;
    pool_allocator pool(heap_upstream{}, options);
    auto ledger = pool.upstream().ledger();
    auto direct = value_or_fail(pool.allocate(1 * mib + 1, 8));
    CHECK(ledger->allocations == 1);
    CHECK(pool.usage().held_bytes == 1 * mib + 1);
    REQUIRE(pool.release(direct));
    CHECK(ledger->live_count() == 0);
    CHECK(pool.usage().held_bytes == 0);
    CHECK(pool.usage().upstream_releases == 1);
}

TEST_CASE("trim keeps at most keep_bytes idle; the retention limit gives back the excess at release", "[pool]") {
    SECTION("trim") {
        pool_allocator pool(heap_upstream{});
        std::vector<allocation<cpu_device>> spans;
        for (int i = 0; i < 4; ++i) {
            spans.push_back(value_or_fail(pool.allocate(1 * mib, 8)));
        }
        for (const auto& span : spans) {
            REQUIRE(pool.release(span));
        }
        CHECK(pool.usage().idle_bytes == 4 * mib);
        CHECK(pool.trim(2 * mib) == 2 * mib);
        CHECK(pool.usage().idle_bytes == 2 * mib);
        CHECK(pool.trim(2 * mib) == 0);
        CHECK(pool.trim() == 2 * mib);
        CHECK(pool.upstream().ledger()->live_count() == 0);
    }
    SECTION("retention limit") {
        pool_options options;
        options.retain_limit_bytes = 2 * mib;
        pool_allocator pool(heap_upstream{}, options);
        std::vector<allocation<cpu_device>> spans;
        for (int i = 0; i < 4; ++i) {
            spans.push_back(value_or_fail(pool.allocate(1 * mib, 8)));
        }
        for (const auto& span : spans) {
            REQUIRE(pool.release(span));
            CHECK(pool.usage().idle_bytes <= 2 * mib);
        }
        CHECK(pool.upstream().ledger()->live_count() == 2);
    }
}

TEST_CASE("upstream refusals end as OUT_OF_MEMORY with nothing changed or leaked", "[pool]") {
    pool_options options;
    options.pass_through_bytes = 1 * mib;
    pool_allocator pool(heap_upstream{}, options);
    auto ledger = pool.upstream().ledger();
    ledger->refuse_from = 1;
    for (std::uint64_t size : {std::uint64_t{64}, 100 * kib, 2 * mib}) {
        auto refused = pool.allocate(size, 8);
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("test upstream refuses"));
        CHECK(pool.usage() == pool_usage{});
    }
    ledger->refuse_from = UINT64_MAX;
    auto fine = value_or_fail(pool.allocate(64, 8));
    REQUIRE(pool.release(fine));
    pool.trim(0);
    CHECK(ledger->live_count() == 0);
}

TEST_CASE("invalid requests are refused: size 0, alignment not a power of two", "[pool]") {
    pool_allocator pool(heap_upstream{});
    CHECK(pool.allocate(0, 8).error().code == status_code::invalid_argument);
    CHECK(pool.allocate(8, 0).error().code == status_code::invalid_argument);
    CHECK(pool.allocate(8, 24).error().code == status_code::invalid_argument);
    CHECK(pool.usage() == pool_usage{});
}

TEST_CASE("the pool never reads or writes the memory it hands out (PROT_NONE upstream)", "[pool]") {
    // Any access by the pool to its memory faults and kills the test.
    pool_options options;
    options.pass_through_bytes = 4 * mib;
    options.retain_limit_bytes = 8 * mib;
    pool_allocator pool(inaccessible_upstream{}, options);
    std::vector<allocation<cpu_device>> live;
    for (int round = 0; round < 3; ++round) {
        for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{64}, 4 * kib, 16 * kib, 64 * kib, 2 * mib, 5 * mib}) {
            live.push_back(value_or_fail(pool.allocate(size, 16)));
        }
        for (std::size_t i = 0; i < live.size(); i += 2) {
            REQUIRE(pool.release(live[i]));
        }
        for (std::size_t i = 1; i < live.size(); i += 2) {
            REQUIRE(pool.release_by_address(live[i].address));
        }
        live.clear();
        pool.trim(round == 1 ? 0 : 1 * mib);
    }
    pool.trim(0);
    CHECK(pool.upstream().ledger()->live_count() == 0);
}

TEST_CASE("destroying a pool gives everything back, live allocations included", "[pool]") {
    heap_upstream upstream;
    auto ledger = upstream.ledger();
    {
        pool_options options;
        options.pass_through_bytes = 1 * mib;
        pool_allocator pool(upstream, options);
        (void)value_or_fail(pool.allocate(64, 8));
        (void)value_or_fail(pool.allocate(64 * kib, 8));
        (void)value_or_fail(pool.allocate(2 * mib, 8));
        auto cached = value_or_fail(pool.allocate(128 * kib, 8));
        REQUIRE(pool.release(cached));
        CHECK(ledger->live_count() == 4);
    }
    CHECK(ledger->live_count() == 0);
    CHECK(ledger->bad_releases == 0);
}

TEST_CASE("an upstream that cannot be moved is pooled in place, or shared through shared_upstream", "[pool]") {
    STATIC_REQUIRE(!std::is_move_constructible_v<heap_allocator>);
    pool_allocator<heap_allocator> in_place(std::in_place, pool_options{});
    auto one = value_or_fail(in_place.allocate(64, 8));
    REQUIRE(in_place.release(one));

    auto engine_heap = std::make_shared<heap_allocator>();
    pool_allocator shared{shared_upstream<heap_allocator>(engine_heap)};
    auto two = value_or_fail(shared.allocate(64, 8));
    REQUIRE(shared.release(two));
    CHECK(&shared.upstream().get() == engine_heap.get());
}

TEST_CASE("growth by commit: a native upstream offering virtual backing is reserved once and committed chunk by chunk", "[pool]") {
    test::committing_upstream upstream;
    auto commits = upstream.commits;
    auto ledger = upstream.ledger();
    pool_allocator pool(upstream, small_reservation());
    REQUIRE(pool.grows_by_commit());
    CHECK(ledger->allocations == 1); // the reservation
    std::vector<allocation<cpu_device>> live;
    for (int i = 0; i < 64; ++i) { // 64 x 16 KiB = 1 MiB: one chunk
        live.push_back(value_or_fail(pool.allocate(16 * kib, 16)));
        std::memset(live.back().address, 0x5a, live.back().size); // committed: writable
    }
    live.push_back(value_or_fail(pool.allocate(16 * kib, 16))); // the second chunk
    std::memset(live.back().address, 0x5a, live.back().size);
    CHECK(ledger->allocations == 1);
    CHECK(commits->commits == 2);
    CHECK(commits->committed_bytes == 2 * mib);
    CHECK(pool.usage().upstream_commits == 2);
    CHECK(pool.usage().held_bytes == 2 * mib);
    for (const auto& one : live) {
        REQUIRE(pool.release(one));
    }
    CHECK(pool.trim(0) == 2 * mib);
    CHECK(commits->committed_bytes == 0);
    CHECK(pool.usage().upstream_decommits == 2);
    CHECK(pool.usage().held_bytes == 0);
    // Growing again commits again, into the same reservation.
    auto again = value_or_fail(pool.allocate(64, 8));
    std::memset(again.address, 1, 64);
    CHECK(commits->commits == 3);
    CHECK(ledger->allocations == 1);
    REQUIRE(pool.release(again));

    SECTION("a refused commit is OUT_OF_MEMORY and changes nothing") {
        pool.trim(0);
        commits->refuse_commits_from = commits->commits + 1;
        const pool_usage before = pool.usage();
        auto refused = pool.allocate(64, 8);
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK(pool.usage() == before);
    }
}

TEST_CASE("growth by commit: spans are pieces of one arena, grown at its top, decommitted by trim and committed again", "[pool]") {
    test::committing_upstream upstream; // commits in 64 KiB granules
    auto commits = upstream.commits;
    auto ledger = upstream.ledger();
    pool_allocator pool(upstream, small_reservation());
    REQUIRE(pool.grows_by_commit());
    auto writable = [](const allocation<cpu_device>& live) { std::memset(live.address, 0x6b, live.size); };
    auto address_of = [](const allocation<cpu_device>& live) { return reinterpret_cast<std::uintptr_t>(live.address); };

    // Two requests: two pieces side by side, each committed in whole granules, no upstream allocation.
    auto first = value_or_fail(pool.allocate(100 * kib, 64)); // 128 KiB
    auto second = value_or_fail(pool.allocate(200 * kib, 64)); // 256 KiB
    writable(first);
    writable(second);
    CHECK(address_of(second) == address_of(first) + 128 * kib);
    CHECK(ledger->allocations == 1); // the reservation only
    CHECK(commits->commits == 2);
    CHECK(commits->committed_bytes == 384 * kib);
    CHECK(pool.usage().held_bytes == 384 * kib);

    // A released piece serves the next request of its size with no upstream call.
    REQUIRE(pool.release(first));
    auto smaller = value_or_fail(pool.allocate(128 * kib, 64));
    CHECK(address_of(smaller) == address_of(first));
    CHECK(commits->commits == 2);

    // The top piece free: a larger request extends it, committing only the granules it lacks.
    REQUIRE(pool.release_by_address(second.address));
    auto larger = value_or_fail(pool.allocate(512 * kib, 64));
    writable(larger);
    CHECK(address_of(larger) == address_of(second));
    CHECK(commits->commits == 3);
    CHECK(commits->committed_bytes == 128 * kib + 512 * kib);
    CHECK(pool.usage().held_bytes == commits->committed_bytes);

    // trim decommits free pieces only; a piece handed out again is committed again.
    REQUIRE(pool.release(smaller)); // 128 KiB free below a live piece
    CHECK(pool.trim(0) == 128 * kib);
    CHECK(commits->committed_bytes == 512 * kib);
    CHECK(pool.usage().held_bytes == 512 * kib);
    auto again = value_or_fail(pool.allocate(128 * kib, 64));
    writable(again); // PROT_NONE unless committed again
    CHECK(address_of(again) == address_of(first));
    CHECK(commits->committed_bytes == 640 * kib);

    SECTION("with nothing live, trim(0) leaves nothing committed and lowers the arena's top") {
        REQUIRE(pool.release(again));
        REQUIRE(pool.release(larger));
        CHECK(pool.trim(0) == 640 * kib);
        CHECK(commits->committed_bytes == 0);
        CHECK(pool.usage().held_bytes == 0);
        // The arena starts again at its base.
        auto fresh = value_or_fail(pool.allocate(1 * mib, 64));
        writable(fresh);
        CHECK(address_of(fresh) == address_of(first));
        REQUIRE(pool.release_by_address(fresh.address));
        pool.trim(0);
        CHECK(commits->committed_bytes == 0);
        CHECK(ledger->allocations == 1);
    }
    SECTION("trim(keep) decommits only the top granules of a free piece that exceed keep") {
        REQUIRE(pool.release(larger)); // the top piece: 512 KiB committed, free
        CHECK(pool.usage().idle_bytes == 512 * kib);
        CHECK(pool.trim(400 * kib) == 128 * kib); // 112 KiB over keep: two whole 64 KiB granules
        CHECK(pool.usage().idle_bytes == 384 * kib);
        CHECK(commits->committed_bytes == 128 * kib + 384 * kib);
        CHECK(pool.trim(384 * kib) == 0);
        CHECK(pool.trim(320 * kib) == 64 * kib); // the next granule down, not the piece
        CHECK(commits->committed_bytes == 128 * kib + 320 * kib);
        // The piece is whole again when handed out: only its decommitted top is committed.
        const std::uint64_t commits_before = commits->commits;
        auto whole = value_or_fail(pool.allocate(512 * kib, 64));
        writable(whole);
        CHECK(address_of(whole) == address_of(larger));
        CHECK(commits->commits == commits_before + 1);
        CHECK(commits->committed_bytes == 640 * kib);
        CHECK(pool.usage().held_bytes == commits->committed_bytes);
        REQUIRE(pool.release(whole));
        REQUIRE(pool.release(again));
        CHECK(pool.trim(0) == 640 * kib);
        CHECK(commits->committed_bytes == 0);
    }
    SECTION("a refused commit is OUT_OF_MEMORY and changes nothing") {
        commits->refuse_commits_from = commits->commits + 1;
        const pool_usage before = pool.usage();
        auto refused = pool.allocate(2 * mib, 64);
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK(pool.usage() == before);
        commits->refuse_commits_from = UINT64_MAX;
        auto granted = value_or_fail(pool.allocate(2 * mib, 64));
        writable(granted);
        CHECK(address_of(granted) == address_of(larger) + 512 * kib); // the top came back down
        REQUIRE(pool.release(granted));
        REQUIRE(pool.release(again));
        REQUIRE(pool.release(larger));
    }
    SECTION("an address inside a piece, or of a free piece, is not an allocation") {
        CHECK(pool.release_by_address(static_cast<char*>(larger.address) + 64 * kib).error().code ==
              status_code::unknown_allocation);
        CHECK(pool.release_by_address(static_cast<char*>(larger.address) + 512 * kib).error().code ==
              status_code::unknown_allocation);
        REQUIRE(pool.release(again));
        CHECK(pool.release_by_address(again.address).error().code == status_code::unknown_allocation);
        REQUIRE(pool.release(larger));
    }
}

TEST_CASE("growth by commit: neighbouring arena pieces released apart serve one larger request", "[pool]") {
    test::committing_upstream upstream;
    auto commits = upstream.commits;
    pool_allocator pool(upstream, small_reservation());
    auto lower = value_or_fail(pool.allocate(1 * mib, 64));
    auto upper = value_or_fail(pool.allocate(3 * mib, 64));
    auto above = value_or_fail(pool.allocate(1 * mib, 64)); // keeps the two off the arena's top
    REQUIRE(pool.release(upper));
    REQUIRE(pool.release(lower));
    const std::uint64_t commits_before = commits->commits;
    auto joined = value_or_fail(pool.allocate(4 * mib, 64)); // separate segments could not serve it
    std::memset(joined.address, 0x2d, joined.size);
    CHECK(joined.address == lower.address);
    CHECK(commits->commits == commits_before);
    CHECK(pool.usage().held_bytes == 5 * mib);
    REQUIRE(pool.release(joined));
    REQUIRE(pool.release(above));
    pool.trim(0);
    CHECK(commits->committed_bytes == 0);
}

TEST_CASE("growth by commit: beyond the retention limit a released arena piece gives back the excess from its top", "[pool]") {
    test::committing_upstream upstream;
    auto commits = upstream.commits;
    pool_options options = small_reservation();
    options.retain_limit_bytes = 1 * mib;
    pool_allocator pool(upstream, options);
    auto kept = value_or_fail(pool.allocate(512 * kib, 64));
    auto large = value_or_fail(pool.allocate(4 * mib, 64));
    CHECK(commits->committed_bytes == 4 * mib + 512 * kib);
    REQUIRE(pool.release(kept)); // 512 KiB idle: within the limit, kept committed
    CHECK(commits->committed_bytes == 4 * mib + 512 * kib);
    REQUIRE(pool.release(large)); // merged with it, 4.5 MiB idle: all but 1 MiB decommitted
    CHECK(commits->committed_bytes == 1 * mib);
    CHECK(pool.usage().held_bytes == 1 * mib);
    CHECK(pool.usage().idle_bytes == 1 * mib);
    auto again = value_or_fail(pool.allocate(4 * mib, 64)); // the merged piece, its top committed again
    std::memset(again.address, 0x3a, again.size);
    CHECK(again.address == kept.address);
    CHECK(commits->committed_bytes == 4 * mib);
    REQUIRE(pool.release(again)); // 4 MiB idle: back to the limit
    CHECK(commits->committed_bytes == 1 * mib);
    CHECK(pool.trim(0) == 1 * mib);
    CHECK(commits->committed_bytes == 0);
}

TEST_CASE("growth by commit: a span the arena cannot hold gets a segment of its own", "[pool]") {
    test::committing_upstream upstream;
    auto commits = upstream.commits;
    auto ledger = upstream.ledger();
    pool_allocator pool(upstream, small_reservation()); // a 32 MiB arena
    auto in_arena = value_or_fail(pool.allocate(8 * mib, 64));
    auto beyond = value_or_fail(pool.allocate(40 * mib, 64));
    std::memset(beyond.address, 0x71, beyond.size); // committed whole
    CHECK(ledger->allocations == 2); // the reservation and the segment
    CHECK(pool.usage().held_bytes == 48 * mib);
    CHECK(commits->committed_bytes == 48 * mib);
    REQUIRE(pool.release_by_address(beyond.address));
    REQUIRE(pool.release(in_arena));
    CHECK(pool.trim(0) == 48 * mib);
    CHECK(commits->committed_bytes == 0);
    CHECK(ledger->live_count() == 1); // the segment given back, the reservation kept
}

TEST_CASE("growth by allocation when asked, even over an upstream offering virtual backing", "[pool]") {
    pool_options options;
    options.growth = pool_growth::by_allocation;
    test::committing_upstream upstream;
    pool_allocator pool(upstream, options);
    CHECK_FALSE(pool.grows_by_commit());
}

TEST_CASE("crossings: a million live 64 B allocations cost one upstream call per 2 MiB chunk", "[pool]") {
    pool_allocator pool(fake_device_upstream{});
    std::vector<allocation<cuda_device>> live;
    live.reserve(1'000'000);
    for (int i = 0; i < 1'000'000; ++i) {
        live.push_back(value_or_fail(pool.allocate(64, 64)));
    }
    // 64 MB of blocks in 2 MiB chunks: 31 chunks.
    CHECK(pool.usage().upstream_allocations == (64'000'000 + 2 * mib - 1) / (2 * mib));
    CHECK(pool.usage().held_bytes == pool.usage().upstream_allocations * 2 * mib);
    for (const auto& one : live) {
        REQUIRE(pool.release(one));
    }
    CHECK(pool.trim(0) == pool.usage().upstream_allocations * 2 * mib);
    CHECK(pool.usage().upstream_releases == pool.usage().upstream_allocations);
}
