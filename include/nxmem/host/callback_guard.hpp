// The host's twin of the plugin guard: every host callback a plugin can call (request_reclaim,
// release_completed) runs inside it, so no host exception unwinds through plugin frames.
#pragma once

#include <nxmem/detail/exception_guard.hpp>

namespace nxmem::host {

using ::nxmem::detail::guard_status;
using ::nxmem::detail::guard_void;

} // namespace nxmem::host
