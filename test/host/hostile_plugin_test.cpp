// A plugin that misbehaves in the ways issue 12's whole-host fuzzing found: the host refuses or
// contains each fault, returns a status (never an exception), keeps its tallies right, and the
// module still unloads. Each case failed before its fix (see the commit that added it).
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <optional>
#include <string>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

// Everything is back: both tallies are zero, the module unloads and is unmapped.
void require_unloads(const std::shared_ptr<host::plugin_module>& module) {
    const auto readiness = value_or_fail(module->readiness());
    INFO(readiness.describe());
    CHECK(readiness.ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(module->path().string()));
}

} // namespace

TEST_CASE("a factory listed twice is refused, naming both indices, and released once",
          "[hostile][factories]") {
    const std::string path = test::plugin_path("NXMEM_DUPLICATE_FACTORY_PLUGIN");
    auto refused = host::plugin_module::load(path);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::contract_violation);
    CHECK_THAT(refused.error().message,
               Catch::Contains("factory 1 is the same pointer as factory 0"));
    // A second release would have aborted the process; none would show as a leak under LSan.
    CHECK_FALSE(test::is_mapped(path));
}

TEST_CASE("allocate refuses size 0 and alignments that are not powers of two before asking the "
          "plugin",
          "[hostile][allocate]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        // This mechanism answers OK to any such request; the host must not ask it.
        auto permissive = open_or_fail<cpu_device>(module, "permissive");
        struct bad_request {
            std::uint64_t size;
            std::uint64_t alignment;
            const char* named;
        };
        const bad_request bad = GENERATE(bad_request{64, 0, "alignment 0 is not a power of two"},
                                         bad_request{64, 3, "alignment 3 is not a power of two"},
                                         bad_request{64, 48, "alignment 48 is not a power of two"},
                                         bad_request{0, 64, "size 0"});
        INFO("size " << bad.size << ", alignment " << bad.alignment);
        auto refused = permissive.allocate(bad.size, bad.alignment);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
        CHECK_THAT(refused.error().message, Catch::Contains(bad.named));
        auto good = value_or_fail(permissive.allocate(64, 64));
        REQUIRE(permissive.release(good));
    }
    require_unloads(module);
}

TEST_CASE("a ticket retired inside enqueue_release that then fails: the completion wins",
          "[hostile][deferred]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto faulty = open_or_fail<cpu_device>(module, "retire-then-fail");
        auto live = value_or_fail(faulty.allocate(4096, 64));
        auto enqueued = faulty.enqueue_release(live); // threw std::out_of_range before the fix
        REQUIRE_FALSE(enqueued);
        CHECK(enqueued.error().code == status_code::contract_violation);
        CHECK_THAT(enqueued.error().message,
                   Catch::Contains("retired ticket") && Catch::Contains("INTERNAL_ERROR") &&
                       Catch::Contains("the release stands"));
        // The allocation is gone: it cannot be released again, and the next drain reports it.
        auto again = faulty.release(live);
        REQUIRE_FALSE(again);
        CHECK(again.error().code == status_code::unknown_allocation);
        auto completions = value_or_fail(faulty.drain_releases());
        REQUIRE(completions.size() == 1);
        CHECK(completions[0].allocation_id == live.allocation_id);
        CHECK(completions[0].report.state == release_state::complete);
        const auto host = value_or_fail(module->readiness()).host;
        CHECK(host.allocations == 0);
        CHECK(host.queued_releases == 0);
    }
    require_unloads(module);
}

TEST_CASE("a completion delivered outside a drain does not keep its allocator alive",
          "[hostile][deferred]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto early = open_or_fail<cpu_device>(module, "early-completion");
        auto live = value_or_fail(early.allocate(4096, 64));
        value_or_fail(early.enqueue_release(live)); // retired inside the call
    } // the engine lets go before any drain
    require_unloads(module); // refused forever before the fix: the allocator pinned itself
}

TEST_CASE("a failed drain keeps the completions it collected for the next drain",
          "[hostile][deferred]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto failing = open_or_fail<cpu_device>(module, "failing-drain");
        auto first = value_or_fail(failing.allocate(4096, 64));
        auto second = value_or_fail(failing.allocate(4096, 64));
        const std::uint64_t first_ticket = value_or_fail(failing.enqueue_release(first));
        const std::uint64_t second_ticket = value_or_fail(failing.enqueue_release(second));
        auto failed = failing.drain_releases(); // retires both, then fails
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::internal_error);
        CHECK(value_or_fail(module->readiness()).host.queued_releases == 0);
        auto completions = value_or_fail(failing.drain_releases());
        REQUIRE(completions.size() == 2);
        CHECK(completions[0].ticket == first_ticket);
        CHECK(completions[1].ticket == second_ticket);
    }
    require_unloads(module);
}

TEST_CASE("a shared prefix whose handle names another mechanism is refused and not counted",
          "[hostile][shared]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto foreign = open_or_fail<cpu_device>(module, "foreign-prefix");
        auto mapping = value_or_fail(foreign.shared_mapping());
        auto refused = mapping.create_prefix(4096);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::contract_violation);
        CHECK_THAT(refused.error().message, Catch::Contains("naming mechanism 4343"));
        const auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.shared_prefixes == 0);
        CHECK(readiness.plugin.shared_prefixes == 0); // handed back to the plugin
    }
    require_unloads(module);
}

TEST_CASE("shared-prefix references the engine still holds go with their allocator",
          "[hostile][shared]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(4096));
        value_or_fail(mapping.retain_prefix(prefix));
        CHECK(value_or_fail(module->readiness()).host.shared_prefixes == 2);
    } // neither reference released: the plugin drops them with the allocator, so must the host
    require_unloads(module);
}
