// One CUDA device as an allocator holds it: the driver loaded for it, the device initialised,
// and the device's primary context retained from open to close. Driver calls that need a
// context run inside `current(...)`, which pushes the primary context onto the calling thread
// and pops it afterwards, so the engine's own current context is left as it was.
#pragma once

#include "driver.hpp"

#include <nxmem/device.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace nxmem::cuda {

class device_context {
public:
    device_context(const device_context&) = delete;
    device_context& operator=(const device_context&) = delete;
    ~device_context() {
        if (retained_) {
            (void)driver_->api().primary_ctx_release(device_);
        }
    }

    // Loads the driver, initialises it and retains the primary context of CUDA ordinal
    // `device.index`. WRONG_DEVICE for no driver, no device or an ordinal the driver does not
    // have; VERSION_MISMATCH for a driver older than the plugin needs.
    static result<std::unique_ptr<device_context>> open(const char* mechanism, device_id device) {
        const std::string who = std::string(mechanism) + " on cuda:" + std::to_string(device.index);
        NXMEM_TRY(loaded, driver::load(who));
        std::unique_ptr<device_context> opened(new device_context(std::move(loaded), device.index, who));
        const driver_api& api = opened->driver_->api();
        if (const CUresult code = api.init(0); code != CUDA_SUCCESS) {
            return fail(status_code::wrong_device,
                        who + ": no CUDA device: cuInit failed: " + opened->driver_->describe(code));
        }
        int count = 0;
        if (const CUresult code = api.device_get_count(&count); code != CUDA_SUCCESS) {
            return fail(status_code::wrong_device, who + ": cuDeviceGetCount failed: " +
                                                       opened->driver_->describe(code));
        }
        if (device.index < 0 || device.index >= count) {
            return fail(status_code::wrong_device,
                        who + ": no such device: device " + std::to_string(device.index) + " of " +
                            std::to_string(count) + " (the CUDA driver sees " +
                            std::to_string(count) + " device" + (count == 1 ? "" : "s") + ")");
        }
        NXMEM_TRY_VOID(opened->driver_->check(api.device_get(&opened->device_, device.index),
                                              [&] { return who + ": cuDeviceGet"; }));
        NXMEM_TRY_VOID(opened->driver_->check(api.primary_ctx_retain(&opened->context_, opened->device_),
                                              [&] { return who + ": cuDevicePrimaryCtxRetain"; }));
        opened->retained_ = true;
        return opened;
    }

    const driver& cuda() const noexcept { return *driver_; }
    const driver_api& api() const noexcept { return driver_->api(); }
    CUdevice device() const noexcept { return device_; }
    int ordinal() const noexcept { return ordinal_; }
    // "cuda-vmm on cuda:0", how messages about this device begin.
    const std::string& who() const noexcept { return who_; }

    template <class What> result<void> check(CUresult code, What&& what) const {
        return driver_->check(code, std::forward<What>(what));
    }

    // Runs `body` (returning a result) with the primary context current on this thread.
    template <class Body> auto current(Body&& body) const -> std::invoke_result_t<Body&> {
        NXMEM_TRY_VOID(check(api().ctx_push_current(context_), [] { return "cuCtxPushCurrent"; }));
        struct pop_on_exit {
            const driver_api& api;
            ~pop_on_exit() {
                CUcontext popped = nullptr;
                (void)api.ctx_pop_current(&popped);
            }
        } pop{api()};
        return body();
    }

private:
    device_context(std::unique_ptr<driver> loaded, int ordinal, std::string who)
        : driver_(std::move(loaded)), ordinal_(ordinal), who_(std::move(who)) {}

    std::unique_ptr<driver> driver_;
    int ordinal_ = 0;
    std::string who_;
    CUdevice device_ = 0;
    CUcontext context_ = nullptr;
    bool retained_ = false;
};

} // namespace nxmem::cuda
