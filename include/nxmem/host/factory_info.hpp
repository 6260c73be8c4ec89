// A factory as the host recorded it at load: one mechanism the plugin offers.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <cstdint>
#include <string>

namespace nxmem::host {

struct factory_info {
    std::string name;
    std::uint64_t mechanism_id = 0;
    std::uint64_t device_types = 0; // bit (1 << t) per NxmemDeviceType t
    std::uint32_t declared_minor = 0;
    std::uint32_t effective_minor = 0;

    bool serves(NxmemDeviceType type) const noexcept {
        return type < 64 && (device_types & (1ull << type)) != 0;
    }
};

} // namespace nxmem::host
