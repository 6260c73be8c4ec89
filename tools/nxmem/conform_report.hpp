// The three forms of `nxmem conform`'s report: text (one line per check), JSON, JUnit XML.
#pragma once

#include "conform_run.hpp"

#include <nlohmann/json.hpp>

#include <ostream>
#include <vector>

namespace nxmem::tool {

void print_conform_text(std::ostream& out, const std::vector<plugin_run>& runs);
nlohmann::ordered_json conform_to_json(const std::vector<plugin_run>& runs);
void write_conform_junit(std::ostream& out, const std::vector<plugin_run>& runs);

} // namespace nxmem::tool
