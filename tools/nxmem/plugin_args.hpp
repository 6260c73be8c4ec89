// The arguments that name what a subcommand opens, as `nxmem bench`, `conform` and `transfer`
// take them: PLUGIN (as_plugin_path), --mechanism NAME and --options TEXT.
#pragma once

#include "plugin_paths.hpp"

#include <CLI/CLI.hpp>

#include <string>

namespace nxmem::tool {

// PLUGIN: one path (a std::string) or several (a std::vector<std::string>).
template <class Paths> CLI::Option* add_plugin_argument(CLI::App& command, Paths& paths, const std::string& help) {
    return command.add_option("PLUGIN", paths, help)
        ->type_name("PATH")
        ->transform(as_plugin_path, std::string(), std::string());
}

CLI::Option* add_mechanism_option(CLI::App& command, std::string& mechanism, const std::string& help);

// --options: key=value entries separated by ';', at most NXMEM_MAX_OPTIONS_BYTES.
CLI::Option* add_mechanism_options_option(CLI::App& command, std::string& options, const std::string& help);

} // namespace nxmem::tool
