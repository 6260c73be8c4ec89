// `nxmem bench`: what the boundary and a plugin's mechanism cost, against malloc, measured in one
// run (the figures of bench/measure/plugin_figures.hpp).
#pragma once

#include "subcommand.hpp"

namespace nxmem::tool {

// Registers `bench` on `parent`.
subcommand add_bench(CLI::App& parent);

} // namespace nxmem::tool
