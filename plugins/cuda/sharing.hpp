// cuda-vmm's memory shared with another process (minor 3) through the driver's shareable handles:
// a physical allocation made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested
// handle types is exported as a file descriptor (cuMemExportToShareableHandle), and the process
// that receives the descriptor gets its own handle to the same memory
// (cuMemImportFromShareableHandle), which it maps into its own reservation.
//
// Sharing is probed once per allocator: the driver's entry points (cuMemExportToShareableHandle,
// cuMemImportFromShareableHandle, cuDeviceGetUuid) and the device's
// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED. Without them the allocator
// does not offer NXMEM_CAP_IPC and makes its physical memory without the handle type.
//
// A handle is untrusted input (docs/ABI.md IP7, IP8). Before the driver sees the descriptor: one
// descriptor, the opaque bytes' tag, the length in whole chunks of this device's granularity (the
// exporter's granularity must be ours), the exporter's GPU by UUID (an ordinal names another GPU
// in a process with another CUDA_VISIBLE_DEVICES), the descriptor not a socket, pipe or directory
// (a driver's descriptor is a character device; the fake driver's a memfd), and an export id this
// allocator never imported. The size is then proved by the driver: the import is mapped once,
// whole, into a scratch reservation (the driver refuses a mapping beyond the physical memory).
#pragma once

#include "device_context.hpp"

#include <nxmem/abi/result.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <sys/random.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace nxmem::cuda {

// The opaque bytes of a cuda-vmm handle.
struct vmm_handle_opaque {
    std::array<char, 8> tag;
    std::array<std::uint8_t, 16> export_id;   // random per export: an allocator imports it once
    std::array<std::uint8_t, 16> device_uuid; // the exporter's GPU (cuDeviceGetUuid)
    std::uint64_t length;                     // the physical allocation's bytes, whole chunks
    std::uint64_t granularity;                // the exporter's chunk
};
static_assert(sizeof(vmm_handle_opaque) <= NXMEM_IPC_OPAQUE_BYTES);
inline constexpr std::array<char, 8> vmm_handle_tag{'N', 'X', 'C', 'U', 'V', 'M', 'M', '1'};

class device_sharing {
public:
    using handle = CUmemGenericAllocationHandle;

    // What `device` offers; never fails (a device that cannot share says why in unavailable()).
    explicit device_sharing(const device_context& device) : device_(device) {
        const sharing_api* api = device.cuda().sharing();
        if (api == nullptr) {
            unavailable_ = device.cuda().sharing_missing();
            return;
        }
        int supported = 0;
        if (const CUresult code = device.api().device_get_attribute(
                &supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device.device());
            code != CUDA_SUCCESS || supported == 0) {
            unavailable_ = device.who() + ": the device does not export memory as POSIX file descriptors";
            return;
        }
        CUuuid uuid{};
        if (const CUresult code = api->device_get_uuid(&uuid, device.device()); code != CUDA_SUCCESS) {
            unavailable_ = device.who() + ": cuDeviceGetUuid failed: " + device.cuda().describe(code);
            return;
        }
        std::memcpy(uuid_.data(), uuid.bytes, uuid_.size());
        api_ = api;
    }

    bool available() const noexcept { return api_ != nullptr; }
    // Why the allocator does not share (empty when it does).
    const std::string& unavailable() const noexcept { return unavailable_; }

    // The requested handle types of physical memory that may be exported.
    CUmemAllocationHandleType handle_types() const noexcept {
        return available() ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    }

    // A new descriptor of `physical` (owned by the caller) and the opaque bytes that describe it.
    result<int> export_descriptor(handle physical, std::uint64_t length, std::uint64_t granularity,
                                  vmm_handle_opaque& opaque) const {
        opaque = vmm_handle_opaque{vmm_handle_tag, {}, uuid_, length, granularity};
        if (::getrandom(opaque.export_id.data(), opaque.export_id.size(), 0) !=
            static_cast<ssize_t>(opaque.export_id.size())) {
            const int code = errno;
            return fail(status_code::internal_error,
                        device_.who() + ": getrandom for an export id failed: " + std::strerror(code));
        }
        int descriptor = -1;
        NXMEM_TRY_VOID(device_.check(
            api_->export_shareable(&descriptor, physical, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            [&] { return device_.who() + ": cuMemExportToShareableHandle"; }));
        return descriptor;
    }

    // The opaque bytes of `untrusted` if it is a cuda-vmm export of this GPU whose length is
    // `length` (its size in whole chunks of `granularity`); INVALID_ARGUMENT naming the fault.
    result<vmm_handle_opaque> read_opaque(const NxmemIpcHandle& untrusted, std::uint64_t length,
                                          std::uint64_t granularity) const {
        vmm_handle_opaque opaque{};
        if (untrusted.fd_count != 1 || untrusted.opaque_length != sizeof opaque) {
            return refuse("a cuda-vmm handle carries 1 descriptor and " + std::to_string(sizeof opaque) +
                          " opaque bytes, not " + std::to_string(untrusted.fd_count) + " and " +
                          std::to_string(untrusted.opaque_length));
        }
        std::memcpy(&opaque, untrusted.opaque, sizeof opaque);
        if (opaque.tag != vmm_handle_tag) {
            return refuse("its opaque bytes are not a cuda-vmm export");
        }
        if (opaque.granularity != granularity || opaque.length != length) {
            return refuse("it describes " + std::to_string(opaque.length) + " bytes in chunks of " +
                          std::to_string(opaque.granularity) + "; a size of " +
                          std::to_string(untrusted.size) + " is " + std::to_string(length) +
                          " bytes in this device's chunks of " + std::to_string(granularity));
        }
        if (opaque.device_uuid != uuid_) {
            return refuse("it was exported from another GPU (its UUID is not " + device_.who() + "'s)");
        }
        return opaque;
    }

    // Records that `export_id` is imported here; INVALID_ARGUMENT if it was before (a replay).
    result<void> remember_import(const std::array<std::uint8_t, 16>& export_id) {
        std::lock_guard lock(imported_mutex_);
        if (!imported_ids_.insert(export_id).second) {
            return refuse("this handle was imported here before (a replay)");
        }
        return boost::outcome_v2::success();
    }
    void forget_import(const std::array<std::uint8_t, 16>& export_id) {
        std::lock_guard lock(imported_mutex_);
        imported_ids_.erase(export_id);
    }

    // This process's handle to the memory behind `descriptor` (borrowed), once the descriptor's
    // kind has passed; the caller releases it. Runs with the context current.
    result<handle> import_descriptor(int descriptor) const {
        struct stat facts {};
        if (::fstat(descriptor, &facts) != 0) {
            const int code = errno;
            return refuse("descriptor 0: fstat failed: " + std::string(std::strerror(code)));
        }
        if (S_ISSOCK(facts.st_mode) || S_ISFIFO(facts.st_mode) || S_ISDIR(facts.st_mode)) {
            return refuse("descriptor 0 is a socket, pipe or directory, not a CUDA shareable handle");
        }
        handle imported = 0;
        const CUresult code = api_->import_shareable(
            &imported, reinterpret_cast<void*>(static_cast<std::uintptr_t>(descriptor)),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (code == CUDA_ERROR_OUT_OF_MEMORY) {
            return fail(status_code::out_of_memory,
                        device_.who() + ": cuMemImportFromShareableHandle failed: " + device_.cuda().describe(code));
        }
        if (code != CUDA_SUCCESS) {
            return refuse("descriptor 0: the driver refused it (cuMemImportFromShareableHandle: " +
                          device_.cuda().describe(code) + ")");
        }
        return imported;
    }

private:
    failure refuse(const std::string& why) const {
        return fail(status_code::invalid_argument, device_.who() + ": IPC handle refused: " + why);
    }

    const device_context& device_;
    const sharing_api* api_ = nullptr;
    std::string unavailable_;
    std::array<std::uint8_t, 16> uuid_{};
    std::mutex imported_mutex_;
    std::set<std::array<std::uint8_t, 16>> imported_ids_; // closed imports' too: a handle imports once
};

} // namespace nxmem::cuda
