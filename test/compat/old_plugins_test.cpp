// Plugins compiled against frozen header snapshots, loaded by the current C++ host at every host
// range from 1.0-1.0 to 1.0-1.NXMEM_ABI_MINOR: each negotiates, opens, allocates, writes and
// releases (through release_allocation where its level has it), unloads and is unmapped; and
// each passes the conformance suite. And the other direction: a plugin of the next minor, which
// no header has yet (future_plugin.c), is opened and driven by the current host.
//
// NXMEM_SNAPSHOT_PLUGINS lists the fixtures as SNAPSHOT=MECHANISM=MINOR=PATH, ':'-separated:
// the snapshot it was built against, its one mechanism, and the newest minor it speaks.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/conform.hpp>
#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

struct snapshot_plugin {
    std::string snapshot;
    std::string mechanism;
    std::uint32_t max_minor;
    std::string path;
};

std::vector<snapshot_plugin> snapshot_plugins() {
    std::vector<snapshot_plugin> plugins;
    std::istringstream list(test::plugin_path("NXMEM_SNAPSHOT_PLUGINS"));
    std::string entry;
    while (std::getline(list, entry, ':')) {
        std::istringstream fields(entry);
        snapshot_plugin plugin;
        std::string minor;
        std::getline(fields, plugin.snapshot, '=');
        std::getline(fields, plugin.mechanism, '=');
        std::getline(fields, minor, '=');
        std::getline(fields, plugin.path);
        plugin.max_minor = static_cast<std::uint32_t>(std::stoul(minor));
        plugins.push_back(plugin);
    }
    REQUIRE_FALSE(plugins.empty());
    return plugins;
}

} // namespace

TEST_CASE("plugins built against every snapshot are driven by the current host at every host range",
          "[snapshot]") {
    for (const snapshot_plugin& plugin : snapshot_plugins()) {
        for (std::uint32_t host_max = 0; host_max <= NXMEM_ABI_MINOR; ++host_max) {
            INFO(plugin.mechanism << " built against the " << plugin.snapshot
                                  << " snapshot, host range 1.0-1." << host_max);
            host::load_options options;
            options.host_range = {NXMEM_ABI_MAJOR, 0, host_max};
            auto module = test::load_or_fail(plugin.path, options);
            const std::uint32_t agreed = std::min(host_max, plugin.max_minor);
            CHECK(module->version().minor == agreed);
            {
                auto allocator = test::open_or_fail<cpu_device>(module, plugin.mechanism);
                CHECK(allocator.effective_minor() <= agreed);
                const bool structured = allocator.effective_minor() >= 1 && plugin.max_minor >= 1;
                CHECK((allocator.checked_table().release_allocation != nullptr) == structured);
                auto live = test::value_or_fail(allocator.allocate(3000, 64));
                std::memset(reinterpret_cast<void*>(live.address), 0x5A, 3000);
                auto released = test::value_or_fail(allocator.release(live));
                CHECK(released.state == release_state::complete);
                CHECK(released.unmapped_bytes == 3000);
            }
            REQUIRE(module->try_unload());
            CHECK_FALSE(test::is_mapped(plugin.path));
        }
    }
}

TEST_CASE("plugins built against every snapshot pass the conformance suite", "[snapshot][conform]") {
    for (const snapshot_plugin& plugin : snapshot_plugins()) {
        INFO(plugin.mechanism << " built against the " << plugin.snapshot << " snapshot");
        const auto results = conform::run_mechanism_checks(plugin.path, plugin.mechanism);
        REQUIRE(results.size() == conform::all_checks.size());
        std::ostringstream failures;
        std::size_t passed = 0;
        for (const conform::check_result& result : results) {
            passed += result.passed() ? 1 : 0;
            if (result.failed()) {
                failures << result.id << ": expected " << result.expected << ", got "
                         << result.actual << '\n';
            }
        }
        INFO(failures.str());
        CHECK(failures.str().empty());
        CHECK(passed >= conform::all_checks.size() / 2);
    }
}

TEST_CASE("a plugin of the next minor is read at the host's minor, its unknown flag cleared",
          "[future]") {
    const std::string path = test::plugin_path("NXMEM_FUTURE_PLUGIN");
    auto module = test::load_or_fail(path);
    CHECK(module->version().minor == NXMEM_ABI_MINOR); // the plugin speaks up to NXMEM_ABI_MINOR + 1
    {
        auto future = test::open_or_fail<cpu_device>(module, "future-c");
        CHECK(future.declared_minor() == NXMEM_ABI_MINOR + 1);
        CHECK(future.effective_minor() == NXMEM_ABI_MINOR);
        CHECK(future.capabilities() == 0); // its one flag is of the next minor: cleared, not refused
        auto live = test::value_or_fail(future.allocate(5000, 256));
        std::memset(reinterpret_cast<void*>(live.address), 0x3C, 5000);
        CHECK(test::value_or_fail(future.release(live)).state == release_state::complete);
    }
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}
