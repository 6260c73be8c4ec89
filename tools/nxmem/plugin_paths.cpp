#include "plugin_paths.hpp"

#include "tool_config.h"

#include <nxmem/abi/version.hpp>

#include <range/v3/range/conversion.hpp>
#include <range/v3/view/filter.hpp>
#include <range/v3/view/split.hpp>
#include <range/v3/view/transform.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>

namespace nxmem::tool {

namespace {

std::vector<std::string> split_path_list(std::string_view list) {
    return list | ranges::views::split(':') |
           ranges::views::transform([](auto&& entry) { return ranges::to<std::string>(entry); }) |
           ranges::views::filter([](const std::string& entry) { return !entry.empty(); }) |
           ranges::to<std::vector>();
}

// The *.so files directly in `directory`, in name order; `origin` names where the directory came
// from in messages.
void add_directory(const std::filesystem::path& directory, std::string_view origin,
                   plugin_list& list) {
    std::error_code failure;
    std::vector<std::string> found;
    std::filesystem::directory_iterator entries(directory, failure);
    for (; !failure && entries != std::filesystem::directory_iterator(); entries.increment(failure)) {
        const std::filesystem::directory_entry& entry = *entries;
        std::error_code ignored;
        if (entry.path().extension() == ".so" && entry.is_regular_file(ignored)) {
            found.push_back(entry.path().string());
        }
    }
    if (failure) {
        list.problems.push_back(std::string(origin) + " '" + directory.string() +
                                "': cannot list the directory: " + failure.message());
        return;
    }
    if (found.empty()) {
        list.problems.push_back(std::string(origin) + " '" + directory.string() +
                                "' is a directory with no .so files");
        return;
    }
    std::sort(found.begin(), found.end());
    list.paths.insert(list.paths.end(), found.begin(), found.end());
}

// The directory of the running executable; empty when /proc/self/exe cannot be read.
std::filesystem::path own_directory() {
    std::error_code failure;
    const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", failure);
    return failure ? std::filesystem::path() : executable.parent_path();
}

// The uninstalled nxmem: the executable still sits in the build directory it was built in.
bool running_from_build_tree() {
    const std::filesystem::path directory = own_directory();
    std::error_code ignored;
    return !directory.empty() && std::filesystem::equivalent(directory, NXMEM_BUILD_DIR, ignored);
}

} // namespace

std::string as_plugin_path(std::string argument) {
    if (argument.empty() || std::filesystem::path(argument).has_parent_path()) {
        return argument;
    }
    return "./" + argument;
}

std::string installed_plugin_directory() {
    // The plugin directory relative to the bin directory, applied to where this executable
    // really is: DESTDIR staging and a moved prefix keep working.
    const std::filesystem::path relative =
        std::filesystem::path(NXMEM_INSTALL_PLUGINDIR).lexically_relative(NXMEM_INSTALL_BINDIR);
    const std::filesystem::path directory = own_directory();
    if (directory.empty() || relative.empty()) {
        return NXMEM_INSTALL_PLUGINDIR;
    }
    return (directory / relative).lexically_normal().string();
}

plugin_list default_plugins() {
    plugin_list list;
    const char* variable = std::getenv(plugin_path_variable);
    if (variable != nullptr && *variable != '\0') {
        list.source = std::string(plugin_path_variable) + "='" + variable + "'";
        const std::string origin = std::string(plugin_path_variable) + " entry";
        for (const std::string& entry : split_path_list(variable)) {
            std::error_code ignored;
            if (std::filesystem::is_directory(entry, ignored)) {
                add_directory(entry, origin, list);
            } else {
                list.paths.push_back(as_plugin_path(entry));
            }
        }
        return list;
    }
    if (running_from_build_tree()) {
        list.source = "the plugins built with nxmem in its build tree";
        list.paths = split_path_list(NXMEM_BUNDLED_PLUGINS);
        return list;
    }
    const std::string directory = installed_plugin_directory();
    list.source = "the installed plugin directory '" + directory + "'";
    add_directory(directory, "the installed plugin directory", list);
    return list;
}

std::string default_plugins_help() {
    const std::string when_unset =
        running_from_build_tree()
            ? std::string("the plugins built with this (uninstalled) nxmem in its build tree;\n"
                          "an installed nxmem looks in ") +
                  NXMEM_INSTALL_PLUGINDIR
            : "the installed plugins in\n" + installed_plugin_directory();
    return std::string("Without PLUGIN arguments: the files and directories (their *.so files) listed in\n") +
           plugin_path_variable + ", colon-separated; if it is unset, " + when_unset + ".\n";
}

std::string version_text() {
    return std::string("nxmem ") + NXMEM_PROJECT_VERSION + "\nplugin C ABI " +
           abi::supported_range.describe() + " (major " + std::to_string(abi::supported_range.major) +
           ", minors " + std::to_string(abi::supported_range.min_minor) + " to " +
           std::to_string(abi::supported_range.max_minor) + ")";
}

} // namespace nxmem::tool
