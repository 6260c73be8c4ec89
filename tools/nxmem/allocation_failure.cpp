// The interposer behind allocation_failure.hpp. Every function that runs while an allocation is
// classified lives in the section nxmem_fault_injector, so the stack walk can skip its own frames
// by address; nothing here allocates.
#include "allocation_failure.hpp"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unwind.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NXMEM_FAULT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||                         \
    __has_feature(memory_sanitizer) || __has_feature(leak_sanitizer)
#define NXMEM_FAULT_SANITIZED 1
#endif
#endif

#define NXMEM_INJECTOR_CODE __attribute__((section("nxmem_fault_injector"), noinline))

extern "C" const char __start_nxmem_fault_injector[];
extern "C" const char __stop_nxmem_fault_injector[];

#ifndef NXMEM_FAULT_SANITIZED
// glibc's allocator under its exported internal names: what the replacements forward to.
extern "C" void* __libc_malloc(std::size_t);
extern "C" void* __libc_calloc(std::size_t, std::size_t);
extern "C" void* __libc_realloc(void*, std::size_t);
extern "C" void* __libc_memalign(std::size_t, std::size_t);
extern "C" void __libc_free(void*);
#endif

namespace nxmem::fault {
namespace {

struct address_range {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
};

// The executable's code, the dynamic loader's, and every other object loaded before the first
// plugin (the runtime).
constexpr std::size_t max_ranges = 256;
address_range executable_ranges[16];
std::size_t executable_count = 0;
address_range loader_ranges[16];
std::size_t loader_count = 0;
address_range runtime_ranges[max_ranges];
std::size_t runtime_count = 0;

// The plugin's file.
bool aimed = false;
dev_t plugin_device = 0;
ino_t plugin_inode = 0;

std::atomic<bool> armed{false};
side counted_side = side::host;
std::uint64_t fail_at = 0;
std::atomic<std::uint64_t> counted{0};
std::atomic<bool> failed_one{false};
thread_local bool classifying = false; // an allocation made while classifying one passes
thread_local bool not_counting = false;

// The plugin's live allocations, unordered; removal swaps the last entry in.
struct live_allocation {
    std::uintptr_t address;
    std::size_t size;
};
constexpr std::size_t max_live = 16384;
live_allocation live[max_live];
std::size_t live_count = 0;
std::atomic_flag live_lock = ATOMIC_FLAG_INIT;
bool live_overflowed = false;

enum class owner { undecided, host, plugin, neither };

struct locked_live {
    NXMEM_INJECTOR_CODE locked_live() {
        while (live_lock.test_and_set(std::memory_order_acquire)) {
        }
    }
    NXMEM_INJECTOR_CODE ~locked_live() { live_lock.clear(std::memory_order_release); }
};

NXMEM_INJECTOR_CODE bool within(const address_range* ranges, std::size_t count,
                                std::uintptr_t address) {
    for (std::size_t i = 0; i < count; ++i) {
        if (address >= ranges[i].begin && address < ranges[i].end) {
            return true;
        }
    }
    return false;
}

// Whether `address` is code of the plugin's library (which may have been loaded a moment ago).
NXMEM_INJECTOR_CODE bool in_plugin(std::uintptr_t address) {
    if (!aimed) {
        return false;
    }
    Dl_info info;
    link_map* map = nullptr;
    if (::dladdr1(reinterpret_cast<void*>(address), &info, reinterpret_cast<void**>(&map),
                  RTLD_DL_LINKMAP) == 0 ||
        map == nullptr || map->l_name == nullptr || map->l_name[0] == '\0') {
        return false;
    }
    struct stat file;
    return ::stat(map->l_name, &file) == 0 && file.st_dev == plugin_device &&
           file.st_ino == plugin_inode;
}

NXMEM_INJECTOR_CODE _Unwind_Reason_Code classify_frame(_Unwind_Context* context, void* verdict) {
    const std::uintptr_t ip = _Unwind_GetIP(context);
    if (ip == 0) {
        return _URC_NO_REASON;
    }
    const std::uintptr_t address = ip - 1; // inside the call instruction
    auto& decided = *static_cast<owner*>(verdict);
    if (address >= reinterpret_cast<std::uintptr_t>(__start_nxmem_fault_injector) &&
        address < reinterpret_cast<std::uintptr_t>(__stop_nxmem_fault_injector)) {
        return _URC_NO_REASON; // the injector itself
    }
    if (within(executable_ranges, executable_count, address)) {
        decided = owner::host;
        return _URC_END_OF_STACK;
    }
    if (within(loader_ranges, loader_count, address)) {
        decided = owner::neither; // the dynamic loader's own memory
        return _URC_END_OF_STACK;
    }
    if (within(runtime_ranges, runtime_count, address)) {
        return _URC_NO_REASON; // libstdc++, libc, the sanitizers: look further out
    }
    decided = in_plugin(address) ? owner::plugin : owner::neither;
    return _URC_END_OF_STACK;
}

// With NXMEM_OOM_TRACE set, the stack of each failed allocation goes to standard error (raw
// addresses with their objects' names: addr2line -Cfpe OBJECT turns them into lines).
bool trace_failures = false;

NXMEM_INJECTOR_CODE void print_failing_stack() {
    static const char heading[] = "nxmem: this allocation fails:\n";
    (void)!::write(2, heading, sizeof heading - 1);
    void* frames[32];
    classifying = true; // backtrace's first call may load libgcc_s, which allocates
    const int depth = ::backtrace(frames, 32);
    classifying = false;
    ::backtrace_symbols_fd(frames, depth, 2);
}

// Whether this allocation is to fail; `plugins` tells whether it is one the plugin made while
// the plugin side is counted (then it is kept in the live table).
NXMEM_INJECTOR_CODE bool allocation_fails(bool through_new, bool& plugins) {
    plugins = false;
    if (!armed.load(std::memory_order_relaxed) || classifying || not_counting) {
        return false;
    }
    if (counted_side == side::host && !through_new) {
        return false; // the host side counts operator new only
    }
    classifying = true;
    owner decided = owner::undecided;
    _Unwind_Backtrace(&classify_frame, &decided);
    classifying = false;
    const owner wanted = counted_side == side::host ? owner::host : owner::plugin;
    if (decided != wanted) {
        return false;
    }
    plugins = wanted == owner::plugin;
    if (counted.fetch_add(1) + 1 == fail_at) {
        failed_one.store(true);
        if (trace_failures) {
            print_failing_stack();
        }
        return true;
    }
    return false;
}

NXMEM_INJECTOR_CODE void remember(void* memory, std::size_t size) {
    if (memory == nullptr) {
        return;
    }
    locked_live lock;
    if (live_count == max_live) {
        live_overflowed = true;
        return;
    }
    live[live_count++] = {reinterpret_cast<std::uintptr_t>(memory), size};
}

// Forgets `memory` if the plugin allocated it; whether it did.
NXMEM_INJECTOR_CODE bool forget(void* memory) {
    if (memory == nullptr) {
        return false;
    }
    locked_live lock;
    for (std::size_t i = 0; i < live_count; ++i) {
        if (live[i].address == reinterpret_cast<std::uintptr_t>(memory)) {
            live[i] = live[--live_count];
            return true;
        }
    }
    return false;
}

NXMEM_INJECTOR_CODE void* raw_allocate(std::size_t size, std::size_t alignment) {
#ifdef NXMEM_FAULT_SANITIZED
    if (alignment <= alignof(std::max_align_t)) {
        return std::malloc(size);
    }
    void* memory = nullptr;
    return ::posix_memalign(&memory, alignment, size) == 0 ? memory : nullptr;
#else
    return alignment <= alignof(std::max_align_t) ? __libc_malloc(size)
                                                  : __libc_memalign(alignment, size);
#endif
}

NXMEM_INJECTOR_CODE void raw_free(void* memory) {
#ifdef NXMEM_FAULT_SANITIZED
    std::free(memory);
#else
    __libc_free(memory);
#endif
}

NXMEM_INJECTOR_CODE void* allocate_new(std::size_t size, std::size_t alignment, bool nothrow) {
    bool plugins = false;
    if (allocation_fails(true, plugins)) {
        if (nothrow) {
            return nullptr;
        }
        throw std::bad_alloc();
    }
    if (size == 0) {
        size = 1;
    }
    void* memory = raw_allocate(size, alignment);
    if (memory == nullptr && !nothrow) {
        throw std::bad_alloc();
    }
    if (plugins) {
        remember(memory, size);
    }
    return memory;
}

NXMEM_INJECTOR_CODE void free_new(void* memory) {
    forget(memory);
    raw_free(memory);
}

int remember_object(dl_phdr_info* info, std::size_t, void*) {
    const bool executable = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
    const bool loader = !executable && std::strstr(info->dlpi_name, "/ld-linux") != nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& header = info->dlpi_phdr[i];
        if (header.p_type != PT_LOAD) {
            continue;
        }
        const address_range range{info->dlpi_addr + header.p_vaddr,
                                  info->dlpi_addr + header.p_vaddr + header.p_memsz};
        if (executable && executable_count < std::size(executable_ranges)) {
            executable_ranges[executable_count++] = range;
        } else if (loader && loader_count < std::size(loader_ranges)) {
            loader_ranges[loader_count++] = range;
        } else if (!executable && !loader && runtime_count < max_ranges) {
            runtime_ranges[runtime_count++] = range;
        }
    }
    return 0;
}

} // namespace

void learn_runtime_objects() {
    trace_failures = std::getenv("NXMEM_OOM_TRACE") != nullptr;
    executable_count = 0;
    loader_count = 0;
    runtime_count = 0;
    dl_iterate_phdr(&remember_object, nullptr);
}

void aim_at_plugin(const char* path) {
    struct stat file;
    aimed = ::stat(path, &file) == 0;
    plugin_device = aimed ? file.st_dev : 0;
    plugin_inode = aimed ? file.st_ino : 0;
}

void arm(side counting, std::uint64_t failing) {
    counted_side = counting;
    fail_at = failing;
    counted.store(0);
    failed_one.store(false);
    {
        locked_live lock;
        live_count = 0;
        live_overflowed = false;
    }
    armed.store(true);
}
void disarm() { armed.store(false); }
std::uint64_t allocations_counted() { return counted.load(); }
bool injected() { return failed_one.load(); }

bool c_allocation_functions_replaced() {
#ifdef NXMEM_FAULT_SANITIZED
    return false;
#else
    return true;
#endif
}

std::uint64_t plugin_allocations_live() {
    locked_live lock;
    return live_overflowed ? UINT64_MAX : live_count;
}
std::uint64_t plugin_bytes_live() {
    locked_live lock;
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < live_count; ++i) {
        bytes += live[i].size;
    }
    return bytes;
}

uncounted::uncounted() noexcept : was_(not_counting) { not_counting = true; }
uncounted::~uncounted() { not_counting = was_; }

} // namespace nxmem::fault

using nxmem::fault::allocate_new;
using nxmem::fault::free_new;

NXMEM_INJECTOR_CODE void* operator new(std::size_t size) { return allocate_new(size, 0, false); }
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size) { return allocate_new(size, 0, false); }
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return allocate_new(size, 0, true);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return allocate_new(size, 0, true);
}
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, std::align_val_t alignment) {
    return allocate_new(size, static_cast<std::size_t>(alignment), false);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, std::align_val_t alignment) {
    return allocate_new(size, static_cast<std::size_t>(alignment), false);
}
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, std::align_val_t alignment,
                                       const std::nothrow_t&) noexcept {
    return allocate_new(size, static_cast<std::size_t>(alignment), true);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, std::align_val_t alignment,
                                         const std::nothrow_t&) noexcept {
    return allocate_new(size, static_cast<std::size_t>(alignment), true);
}
void operator delete(void* memory) noexcept { free_new(memory); }
void operator delete[](void* memory) noexcept { free_new(memory); }
void operator delete(void* memory, std::size_t) noexcept { free_new(memory); }
void operator delete[](void* memory, std::size_t) noexcept { free_new(memory); }
void operator delete(void* memory, const std::nothrow_t&) noexcept { free_new(memory); }
void operator delete[](void* memory, const std::nothrow_t&) noexcept { free_new(memory); }
void operator delete(void* memory, std::align_val_t) noexcept { free_new(memory); }
void operator delete[](void* memory, std::align_val_t) noexcept { free_new(memory); }
void operator delete(void* memory, std::size_t, std::align_val_t) noexcept { free_new(memory); }
void operator delete[](void* memory, std::size_t, std::align_val_t) noexcept { free_new(memory); }
void operator delete(void* memory, std::align_val_t, const std::nothrow_t&) noexcept {
    free_new(memory);
}
void operator delete[](void* memory, std::align_val_t, const std::nothrow_t&) noexcept {
    free_new(memory);
}

#ifndef NXMEM_FAULT_SANITIZED
namespace nxmem::fault {
namespace {

NXMEM_INJECTOR_CODE bool c_allocation_fails(bool& plugins) {
    if (allocation_fails(false, plugins)) {
        errno = ENOMEM;
        return true;
    }
    return false;
}

NXMEM_INJECTOR_CODE bool valid_alignment(std::size_t alignment) {
    return alignment != 0 && (alignment & (alignment - 1)) == 0;
}

} // namespace
} // namespace nxmem::fault

using nxmem::fault::c_allocation_fails;

extern "C" {

NXMEM_INJECTOR_CODE void* malloc(std::size_t size) {
    bool plugins = false;
    if (c_allocation_fails(plugins)) {
        return nullptr;
    }
    void* memory = __libc_malloc(size);
    if (plugins) {
        nxmem::fault::remember(memory, size);
    }
    return memory;
}

NXMEM_INJECTOR_CODE void* calloc(std::size_t count, std::size_t size) {
    bool plugins = false;
    if (c_allocation_fails(plugins)) {
        return nullptr;
    }
    void* memory = __libc_calloc(count, size);
    if (plugins) {
        nxmem::fault::remember(memory, count * size);
    }
    return memory;
}

NXMEM_INJECTOR_CODE void* realloc(void* memory, std::size_t size) {
    bool plugins = false;
    if (size != 0 && c_allocation_fails(plugins)) {
        return nullptr; // `memory` stays as it was
    }
    const bool kept = nxmem::fault::forget(memory);
    void* moved = __libc_realloc(memory, size);
    if (moved == nullptr && size != 0 && kept) {
        nxmem::fault::remember(memory, size); // the old block is still there
    } else if (moved != nullptr && (kept || plugins)) {
        nxmem::fault::remember(moved, size);
    }
    return moved;
}

NXMEM_INJECTOR_CODE void free(void* memory) {
    nxmem::fault::forget(memory);
    __libc_free(memory);
}

NXMEM_INJECTOR_CODE int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
    if (!nxmem::fault::valid_alignment(alignment) || alignment % sizeof(void*) != 0) {
        return EINVAL;
    }
    bool plugins = false;
    if (c_allocation_fails(plugins)) {
        return ENOMEM;
    }
    void* memory = __libc_memalign(alignment, size);
    if (memory == nullptr) {
        return ENOMEM;
    }
    if (plugins) {
        nxmem::fault::remember(memory, size);
    }
    *out = memory;
    return 0;
}

NXMEM_INJECTOR_CODE void* memalign(std::size_t alignment, std::size_t size) {
    bool plugins = false;
    if (c_allocation_fails(plugins)) {
        return nullptr;
    }
    void* memory = __libc_memalign(alignment, size);
    if (plugins) {
        nxmem::fault::remember(memory, size);
    }
    return memory;
}

NXMEM_INJECTOR_CODE void* aligned_alloc(std::size_t alignment, std::size_t size) {
    if (!nxmem::fault::valid_alignment(alignment)) {
        errno = EINVAL;
        return nullptr;
    }
    return memalign(alignment, size);
}

} // extern "C"
#endif
