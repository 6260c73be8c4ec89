// Where the built plugins are: the test's environment names them (set by test/meson.build). A
// missing variable fails the test loudly; it never skips.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

namespace nxmem::test {

inline std::string plugin_path(const char* variable) {
    const char* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') {
        FAIL("environment variable " << variable
                                     << " is not set: run the tests through `meson test`");
    }
    return value;
}

inline std::string testplugin_path() { return plugin_path("NXMEM_TESTPLUGIN"); }
inline std::string minimal_c_plugin_path() { return plugin_path("NXMEM_MINIMAL_C_PLUGIN"); }

} // namespace nxmem::test
