// The pool's layers, each alone over a fake of the layer below (docs/HOST.md "Pools"):
// - chunk_source over test upstreams: chunks, segments, the reservation and its arena, the
//   region list and the lease that keeps every region from being given back or decommitted;
// - span_heap over a fake chunk source (fake addresses, granules committed in a vector): best
//   fit, split, merge, the arena's growth and decommit, segments, a give-back the source refuses;
// - small_blocks over the same fake: blocks from one chunk, release by id, a chunk given back;
// - cached_spans over span_heap: a parked piece serves the next request of its bin;
// - the facade: for_each_region, lease, and a release by address naming the address only.
#include "../support/loaded.hpp" // value_or_fail
#include "test_upstreams.hpp"

#include <nxmem/pool.hpp>
#include <nxmem/pool/detail/cached_spans.hpp>
#include <nxmem/pool/detail/chunk_source.hpp>
#include <nxmem/pool/detail/small_blocks.hpp>
#include <nxmem/pool/detail/span_heap.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace nxmem;
using nxmem::test::value_or_fail;

namespace {
constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

std::vector<pool_region> regions_of(const auto& holder) {
    std::vector<pool_region> listed;
    holder.for_each_region([&](const pool_region& region) { listed.push_back(region); });
    return listed;
}
std::uint64_t count_kind(const std::vector<pool_region>& regions, pool_region_kind kind) {
    std::uint64_t count = 0;
    for (const pool_region& region : regions) {
        count += region.kind == kind ? 1 : 0;
    }
    return count;
}

// A chunk source with nothing behind its addresses: chunks and segments from a counter, an arena
// of 1 GiB whose granules' commitment is a vector, and every call counted. `keeps` makes it
// refuse every give-back and decommit, as a lease does.
class fake_chunk_source {
public:
    using device_type = cuda_device;
    static constexpr std::uint64_t arena_start = 0x100000000000ULL;

    explicit fake_chunk_source(bool arena) : arena_(arena) {}

    device_id device() const noexcept { return {NXMEM_DEVICE_CUDA, 0}; }
    std::uint64_t granule() const noexcept { return 64 * kib; }
    std::uint64_t chunk_bytes() const noexcept { return 2 * mib; }
    void limit_chunks(std::uint64_t) noexcept {}

    result<pool_detail::chunk_grant> take_chunk() {
        ++chunks_taken;
        const auto slot = static_cast<std::uint32_t>(chunks_taken - 1);
        return pool_detail::chunk_grant{slot, 0x200000000000ULL + slot * chunk_bytes(), 7};
    }
    void abandon_chunk(std::uint32_t) noexcept { ++chunks_given; }
    bool give_back_chunk(std::uint32_t) {
        if (keeps) {
            return false;
        }
        ++chunks_given;
        return true;
    }

    result<allocation<cuda_device>> take_segment(std::uint64_t bytes, std::uint64_t, bool) {
        ++segments_taken;
        const std::uint64_t base = next_segment_;
        next_segment_ += (bytes + granule() - 1) / granule() * granule() + granule(); // never adjacent
        return allocation<cuda_device>{cuda_device::from_wire(base), bytes, granule(), segments_taken, 7, device()};
    }
    bool map_segment(const allocation<cuda_device>&, std::uint32_t, bool) noexcept { return true; }
    bool give_back_segment(const allocation<cuda_device>&) {
        if (keeps) {
            return false;
        }
        ++segments_given;
        return true;
    }
    void abandon_segment(const allocation<cuda_device>&) noexcept { ++segments_given; }
    result<release_report> release_pass_through(const allocation<cuda_device>& memory) {
        ++segments_given;
        return release_report{release_state::complete, memory.size, 0};
    }
    void release_at_exit(const allocation<cuda_device>&) noexcept {}

    bool has_arena() const noexcept { return arena_; }
    std::uint64_t arena_base() const noexcept { return arena_start; }
    std::uint64_t arena_limit() const noexcept { return arena_ ? 1024 * mib : 0; }
    const allocation<cuda_device>& arena_allocation() const noexcept { return reservation_; }
    bool prepare_arena(std::uint64_t, std::uint64_t end) noexcept {
        if (committed_.size() < end / granule()) {
            committed_.resize(end / granule(), false);
        }
        return true;
    }
    std::uint64_t change_commitment(std::uint64_t base, std::uint64_t bytes, bool commit, std::optional<error>&) {
        if (!commit && keeps) {
            return 0;
        }
        std::uint64_t changed = 0;
        for (std::uint64_t at = (base - arena_start) / granule(); at < (base + bytes - arena_start) / granule(); ++at) {
            if (committed_[at] != commit) {
                committed_[at] = commit;
                changed += granule();
            }
        }
        (commit ? committed_bytes_up : committed_bytes_down) += changed;
        return changed;
    }
    std::uint64_t committed_bytes_in(std::uint64_t base, std::uint64_t bytes) const noexcept {
        std::uint64_t committed = 0;
        for (std::uint64_t at = (base - arena_start) / granule(); at < (base + bytes - arena_start) / granule(); ++at) {
            committed += committed_[at] ? granule() : 0;
        }
        return committed;
    }
    std::uint64_t top_bytes_holding(std::uint64_t base, std::uint64_t bytes, std::uint64_t wanted) const noexcept {
        std::uint64_t taken = 0;
        std::uint64_t committed = 0;
        for (std::uint64_t at = (base + bytes - arena_start) / granule(); committed < wanted && taken < bytes;) {
            --at;
            taken += granule();
            committed += committed_[at] ? granule() : 0;
        }
        return taken;
    }
    std::uint64_t committed_now() const { return committed_bytes_up - committed_bytes_down; }

    bool keeps = false;
    std::uint64_t chunks_taken = 0;
    std::uint64_t chunks_given = 0;
    std::uint64_t segments_taken = 0;
    std::uint64_t segments_given = 0;
    std::uint64_t committed_bytes_up = 0;
    std::uint64_t committed_bytes_down = 0;

private:
    bool arena_;
    std::vector<bool> committed_;
    std::uint64_t next_segment_ = 0x300000000000ULL;
    allocation<cuda_device> reservation_{cuda_device::from_wire(arena_start), 2048 * mib, 64 * kib, 99, 7, device()};
};

using fake_spans = pool_detail::span_heap<fake_chunk_source>;

allocation<cuda_device> fitted(fake_spans& spans, std::uint64_t bytes) {
    auto found = spans.allocate_fitting(bytes, bytes, 256, true);
    REQUIRE(found.has_value());
    return value_or_fail(std::move(*found));
}
void release_span(fake_spans& spans, const allocation<cuda_device>& live) {
    pool_detail::span_ticket::verdict verdict{};
    auto* piece = spans.claim(live, verdict);
    REQUIRE(verdict == pool_detail::span_ticket::verdict::claimed);
    REQUIRE(spans.release_claimed(*piece, live.size, pool_detail::generation_of(live.allocation_id)));
}
std::uint64_t wire(const allocation<cuda_device>& live) { return cuda_device::to_wire(live.address); }

} // namespace

TEST_CASE("span layer over a fake source: best fit, split, merge and the arena's top", "[pool][layers][spans]") {
    fake_chunk_source source(true);
    fake_spans spans(source);
    const std::uint64_t base = fake_chunk_source::arena_start;

    const auto first = fitted(spans, 64 * kib);
    const auto second = fitted(spans, 128 * kib);
    const auto third = fitted(spans, 64 * kib);
    CHECK(wire(first) == base);
    CHECK(wire(second) == base + 64 * kib);
    CHECK(wire(third) == base + 192 * kib);
    CHECK(source.committed_now() == 256 * kib);

    // The middle piece comes back; a smaller request takes its lower part (best fit), the rest
    // stays free above it.
    release_span(spans, second);
    CHECK(spans.free_bytes() == 128 * kib);
    const auto inside = fitted(spans, 64 * kib);
    CHECK(wire(inside) == base + 64 * kib);
    CHECK(spans.free_bytes() == 64 * kib);
    CHECK(spans.find_live_in_arena(wire(inside)).has_value());
    CHECK_FALSE(spans.find_live_in_arena(base + 128 * kib).has_value()); // free, not live

    // All released: one free piece, which a request of the whole serves without growing.
    release_span(spans, first);
    release_span(spans, inside);
    release_span(spans, third);
    CHECK(spans.free_bytes() == 256 * kib);
    auto whole = spans.allocate_fitting(256 * kib, 256 * kib, 256, false);
    REQUIRE(whole.has_value());
    CHECK(wire(value_or_fail(std::move(*whole))) == base);
    CHECK(source.committed_now() == 256 * kib);
}

TEST_CASE("span layer over a fake source: decommit from the top, and a source that keeps its granules",
          "[pool][layers][spans]") {
    fake_chunk_source source(true);
    fake_spans spans(source);
    const auto low = fitted(spans, 128 * kib);
    const auto high = fitted(spans, 128 * kib);
    release_span(spans, high);

    source.keeps = true; // a lease: the source refuses every decommit
    CHECK(spans.decommit_free_arena(1024 * mib) == 0);
    CHECK(spans.free_bytes() == 128 * kib);
    CHECK(source.committed_now() == 256 * kib);

    source.keeps = false;
    CHECK(spans.decommit_free_arena(64 * kib) == 64 * kib); // only the top granule asked for
    CHECK(source.committed_now() == 192 * kib);
    CHECK(spans.decommit_free_arena(1024 * mib) == 64 * kib);
    CHECK(spans.free_bytes() == 0);
    // The arena's top came down: the next piece starts where `high` did, committed again.
    const auto again = fitted(spans, 128 * kib);
    CHECK(wire(again) == wire(high));
    CHECK(source.committed_now() == 256 * kib);
    release_span(spans, low);
    release_span(spans, again);
}

TEST_CASE("span layer over a fake source: segments, pass-throughs, and an idle segment the source keeps",
          "[pool][layers][spans]") {
    fake_chunk_source source(false);
    fake_spans spans(source);
    CHECK_FALSE(spans.allocate_fitting(128 * kib, 128 * kib, 256, true).has_value()); // no arena to grow
    const auto segment = value_or_fail(spans.allocate_segment(128 * kib, 100 * kib, 256, false));
    CHECK(segment.size == 100 * kib);
    CHECK(source.segments_taken == 1);
    release_span(spans, segment);
    CHECK(spans.free_bytes() == 128 * kib);

    source.keeps = true;
    CHECK(spans.give_back_idle_segments(1024 * mib) == 0);
    CHECK(spans.free_bytes() == 128 * kib); // still free, and it serves the next request
    auto reused = spans.allocate_fitting(128 * kib, 128 * kib, 256, false);
    REQUIRE(reused.has_value());
    const auto again = value_or_fail(std::move(*reused));
    CHECK(wire(again) == wire(segment));
    CHECK(spans.find_live_in_segment(pool_detail::span_of(again.allocation_id), wire(again)).has_value());
    release_span(spans, again);

    source.keeps = false;
    CHECK(spans.give_back_idle_segments(1024 * mib) == 128 * kib);
    CHECK(source.segments_given == 1);

    const auto passed = value_or_fail(spans.allocate_segment(3 * mib, 3 * mib, 256, true));
    release_span(spans, passed);
    CHECK(source.segments_given == 2); // a pass-through goes back at its release
    CHECK(spans.free_bytes() == 0);
}

TEST_CASE("small-block layer over a fake source: one chunk, checked releases, the chunk given back",
          "[pool][layers][blocks]") {
    fake_chunk_source source(false);
    pool_detail::small_blocks<fake_chunk_source> blocks(source);
    CHECK(blocks.slabs_per_chunk() == 32);
    const std::uint32_t size_class = pool_classes::class_of(64, 16);
    std::vector<allocation<cuda_device>> live;
    for (int i = 0; i < 100; ++i) {
        live.push_back(value_or_fail(blocks.allocate(size_class, 64, 16)));
    }
    CHECK(source.chunks_taken == 1);
    CHECK(blocks.figures().live_allocations == 100);
    CHECK(blocks.figures().handed_out_bytes == 100 * 64);
    CHECK(blocks.find_live(wire(live[5]), 0, 0x200000000000ULL)->allocation_id == live[5].allocation_id);

    int freed_slabs = 0;
    const auto freed_slab = [&] { ++freed_slabs; };
    allocation<cuda_device> misdescribed = live[0];
    misdescribed.size = 48;
    CHECK(blocks.release(misdescribed, freed_slab).error().code == status_code::invalid_argument);
    for (const auto& one : live) {
        REQUIRE(blocks.release(one, freed_slab));
    }
    CHECK(blocks.release(live[0], freed_slab).error().code == status_code::unknown_allocation);
    CHECK(blocks.figures().live_allocations == 0);
    CHECK(freed_slabs == 0); // its one slab is the shard's current one: kept

    blocks.retire_idle_current_slabs();
    source.keeps = true;
    CHECK(blocks.give_back_free_chunks(UINT64_MAX) == 0);
    CHECK(blocks.free_bytes() == 2 * mib); // the chunk's slabs are free again, and serve
    REQUIRE(blocks.release(value_or_fail(blocks.allocate(size_class, 64, 16)), freed_slab));
    CHECK(source.chunks_taken == 1);
    blocks.retire_idle_current_slabs();
    source.keeps = false;
    CHECK(blocks.give_back_free_chunks(UINT64_MAX) == 2 * mib);
    CHECK(source.chunks_given == 1);
    CHECK(blocks.free_bytes() == 0);
}

TEST_CASE("cache layer over the span layer: a parked piece serves its thread's next request of the bin",
          "[pool][layers][caches]") {
    fake_chunk_source source(true);
    fake_spans spans(source);
    pool_detail::cached_spans<fake_spans> caches(spans, 4 * mib);
    int idle = 0;
    const auto on_idle = [&] { ++idle; };
    const auto first = value_or_fail(caches.allocate(200 * kib, 256));
    REQUIRE(caches.release(first, on_idle));
    CHECK(idle == 1);
    CHECK(caches.parked_bytes() == 256 * kib); // rounded to the granule
    CHECK(caches.figures().live_allocations == 0);
    CHECK(caches.figures().handed_out_bytes == 0); // parked is idle
    CHECK(caches.release(first, on_idle).error().code == status_code::unknown_allocation);
    CHECK(idle == 1);

    const std::uint64_t committed = source.committed_bytes_up;
    const auto second = value_or_fail(caches.allocate(250 * kib, 256));
    CHECK(wire(second) == wire(first));
    CHECK(second.allocation_id != first.allocation_id);
    CHECK(source.committed_bytes_up == committed);
    REQUIRE(caches.release(second, on_idle));
    CHECK(caches.flush_all() == 1);
    CHECK(caches.parked_bytes() == 0);
    CHECK(spans.free_bytes() == 256 * kib);
}

TEST_CASE("chunk source over a heap upstream: chunks and segments listed, given back, kept under a lease",
          "[pool][layers][source]") {
    pool_detail::chunk_source<test::heap_upstream> source(test::heap_upstream{}, pool_options{});
    auto ledger = source.upstream().ledger();
    CHECK_FALSE(source.grows_by_commit());
    CHECK(regions_of(source).empty());

    const std::uint64_t before = source.region_generation();
    const auto chunk = value_or_fail(source.take_chunk());
    CHECK(source.region_generation() > before);
    const auto segment = value_or_fail(source.take_segment(1 * mib, 64, false));
    REQUIRE(source.map_segment(segment, 3, false));
    auto listed = regions_of(source);
    REQUIRE(listed.size() == 2);
    CHECK(count_kind(listed, pool_region_kind::chunk) == 1);
    CHECK(count_kind(listed, pool_region_kind::segment) == 1);
    for (const pool_region& region : listed) {
        CHECK(region.committed);
        CHECK(region.bytes == (region.kind == pool_region_kind::chunk ? source.chunk_bytes() : 1 * mib));
        if (region.kind == pool_region_kind::chunk) {
            CHECK(region.address == chunk.base);
        }
    }
    CHECK(source.visit_region_holding(chunk.base + 100, [&](const pool_detail::mapped_region& region) {
        CHECK_FALSE(region.segment);
        CHECK(region.tag == chunk.slot);
    }));

    {
        pool_lease lease = source.lease();
        CHECK(source.leases() == 1);
        CHECK_FALSE(source.give_back_chunk(chunk.slot));
        CHECK_FALSE(source.give_back_segment(segment));
        CHECK(ledger->live_count() == 2);
        CHECK(regions_of(source).size() == 2);
    }
    CHECK(source.leases() == 0);
    CHECK(source.give_back_chunk(chunk.slot));
    CHECK(source.give_back_segment(segment));
    CHECK(ledger->live_count() == 0);
    CHECK(regions_of(source).empty());
    pool_usage figures;
    source.add_upstream_figures(figures);
    CHECK(figures.held_bytes == 0);
    CHECK(figures.upstream_allocations == 2);
    CHECK(figures.upstream_releases == 2);
}

TEST_CASE("chunk source growing by commit: the reservation, its committed chunks and arena runs, no decommit "
          "under a lease",
          "[pool][layers][source]") {
    pool_options options;
    options.reserve_bytes = 256 * mib;
    pool_detail::chunk_source<test::committing_upstream> source(test::committing_upstream{}, options);
    REQUIRE(source.grows_by_commit());
    auto commits = source.upstream().commits;
    CHECK(source.reserved_bytes() == 256 * mib);

    auto listed = regions_of(source);
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].kind == pool_region_kind::reservation);
    CHECK_FALSE(listed[0].committed);

    const auto chunk = value_or_fail(source.take_chunk());
    REQUIRE(source.has_arena());
    const std::uint64_t arena = source.arena_base();
    REQUIRE(source.prepare_arena(0, 4 * source.granule()));
    std::optional<error> refused;
    const std::uint64_t generation = source.region_generation();
    CHECK(source.change_commitment(arena + source.granule(), 2 * source.granule(), true, refused) ==
          2 * source.granule());
    CHECK(source.region_generation() > generation); // an arena run appeared: list again
    CHECK_FALSE(refused.has_value());
    listed = regions_of(source);
    REQUIRE(listed.size() == 3);
    CHECK(count_kind(listed, pool_region_kind::chunk) == 1);
    REQUIRE(count_kind(listed, pool_region_kind::arena_run) == 1);
    for (const pool_region& region : listed) {
        if (region.kind == pool_region_kind::arena_run) {
            CHECK(region.address == arena + source.granule());
            CHECK(region.bytes == 2 * source.granule());
        }
    }
    CHECK(source.committed_bytes_in(arena, 4 * source.granule()) == 2 * source.granule());

    {
        pool_lease lease = source.lease();
        CHECK(source.change_commitment(arena, 4 * source.granule(), false, refused) == 0);
        CHECK_FALSE(source.give_back_chunk(chunk.slot));
        CHECK(commits->committed_bytes == source.chunk_bytes() + 2 * source.granule());
    }
    CHECK(source.change_commitment(arena, 4 * source.granule(), false, refused) == 2 * source.granule());
    CHECK(source.give_back_chunk(chunk.slot));
    CHECK(commits->committed_bytes == 0);
    CHECK(regions_of(source).size() == 1); // the reservation stays
}

TEST_CASE("the facade lists its regions and keeps them under a lease", "[pool][layers][facade]") {
    pool_options options;
    options.pass_through_bytes = 1 * mib;
    pool_allocator<test::heap_upstream> pool(test::heap_upstream{}, options);
    auto ledger = pool.upstream().ledger();
    const auto small = value_or_fail(pool.allocate(64, 16));
    const auto span = value_or_fail(pool.allocate(256 * kib, 64));
    const auto passed = value_or_fail(pool.allocate(2 * mib, 64));
    auto listed = regions_of(pool);
    CHECK(count_kind(listed, pool_region_kind::chunk) == 1);
    CHECK(count_kind(listed, pool_region_kind::segment) == 1);
    CHECK(count_kind(listed, pool_region_kind::pass_through) == 1);
    const std::uint64_t generation = pool.region_generation();

    REQUIRE(pool.release(small));
    REQUIRE(pool.release(span));
    {
        pool_lease lease = pool.lease();
        REQUIRE(lease.held());
        CHECK(pool.trim(0) == 0);
        CHECK(ledger->live_count() == 3);
        CHECK(pool.region_generation() == generation);
        REQUIRE(pool.release(passed)); // the engine's own allocation goes, lease or not
        CHECK(ledger->live_count() == 2);
    }
    CHECK(pool.trim(0) == pool.chunk_bytes() + 256 * kib);
    CHECK(ledger->live_count() == 0);
    CHECK(regions_of(pool).empty());
    CHECK(pool.usage().held_bytes == 0);
}

TEST_CASE("a pool over posix-lazy's stand-in reports its reservation apart from what it holds", "[pool][layers][facade]") {
    pool_options options;
    options.reserve_bytes = 256 * mib;
    pool_allocator<test::committing_upstream> pool(test::committing_upstream{}, options);
    REQUIRE(pool.grows_by_commit());
    CHECK(pool.reserved_bytes() == 256 * mib);
    CHECK(pool.usage().held_bytes == 0);
    const auto small = value_or_fail(pool.allocate(64, 16));
    CHECK(pool.usage().held_bytes == pool.chunk_bytes());
    REQUIRE(pool.release(small));
}

TEST_CASE("a release by address where nothing live starts names the address, not an allocation id",
          "[pool][layers][facade]") {
    pool_allocator<test::heap_upstream> pool(test::heap_upstream{}, pool_options{});
    const auto small = value_or_fail(pool.allocate(64, 16));
    const std::uint64_t inside = cpu_device::to_wire(small.address) + 16;
    const auto refused = pool.release_by_address(cpu_device::from_wire(inside));
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == status_code::unknown_allocation);
    const std::string text = refused.error().describe();
    CHECK_THAT(text, Catch::Contains("0x" + nxmem::detail::to_hex(inside)));
    CHECK_THAT(text, !Catch::Contains("allocation 0"));
    REQUIRE(pool.release(small));
}
