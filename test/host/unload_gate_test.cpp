// Tests that leave the module pinned for the rest of the process, which is why they are their own
// test executable: the sticky mechanism never retires a queued release, and an allocator with a
// pending release stays alive after the engine lets go of it.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("unload stays refused while a sticky queued release never retires", "[sticky]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        auto sticky = open_or_fail<cpu_device>(module, "sticky");
        REQUIRE((sticky.capabilities() & NXMEM_CAP_DEFERRED_RELEASE) != 0);
        auto live = value_or_fail(sticky.allocate(4096, 64));
        REQUIRE(sticky.enqueue_release(live));
        for (int attempt = 0; attempt < 3; ++attempt) {
            CHECK(value_or_fail(sticky.drain_releases()).empty());
        }
    } // the engine lets go of the allocator; the queued release still pins it
    for (int attempt = 0; attempt < 3; ++attempt) {
        auto refused = module->try_unload();
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::busy);
        CHECK_THAT(refused.error().message, Catch::Contains("queued releases 1"));
    }
    auto readiness = value_or_fail(module->readiness());
    CHECK(readiness.plugin.queued_releases == 1);
    CHECK(readiness.host.queued_releases == 1);
    CHECK(readiness.host.allocators == 1);
    CHECK(test::is_mapped(path));
}

TEST_CASE("a queued release keeps its allocator alive after the engine lets go", "[pending]") {
    auto module = load_or_fail(test::testplugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        auto live = value_or_fail(lazy.allocate(4096, 64));
        REQUIRE(lazy.enqueue_release(live));
    } // the engine's handle is gone; the pending release pins the allocator
    auto readiness = value_or_fail(module->readiness());
    CHECK(readiness.host.allocators == 1);
    CHECK(readiness.plugin.allocators == 1);
    CHECK_FALSE(module->try_unload());
}

