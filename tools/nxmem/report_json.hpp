// The --json form of `nxmem inspect`: an array with one object per plugin, keys in snake_case.
#pragma once

#include "inspection.hpp"

#include <nlohmann/json.hpp>

#include <vector>

namespace nxmem::tool {

nlohmann::ordered_json to_json(const std::vector<plugin_report>& reports);

} // namespace nxmem::tool
