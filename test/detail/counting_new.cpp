// In a translation unit of its own, so no call site sees both the replaced new and free.
#include "counting_new.hpp"

#include <cstdlib>
#include <new>

namespace nxmem::test {
bool fail_allocations = false;
std::size_t allocations = 0;
} // namespace nxmem::test

void* operator new(std::size_t bytes) {
    ++nxmem::test::allocations;
    if (nxmem::test::fail_allocations) {
        throw std::bad_alloc();
    }
    if (void* memory = std::malloc(bytes == 0 ? 1 : bytes)) {
        return memory;
    }
    throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return operator new(bytes); }
// The nothrow forms too, so every block the plain deletes below free came from malloc (under
// AddressSanitizer, a nothrow new left to its runtime and freed here is an alloc-dealloc mismatch).
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
    try {
        return operator new(bytes);
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept {
    return operator new(bytes, tag);
}
// The aligned forms too: the tables' slot arrays are cache-line aligned.
void* operator new(std::size_t bytes, std::align_val_t alignment) {
    ++nxmem::test::allocations;
    if (nxmem::test::fail_allocations) {
        throw std::bad_alloc();
    }
    const auto align = static_cast<std::size_t>(alignment);
    const std::size_t wanted = bytes == 0 ? 1 : bytes;
    const std::size_t rounded = (wanted + align - 1) / align * align; // aligned_alloc's rule
    if (void* memory = std::aligned_alloc(align, rounded)) {
        return memory;
    }
    throw std::bad_alloc();
}
void* operator new[](std::size_t bytes, std::align_val_t alignment) {
    return operator new(bytes, alignment);
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
