// The stream-ordered layer (pool/stream_ordered_pool.hpp) over a fake device and over a pool, on
// host timelines whose work completes only when the test says (host_timeline_policy.hpp): a block
// released on a stream is reused at once by that stream, by another only once its fences
// completed (or with a wait, where the policy inserts waits), and never goes back below before;
// record_stream fences every stream a block was used on; releases are checked; and a RapidCheck
// trace over four streams holds the ordering against a model.
#include "../support/loaded.hpp" // value_or_fail
#include "host_timeline_policy.hpp"
#include "test_upstreams.hpp"

#include <nxmem/pool.hpp>
#include <nxmem/pool/stream_ordered_pool.hpp>

#include <catch2/catch.hpp>
#include <rapidcheck.h>
#include <rapidcheck/catch.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

using namespace nxmem;
using nxmem::test::value_or_fail;

namespace {

using fake_layer = stream_ordered_pool<test::fake_device_upstream, test::host_timeline_policy>;
using waiting_layer = stream_ordered_pool<test::fake_device_upstream, test::host_timeline_waiting_policy>;

static_assert(assert_device_allocator<fake_layer>(), "the layer is itself a DeviceAllocator");
static_assert(!fake_layer::inserts_waits && waiting_layer::inserts_waits);

std::uint64_t wire(const allocation<cuda_device>& live) { return cuda_device::to_wire(live.address); }

// An allocation on `stream`, used by work queued there (not run yet), and released on it.
template <class Layer>
allocation<cuda_device> released_while_queued(Layer& layer, test::host_timeline& timeline, std::uint32_t stream) {
    const auto live = value_or_fail(layer.allocate(4096, 256, stream));
    timeline.submit(stream);
    value_or_fail(layer.deallocate(live, stream));
    return live;
}

struct fake_fixture {
    std::shared_ptr<test::host_timeline> timeline = std::make_shared<test::host_timeline>();
    test::fake_device_upstream device;
    std::shared_ptr<test::upstream_ledger> ledger = device.ledger();
};

} // namespace

TEST_CASE("stream-ordered layer: a block released on a stream is reused at once by that stream",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    const auto first = released_while_queued(layer, *f.timeline, 0);
    CHECK(layer.usage().pending_allocations == 1);

    const auto again = value_or_fail(layer.allocate(4000, 256, 0));
    CHECK(wire(again) == wire(first));
    CHECK(again.size == 4000);
    CHECK(again.allocation_id != first.allocation_id);
    CHECK(f.ledger->allocations == 1);
    CHECK(f.ledger->releases == 0);
    CHECK(layer.usage().pending_allocations == 0);
}

TEST_CASE("stream-ordered layer: another stream reuses a block only after its fence completed",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    const auto first = released_while_queued(layer, *f.timeline, 0);

    const auto other = value_or_fail(layer.allocate(4096, 256, 1)); // stream 0's work pending
    CHECK(wire(other) != wire(first));
    CHECK(f.ledger->allocations == 2);

    f.timeline->complete(0);
    const auto after = value_or_fail(layer.allocate(4096, 256, 1));
    CHECK(wire(after) == wire(first));
    CHECK(f.ledger->allocations == 2);
    CHECK(f.timeline->waits_inserted == 0);
}

TEST_CASE("stream-ordered layer: a stream taking back what it released records no fence; another stream's "
          "first request records one for every release before it",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    for (int round = 0; round < 3; ++round) {
        released_while_queued(layer, *f.timeline, 0);
        value_or_fail(layer.allocate(4096, 256, 0));
    }
    CHECK(f.timeline->fences_recorded == 0);

    const auto first = value_or_fail(layer.allocate(4096, 256, 0));
    const auto second = value_or_fail(layer.allocate(4096, 256, 0));
    f.timeline->submit(0);
    value_or_fail(layer.deallocate(first, 0));
    f.timeline->submit(0);
    value_or_fail(layer.deallocate(second, 0));
    CHECK(f.timeline->fences_recorded == 0);
    const auto third = value_or_fail(layer.allocate(4096, 256, 1)); // stream 0's work pending
    CHECK(wire(third) != wire(first));
    CHECK(wire(third) != wire(second));
    CHECK(f.timeline->fences_recorded == 1); // one fence on stream 0 covers both releases
    value_or_fail(layer.allocate(4096, 256, 1));
    CHECK(f.timeline->fences_recorded == 1);
    f.timeline->complete(0);
    const auto fourth = value_or_fail(layer.allocate(4096, 256, 1));
    const auto fifth = value_or_fail(layer.allocate(4096, 256, 1));
    CHECK(((wire(fourth) == wire(first) && wire(fifth) == wire(second)) ||
           (wire(fourth) == wire(second) && wire(fifth) == wire(first))));
    CHECK(f.timeline->fences_retired == f.timeline->fences_recorded);
}

TEST_CASE("stream-ordered layer: a fence recorded after the release is never earlier than its work",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    const auto first = released_while_queued(layer, *f.timeline, 0); // work 1 on stream 0
    f.timeline->submit(0);                                            // work 2, after the release
    value_or_fail(layer.allocate(4096, 256, 1));                      // records the fence: through work 2
    f.timeline->complete_through(0, 1);
    // The release's own work has run, but the only fence the layer holds waits for work 2 too:
    // later than needed, never earlier.
    CHECK(wire(value_or_fail(layer.allocate(4096, 256, 1))) != wire(first));
    f.timeline->complete(0);
    CHECK(wire(value_or_fail(layer.allocate(4096, 256, 1))) == wire(first));
}

TEST_CASE("stream-ordered layer: a fence that cannot be recorded when another stream asks leaves the block "
          "pending, and collect records it later",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    f.timeline->refuse_records = true;
    const auto first = released_while_queued(layer, *f.timeline, 0); // a release records nothing
    f.timeline->complete(0);
    CHECK(wire(value_or_fail(layer.allocate(4096, 256, 1))) != wire(first));
    CHECK(layer.collect() == 0);
    CHECK(layer.usage().pending_allocations == 1);
    f.timeline->refuse_records = false;
    CHECK(layer.collect() == 4096);
    CHECK(layer.usage().pending_allocations == 0);
    CHECK(f.timeline->fences_retired == f.timeline->fences_recorded);
}

TEST_CASE("stream-ordered layer: where the policy waits, another stream takes a pending block at once, "
          "waiting for its fence",
          "[pool][layers][streams]") {
    fake_fixture f;
    waiting_layer layer(f.device, test::host_timeline_waiting_policy(f.timeline));
    const auto first = released_while_queued(layer, *f.timeline, 0);

    const auto other = value_or_fail(layer.allocate(4096, 256, 1));
    CHECK(wire(other) == wire(first));
    CHECK(f.timeline->waits_inserted == 1);
    CHECK(f.ledger->allocations == 1);

    // Its own stream needs no wait, completed or not.
    f.timeline->submit(1);
    value_or_fail(layer.deallocate(other, 1));
    value_or_fail(layer.allocate(4096, 256, 1));
    CHECK(f.timeline->waits_inserted == 1);
}

TEST_CASE("stream-ordered layer: a pending block is never given back below before its fences complete; "
          "collect and trim give it once they have",
          "[pool][layers][streams]") {
    SECTION("over the device itself: collect") {
        fake_fixture f;
        fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
        const auto live = value_or_fail(layer.allocate(1 << 20, 4096, 2));
        f.timeline->submit(2);
        value_or_fail(layer.deallocate(live, 2));
        CHECK(layer.collect() == 0);
        CHECK(f.ledger->releases == 0);
        f.timeline->complete(2);
        CHECK(layer.collect() == (1 << 20));
        CHECK(f.ledger->releases == 1);
        CHECK(layer.usage().pending_allocations == 0);
        CHECK(f.timeline->fences_retired == f.timeline->fences_recorded);
    }
    SECTION("over a pool: trim keeps it pending, so the pool keeps it, until it completed") {
        fake_fixture f;
        using pooled = pool_allocator<test::fake_device_upstream>;
        stream_ordered_pool<pooled, test::host_timeline_policy> layer(std::in_place, test::host_timeline_policy(f.timeline),
                                                                       stream_pool_options{}, f.device);
        const auto small = value_or_fail(layer.allocate(256, 16, 0));
        const auto large = value_or_fail(layer.allocate(512 * 1024, 4096, 0));
        f.timeline->submit(0);
        value_or_fail(layer.deallocate(small, 0));
        value_or_fail(layer.deallocate(large, 0));
        CHECK(layer.trim() == 0);
        CHECK(layer.below().usage().live_allocations == 2);
        CHECK(f.ledger->live_count() > 0);
        f.timeline->complete(0);
        CHECK(layer.trim() > 0);
        CHECK(layer.below().usage().live_allocations == 0);
        CHECK(f.ledger->live_count() == 0);
    }
}

TEST_CASE("stream-ordered layer: record_stream fences every stream a block was used on", "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    const auto first = value_or_fail(layer.allocate(8192, 256, 0));
    value_or_fail(layer.record_stream(first, 1));
    value_or_fail(layer.record_stream(first, 1)); // once is enough
    f.timeline->submit(0);
    f.timeline->submit(1);
    value_or_fail(layer.deallocate(first, 0));
    CHECK(f.timeline->fences_recorded == 1); // stream 1's; stream 0's once another stream asks

    // Stream 1's work may still use it: not even its own stream takes it back yet.
    const auto second = value_or_fail(layer.allocate(8192, 256, 0));
    CHECK(wire(second) != wire(first));
    f.timeline->complete(1);
    // Stream 2 needs both fences; stream 0 only stream 1's.
    const auto third = value_or_fail(layer.allocate(8192, 256, 2));
    CHECK(wire(third) != wire(first));
    CHECK(layer.collect() == 0);
    const auto fourth = value_or_fail(layer.allocate(8192, 256, 0));
    CHECK(wire(fourth) == wire(first));
    CHECK(f.ledger->releases == 0);
}

TEST_CASE("stream-ordered layer as docs/HOST.md shows it: a block read on a copy stream waits for the copy",
          "[pool][layers][streams]") {
    fake_fixture f;
    using layer_type = stream_ordered_pool<pool_allocator<test::fake_device_upstream>, test::host_timeline_policy>;
    const std::uint32_t compute = 0;
    const std::uint32_t copy = 1;
    layer_type layer(std::in_place, test::host_timeline_policy(f.timeline), stream_pool_options{}, f.device);

    auto x = layer.allocate(1 << 20, 256, compute).value();
    layer.record_stream(x, copy).value();
    f.timeline->submit(compute);
    f.timeline->submit(copy);
    layer.deallocate(x, compute).value();
    auto y = layer.allocate(1 << 20, 256, compute).value();
    CHECK(y.address != x.address);
    CHECK(layer.trim() == 0);
    const stream_pool_usage pending = layer.usage();
    CHECK(pending.pending_allocations == 1);
    CHECK(pending.pending_bytes == 1 << 20);
    CHECK(pending.streams == 1); // lanes: the copy stream neither allocated nor released
    f.timeline->complete(copy);
    f.timeline->complete(compute);
    layer.deallocate(y, compute).value();
    CHECK(layer.trim() > 0);
    CHECK(f.ledger->live_count() == 0);
}

TEST_CASE("stream-ordered layer: releases are checked, and a fence that cannot be recorded changes nothing",
          "[pool][layers][streams]") {
    fake_fixture f;
    fake_layer layer(f.device, test::host_timeline_policy(f.timeline));
    const auto live = value_or_fail(layer.allocate(4096, 256, 0));

    auto misdescribed = live;
    misdescribed.size = 4095;
    CHECK(layer.deallocate(misdescribed, 0).error().code == status_code::invalid_argument);
    auto foreign = live;
    foreign.mechanism_id += 1;
    CHECK(layer.deallocate(foreign, 0).error().code == status_code::wrong_mechanism);
    CHECK(layer.record_stream(misdescribed, 1).error().code == status_code::invalid_argument);

    f.timeline->refuse_records = true;
    value_or_fail(layer.record_stream(live, 1));
    CHECK(layer.deallocate(live, 0).error().code == status_code::internal_error); // stream 1's fence
    CHECK(layer.usage().pending_allocations == 0);
    f.timeline->refuse_records = false;

    value_or_fail(layer.release(live)); // on the stream it was allocated on
    CHECK(layer.usage().pending_allocations == 1);
    CHECK(layer.deallocate(live, 0).error().code == status_code::unknown_allocation);
    CHECK(layer.record_stream(live, 1).error().code == status_code::unknown_allocation);
    const auto again = value_or_fail(layer.allocate(4096, 256, 0));
    CHECK(layer.deallocate(live, 0).error().code == status_code::unknown_allocation); // a stale id
    value_or_fail(layer.deallocate(again, 0));
}

namespace {

enum class stream_step_kind { allocate, release, record_stream, submit, complete, collect };
struct stream_step {
    stream_step_kind kind = stream_step_kind::allocate;
    std::uint32_t stream = 0;
    std::uint64_t size = 0;
    std::size_t pick = 0;
};

// The fake device, recording what the layer gave back, so the trace checks every give-back.
class watched_device {
public:
    using device_type = cuda_device;
    device_id device() const noexcept { return inner_.device(); }
    result<allocation<cuda_device>> allocate(std::uint64_t size, std::uint64_t alignment) {
        return inner_.allocate(size, alignment);
    }
    result<release_report> release(const allocation<cuda_device>& live) {
        given_back->push_back(cuda_device::to_wire(live.address));
        return inner_.release(live);
    }
    std::shared_ptr<std::vector<std::uint64_t>> given_back = std::make_shared<std::vector<std::uint64_t>>();

private:
    test::fake_device_upstream inner_;
};

} // namespace

TEST_CASE("stream-ordered layer: no block reaches a stream other than its releaser's, or the layer below, "
          "while a fence of another stream is pending",
          "[pool][layers][streams][property]") {
    rc::prop("a trace over four streams", [](void) {
        const auto trace = *rc::gen::container<std::vector<stream_step>>(rc::gen::build<stream_step>(
            rc::gen::set(&stream_step::kind, rc::gen::weightedOneOf<stream_step_kind>({
                                                 {6, rc::gen::just(stream_step_kind::allocate)},
                                                 {4, rc::gen::just(stream_step_kind::release)},
                                                 {1, rc::gen::just(stream_step_kind::record_stream)},
                                                 {3, rc::gen::just(stream_step_kind::submit)},
                                                 {2, rc::gen::just(stream_step_kind::complete)},
                                                 {1, rc::gen::just(stream_step_kind::collect)},
                                             })),
            rc::gen::set(&stream_step::stream, rc::gen::inRange<std::uint32_t>(0, 4)),
            rc::gen::set(&stream_step::size, rc::gen::elementOf(std::vector<std::uint64_t>{256, 4096, 5000, 65536})),
            rc::gen::set(&stream_step::pick, rc::gen::inRange<std::size_t>(0, 1 << 20))));
        auto timeline = std::make_shared<test::host_timeline>();
        watched_device device;
        const auto given_back = device.given_back;
        stream_ordered_pool<watched_device, test::host_timeline_policy> layer(device, test::host_timeline_policy(timeline));

        struct live_entry {
            allocation<cuda_device> live;
            std::uint32_t stream;
            std::set<std::uint32_t> used_on;
        };
        std::map<std::uint64_t, live_entry> live; // by address
        // The model: each pending block's fences, by address: (stream, submitted count at release).
        std::map<std::uint64_t, std::map<std::uint32_t, std::uint64_t>> pending;
        auto pending_on_other = [&](std::uint64_t address, std::uint32_t taker) {
            const auto found = pending.find(address);
            if (found == pending.end()) {
                return false;
            }
            for (const auto& [stream, count] : found->second) {
                if (stream != taker && timeline->completed(stream) < count) {
                    return true;
                }
            }
            return false;
        };
        for (const stream_step& next : trace) {
            switch (next.kind) {
            case stream_step_kind::allocate: {
                const auto made = layer.allocate(next.size, 256, next.stream);
                RC_ASSERT(made.has_value());
                const std::uint64_t address = cuda_device::to_wire(made.value().address);
                RC_ASSERT(live.count(address) == 0);
                RC_ASSERT(!pending_on_other(address, next.stream));
                pending.erase(address);
                live[address] = {made.value(), next.stream, {next.stream}};
                break;
            }
            case stream_step_kind::release:
            case stream_step_kind::record_stream: {
                if (live.empty()) {
                    break;
                }
                auto chosen = live.begin();
                std::advance(chosen, static_cast<std::ptrdiff_t>(next.pick % live.size()));
                if (next.kind == stream_step_kind::record_stream) {
                    RC_ASSERT(layer.record_stream(chosen->second.live, next.stream).has_value());
                    chosen->second.used_on.insert(next.stream);
                    break;
                }
                RC_ASSERT(layer.deallocate(chosen->second.live, chosen->second.stream).has_value());
                auto& fences = pending[chosen->first];
                for (const std::uint32_t stream : chosen->second.used_on) {
                    fences[stream] = timeline->submitted(stream);
                }
                live.erase(chosen);
                break;
            }
            case stream_step_kind::submit: timeline->submit(next.stream); break;
            case stream_step_kind::complete: timeline->complete(next.stream); break;
            case stream_step_kind::collect: layer.collect(); break;
            }
            for (const std::uint64_t address : *given_back) {
                for (const auto& [stream, count] : pending[address]) {
                    RC_ASSERT(timeline->completed(stream) >= count);
                }
                pending.erase(address);
            }
            given_back->clear();
        }
    });
}
