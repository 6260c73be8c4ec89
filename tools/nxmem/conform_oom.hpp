// `nxmem conform --oom`: allocation-failure injection on the plugin's side. For each mechanism,
// a child runs the standard sequence (oom_sequence.hpp) once without a failure, counting the
// plugin's allocations (allocation_failure.hpp); then, for every N up to that count, a child runs
// it again with the plugin's N-th allocation failing. Each must end cleanly: every call succeeds
// or is refused with OUT_OF_MEMORY (or the step's documented code) with the counts unchanged,
// succeeds when repeated, and after the unload the library is unmapped with none of the plugin's
// allocations left. docs/CONFORMANCE.md, "Out of memory in the plugin".
#pragma once

#include "conform_run.hpp"

namespace nxmem::tool {

plugin_run run_oom(const conform_request& request);

} // namespace nxmem::tool
