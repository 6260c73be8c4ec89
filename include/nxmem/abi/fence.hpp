// Reading fences and copy requests (minor 4): the form of an NxmemFencedReleaseRequest's fence
// array and of one fence, checked before anything in them is believed, and the one kind of fence
// any side can test itself, a host timeline. Whether a mechanism waits on a kind, and on which
// device, is the receiver's check (docs/ABI.md F1-F5, CP1-CP4).
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace nxmem::abi {

// The first minor whose header defines fences, fenced release and copies.
inline constexpr std::uint32_t stream_minor = 4;

// The fence kinds this header knows, as a mask of (1 << kind).
inline constexpr std::uint64_t known_fence_kinds = (1ull << NXMEM_FENCE_HOST_TIMELINE) |
                                                   (1ull << NXMEM_FENCE_CUDA_STREAM) |
                                                   (1ull << NXMEM_FENCE_CUDA_EVENT);
constexpr std::uint64_t fence_kind_bit(std::uint32_t kind) noexcept {
    return kind < 64 ? 1ull << kind : 0;
}

// The smallest stride a fence array may have: the minor-4 fence.
inline constexpr std::uint32_t min_fence_stride = 40;

// The fences of one request, copied: at most NXMEM_MAX_FENCES.
struct fence_list {
    std::array<NxmemFence, NXMEM_MAX_FENCES> fences{};
    std::uint32_t count = 0;
    const NxmemFence* begin() const noexcept { return fences.data(); }
    const NxmemFence* end() const noexcept { return fences.data() + count; }
};

// Copies the request's fences, or INVALID_ARGUMENT naming the first fault of form: fence_count 0
// or above NXMEM_MAX_FENCES, `fences` NULL, a stride below 40 or not a multiple of 8, a fence
// failing the request rules, or one larger than the stride (fences would overlap). A HOST_TIMELINE
// fence whose counter is NULL or not 8-aligned is malformed too: nobody could read it.
inline result<fence_list> read_fences(const NxmemFencedReleaseRequest& request) {
    const auto refuse = [](const std::string& why) {
        return fail(status_code::invalid_argument, "malformed fences: " + why);
    };
    if (request.fence_count == 0 || request.fence_count > NXMEM_MAX_FENCES) {
        return refuse("fence_count " + std::to_string(request.fence_count) + ", not 1 to " +
                      std::to_string(NXMEM_MAX_FENCES));
    }
    if (request.fences == nullptr) {
        return refuse("the fence array is NULL");
    }
    if (request.fence_stride < min_fence_stride || request.fence_stride % 8 != 0) {
        return refuse("fence_stride " + std::to_string(request.fence_stride) +
                      " is below 40 or not a multiple of 8");
    }
    fence_list list;
    const auto* bytes = reinterpret_cast<const unsigned char*>(request.fences);
    for (std::uint32_t index = 0; index < request.fence_count; ++index) {
        const auto* untrusted =
            reinterpret_cast<const NxmemFence*>(bytes + std::size_t{index} * request.fence_stride);
        NXMEM_TRY(fence, read_request(untrusted));
        if (fence.struct_size > request.fence_stride) {
            return refuse("fence " + std::to_string(index) + " is " +
                          std::to_string(fence.struct_size) + " bytes, more than the stride");
        }
        if (fence.kind == NXMEM_FENCE_HOST_TIMELINE && (fence.handle == 0 || fence.handle % 8 != 0)) {
            return refuse("fence " + std::to_string(index) +
                          " is a host timeline whose counter is NULL or not 8-aligned");
        }
        list.fences[index] = fence;
    }
    list.count = request.fence_count;
    return list;
}

// Whether a HOST_TIMELINE fence has completed: its counter reads its value or more. The acquire
// load pairs with the host's store, so what the host wrote before it is seen after.
inline bool host_timeline_reached(const NxmemFence& fence) noexcept {
    auto* counter = reinterpret_cast<std::uint64_t*>(static_cast<std::uintptr_t>(fence.handle));
    return std::atomic_ref<std::uint64_t>(*counter).load(std::memory_order_acquire) >= fence.value;
}

// A fence of `kind` is refused unless `accepted` has its bit: UNSUPPORTED_CAPABILITY. A fence of
// another device than `device`: WRONG_DEVICE. `what` names the side refusing.
inline result<void> check_fence_for(const NxmemFence& fence, std::uint64_t accepted,
                                    const NxmemDeviceId& device, const std::string& what) {
    if ((fence_kind_bit(fence.kind) & accepted) == 0) {
        return fail(status_code::unsupported_capability,
                    what + " does not wait on fences of kind " + std::to_string(fence.kind));
    }
    if (fence.device.device_type != device.device_type || fence.device.index != device.index) {
        return fail(status_code::wrong_device,
                    what + ": a fence names device " + std::to_string(fence.device.device_type) +
                        ":" + std::to_string(fence.device.index) + ", not the allocator's");
    }
    return success();
}

inline bool known_copy_direction(std::uint32_t direction) noexcept {
    return direction == NXMEM_COPY_TO_HOST || direction == NXMEM_COPY_FROM_HOST;
}
inline bool known_copy_target(std::uint32_t target) noexcept {
    return target == NXMEM_COPY_ALLOCATION || target == NXMEM_COPY_PREFIX;
}

// The form of a copy request: a known direction and target, `offset + length` within `size` (the
// size the host describes) without wrapping, and a host buffer unless the length is 0.
inline result<void> check_copy_form(const NxmemCopyRequest& request, std::uint64_t size) {
    if (!known_copy_direction(request.direction) || !known_copy_target(request.target)) {
        return fail(status_code::invalid_argument,
                    "unknown copy direction " + std::to_string(request.direction) + " or target " +
                        std::to_string(request.target));
    }
    if (request.offset > size || request.length > size - request.offset) {
        return fail(status_code::invalid_argument,
                    "copy range [" + std::to_string(request.offset) + ", +" +
                        std::to_string(request.length) + ") lies outside the " + std::to_string(size) +
                        " bytes described");
    }
    if (request.length != 0 && request.host_buffer == nullptr) {
        return fail(status_code::invalid_argument, "the copy's host buffer is NULL");
    }
    return success();
}

} // namespace nxmem::abi
