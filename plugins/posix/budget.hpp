// An allocator's budget against the `budget` option: the kit's budget loop
// (nxmem/plugin/budget.hpp), which posix wrote first.
#pragma once

#include <nxmem/plugin/budget.hpp>

namespace nxmem::posix {

using byte_budget = plugin::byte_budget;

} // namespace nxmem::posix
