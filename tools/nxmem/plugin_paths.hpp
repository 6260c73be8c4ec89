// Which plugins a subcommand looks at when none is named: NXMEM_PLUGIN_PATH when it is set and not
// empty; else, for an installed nxmem, the installed plugin directory (found relative to the
// executable, so a staged or moved install works); for the uninstalled nxmem in its build
// directory, the plugins built with it (their build-tree paths, fixed at build time).
#pragma once

#include <string>
#include <vector>

namespace nxmem::tool {

inline constexpr const char* plugin_path_variable = "NXMEM_PLUGIN_PATH";

struct plugin_list {
    std::vector<std::string> paths;
    std::vector<std::string> problems; // entries that yielded no plugin, each with the reason
    std::string source;                // where the list came from, for messages
};

// NXMEM_PLUGIN_PATH is colon-separated; a file entry is taken as is (a missing one is reported
// when it fails to load), a directory entry contributes its *.so files in name order.
plugin_list default_plugins();

// A PLUGIN argument as the loader must see it: a bare file name ("plugin.so") names the file in
// the current directory, as any other path does, and is never handed to dlopen's library search
// (which would look in the system's library directories and not here). Other paths are kept.
std::string as_plugin_path(std::string argument);

// The installed plugin directory as this executable sees it.
std::string installed_plugin_directory();

// The paragraph of the --help footers that says where the plugins come from without arguments.
std::string default_plugins_help();

// The project version and the ABI range, for --version.
std::string version_text();

} // namespace nxmem::tool
