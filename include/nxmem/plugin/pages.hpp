// Pages and mappings for a mechanism that takes memory from mmap: the page size, rounding that
// refuses to overflow (ABI.md Q18), mapping at any alignment (over-map by alignment - page, trim
// head and tail), and unmapping. Every failure is an OUT_OF_MEMORY value naming the mechanism and
// carrying errno's text, never a crash; the failure text is built out of line, so a call that
// succeeds costs a compare or two.
#pragma once

#include <nxmem/abi/result.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <nxmem/detail/page_size.hpp>

namespace nxmem::plugin {

inline std::uint64_t page_bytes() noexcept { return nxmem::detail::system_page_bytes(); }

inline std::string errno_text(int code) { return std::string(std::strerror(code)); }

// The failures below are built apart (cold, never inlined), so the calls that succeed inline to
// a compare or two.
[[gnu::cold, gnu::noinline]] inline error rounding_overflows(std::uint64_t value, std::uint64_t granule,
                                                            const char* mechanism) {
    return error{status_code::out_of_memory, std::string(mechanism) + ": " + std::to_string(value) +
                                                 " bytes overflow when rounded up to " +
                                                 std::to_string(granule)};
}

// `value` rounded up to a multiple of `granule` (a power of two); OUT_OF_MEMORY on overflow,
// which is what an absurd size is.
inline result<std::uint64_t> round_up(std::uint64_t value, std::uint64_t granule,
                                      const char* mechanism) {
    if (value > UINT64_MAX - (granule - 1)) [[unlikely]] {
        return boost::outcome_v2::failure(rounding_overflows(value, granule, mechanism));
    }
    return (value + granule - 1) & ~(granule - 1);
}

[[gnu::cold, gnu::noinline]] inline error mapping_overflows(std::uint64_t length, std::uint64_t alignment,
                                                           const char* mechanism) {
    return error{status_code::out_of_memory, std::string(mechanism) + ": " + std::to_string(length) +
                                                 " bytes aligned to " + std::to_string(alignment) +
                                                 " overflow the address space"};
}

[[gnu::cold, gnu::noinline]] inline error mapping_failed(std::uint64_t total, int code,
                                                        const char* mechanism) {
    return error{status_code::out_of_memory, std::string(mechanism) + ": mmap of " +
                                                 std::to_string(total) + " bytes failed: " +
                                                 errno_text(code)};
}

// Maps `length` bytes (a page multiple) at an address aligned to `alignment` (a power of two):
// over-maps by alignment - page and trims the head and the tail with munmap.
inline result<std::uint64_t> map_aligned(std::uint64_t length, std::uint64_t alignment, int prot,
                                         int flags, const char* mechanism) {
    const std::uint64_t page = page_bytes();
    const std::uint64_t slack = alignment > page ? alignment - page : 0;
    if (length > UINT64_MAX - slack) [[unlikely]] {
        return boost::outcome_v2::failure(mapping_overflows(length, alignment, mechanism));
    }
    const std::uint64_t total = length + slack;
    void* mapped = ::mmap(nullptr, static_cast<std::size_t>(total), prot, flags, -1, 0);
    if (mapped == MAP_FAILED) [[unlikely]] {
        return boost::outcome_v2::failure(mapping_failed(total, errno, mechanism));
    }
    const auto start = reinterpret_cast<std::uint64_t>(mapped);
    const std::uint64_t aligned = (start + (alignment - 1)) & ~(alignment - 1);
    if (aligned > start) {
        ::munmap(mapped, static_cast<std::size_t>(aligned - start));
    }
    const std::uint64_t tail = start + total - (aligned + length);
    if (tail > 0) {
        ::munmap(reinterpret_cast<void*>(aligned + length), static_cast<std::size_t>(tail));
    }
    return aligned;
}

inline int unmap(std::uint64_t address, std::uint64_t length) noexcept {
    return ::munmap(reinterpret_cast<void*>(address), static_cast<std::size_t>(length));
}

} // namespace nxmem::plugin
