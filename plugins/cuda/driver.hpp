// The CUDA driver, loaded at run time. Nothing links libcuda: an allocator that opens dlopens
// libcuda.so.1 (or the file named by NXMEM_CUDA_DRIVER), checks its version, and resolves every
// entry point it uses through cuGetProcAddress with the CUDA version whose signature it expects,
// so a newer driver can never hand it a function of another shape. cuda.h and cudaTypedefs.h
// supply the types only.
//
// Only two symbols are looked up by name with dlsym: cuDriverGetVersion (every driver exports
// it, and the version decides whether the rest can be asked for) and cuGetProcAddress_v2 (the
// CUDA 12.0 resolver that reports whether a symbol was found).
#pragma once

#include <nxmem/abi/result.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

namespace nxmem::cuda {

// cuGetProcAddress_v2 (with its symbolStatus argument) is CUDA 12.0's.
inline constexpr int needed_driver_version = 12000;
inline constexpr const char* driver_path_variable = "NXMEM_CUDA_DRIVER";
inline constexpr const char* default_driver_path = "libcuda.so.1";

// "12.4" for 12040, the form cuDriverGetVersion's numbers are written in.
inline std::string cuda_version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Every entry point the plugin calls, each of the signature the CUDA version in its type's name
// introduced (the version it is asked for with).
struct driver_api {
    PFN_cuGetErrorName_v6000 get_error_name = nullptr;
    PFN_cuGetErrorString_v6000 get_error_string = nullptr;
    PFN_cuInit_v2000 init = nullptr;
    PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
    PFN_cuDeviceGet_v2000 device_get = nullptr;
    PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
    PFN_cuCtxPushCurrent_v4000 ctx_push_current = nullptr;
    PFN_cuCtxPopCurrent_v4000 ctx_pop_current = nullptr;
    PFN_cuMemGetInfo_v3020 mem_get_info = nullptr;
    PFN_cuMemAlloc_v3020 mem_alloc = nullptr;
    PFN_cuMemFree_v3020 mem_free = nullptr;
    PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
    PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
    PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
    PFN_cuMemCreate_v10020 mem_create = nullptr;
    PFN_cuMemRelease_v10020 mem_release = nullptr;
    PFN_cuMemMap_v10020 mem_map = nullptr;
    PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
    PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
    // Copies and stream order (ABI minor 4, stream_order.hpp).
    PFN_cuMemcpyDtoH_v3020 memcpy_dtoh = nullptr;
    PFN_cuMemcpyHtoD_v3020 memcpy_htod = nullptr;
    PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async = nullptr;
    PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async = nullptr;
    PFN_cuEventCreate_v2000 event_create = nullptr;
    PFN_cuEventRecord_v2000 event_record = nullptr;
    PFN_cuEventQuery_v2000 event_query = nullptr;
    PFN_cuEventDestroy_v4000 event_destroy = nullptr;
    PFN_cuStreamCreate_v2000 stream_create = nullptr;
    PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
    PFN_cuStreamWaitEvent_v3020 stream_wait_event = nullptr;
};

// The entry points sharing across processes needs (cuda-vmm's IPC), resolved apart: a driver
// without them still allocates, and only the allocators' NXMEM_CAP_IPC stays clear.
struct sharing_api {
    PFN_cuMemExportToShareableHandle_v10020 export_shareable = nullptr;
    PFN_cuMemImportFromShareableHandle_v10020 import_shareable = nullptr;
    PFN_cuDeviceGetUuid_v11040 device_get_uuid = nullptr;
};

// One dlopen of the driver library; closed when the last allocator using it goes.
class driver {
public:
    driver(const driver&) = delete;
    driver& operator=(const driver&) = delete;
    ~driver() {
        if (library_ != nullptr) {
            ::dlclose(library_);
        }
    }

    // Loads the driver and resolves the API. WRONG_DEVICE when there is no driver to load,
    // VERSION_MISMATCH when it is older than the plugin needs; `who` starts every message.
    static result<std::unique_ptr<driver>> load(const std::string& who) {
        const char* configured = std::getenv(driver_path_variable);
        std::string path = configured != nullptr && *configured != '\0' ? configured : default_driver_path;
        void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) {
            const char* why = ::dlerror();
            return fail(status_code::wrong_device,
                        who + ": no CUDA driver: cannot load " + path + " (" +
                            (why != nullptr ? why : "unknown reason") + ")");
        }
        std::unique_ptr<driver> loaded(new driver(library, std::move(path)));
        NXMEM_TRY_VOID(loaded->resolve(who));
        return loaded;
    }

    const driver_api& api() const noexcept { return api_; }
    // The sharing entry points, or nullptr when the driver lacks one (sharing_missing() says which).
    const sharing_api* sharing() const noexcept { return sharing_missing_.empty() ? &sharing_ : nullptr; }
    const std::string& sharing_missing() const noexcept { return sharing_missing_; }
    int version() const noexcept { return version_; }
    const std::string& path() const noexcept { return path_; }

    // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
    std::string describe(CUresult code) const {
        const char* name = nullptr;
        const char* text = nullptr;
        if (api_.get_error_name == nullptr || api_.get_error_name(code, &name) != CUDA_SUCCESS ||
            name == nullptr) {
            return "CUresult " + std::to_string(static_cast<int>(code));
        }
        std::string described(name);
        if (api_.get_error_string != nullptr && api_.get_error_string(code, &text) == CUDA_SUCCESS &&
            text != nullptr) {
            described += std::string(" (") + text + ")";
        }
        return described;
    }

    // OK for CUDA_SUCCESS; otherwise OUT_OF_MEMORY (the driver ran out) or INTERNAL_ERROR,
    // with "<what()> failed: <the driver's error>". `what` is called only on failure.
    template <class What> result<void> check(CUresult code, What&& what) const {
        if (code == CUDA_SUCCESS) {
            return boost::outcome_v2::success();
        }
        return fail(code == CUDA_ERROR_OUT_OF_MEMORY ? status_code::out_of_memory
                                                     : status_code::internal_error,
                    std::string(what()) + " failed: " + describe(code));
    }

    // Asks the driver for `symbol` as CUDA `version` defined it (for entry points beyond
    // driver_api, such as the host functions the GPU tests queue).
    template <class Function>
    result<void> entry(const std::string& who, const char* symbol, int version, Function& slot) {
        void* found = nullptr;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        const CUresult code =
            get_proc_address_(symbol, &found, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
        if (code != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || found == nullptr) {
            return fail(status_code::version_mismatch,
                        who + ": the CUDA driver " + path_ + " (version " +
                            cuda_version_text(version_) + ") has no " + symbol + " for CUDA " +
                            cuda_version_text(version) + " (cuGetProcAddress: CUresult " +
                            std::to_string(static_cast<int>(code)) + ", symbol status " +
                            std::to_string(static_cast<int>(status)) + ")");
        }
        slot = reinterpret_cast<Function>(found);
        return boost::outcome_v2::success();
    }

private:
    driver(void* library, std::string path) : library_(library), path_(std::move(path)) {}

    result<void> resolve(const std::string& who) {
        auto* get_version =
            reinterpret_cast<PFN_cuDriverGetVersion_v2020>(::dlsym(library_, "cuDriverGetVersion"));
        if (get_version == nullptr) {
            return fail(status_code::wrong_device,
                        who + ": no CUDA driver: " + path_ + " exports no cuDriverGetVersion");
        }
        if (const CUresult code = get_version(&version_); code != CUDA_SUCCESS) {
            return fail(status_code::wrong_device, who + ": no CUDA driver: cuDriverGetVersion of " +
                                                       path_ + " failed with CUresult " +
                                                       std::to_string(static_cast<int>(code)));
        }
        if (version_ < needed_driver_version) {
            return fail(status_code::version_mismatch,
                        who + ": the CUDA driver " + path_ + " is version " +
                            cuda_version_text(version_) + ", older than the CUDA " +
                            cuda_version_text(needed_driver_version) + " this plugin needs");
        }
        get_proc_address_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(
            ::dlsym(library_, "cuGetProcAddress_v2"));
        if (get_proc_address_ == nullptr) {
            return fail(status_code::version_mismatch,
                        who + ": the CUDA driver " + path_ + " (version " +
                            cuda_version_text(version_) + ") exports no cuGetProcAddress_v2");
        }
        NXMEM_TRY_VOID(entry(who, "cuGetErrorName", 6000, api_.get_error_name));
        NXMEM_TRY_VOID(entry(who, "cuGetErrorString", 6000, api_.get_error_string));
        NXMEM_TRY_VOID(entry(who, "cuInit", 2000, api_.init));
        NXMEM_TRY_VOID(entry(who, "cuDeviceGetCount", 2000, api_.device_get_count));
        NXMEM_TRY_VOID(entry(who, "cuDeviceGet", 2000, api_.device_get));
        NXMEM_TRY_VOID(entry(who, "cuDeviceGetAttribute", 2000, api_.device_get_attribute));
        NXMEM_TRY_VOID(entry(who, "cuDevicePrimaryCtxRetain", 7000, api_.primary_ctx_retain));
        NXMEM_TRY_VOID(entry(who, "cuDevicePrimaryCtxRelease", 11000, api_.primary_ctx_release));
        NXMEM_TRY_VOID(entry(who, "cuCtxPushCurrent", 4000, api_.ctx_push_current));
        NXMEM_TRY_VOID(entry(who, "cuCtxPopCurrent", 4000, api_.ctx_pop_current));
        NXMEM_TRY_VOID(entry(who, "cuMemGetInfo", 3020, api_.mem_get_info));
        NXMEM_TRY_VOID(entry(who, "cuMemAlloc", 3020, api_.mem_alloc));
        NXMEM_TRY_VOID(entry(who, "cuMemFree", 3020, api_.mem_free));
        NXMEM_TRY_VOID(entry(who, "cuMemGetAllocationGranularity", 10020,
                             api_.mem_get_allocation_granularity));
        NXMEM_TRY_VOID(entry(who, "cuMemAddressReserve", 10020, api_.mem_address_reserve));
        NXMEM_TRY_VOID(entry(who, "cuMemAddressFree", 10020, api_.mem_address_free));
        NXMEM_TRY_VOID(entry(who, "cuMemCreate", 10020, api_.mem_create));
        NXMEM_TRY_VOID(entry(who, "cuMemRelease", 10020, api_.mem_release));
        NXMEM_TRY_VOID(entry(who, "cuMemMap", 10020, api_.mem_map));
        NXMEM_TRY_VOID(entry(who, "cuMemUnmap", 10020, api_.mem_unmap));
        NXMEM_TRY_VOID(entry(who, "cuMemSetAccess", 10020, api_.mem_set_access));
        NXMEM_TRY_VOID(entry(who, "cuMemcpyDtoH", 3020, api_.memcpy_dtoh));
        NXMEM_TRY_VOID(entry(who, "cuMemcpyHtoD", 3020, api_.memcpy_htod));
        NXMEM_TRY_VOID(entry(who, "cuMemcpyDtoHAsync", 3020, api_.memcpy_dtoh_async));
        NXMEM_TRY_VOID(entry(who, "cuMemcpyHtoDAsync", 3020, api_.memcpy_htod_async));
        NXMEM_TRY_VOID(entry(who, "cuEventCreate", 2000, api_.event_create));
        NXMEM_TRY_VOID(entry(who, "cuEventRecord", 2000, api_.event_record));
        NXMEM_TRY_VOID(entry(who, "cuEventQuery", 2000, api_.event_query));
        NXMEM_TRY_VOID(entry(who, "cuEventDestroy", 4000, api_.event_destroy));
        NXMEM_TRY_VOID(entry(who, "cuStreamCreate", 2000, api_.stream_create));
        NXMEM_TRY_VOID(entry(who, "cuStreamDestroy", 4000, api_.stream_destroy));
        NXMEM_TRY_VOID(entry(who, "cuStreamWaitEvent", 3020, api_.stream_wait_event));
        resolve_sharing(who);
        return boost::outcome_v2::success();
    }

    // Optional: the first entry point missing is recorded, and the driver serves without sharing.
    void resolve_sharing(const std::string& who) {
        result<void> found = entry(who, "cuMemExportToShareableHandle", 10020, sharing_.export_shareable);
        if (found) {
            found = entry(who, "cuMemImportFromShareableHandle", 10020, sharing_.import_shareable);
        }
        if (found) {
            found = entry(who, "cuDeviceGetUuid", 11040, sharing_.device_get_uuid);
        }
        if (!found) {
            sharing_ = sharing_api{};
            sharing_missing_ = found.error().message;
        }
    }

    void* library_ = nullptr;
    std::string path_;
    int version_ = 0;
    PFN_cuGetProcAddress_v12000 get_proc_address_ = nullptr;
    driver_api api_;
    sharing_api sharing_;
    std::string sharing_missing_; // empty when every sharing entry point was found
};

} // namespace nxmem::cuda
