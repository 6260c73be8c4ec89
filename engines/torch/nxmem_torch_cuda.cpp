// nxmem_torch_cuda.so: PyTorch's CUDAPluggableAllocator entry points over nxmem's cuda plugin
// (include/nxmem/torch/cuda_pluggable_allocator.h, docs/TORCH.md). Per device: the plugin's
// allocator behind a pool_allocator, behind a stream_ordered_pool whose policy records CUDA
// events (nxmem::pytorch::cuda_stream_policy); a table by address gives free(ptr) its
// allocation. Built wherever the cuda plugin is (it needs no libtorch), installed as
// LIBDIR/nxmem/torch/nxmem_torch_cuda.so, and tested over the fake driver by a caller that calls
// it as PyTorch does (test/torch/cuda_pluggable_test.cpp).
//
// Everything it makes lives until the process exits (as nxmem_torch.so's adapters do): PyTorch
// frees tensors during interpreter shutdown, after any destructor of ours could have run.
#include "device_context.hpp" // plugins/cuda

#include <nxmem/host.hpp>
#include <nxmem/host/pooled_allocator.hpp>
#include <nxmem/pool/shared_upstream.hpp>
#include <nxmem/pool/stream_ordered_pool.hpp>
#include <nxmem/torch/cuda_pluggable_allocator.h>
#include <nxmem/torch/cuda_stream_policy.hpp>

#include <array>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

using pool_type = nxmem::host::pooled_plugin_allocator<nxmem::cuda_device>;
using policy_type = nxmem::pytorch::cuda_stream_policy<nxmem::cuda::driver_api>;
using layer_type = nxmem::stream_ordered_pool<nxmem::shared_upstream<pool_type>, policy_type>;

// PyTorch's own CUDA caching allocator rounds to 512 bytes; tensors may rely on that alignment.
constexpr std::uint64_t tensor_alignment = 512;
constexpr int device_limit = 16;

struct device_layer {
    std::unique_ptr<nxmem::cuda::device_context> device; // keeps the driver loaded and the context retained
    std::shared_ptr<pool_type> pool;
    std::unique_ptr<layer_type> layer;
};

struct module_state {
    std::mutex mutex; // the fields below; never held across a call into the plugin or the driver
    std::shared_ptr<nxmem::host::plugin_module> plugin;
    std::array<std::shared_ptr<device_layer>, device_limit> devices;
    std::unordered_map<std::uint64_t, nxmem::allocation<nxmem::cuda_device>> live; // by wire address
};

module_state& state() {
    static module_state* immortal = new module_state; // see the file's comment
    return *immortal;
}

thread_local std::string last_error;

const char* environment(const char* name, const char* fallback) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? value : fallback;
}

nxmem::result<std::shared_ptr<nxmem::host::plugin_module>> plugin() {
    {
        std::lock_guard hold(state().mutex);
        if (state().plugin != nullptr) {
            return state().plugin;
        }
    }
    const char* path = environment("NXMEM_TORCH_CUDA_PLUGIN", nullptr);
    if (path == nullptr) {
        return nxmem::fail(nxmem::status_code::invalid_argument, "nxmem_torch_cuda: NXMEM_TORCH_CUDA_PLUGIN is not set");
    }
    NXMEM_TRY(loaded, nxmem::host::plugin_module::load(path));
    std::lock_guard hold(state().mutex);
    if (state().plugin == nullptr) {
        state().plugin = std::move(loaded);
    }
    return state().plugin;
}

// The device's layer, opened on first use (a second thread racing to open it keeps the first).
nxmem::result<std::shared_ptr<device_layer>> layer_of(int device) {
    if (device < 0 || device >= device_limit) {
        return nxmem::fail(nxmem::status_code::wrong_device, "nxmem_torch_cuda: device " + std::to_string(device) + " out of range");
    }
    {
        std::lock_guard hold(state().mutex);
        if (state().devices[static_cast<std::size_t>(device)] != nullptr) {
            return state().devices[static_cast<std::size_t>(device)];
        }
    }
    NXMEM_TRY(module, plugin());
    const char* mechanism = environment("NXMEM_TORCH_CUDA_MECHANISM", "cuda-eager");
    NXMEM_TRY(pool, nxmem::host::open_pooled_allocator<nxmem::cuda_device>(module, mechanism, device));
    NXMEM_TRY(context, nxmem::cuda::device_context::open("nxmem_torch_cuda", {NXMEM_DEVICE_CUDA, device}));
    const nxmem::cuda::driver_api& api = context->api();
    CUcontext primary = nullptr;
    NXMEM_TRY_VOID(context->cuda().check(api.primary_ctx_retain(&primary, context->device()),
                                         [] { return "nxmem_torch_cuda: cuDevicePrimaryCtxRetain"; }));
    auto opened = std::make_shared<device_layer>();
    opened->device = std::move(context);
    opened->pool = pool;
    opened->layer = std::make_unique<layer_type>(nxmem::shared_upstream<pool_type>(pool),
                                                 policy_type(api, primary)); // the table lives with the device
    std::lock_guard hold(state().mutex);
    auto& slot = state().devices[static_cast<std::size_t>(device)];
    if (slot == nullptr) {
        slot = std::move(opened);
    }
    return slot;
}

// Runs `body`; a failure or an exception is kept for nxmem_cuda_last_error, and `fallback` returned.
template <class T, class Body> T guarded(T fallback, Body&& body) noexcept {
    try {
        nxmem::result<T> outcome = body();
        if (outcome) {
            return outcome.value();
        }
        last_error = outcome.error().describe();
    } catch (const std::exception& failure) {
        try {
            last_error = failure.what();
        } catch (...) {
        }
    } catch (...) {
        try {
            last_error = "an exception of a type not derived from std::exception";
        } catch (...) {
        }
    }
    return fallback;
}

// The live allocation at `ptr`, taken out of the table (released) or left in it (recorded).
nxmem::result<nxmem::allocation<nxmem::cuda_device>> find_live(void* ptr, bool take) {
    std::lock_guard hold(state().mutex);
    const auto found = state().live.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (found == state().live.end()) {
        return nxmem::fail(nxmem::status_code::unknown_allocation, "nxmem_torch_cuda: no live allocation at this address");
    }
    const nxmem::allocation<nxmem::cuda_device> live = found->second;
    if (take) {
        state().live.erase(found);
    }
    return live;
}

} // namespace

#define NXMEM_TORCH_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

NXMEM_TORCH_CUDA_EXPORT void* nxmem_cuda_malloc(ssize_t size, int device, CUstream stream) {
    return guarded<void*>(nullptr, [&]() -> nxmem::result<void*> {
        if (size <= 0) {
            return nxmem::fail(nxmem::status_code::invalid_argument, "nxmem_torch_cuda: size must be positive");
        }
        NXMEM_TRY(opened, layer_of(device));
        NXMEM_TRY(live, opened->layer->allocate(static_cast<std::uint64_t>(size), tensor_alignment, stream));
        try {
            std::lock_guard hold(state().mutex);
            state().live.emplace(nxmem::cuda_device::to_wire(live.address), live);
        } catch (...) {
            (void)opened->layer->deallocate(live, stream);
            throw;
        }
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(nxmem::cuda_device::to_wire(live.address)));
    });
}

NXMEM_TORCH_CUDA_EXPORT void nxmem_cuda_free(void* ptr, ssize_t size, int device, CUstream stream) {
    (void)guarded<bool>(false, [&]() -> nxmem::result<bool> {
        if (ptr == nullptr) {
            return true;
        }
        NXMEM_TRY(opened, layer_of(device));
        NXMEM_TRY(live, find_live(ptr, true));
        if (static_cast<std::uint64_t>(size) != live.size) {
            std::lock_guard hold(state().mutex);
            state().live.emplace(nxmem::cuda_device::to_wire(live.address), live); // as it was: nothing released
            return nxmem::fail(nxmem::status_code::invalid_argument, "nxmem_torch_cuda: free of " + std::to_string(size) +
                                                                          " bytes at an allocation of " + std::to_string(live.size));
        }
        if (auto released = opened->layer->deallocate(live, stream); !released) {
            std::lock_guard hold(state().mutex);
            state().live.emplace(nxmem::cuda_device::to_wire(live.address), live);
            return std::move(released).error();
        }
        return true;
    });
}

NXMEM_TORCH_CUDA_EXPORT void nxmem_cuda_record_stream(void* ptr, CUstream stream) {
    (void)guarded<bool>(false, [&]() -> nxmem::result<bool> {
        NXMEM_TRY(live, find_live(ptr, false));
        NXMEM_TRY(opened, layer_of(live.device.index));
        NXMEM_TRY_VOID(opened->layer->record_stream(live, stream));
        return true;
    });
}

NXMEM_TORCH_CUDA_EXPORT unsigned long long nxmem_cuda_trim(void) {
    return guarded<unsigned long long>(0, []() -> nxmem::result<unsigned long long> {
        std::array<std::shared_ptr<device_layer>, device_limit> devices;
        {
            std::lock_guard hold(state().mutex);
            devices = state().devices;
        }
        unsigned long long given = 0;
        for (const auto& opened : devices) {
            if (opened != nullptr) {
                opened->layer->collect(); // what the streams finished goes back to the pool
                given += opened->pool->trim();
            }
        }
        return given;
    });
}

NXMEM_TORCH_CUDA_EXPORT const char* nxmem_cuda_last_error(void) { return last_error.c_str(); }
