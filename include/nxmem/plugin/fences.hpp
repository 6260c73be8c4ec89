// Fences as the kit hands them to a mechanism (minor 4), and the pending work a fence becomes
// while its release waits in the queue. The kit waits on HOST_TIMELINE fences itself; a mechanism
// that waits on other kinds (a CUDA stream or event) turns each into a pending_work object the
// kit polls at every drain, never blocking (docs/PLUGINS.md, "Fenced release and copies").
#pragma once

#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/result.hpp>
#include <nxmem/device.hpp>

#include <cstdint>
#include <memory>
#include <optional>

namespace nxmem::plugin {

// One fence, checked: its kind is one the mechanism said it waits on, its device the allocator's.
// Borrowed for the call that carries it: copy what is needed.
struct fence {
    NxmemFenceKind kind = 0;
    device_id device;
    std::uint64_t handle = 0;
    std::uint64_t value = 0;

    static fence from_wire(const NxmemFence& wire) noexcept {
        return {wire.kind, device_id::from_wire(wire.device), wire.handle, wire.value};
    }
};

// Work a queued release waits for. poll() says whether it has completed; it is called by drains
// (one at a time per allocator, never concurrently for one object) and must not block. Destroying
// it before completion (the allocator goes with releases still queued) gives up the wait.
class pending_work {
public:
    pending_work() = default;
    pending_work(const pending_work&) = delete;
    pending_work& operator=(const pending_work&) = delete;
    virtual ~pending_work() = default;
    virtual result<bool> poll() = 0;
};

// The kit's own pending work for a HOST_TIMELINE fence: the host's counter reaching the value.
class host_timeline_work final : public pending_work {
public:
    explicit host_timeline_work(const NxmemFence& fence) noexcept : fence_(fence) {}
    result<bool> poll() override { return abi::host_timeline_reached(fence_); }

private:
    NxmemFence fence_;
};

// What a copy does, as the kit hands it to a mechanism after checking it (CP1-CP4): `length`
// bytes at `offset` of the allocation or prefix, to or from `host_buffer`. Without `stream` the
// copy has completed when the member returns; with it (a kind the mechanism lists in
// copy_stream_kinds()) it is queued after the work the fence names and the member returns at once.
struct copy_job {
    NxmemCopyDirection direction = NXMEM_COPY_TO_HOST;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    void* host_buffer = nullptr;
    std::optional<fence> stream;
};

} // namespace nxmem::plugin
