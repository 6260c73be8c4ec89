// A capability table an allocator points to, and the levels it declares and was read at.
#pragma once

#include <cstdint>
#include <string_view>

namespace nxmem::host {

struct capability_table_level {
    std::string_view name; // "virtual-backing", "shared-mapping", "ipc", "fenced-release", "copy"
    std::uint32_t declared_minor = 0;
    std::uint32_t effective_minor = 0;
};

} // namespace nxmem::host
