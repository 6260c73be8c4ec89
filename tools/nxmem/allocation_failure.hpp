// Fails the N-th allocation of one side, host or plugin: the executable that links this file
// replaces the global operator new (every form) and, outside sanitizer builds, the C allocation
// functions malloc, calloc, realloc, posix_memalign, aligned_alloc and memalign. A plugin linked to
// the shared C and C++ runtimes binds those names to the executable's definitions, so its
// allocations reach the injector whether its own code or a runtime function it called (a
// std::string member, strdup) made them.
//
// Whose allocation it is, is decided by the caller: the stack is walked from the allocation
// outwards, skipping the injector and the runtime (every object loaded before
// learn_runtime_objects: libstdc++, libc, libgcc, the sanitizers), and the first other frame
// decides: the executable's code is the host's (the header-only host is compiled into it), the
// code of the plugin's library (the file aimed at, compared by device and inode) is the plugin's,
// anything else (another library the plugin loaded, e.g. a driver) is neither's. An allocation
// whose first caller is the dynamic loader itself (link maps, a thread's dynamic TLS block) is the
// loader's: never counted, since glibc answers its failure by aborting or by failing dlopen.
// Deciding by caller rather than by a flag the host sets around each plugin call needs no hook in
// the host and also sees what a plugin allocates while dlopen runs its initialisers, before the
// host has called it at all.
//
// The host target counts operator new only: every allocation of the host's own code goes through
// it, and malloc is reached from the host only through glibc (dlopen), whose out-of-memory
// handling is glibc's. In AddressSanitizer, ThreadSanitizer and LeakSanitizer builds the C
// allocation functions are the sanitizer's own and are not replaced (replacing them would replace
// the sanitizer's allocator): there only operator new is failed, and LeakSanitizer finds leaks.
//
// While the plugin is aimed at, the injector also keeps every live allocation the plugin made
// (address and size, in a fixed table: nothing allocates) until it is freed, by anyone: what is
// still there when the plugin has been unloaded leaked.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nxmem::fault {

enum class side { host, plugin };

// Call once, before any plugin is loaded: records which loaded objects are the runtime.
void learn_runtime_objects();

// Which library's code is the plugin's (a path that stat() resolves; the library need not be
// loaded yet). Call before arming the plugin side.
void aim_at_plugin(const char* path);

// From now on count `counted`'s allocations and fail the `fail_at`-th (0: fail none).
void arm(side counted, std::uint64_t fail_at);
void disarm();
std::uint64_t allocations_counted();
bool injected();

// Whether the C allocation functions are replaced in this build (not under a sanitizer).
bool c_allocation_functions_replaced();

// The plugin's allocations not freed yet (counted from the last arm).
std::uint64_t plugin_allocations_live();
std::uint64_t plugin_bytes_live();

// While one exists on a thread, that thread's allocations are neither counted nor failed: the
// checker's own bookkeeping (readiness queries, messages) between steps.
class uncounted {
public:
    uncounted() noexcept;
    ~uncounted();
    uncounted(const uncounted&) = delete;
    uncounted& operator=(const uncounted&) = delete;

private:
    bool was_;
};

} // namespace nxmem::fault
