// The system's page size, queried once.
#pragma once

#include <cstdint>

#include <unistd.h>

namespace nxmem::detail {

inline std::uint64_t system_page_bytes() noexcept {
    static const std::uint64_t bytes = [] {
        const long queried = ::sysconf(_SC_PAGESIZE);
        return queried > 0 ? static_cast<std::uint64_t>(queried) : std::uint64_t{4096};
    }();
    return bytes;
}

} // namespace nxmem::detail
