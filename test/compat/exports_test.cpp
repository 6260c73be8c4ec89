// Every bundled plugin defines exactly the contract's three entry points in its dynamic symbol
// table (the test plugin adds its documented test-only counters): nothing else that another
// library, libstdc++ above all, could bind to and so keep the plugin mapped after dlclose.
// nxmem_plugin_dep (include/nxmem/nxmem_plugin.map) is what makes this so.
#include "elf_exports.hpp"

#include "../support/plugin_paths.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

namespace {

using names = std::set<std::string>;

const names entry_points{"NxmemNegotiate", "NxmemCreateAllocatorFactories",
                         "NxmemQueryUnloadReadiness"};

std::string listed(const names& symbols) {
    std::ostringstream text;
    for (const auto& name : symbols) {
        text << "\n  " << name;
    }
    return text.str();
}

void require_exports(const std::string& path, const names& expected) {
    INFO(path);
    const names defined = nxmem::test::defined_dynamic_symbols(path);
    INFO("defined:" << listed(defined));
    CHECK(defined.size() == expected.size());
    CHECK(defined == expected);
}

} // namespace

TEST_CASE("the ELF reader finds what a library defines, weak and unique symbols included") {
    // libstdc++ is loaded in this C++ test; its link map names the file.
    void* libstdcxx = ::dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(libstdcxx != nullptr);
    link_map* map = nullptr;
    REQUIRE(::dlinfo(libstdcxx, RTLD_DI_LINKMAP, &map) == 0);
    const std::string path = map->l_name;
    ::dlclose(libstdcxx);
    INFO(path);
    const names defined = nxmem::test::defined_dynamic_symbols(path);
    CHECK(defined.count("_ZSt4cout") == 1);
    CHECK(defined.count("_ZNSs4_Rep11_S_max_sizeE") == 1); // an STB_GNU_UNIQUE object
    CHECK(defined.size() > 1000); // libstdc++ exports thousands; a reader that skips some fails
    CHECK(defined.count("malloc") == 0); // referenced, not defined there
}

TEST_CASE("the bundled plugins export exactly the three entry points") {
    require_exports(nxmem::test::minimal_c_plugin_path(), entry_points);
    require_exports(nxmem::test::plugin_path("NXMEM_POSIX_PLUGIN"), entry_points);
}

TEST_CASE("the test plugin exports the three entry points and its test-only counters") {
    names expected = entry_points;
    expected.insert({"NxmemTestFactoriesCreated", "NxmemTestFactoriesReleased",
                     "NxmemTestOverclaimingReleases"});
    require_exports(nxmem::test::testplugin_path(), expected);
}

TEST_CASE("the partial-export fixtures export only what they define") {
    require_exports(nxmem::test::plugin_path("NXMEM_NO_NEGOTIATE_PLUGIN"),
                    {"NxmemCreateAllocatorFactories", "NxmemQueryUnloadReadiness"});
    require_exports(nxmem::test::plugin_path("NXMEM_NO_CREATE_FACTORIES_PLUGIN"),
                    {"NxmemNegotiate", "NxmemQueryUnloadReadiness"});
    require_exports(nxmem::test::plugin_path("NXMEM_NO_QUERY_UNLOAD_READINESS_PLUGIN"),
                    {"NxmemNegotiate", "NxmemCreateAllocatorFactories"});
    require_exports(nxmem::test::plugin_path("NXMEM_NO_EXPORTS_PLUGIN"), {});
}

TEST_CASE("the compatibility fixtures export exactly the three entry points") {
    std::istringstream paths(nxmem::test::plugin_path("NXMEM_COMPAT_PLUGINS"));
    std::string path;
    int count = 0;
    while (std::getline(paths, path, ':')) {
        require_exports(path, entry_points);
        ++count;
    }
    CHECK(count > 0);
}
