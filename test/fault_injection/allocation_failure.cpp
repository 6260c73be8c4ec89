// The interposer behind allocation_failure.hpp. Every function that runs while an allocation is
// classified lives in the section nxmem_fault_injector, so the stack walk can skip its own frames
// by address; nothing here allocates.
#include "allocation_failure.hpp"

#include <link.h>
#include <unwind.h>

#include <cstddef>
#include <iterator>
#include <cstdlib>
#include <new>

#define NXMEM_INJECTOR_CODE __attribute__((section("nxmem_fault_injector"), noinline))

extern "C" const char __start_nxmem_fault_injector[];
extern "C" const char __stop_nxmem_fault_injector[];

namespace nxmem::test::fault {
namespace {

struct address_range {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
};

// The executable's code, and the code of every object loaded before the first plugin.
constexpr std::size_t max_ranges = 256;
address_range executable_ranges[16];
std::size_t executable_count = 0;
address_range runtime_ranges[max_ranges];
std::size_t runtime_count = 0;

bool armed = false;
bool classifying = false;
std::uint64_t fail_at = 0;
std::uint64_t counted = 0;
bool failed_one = false;

enum class owner { undecided, host, plugin };

NXMEM_INJECTOR_CODE bool within(const address_range* ranges, std::size_t count,
                                std::uintptr_t address) {
    for (std::size_t i = 0; i < count; ++i) {
        if (address >= ranges[i].begin && address < ranges[i].end) {
            return true;
        }
    }
    return false;
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
    if (within(runtime_ranges, runtime_count, address)) {
        return _URC_NO_REASON; // libstdc++, libc, the sanitizers: look further out
    }
    decided = owner::plugin; // an object loaded later: a plugin
    return _URC_END_OF_STACK;
}

NXMEM_INJECTOR_CODE bool host_allocation_fails() {
    if (!armed || classifying) {
        return false;
    }
    classifying = true;
    owner decided = owner::undecided;
    _Unwind_Backtrace(&classify_frame, &decided);
    classifying = false;
    if (decided != owner::host) {
        return false;
    }
    ++counted;
    if (counted == fail_at) {
        failed_one = true;
        return true;
    }
    return false;
}

NXMEM_INJECTOR_CODE void* allocate(std::size_t size, std::size_t alignment, bool nothrow) {
    if (host_allocation_fails()) {
        if (nothrow) {
            return nullptr;
        }
        throw std::bad_alloc();
    }
    if (size == 0) {
        size = 1;
    }
    void* memory = nullptr;
    if (alignment <= alignof(std::max_align_t)) {
        memory = std::malloc(size);
    } else if (::posix_memalign(&memory, alignment, size) != 0) {
        memory = nullptr;
    }
    if (memory == nullptr && !nothrow) {
        throw std::bad_alloc();
    }
    return memory;
}

int remember_object(dl_phdr_info* info, std::size_t, void*) {
    const bool executable = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& header = info->dlpi_phdr[i];
        if (header.p_type != PT_LOAD) {
            continue;
        }
        const address_range range{info->dlpi_addr + header.p_vaddr,
                                  info->dlpi_addr + header.p_vaddr + header.p_memsz};
        if (executable && executable_count < std::size(executable_ranges)) {
            executable_ranges[executable_count++] = range;
        } else if (!executable && runtime_count < max_ranges) {
            runtime_ranges[runtime_count++] = range;
        }
    }
    return 0;
}

} // namespace

void learn_runtime_objects() {
    executable_count = 0;
    runtime_count = 0;
    dl_iterate_phdr(&remember_object, nullptr);
}

void arm(std::uint64_t failing) {
    fail_at = failing;
    counted = 0;
    failed_one = false;
    armed = true;
}
void disarm() { armed = false; }
std::uint64_t host_allocations_counted() { return counted; }
bool injected() { return failed_one; }

} // namespace nxmem::test::fault

using nxmem::test::fault::allocate;

NXMEM_INJECTOR_CODE void* operator new(std::size_t size) { return allocate(size, 0, false); }
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size) { return allocate(size, 0, false); }
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    return allocate(size, 0, true);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return allocate(size, 0, true);
}
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, std::align_val_t alignment) {
    return allocate(size, static_cast<std::size_t>(alignment), false);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, std::align_val_t alignment) {
    return allocate(size, static_cast<std::size_t>(alignment), false);
}
NXMEM_INJECTOR_CODE void* operator new(std::size_t size, std::align_val_t alignment,
                                       const std::nothrow_t&) noexcept {
    return allocate(size, static_cast<std::size_t>(alignment), true);
}
NXMEM_INJECTOR_CODE void* operator new[](std::size_t size, std::align_val_t alignment,
                                         const std::nothrow_t&) noexcept {
    return allocate(size, static_cast<std::size_t>(alignment), true);
}
void operator delete(void* memory) noexcept { std::free(memory); }
void operator delete[](void* memory) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t) noexcept { std::free(memory); }
void operator delete(void* memory, const std::nothrow_t&) noexcept { std::free(memory); }
void operator delete[](void* memory, const std::nothrow_t&) noexcept { std::free(memory); }
void operator delete(void* memory, std::align_val_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::align_val_t) noexcept { std::free(memory); }
void operator delete(void* memory, std::size_t, std::align_val_t) noexcept { std::free(memory); }
void operator delete[](void* memory, std::size_t, std::align_val_t) noexcept { std::free(memory); }
void operator delete(void* memory, std::align_val_t, const std::nothrow_t&) noexcept {
    std::free(memory);
}
void operator delete[](void* memory, std::align_val_t, const std::nothrow_t&) noexcept {
    std::free(memory);
}
