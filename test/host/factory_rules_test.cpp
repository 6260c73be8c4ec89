// Factory lists that break S2, X4 or X5 (test/host/bad_factories_plugin.c, one library per fault):
// each load is refused with CONTRACT_VIOLATION naming the fault, every factory the host could
// read a release slot for is released exactly once although the load failed (O1), and the
// library is unmapped afterwards (U9). A well-formed build of the same source loads, as a control.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>

using namespace nxmem;

namespace {

std::string fixture(const std::string& variant) {
    return test::plugin_path("NXMEM_BAD_FACTORIES_DIR") + "/nxmem_test_factories_" + variant + ".so";
}

struct factory_fault {
    const char* variant;
    const char* rule;
    const char* named;                     // what the refusal must say
    std::optional<std::uint64_t> released; // factories released by the refused load
};

} // namespace

TEST_CASE("a refused factory list is named, its factories are released once, and nothing stays "
          "mapped",
          "[rules][factories]") {
    const factory_fault faults[] = {
        {"null_open", "S2", "required slot 'open_allocator' is NULL", 2},
        {"null_release", "S2", "required slot 'release' is NULL", 1}, // one cannot be released
        // The count is not believed, so which pointers are real is not known: none is released.
        {"count_above_capacity", "X4", "reported 65 factories with a capacity of 64", std::nullopt},
        {"null_name", "X5", "a factory name is NULL, empty or longer than 127 bytes", 2},
        {"empty_name", "X5", "a factory name is NULL, empty or longer than 127 bytes", 2},
        {"long_name", "X5", "a factory name is NULL, empty or longer than 127 bytes", 2},
        {"duplicate_name", "X5", "factory 'first' repeats another factory's name or mechanism id", 2},
        {"duplicate_id", "X5", "factory 'second' repeats another factory's name or mechanism id", 2},
        {"zero_id", "X5", "factory 'second' has mechanism id 0", 2},
    };
    for (const factory_fault& fault : faults) {
        DYNAMIC_SECTION(fault.rule << ": " << fault.variant) {
            const std::string path = fixture(fault.variant);
            {
                test::library_handle handle(path); // keeps the counter readable after the refusal
                auto refused = host::plugin_module::load(path);
                REQUIRE_FALSE(refused);
                CHECK(refused.error().code == status_code::contract_violation);
                CHECK_THAT(refused.error().message, Catch::Contains(fault.named));
                if (fault.released) {
                    CHECK(handle.counter("NxmemProbeFactoriesReleased") == *fault.released); // O1
                }
            }
            CHECK_FALSE(test::is_mapped(path));
        }
    }
}

TEST_CASE("the well-formed factory list of the same source loads and unloads", "[rules][factories]") {
    const std::string path = fixture("well_formed");
    {
        test::library_handle handle(path);
        auto module = test::load_or_fail(path);
        REQUIRE(module->factories().size() == 2);
        CHECK(module->factories()[0].name == "first");
        CHECK(module->factories()[1].name == "second");
        REQUIRE(module->try_unload());
        CHECK(handle.counter("NxmemProbeFactoriesReleased") == 2);
    }
    CHECK_FALSE(test::is_mapped(path));
}
