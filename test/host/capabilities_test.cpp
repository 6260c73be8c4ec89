// Virtual backing, shared prefixes, deferred and structured release, host callbacks: every
// remaining scenario of the contract, through the entry points an engine calls.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <optional>
#include <stdexcept>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("lazy backing commits, decommits and reports mapped bytes", "[virtual-backing]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        const auto live = value_or_fail(lazy.allocate(10 * 4096 + 100, 4096));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);

        REQUIRE(backing.commit(live, {0, 3 * 4096}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 3 * 4096);
        REQUIRE(backing.commit(live, {4096, 4096})); // committing a committed page costs nothing
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 3 * 4096);
        REQUIRE(backing.commit(live, {10 * 4096, 100})); // the partial last page
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 3 * 4096 + 100);
        REQUIRE(backing.decommit(live, {4096, 2 * 4096}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4096 + 100);
        REQUIRE(backing.decommit(live, {4096, 4096})); // decommitting twice is not an error
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4096 + 100);

        for (byte_range outside : {byte_range{11 * 4096, 4096}, byte_range{0, 0},
                                   byte_range{4096, ~0ull - 100}}) {
            auto refused = backing.commit(live, outside);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::invalid_argument);
        }
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4096 + 100);

        auto report = value_or_fail(lazy.release(live));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 4096 + 100); // credits what was mapped
        auto gone = backing.mapped_bytes(live);
        REQUIRE_FALSE(gone);
        CHECK(gone.error().code == status_code::unknown_allocation);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a shared prefix is reference counted and costed once", "[shared-mapping]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(16 * 4096));
        CHECK(value_or_fail(module->readiness()).plugin.shared_prefixes == 1);

        std::vector<allocation<cpu_device>> sequences;
        std::uint64_t newly_mapped = 0;
        for (int i = 0; i < 8; ++i) {
            sequences.push_back(value_or_fail(lazy.allocate(64 * 4096, 4096)));
            auto commit = value_or_fail(mapping.commit_prefix(sequences.back(), prefix));
            CHECK(commit.shared_bytes == 16 * 4096);
            CHECK(commit.sharers == static_cast<std::uint64_t>(i + 1));
            newly_mapped += commit.newly_mapped_bytes;
        }
        CHECK(newly_mapped == 16 * 4096); // eight sharers, paid for once
        CHECK(value_or_fail(module->readiness()).plugin.views == 8);

        REQUIRE(mapping.retain_prefix(prefix));
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(mapping.release_prefix(prefix)); // the creator's reference
        // The mappings still hold the prefix.
        CHECK(value_or_fail(module->readiness()).plugin.shared_prefixes == 1);
        for (const auto& sequence : sequences) {
            REQUIRE(lazy.release(sequence));
        }
        auto after = value_or_fail(module->readiness());
        CHECK(after.plugin.shared_prefixes == 0); // the last mapping's release freed it
        CHECK(after.plugin.views == 0);
        auto stale = mapping.retain_prefix(prefix);
        REQUIRE_FALSE(stale);
        CHECK(stale.error().code == status_code::invalid_argument);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("deferred releases retire in order and pin the module", "[deferred-release]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    std::vector<std::uint64_t> tickets;
    std::optional<host::plugin_allocator<cpu_device>> lazy = open_or_fail<cpu_device>(module, "lazy");
    {
        for (int i = 0; i < 5; ++i) {
            auto live = value_or_fail(lazy->allocate(4096, 64));
            tickets.push_back(value_or_fail(lazy->enqueue_release(live)));
        }
        const auto kept = value_or_fail(lazy->allocate(4096, 64)); // live, not queued
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.queued_releases == 5);
        CHECK(readiness.plugin.queued_releases == 5);
        // A queued allocation has left the kit's registry but is live until it retires: the
        // plugin counts it once, as the host does.
        CHECK(readiness.plugin.allocations == 6);
        CHECK(readiness.host.allocations == 6);
        value_or_fail(lazy->release(kept));
    }
    auto pinned = module->try_unload();
    REQUIRE_FALSE(pinned);
    CHECK(pinned.error().code == status_code::busy);
    CHECK_THAT(pinned.error().message, Catch::Contains("queued releases 5"));
    CHECK(test::is_mapped(path));

    auto retired = value_or_fail(lazy->drain_releases());
    REQUIRE(retired.size() == tickets.size());
    for (std::size_t i = 0; i < tickets.size(); ++i) {
        CHECK(retired[i].ticket == tickets[i]); // enqueue order
        CHECK(retired[i].report.state == release_state::complete);
    }
    const auto drained = value_or_fail(module->readiness());
    CHECK(drained.host.queued_releases == 0);
    CHECK(drained.plugin.queued_releases == 0);
    CHECK(drained.plugin.allocations == 0);
    lazy.reset();
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}

TEST_CASE("a refusing host callback fails the allocation cleanly", "[host-callbacks]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        std::uint64_t asked = 0;
        auto refusing = [&asked](const host::reclaim_request& request) -> result<void> {
            asked += request.bytes_needed;
            return fail(status_code::out_of_memory, "the governor has nothing left to evict");
        };
        auto probe = value_or_fail(
            host::open_allocator<cpu_device>(module, "callback-probe", 0, "", refusing));
        CHECK(probe.offers_reclaim());
        auto failed = probe.allocate(1 << 16, 64);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::host_refused);
        CHECK_THAT(failed.error().message, Catch::Contains("nothing left to evict"));
        CHECK(asked == 1 << 16);
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocations == 0);
        CHECK(readiness.host.allocations == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a reclaim hook that throws fails the allocation and the host stays usable",
          "[host-callbacks]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto throwing = [](const host::reclaim_request&) -> result<void> {
            throw std::runtime_error("the governor threw");
        };
        auto probe = value_or_fail(
            host::open_allocator<cpu_device>(module, "callback-probe", 0, "", throwing));
        auto failed = probe.allocate(256, 16);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::internal_error); // the host's guard caught it
        CHECK_THAT(failed.error().message, Catch::Contains("the governor threw"));
        auto eager = open_or_fail<cpu_device>(module, "eager");
        CHECK(eager.release(value_or_fail(eager.allocate(256, 16))));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a reclaim hook may re-enter the same plugin on the same thread", "[host-callbacks]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        std::optional<host::plugin_allocator<cpu_device>> self;
        std::vector<allocation<cpu_device>> victims;
        bool armed = false;
        int evicted = 0;
        auto evicting = [&](const host::reclaim_request&) -> result<void> {
            if (!armed) {
                return boost::outcome_v2::success();
            }
            // Re-enters the plugin that is asking, on its own thread, while it waits.
            NXMEM_TRY_VOID(self->release(victims.back()));
            victims.pop_back();
            ++evicted;
            return boost::outcome_v2::success();
        };
        self.emplace(value_or_fail(
            host::open_allocator<cpu_device>(module, "callback-probe", 0, "", evicting)));
        for (int i = 0; i < 3; ++i) {
            victims.push_back(value_or_fail(self->allocate(1024, 64)));
        }
        armed = true;
        auto fresh = value_or_fail(self->allocate(1024, 64));
        CHECK(evicted == 1);
        CHECK(victims.size() == 2);
        armed = false;
        REQUIRE(self->release(fresh));
        for (const auto& victim : victims) {
            REQUIRE(self->release(victim));
        }
        self.reset();
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a host with no reclaim hook reports the capability as absent", "[host-callbacks]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto probe = open_or_fail<cpu_device>(module, "callback-probe");
        CHECK_FALSE(probe.offers_reclaim());
        auto failed = probe.allocate(64, 8);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::unsupported_capability);
        CHECK_THAT(failed.error().message, Catch::Contains("no reclaim hook"));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a partial release is quarantined rather than refunded", "[structured-release]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto quarantining = open_or_fail<cpu_device>(module, "quarantining");
        REQUIRE((quarantining.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) != 0);
        const auto live = value_or_fail(quarantining.allocate(1000, 64));
        auto report = value_or_fail(quarantining.release(live));
        CHECK(report.state == release_state::quarantined);
        CHECK(report.unmapped_bytes == 500);
        CHECK(report.residual_owned_bytes == 500);
        CHECK(quarantining.quarantined_bytes() == 500);
        // Gone as far as the host is concerned: no second release, no refund.
        auto again = quarantining.release(live);
        REQUIRE_FALSE(again);
        CHECK(again.error().code == status_code::unknown_allocation);
        CHECK(quarantining.quarantined_bytes() == 500);
        // The address is never reissued: the next allocation lies elsewhere.
        auto next = value_or_fail(quarantining.allocate(1000, 64));
        CHECK(next.address != live.address);
        CHECK(quarantining.release(next));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a release state from the future is quarantined, not guessed", "[structured-release]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto future = open_or_fail<cpu_device>(module, "future-state");
        const auto live = value_or_fail(future.allocate(2048, 64));
        auto report = value_or_fail(future.release(live));
        CHECK(report.state == release_state::quarantined);
        CHECK(report.unmapped_bytes == 0);           // nothing is credited...
        CHECK(report.residual_owned_bytes == 2048);  // ...the whole allocation is held back
        CHECK(future.quarantined_bytes() == 2048);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a failed release leaves the allocation as live as before", "[structured-release]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto failing = open_or_fail<cpu_device>(module, "failing-release");
        const auto live = value_or_fail(failing.allocate(4096, 64));
        auto failed = failing.release(live);
        REQUIRE_FALSE(failed);
        CHECK_THAT(failed.error().message, Catch::Contains("still live"));
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.allocations == 1); // nothing changed on either side
        CHECK(readiness.plugin.allocations == 1);
        CHECK(failing.quarantined_bytes() == 0);
        // The same description releases it: the host kept its record.
        auto report = value_or_fail(failing.release(live));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 4096);
        CHECK(value_or_fail(module->readiness()).host.allocations == 0);
    }
    REQUIRE(module->try_unload());
}
