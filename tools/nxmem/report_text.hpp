// The human-readable form of `nxmem inspect`: one block per plugin, a table of its mechanisms.
// (The command joins the blocks, each rendered in the child that inspected the plugin.)
#pragma once

#include "inspection.hpp"

#include <ostream>

namespace nxmem::tool {

void print_text(std::ostream& out, const plugin_report& report);

} // namespace nxmem::tool
