// The plugin's exception guard: every slot and export body a plugin defines runs inside it.
#pragma once

#include <nxmem/detail/exception_guard.hpp>

namespace nxmem::plugin {

// guard(status, body): body's NxmemStatusCode, or INTERNAL_ERROR with what() if it threw.
using ::nxmem::detail::guard_status;
// guard_void(body [, on_failure]): for slots without a status (retain, release).
using ::nxmem::detail::guard_void;

} // namespace nxmem::plugin
