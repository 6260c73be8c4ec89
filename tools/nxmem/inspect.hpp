// `nxmem inspect`: what each plugin offers, what the host makes of it, and whether it unloads.
#pragma once

#include "subcommand.hpp"

namespace nxmem::tool {

// Registers `inspect` on `parent`.
subcommand add_inspect(CLI::App& parent);

} // namespace nxmem::tool
