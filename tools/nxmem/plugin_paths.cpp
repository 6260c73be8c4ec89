#include "plugin_paths.hpp"

#include "bundled_plugins.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>

namespace nxmem::tool {

namespace {

std::vector<std::string> split_path_list(std::string_view list) {
    std::vector<std::string> entries;
    while (!list.empty()) {
        const std::size_t colon = list.find(':');
        const std::string_view entry = list.substr(0, colon);
        if (!entry.empty()) {
            entries.emplace_back(entry);
        }
        if (colon == std::string_view::npos) {
            break;
        }
        list.remove_prefix(colon + 1);
    }
    return entries;
}

// The *.so files directly in `directory`, in name order.
void add_directory(const std::filesystem::path& directory, plugin_list& list) {
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
        list.problems.push_back(std::string(plugin_path_variable) + " entry '" + directory.string() +
                                "': cannot list the directory: " + failure.message());
        return;
    }
    if (found.empty()) {
        list.problems.push_back(std::string(plugin_path_variable) + " entry '" + directory.string() +
                                "' is a directory with no .so files");
        return;
    }
    std::sort(found.begin(), found.end());
    list.paths.insert(list.paths.end(), found.begin(), found.end());
}

} // namespace

plugin_list default_plugins() {
    plugin_list list;
    const char* variable = std::getenv(plugin_path_variable);
    if (variable == nullptr || *variable == '\0') {
        list.source = "the plugins bundled with nxmem";
        list.paths = split_path_list(NXMEM_BUNDLED_PLUGINS);
        return list;
    }
    list.source = std::string(plugin_path_variable) + "='" + variable + "'";
    for (const std::string& entry : split_path_list(variable)) {
        std::error_code ignored;
        if (std::filesystem::is_directory(entry, ignored)) {
            add_directory(entry, list);
        } else {
            list.paths.push_back(entry);
        }
    }
    return list;
}

} // namespace nxmem::tool
