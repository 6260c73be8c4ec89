// Work a release waits for, as the engine names it (minor 4; docs/HOST.md, "Releasing after
// device work"). A host timeline is a counter the engine only ever increases; the host checks it
// itself. Other kinds (a CUDA stream or event) the mechanism waits on when its table lists the
// kind; otherwise the engine's fence_query says whether one has completed.
#pragma once

#include <nxmem/device.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <atomic>
#include <cstdint>
#include <functional>

namespace nxmem::host {

struct fence {
    NxmemFenceKind kind = NXMEM_FENCE_HOST_TIMELINE;
    device_id device{};
    std::uint64_t handle = 0;
    std::uint64_t value = 0;

    // Completed once `counter` reads `value` or more. The counter must outlive the release.
    static fence host_timeline(const std::atomic<std::uint64_t>& counter, std::uint64_t value,
                               device_id device) noexcept {
        static_assert(sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t) &&
                      std::atomic<std::uint64_t>::is_always_lock_free);
        return {NXMEM_FENCE_HOST_TIMELINE, device, reinterpret_cast<std::uint64_t>(&counter), value};
    }

    NxmemFence to_wire() const noexcept {
        NxmemFence wire{};
        wire.struct_size = sizeof wire;
        wire.kind = kind;
        wire.device = device.to_wire();
        wire.handle = handle;
        wire.value = value;
        return wire;
    }
};

// Whether a fence of a kind neither the host nor the mechanism waits on has completed. Called
// at drains, never concurrently for one release; it must not block.
using fence_query = std::function<bool(const fence&)>;

} // namespace nxmem::host
