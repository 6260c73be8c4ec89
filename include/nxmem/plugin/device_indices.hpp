// Which indices of its device types a mechanism serves (ABI.md Q16): a factory names types, not
// indices, so each mechanism refuses, at open, an index it does not serve, naming it.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/device.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <cstdint>
#include <string>

namespace nxmem::plugin {

// Refuses (WRONG_DEVICE, naming mechanism, device and index) an open on an index outside
// [0, served); call it first in open: `NXMEM_TRY_VOID(serve_device_indices(context, 1));`.
inline result<void> serve_device_indices(const open_context& context, std::int32_t served) {
    if (context.device.index >= 0 && context.device.index < served) [[likely]] {
        return success();
    }
    return fail(status_code::wrong_device,
                std::string(context.mechanism_name) + " serves " +
                    std::string(device_type_name(context.device.type)) + " indices 0 to " +
                    std::to_string(served - 1) + ", not " + std::to_string(context.device.index));
}

} // namespace nxmem::plugin
