// Operator-facing names: capability flags, device types, versions, and joining them into text.
#pragma once

#include <nxmem/abi/version.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::tool {

// "virtual-backing", "shared-mapping", ... for each set NXMEM_CAP_* flag, in flag order; a bit
// the contract does not define reads "unknown(bit N)".
std::vector<std::string> capability_names(NxmemCapabilities capabilities);

// "cpu", "cuda", ... for each set bit (1 << type); a type nxmem has no name for reads "unknown(N)".
std::vector<std::string> device_type_names(std::uint64_t device_types);

// The name of one device type, as device_type_names spells it.
std::string device_type_label(NxmemDeviceType type);

// "1.1"
std::string version_label(std::uint32_t major, std::uint32_t minor);
std::string version_label(const abi::negotiated_version& version);

// The words separated by `separator`, or `if_empty` when there are none.
std::string join(const std::vector<std::string>& words, std::string_view separator,
                 std::string_view if_empty);

} // namespace nxmem::tool
