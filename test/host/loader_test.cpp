// Loading, exports, negotiation and factories: what happens before any allocator is opened.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

using namespace nxmem;
using nxmem::test::is_mapped;
using nxmem::test::load_or_fail;

TEST_CASE("a library missing one of the three exports is refused, named, and no longer mapped",
          "[loader]") {
    const auto [variable, missing] = GENERATE(
        std::pair{"NXMEM_NO_NEGOTIATE_PLUGIN", "NxmemNegotiate"},
        std::pair{"NXMEM_NO_CREATE_FACTORIES_PLUGIN", "NxmemCreateAllocatorFactories"},
        std::pair{"NXMEM_NO_QUERY_UNLOAD_READINESS_PLUGIN", "NxmemQueryUnloadReadiness"});
    const std::string path = test::plugin_path(variable);
    auto loaded = host::plugin_module::load(path);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == status_code::contract_violation);
    CHECK_THAT(loaded.error().message, Catch::Contains(missing));
    CHECK_THAT(loaded.error().message, Catch::Contains("missing export"));
    CHECK_FALSE(is_mapped(path));
}

TEST_CASE("a library with none of the exports is refused naming all three", "[loader]") {
    const std::string path = test::plugin_path("NXMEM_NO_EXPORTS_PLUGIN");
    auto loaded = host::plugin_module::load(path);
    REQUIRE_FALSE(loaded);
    for (const char* name : {"NxmemNegotiate", "NxmemCreateAllocatorFactories",
                             "NxmemQueryUnloadReadiness"}) {
        CHECK_THAT(loaded.error().message, Catch::Contains(name));
    }
    CHECK_FALSE(is_mapped(path));
}

TEST_CASE("a file that is not a plugin is refused with the loader's reason", "[loader]") {
    SECTION("a missing file") {
        auto loaded = host::plugin_module::load("/nonexistent/nxmem_plugin.so");
        REQUIRE_FALSE(loaded);
        CHECK_THAT(loaded.error().message, Catch::Contains("/nonexistent/nxmem_plugin.so"));
        CHECK_THAT(loaded.error().message, Catch::Contains("No such file"));
    }
    SECTION("a text file") {
        const std::string path = std::string(std::getenv("NXMEM_SCRATCH_DIR") ? std::getenv("NXMEM_SCRATCH_DIR") : ".") + "/not_a_plugin.so";
        std::ofstream(path) << "this is not an ELF object\n";
        auto loaded = host::plugin_module::load(path);
        REQUIRE_FALSE(loaded);
        CHECK_THAT(loaded.error().message, Catch::Contains("not_a_plugin.so"));
        // glibc says "invalid ELF header" (or "file too short" for tiny files)
        CHECK_THAT(loaded.error().message,
                   Catch::Contains("ELF") || Catch::Contains("file too short"));
    }
}

TEST_CASE("a plugin outside the host's major range is refused", "[negotiation]") {
    const std::string path = test::testplugin_path();
    host::load_options options;
    options.host_range = {2, 0, 3};
    auto loaded = host::plugin_module::load(path, options);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == status_code::version_mismatch);
    CHECK_THAT(loaded.error().message, Catch::Contains("major"));
    CHECK_FALSE(is_mapped(path)); // a failed negotiation unloads
}

TEST_CASE("a host range with no minor in common is refused", "[negotiation]") {
    host::load_options options;
    options.host_range = {1, NXMEM_ABI_MINOR + 1, NXMEM_ABI_MINOR + 4};
    auto loaded = host::plugin_module::load(test::testplugin_path(), options);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == status_code::version_mismatch);
}

TEST_CASE("negotiation fixes the highest common minor as the ceiling", "[negotiation]") {
    auto current = load_or_fail(test::testplugin_path());
    CHECK(current->version() == nxmem::abi::negotiated_version{1, 4});
    CHECK(current->plugin_range() == nxmem::abi::version_range{1, 0, 4});
    REQUIRE(current->try_unload());

    host::load_options older;
    older.host_range = {1, 0, 0};
    auto clamped = load_or_fail(test::testplugin_path(), older);
    CHECK(clamped->version() == nxmem::abi::negotiated_version{1, 0});
    REQUIRE(clamped->try_unload());
}

TEST_CASE("every factory is listed once with its name, id and device types", "[factories]") {
    auto module = load_or_fail(test::testplugin_path());
    const auto& factories = module->factories();
    REQUIRE(factories.size() == 20);
    for (const char* name : {"eager", "legacy-1-0", "lazy", "callback-probe", "quarantining",
                             "future-state", "sticky", "throwing", "short-struct",
                             "overclaiming", "no-misuse-check", "lying-capabilities",
                             "segfaulting", "failing-release", "unmasked-flags",
                             // issue 12's host faults
                             "permissive", "retire-then-fail", "early-completion",
                             "failing-drain", "foreign-prefix"}) {
        const host::factory_info* factory = module->find_factory(name);
        REQUIRE(factory != nullptr);
        CHECK(factory->mechanism_id != 0);
        CHECK(factory->serves(NXMEM_DEVICE_CPU));
        CHECK(factory->serves(NXMEM_DEVICE_CUDA));
        CHECK_FALSE(factory->serves(NXMEM_DEVICE_HIP));
    }
    CHECK(module->find_factory("no-such-mechanism") == nullptr);
    REQUIRE(module->try_unload());
}

TEST_CASE("every factory is released exactly once", "[factories]") {
    const std::string path = test::testplugin_path();
    // A second handle keeps the module mapped after the host lets go, so its own counters can be
    // read afterwards; reading a statically linked copy would observe a different variable.
    test::library_handle keep(path);
    const std::uint64_t created_before = keep.counter("NxmemTestFactoriesCreated");
    const std::uint64_t released_before = keep.counter("NxmemTestFactoriesReleased");
    std::uint64_t listed = 0;
    {
        auto module = load_or_fail(path);
        listed = module->factories().size();
        REQUIRE(listed == 20); // as "every factory is listed once with its name, id and device types"
        CHECK(keep.counter("NxmemTestFactoriesCreated") - created_before == listed);
        CHECK(keep.counter("NxmemTestFactoriesReleased") == released_before);
        auto allocator = test::open_or_fail<cpu_device>(module, "eager");
        (void)allocator;
    } // the allocator, then the module: every factory goes back here
    CHECK(keep.counter("NxmemTestFactoriesReleased") - released_before == listed);
    keep.close();
    CHECK_FALSE(is_mapped(path));
}

TEST_CASE("an idle plugin unloads and is no longer mapped", "[unload]") {
    const std::string path = test::testplugin_path();
    auto module = load_or_fail(path);
    CHECK(is_mapped(path));
    auto readiness = test::value_or_fail(module->readiness());
    CHECK(readiness.ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(module->loaded());
    CHECK_FALSE(is_mapped(path));
    auto again = module->try_unload();
    REQUIRE_FALSE(again);
    CHECK_THAT(again.error().message, Catch::Contains("already unloaded"));
}

TEST_CASE("the C example plugin loads and negotiates its baseline", "[loader][c-example]") {
    auto module = load_or_fail(test::minimal_c_plugin_path());
    CHECK(module->version() == nxmem::abi::negotiated_version{1, 0}); // it speaks minor 0 only
    REQUIRE(module->factories().size() == 1);
    CHECK(module->factories()[0].name == "minimal-c");
    REQUIRE(module->try_unload());
}
