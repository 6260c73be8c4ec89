// A mechanism's live shared prefixes by id: the kit's table (nxmem/plugin/prefix_table.hpp),
// which posix wrote first.
#pragma once

#include <nxmem/plugin/prefix_table.hpp>

namespace nxmem::posix {

using plugin::check_prefix_fits;
using plugin::prefix_table;

} // namespace nxmem::posix
