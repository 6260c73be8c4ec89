// Fails the N-th allocation the host makes: this test executable replaces the global operator new
// (every form) and counts, while armed, each allocation whose nearest caller (the first stack
// frame in this executable or in a plugin, skipping the C++ runtime and the injector itself) is
// host code — the header-only host is compiled into this executable; a frame in a plugin means
// the plugin allocated, which is not counted and never failed.
//
// Only operator new is interposed, not malloc: every allocation of the host's own code goes
// through operator new (containers, strings, shared_ptr, paths); malloc is reached only from
// glibc's dynamic loader inside dlopen, whose out-of-memory handling is glibc's, and replacing
// malloc in an AddressSanitizer build would replace ASan's own allocator.
#pragma once

#include <cstdint>

namespace nxmem::test::fault {

// Call once, before any plugin is loaded: records which loaded objects are the runtime.
void learn_runtime_objects();

// From now on count host allocations and fail the `fail_at`-th (0: fail none).
void arm(std::uint64_t fail_at);
void disarm();
std::uint64_t host_allocations_counted();
bool injected();

} // namespace nxmem::test::fault
