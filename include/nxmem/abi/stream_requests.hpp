// Minor-4 requests as a sender lays them out: a fence, a fenced release over an array of them, a
// copy between host memory and a range of an allocation or of a shared prefix. The host, the
// conformance suite and tests that talk to a table directly build them here; whoever receives
// one reads it with abi/fence.hpp.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <cstdint>

namespace nxmem::abi {

// A fence of `kind` on `device`: its handle (a host timeline's counter, a CUstream, a CUevent)
// and, for a host timeline, the value the counter must reach.
inline NxmemFence make_fence(NxmemFenceKind kind, const NxmemDeviceId& device, std::uint64_t handle,
                             std::uint64_t value = 0) noexcept {
    auto made = make_struct<NxmemFence>();
    made.kind = kind;
    made.device = device;
    made.handle = handle;
    made.value = value;
    return made;
}

// The release of `live` under `ticket`, after `count` fences from `fences` laid `stride` bytes
// apart (borrowed for the call).
inline NxmemFencedReleaseRequest make_fenced_release_request(const NxmemAllocation& live, std::uint64_t ticket,
                                                             const NxmemFence* fences, std::uint32_t count,
                                                             std::uint32_t stride = sizeof(NxmemFence)) noexcept {
    auto made = make_struct<NxmemFencedReleaseRequest>();
    made.fence_count = count;
    made.allocation = live;
    made.ticket = ticket;
    made.fences = fences;
    made.fence_stride = stride;
    return made;
}

// A copy of `length` bytes at `offset` of `live` and `host_memory`, synchronous or queued on
// `stream`. The ABI has one pointer for both directions; a FROM_HOST copy only reads it (CP1).
inline NxmemCopyRequest make_copy_request(NxmemCopyDirection direction, const NxmemAllocation& live,
                                          std::uint64_t offset, std::uint64_t length, const void* host_memory,
                                          const NxmemFence* stream = nullptr) noexcept {
    auto made = make_struct<NxmemCopyRequest>();
    made.direction = direction;
    made.target = NXMEM_COPY_ALLOCATION;
    made.allocation = live;
    made.offset = offset;
    made.length = length;
    made.host_buffer = const_cast<void*>(host_memory);
    made.stream = stream;
    return made;
}

// The same for a range of a shared prefix (the allocation member stays zero).
inline NxmemCopyRequest make_prefix_copy_request(NxmemCopyDirection direction, const NxmemSharedPrefixHandle& prefix,
                                                 std::uint64_t offset, std::uint64_t length, const void* host_memory,
                                                 const NxmemFence* stream = nullptr) noexcept {
    NxmemCopyRequest made = make_copy_request(direction, NxmemAllocation{}, offset, length, host_memory, stream);
    made.target = NXMEM_COPY_PREFIX;
    made.prefix = prefix;
    return made;
}

} // namespace nxmem::abi
