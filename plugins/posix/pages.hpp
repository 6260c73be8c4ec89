// The madvise calls the posix mechanisms use (huge pages, populate); the page size, rounding that
// refuses to overflow and aligned mmap are the kit's (nxmem/plugin/pages.hpp), named here too.
#pragma once

#include <nxmem/abi/result.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <nxmem/detail/page_size.hpp>

#include <nxmem/plugin/pages.hpp>

namespace nxmem::posix {

// The page helpers are the kit's (nxmem/plugin/pages.hpp); the huge-page and populate advice is
// posix's own.
using plugin::errno_text;
using plugin::map_aligned;
using plugin::page_bytes;
using plugin::round_up;
using plugin::unmap;

// MADV_POPULATE_WRITE (Linux 5.14); spelled out so the plugin builds against older headers.
inline constexpr int madv_populate_write = 23;
inline constexpr std::uint64_t huge_page_bytes = 2ull << 20;

// MADV_HUGEPAGE where the kernel supports transparent huge pages; anything else is ignored (the
// advice is a hint, and kernels without THP answer EINVAL).
inline void advise_huge_pages(std::uint64_t address, std::uint64_t length) noexcept {
    (void)::madvise(reinterpret_cast<void*>(address), static_cast<std::size_t>(length),
                    MADV_HUGEPAGE);
}

// Pre-faults [address, address + length) for writing with MADV_POPULATE_WRITE. `supported`
// remembers a kernel that does not know the advice (EINVAL): populate then quietly does nothing.
// Any other failure (ENOMEM, EFAULT, ...) is returned as an errno value.
inline int populate_for_writing(std::uint64_t address, std::uint64_t length,
                                std::atomic<bool>& supported) noexcept {
    if (!supported.load(std::memory_order_relaxed)) {
        return 0;
    }
    if (::madvise(reinterpret_cast<void*>(address), static_cast<std::size_t>(length),
                  madv_populate_write) == 0) {
        return 0;
    }
    const int code = errno;
    if (code == EINVAL) {
        supported.store(false, std::memory_order_relaxed);
        return 0;
    }
    return code;
}

} // namespace nxmem::posix
