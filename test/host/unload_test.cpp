// The unload gate: refused while anything the module handed out is still held, with both tallies
// in the refusal; granted, and really unmapped, once everything is back.
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

// try_unload is refused with BUSY, the message carrying `host_says` and `plugin_says`, and the
// library stays mapped.
void require_refused(host::plugin_module& module, const std::string& plugin_says,
                     const std::string& host_says) {
    auto refused = module.try_unload();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::busy);
    CHECK_THAT(refused.error().message, Catch::Contains("plugin reports {") &&
                                            Catch::Contains(plugin_says) &&
                                            Catch::Contains("host holds {") &&
                                            Catch::Contains(host_says));
    CHECK(module.loaded());
    CHECK(test::is_mapped(module.path().string()));
}

} // namespace

TEST_CASE("unload is refused while an allocator is open", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    std::optional<host::plugin_allocator<cpu_device>> eager = open_or_fail<cpu_device>(module, "eager");
    require_refused(*module, "allocators 1", "allocators 1");
    eager.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("unload is refused while an allocation is live", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    auto eager = open_or_fail<cpu_device>(module, "eager");
    auto live = value_or_fail(eager.allocate(64, 8));
    require_refused(*module, "allocations 1", "allocations 1");
    REQUIRE(eager.release(live));
    require_refused(*module, "allocations 0", "allocators 1"); // still open
}

TEST_CASE("unload is refused while a shared prefix is held", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    std::optional<host::plugin_allocator<cpu_device>> lazy = open_or_fail<cpu_device>(module, "lazy");
    {
        auto mapping = value_or_fail(lazy->shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(4096));
        require_refused(*module, "shared prefixes 1", "shared prefixes 1");
        REQUIRE(mapping.release_prefix(prefix));
    }
    lazy.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("unload is refused while a capability view is held", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    std::optional<host::virtual_backing_view<cpu_device>> backing;
    {
        auto lazy = open_or_fail<cpu_device>(module, "lazy");
        backing.emplace(value_or_fail(lazy.virtual_backing()));
    } // the view alone keeps the allocator alive
    require_refused(*module, "allocators 1", "views 1");
    backing.reset();
    REQUIRE(module->try_unload());
}

TEST_CASE("unload is refused while a queued release has not retired", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    auto lazy = open_or_fail<cpu_device>(module, "lazy");
    auto live = value_or_fail(lazy.allocate(4096, 64));
    REQUIRE(lazy.enqueue_release(live));
    require_refused(*module, "queued releases 1", "queued releases 1");
    REQUIRE(value_or_fail(lazy.drain_releases()).size() == 1);
    require_refused(*module, "queued releases 0", "allocators 1");
}

TEST_CASE("unload is refused while a pin is held", "[unload]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    {
        auto pin = value_or_fail(module->pin());
        require_refused(*module, "allocators 0", "pins 1");
    }
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
    auto late = module->pin();
    REQUIRE_FALSE(late);
    CHECK(late.error().code == status_code::busy);
}

TEST_CASE("opening an allocator on an unloaded module is refused", "[unload]") {
    auto module = load_or_fail(test::testplugin_path());
    REQUIRE(module->try_unload());
    auto opened = host::open_allocator<cpu_device>(module, "eager");
    REQUIRE_FALSE(opened);
    CHECK(opened.error().code == status_code::busy);
}
