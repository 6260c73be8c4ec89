// `nxmem conform`: runs the conformance suite (include/nxmem/conform/) on every mechanism of a
// plugin, each mechanism in a child process of its own, so a plugin that crashes is reported with
// the check that was running and the other mechanisms' results are kept.
#pragma once

#include "subcommand.hpp"

namespace nxmem::tool {

// Registers `conform` on `parent`.
subcommand add_conform(CLI::App& parent);

} // namespace nxmem::tool
