// Reading an NxmemIpcHandle (minor 3): a record another process wrote, so untrusted input. The
// form is checked here, before anything in it is believed; a mechanism then checks what only it
// can (each descriptor's kind and size, its opaque bytes, a replay). docs/ABI.md, rules IP1-IP9.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <cstdint>
#include <string>

namespace nxmem::abi {

// The first minor whose header defines sharing across processes.
inline constexpr std::uint32_t ipc_minor = 3;

inline bool known_ipc_kind(std::uint32_t kind) noexcept {
    return kind == NXMEM_IPC_ALLOCATION || kind == NXMEM_IPC_PREFIX;
}
inline bool known_ipc_access(std::uint32_t access) noexcept {
    return access == NXMEM_IPC_READ_WRITE || access == NXMEM_IPC_READ_ONLY;
}

// A local copy of the handle at `untrusted`, or INVALID_ARGUMENT naming the first fault: the
// request rules (NULL, below the baseline, above the cap, a non-zero byte this header does not
// know), then a minor below 3, an unknown kind or access, size 0, more than NXMEM_IPC_MAX_FDS
// descriptors or a negative one among the first fd_count, more than NXMEM_IPC_OPAQUE_BYTES
// opaque bytes. Entries of `fds` past fd_count are not read.
inline result<NxmemIpcHandle> read_ipc_handle(const NxmemIpcHandle* untrusted) {
    NXMEM_TRY(handle, read_request(untrusted));
    const auto refuse = [](const std::string& why) {
        return fail(status_code::invalid_argument, "malformed IPC handle: " + why);
    };
    if (handle.abi_minor < ipc_minor) {
        return refuse("it declares minor " + std::to_string(handle.abi_minor) +
                      ", and no minor below 3 defines handles");
    }
    if (!known_ipc_kind(handle.kind)) {
        return refuse("unknown kind " + std::to_string(handle.kind));
    }
    if (!known_ipc_access(handle.access)) {
        return refuse("unknown access " + std::to_string(handle.access));
    }
    if (handle.size == 0) {
        return refuse("it shares 0 bytes");
    }
    if (handle.fd_count > NXMEM_IPC_MAX_FDS) {
        return refuse(std::to_string(handle.fd_count) + " descriptors, more than " +
                      std::to_string(NXMEM_IPC_MAX_FDS));
    }
    for (std::uint32_t index = 0; index < handle.fd_count; ++index) {
        if (handle.fds[index] < 0) {
            return refuse("descriptor " + std::to_string(index) + " is " +
                          std::to_string(handle.fds[index]));
        }
    }
    if (handle.opaque_length > NXMEM_IPC_OPAQUE_BYTES) {
        return refuse(std::to_string(handle.opaque_length) + " opaque bytes, more than " +
                      std::to_string(NXMEM_IPC_OPAQUE_BYTES));
    }
    return handle;
}

// WRONG_MECHANISM or WRONG_DEVICE unless the handle was exported by `mechanism_id` on `device`
// (compared by type and index; the embedded record's struct_size is not judged, L10).
inline result<void> check_ipc_identity(const NxmemIpcHandle& handle, std::uint64_t mechanism_id,
                                       const NxmemDeviceId& device) {
    if (handle.mechanism_id != mechanism_id) {
        return fail(status_code::wrong_mechanism,
                    "IPC handle of mechanism " + std::to_string(handle.mechanism_id) +
                        " handed to mechanism " + std::to_string(mechanism_id));
    }
    if (handle.device.device_type != device.device_type || handle.device.index != device.index) {
        return fail(status_code::wrong_device,
                    "IPC handle of device type " + std::to_string(handle.device.device_type) +
                        " index " + std::to_string(handle.device.index) +
                        " handed to an allocator of device type " + std::to_string(device.device_type) +
                        " index " + std::to_string(device.index));
    }
    return boost::outcome_v2::success();
}

// INVALID_ARGUMENT for an unknown access, or a read-write import of a read-only handle.
inline result<void> check_ipc_access(const NxmemIpcHandle& handle, std::uint32_t wanted) {
    if (!known_ipc_access(wanted)) {
        return fail(status_code::invalid_argument, "unknown import access " + std::to_string(wanted));
    }
    if (wanted == NXMEM_IPC_READ_WRITE && handle.access == NXMEM_IPC_READ_ONLY) {
        return fail(status_code::invalid_argument,
                    "a read-write import of a read-only IPC handle");
    }
    return boost::outcome_v2::success();
}

} // namespace nxmem::abi
