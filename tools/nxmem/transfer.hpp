// `nxmem transfer`: what the transfer layer costs over a plugin's host memory, against
// ucx_perftest on the same transport (measure/transfer_figures.hpp, docs/TRANSFER.md). Built
// only where UCX is found.
#pragma once

#include "subcommand.hpp"

namespace nxmem::tool {

// Registers `transfer` on `parent`.
subcommand add_transfer(CLI::App& parent);

} // namespace nxmem::tool
