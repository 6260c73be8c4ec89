// A reference to a shared prefix, as the host hands it to the engine. Copying it does not add a
// reference: references are taken and dropped explicitly through the SharedMapping view.
#pragma once

#include <nxmem/device.hpp>

#include <cstdint>

namespace nxmem::host {

struct shared_prefix {
    std::uint64_t prefix_id = 0;
    std::uint64_t size = 0;
    std::uint64_t mechanism_id = 0;
    device_id device{};
    friend bool operator==(const shared_prefix&, const shared_prefix&) = default;

    NxmemSharedPrefixHandle to_wire() const noexcept {
        NxmemSharedPrefixHandle handle{};
        handle.struct_size = sizeof handle;
        handle.mechanism_id = mechanism_id;
        handle.device = device.to_wire();
        handle.prefix_id = prefix_id;
        handle.size = size;
        return handle;
    }
};

} // namespace nxmem::host
