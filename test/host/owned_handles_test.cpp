// owned_prefix and owned_allocation: the RAII owners release what they hold on destruction, move
// the ownership with them, and leave the raw calls to engines that want them.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <type_traits>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

constexpr std::uint64_t prefix_bytes = 4 * 4096;

// The references the host counts (the plugin counts prefixes, not references).
std::uint64_t prefix_references(const std::shared_ptr<host::plugin_module>& module) {
    return value_or_fail(module->readiness()).host.shared_prefixes;
}

std::uint64_t live_allocations(const std::shared_ptr<host::plugin_module>& module) {
    return value_or_fail(module->readiness()).host.allocations;
}

// An engine step that fails after taking a reference: the early return must not leak it.
result<void> prepare_then_fail(host::shared_mapping_view<cpu_device> mapping) {
    NXMEM_TRY(prefix, host::owned_prefix<cpu_device>::create(std::move(mapping), prefix_bytes));
    static_cast<void>(prefix);
    return fail(status_code::busy, "the engine gave up after creating the prefix");
}

} // namespace

TEST_CASE("the owning handles are move-only", "[owned]") {
    STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<host::owned_prefix<cpu_device>>);
    STATIC_REQUIRE_FALSE(std::is_copy_assignable_v<host::owned_prefix<cpu_device>>);
    STATIC_REQUIRE(std::is_nothrow_move_constructible_v<host::owned_prefix<cpu_device>>);
    STATIC_REQUIRE(std::is_nothrow_move_assignable_v<host::owned_prefix<cpu_device>>);
    STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<host::owned_allocation<cpu_device>>);
    STATIC_REQUIRE_FALSE(std::is_copy_assignable_v<host::owned_allocation<cpu_device>>);
    STATIC_REQUIRE(std::is_nothrow_move_constructible_v<host::owned_allocation<cpu_device>>);
    STATIC_REQUIRE(std::is_nothrow_move_assignable_v<host::owned_allocation<cpu_device>>);
}

TEST_CASE("an owned prefix releases its reference when it goes out of scope", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        {
            auto prefix = value_or_fail(host::owned_prefix<cpu_device>::create(mapping, prefix_bytes));
            REQUIRE(prefix);
            CHECK(prefix.get().size >= prefix_bytes);
            CHECK(prefix_references(module) == 1);

            // Committing through get() works as with a raw prefix; the mapping holds its own.
            auto live = value_or_fail(lazy.allocate(16 * 4096, 4096));
            CHECK(value_or_fail(mapping.commit_prefix(live, prefix.get())).sharers == 1);
            REQUIRE(lazy.release(live));
        }
        CHECK(prefix_references(module) == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("an early return cannot leak an owned prefix", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto failed = prepare_then_fail(value_or_fail(lazy.shared_mapping()));
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::busy);
        CHECK(prefix_references(module) == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("moving an owned prefix moves the reference, never doubles or drops it", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto first = value_or_fail(host::owned_prefix<cpu_device>::create(mapping, prefix_bytes));
        const host::shared_prefix id = first.get();

        host::owned_prefix<cpu_device> moved(std::move(first));
        CHECK_FALSE(first); // NOLINT(bugprone-use-after-move): the moved-from state is the point
        REQUIRE(moved);
        CHECK(moved.get() == id);
        CHECK(prefix_references(module) == 1);
        CHECK(first.reset()); // an empty handle's reset succeeds and does nothing
        CHECK(prefix_references(module) == 1);

        // Assigning over a handle that owns a reference releases that reference first.
        auto second = value_or_fail(host::owned_prefix<cpu_device>::create(mapping, prefix_bytes));
        CHECK(prefix_references(module) == 2);
        second = std::move(moved);
        CHECK(prefix_references(module) == 1);
        CHECK(second.get() == id);
    }
    CHECK(prefix_references(module) == 0);
    REQUIRE(module->try_unload());
}

TEST_CASE("retain takes a reference of its own; release() hands one back to the caller", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        const host::shared_prefix raw = value_or_fail(mapping.create_prefix(prefix_bytes));
        {
            auto retained = value_or_fail(host::owned_prefix<cpu_device>::retain(mapping, raw));
            CHECK(prefix_references(module) == 2);
        }
        CHECK(prefix_references(module) == 1); // the raw reference is the caller's still

        host::owned_prefix<cpu_device> adopted(mapping, raw);
        const host::shared_prefix given_back = adopted.release();
        CHECK_FALSE(adopted);
        CHECK(given_back == raw);
        CHECK(prefix_references(module) == 1); // release() released nothing
        REQUIRE(mapping.release_prefix(given_back));
        CHECK(prefix_references(module) == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("reset() reports a failed release and keeps the reference", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        const host::shared_prefix raw = value_or_fail(mapping.create_prefix(prefix_bytes));
        REQUIRE(mapping.release_prefix(raw)); // gone: the plugin no longer knows it

        host::owned_prefix<cpu_device> stale(mapping, raw);
        auto dropped = stale.reset();
        REQUIRE_FALSE(dropped);
        CHECK(dropped.error().code == status_code::invalid_argument);
        CHECK(stale); // still owned, so the failure is not silently forgotten
        static_cast<void>(stale.release()); // this test's own bogus adoption
        CHECK(prefix_references(module) == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("an owned allocation is released when it goes out of scope or is reset", "[owned]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "eager");
        {
            auto owned = value_or_fail(host::owned_allocation<cpu_device>::allocate(eager, 4096, 64));
            REQUIRE(owned);
            CHECK(owned->size == 4096);
            CHECK(live_allocations(module) == 1);
        }
        CHECK(live_allocations(module) == 0);

        auto owned = value_or_fail(host::owned_allocation<cpu_device>::allocate(eager, 4096, 64));
        auto replaced = value_or_fail(host::owned_allocation<cpu_device>::allocate(eager, 8192, 64));
        CHECK(live_allocations(module) == 2);
        replaced = std::move(owned); // releases the 8 KiB one
        CHECK(live_allocations(module) == 1);
        CHECK(replaced->size == 4096);

        const release_report report = value_or_fail(replaced.reset());
        CHECK(report.state == release_state::complete);
        CHECK_FALSE(replaced);
        CHECK(live_allocations(module) == 0);

        // release() hands the allocation back; the caller releases it through the allocator.
        auto handed = value_or_fail(host::owned_allocation<cpu_device>::allocate(eager, 4096, 64));
        const allocation<cpu_device> live = handed.release();
        CHECK(live_allocations(module) == 1);
        REQUIRE(eager.release(live));
        CHECK(live_allocations(module) == 0);
    }
    REQUIRE(module->try_unload());
}
