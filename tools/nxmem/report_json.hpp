// The --json form of `nxmem inspect`: one object per plugin, keys in snake_case (the command
// prints them as an array).
#pragma once

#include "inspection.hpp"

#include <nlohmann/json.hpp>

namespace nxmem::tool {

nlohmann::ordered_json to_json(const plugin_report& report);

} // namespace nxmem::tool
