// The human-readable form of `nxmem inspect`: one block per plugin, a table of its mechanisms.
#pragma once

#include "inspection.hpp"

#include <ostream>
#include <vector>

namespace nxmem::tool {

void print_text(std::ostream& out, const std::vector<plugin_report>& reports);

} // namespace nxmem::tool
