// Helpers for the cuda plugin's tests: where the plugin and the fake driver are, and the fake's
// controls (fake_cuda_control.h), reached through the same loaded instance the plugin uses.
#pragma once

#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <fake_cuda_control.h>
#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

namespace nxmem::test {

inline std::string cuda_plugin_path() { return plugin_path("NXMEM_CUDA_PLUGIN"); }
inline std::string fake_cuda_driver_path() { return plugin_path("NXMEM_FAKE_CUDA_DRIVER"); }

inline constexpr std::uint64_t mib = 1ull << 20;
inline constexpr std::uint64_t chunk = 2 * mib; // the fake's default granularity

// The driver calls a test makes itself (streams, events, copies, host functions), asked of the
// driver library `library` through cuGetProcAddress_v2 as the plugin asks; the same calls work on
// the fake and on a real driver.
struct driver_calls {
    PFN_cuInit_v2000 init = nullptr;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain = nullptr;
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_ctx_release = nullptr;
    PFN_cuCtxPushCurrent_v4000 ctx_push_current = nullptr;
    PFN_cuCtxPopCurrent_v4000 ctx_pop_current = nullptr;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize = nullptr;
    PFN_cuStreamCreate_v2000 stream_create = nullptr;
    PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
    PFN_cuStreamQuery_v2000 stream_query = nullptr;
    PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
    PFN_cuStreamWaitEvent_v3020 stream_wait_event = nullptr;
    PFN_cuEventCreate_v2000 event_create = nullptr;
    PFN_cuEventRecord_v2000 event_record = nullptr;
    PFN_cuEventQuery_v2000 event_query = nullptr;
    PFN_cuEventSynchronize_v2000 event_synchronize = nullptr;
    PFN_cuEventDestroy_v4000 event_destroy = nullptr;
    PFN_cuMemcpyHtoD_v3020 memcpy_htod = nullptr;
    PFN_cuMemcpyDtoH_v3020 memcpy_dtoh = nullptr;
    PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async = nullptr;
    PFN_cuMemcpyDtoHAsync_v3020 memcpy_dtoh_async = nullptr;
    PFN_cuLaunchHostFunc_v10000 launch_host_func = nullptr;
    PFN_cuMemGetInfo_v3020 mem_get_info = nullptr;

    explicit driver_calls(void* library) {
        resolver_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(::dlsym(library, "cuGetProcAddress_v2"));
        REQUIRE(resolver_ != nullptr);
        entry("cuInit", 2000, init);
        entry("cuDevicePrimaryCtxRetain", 7000, primary_ctx_retain);
        entry("cuDevicePrimaryCtxRelease", 11000, primary_ctx_release);
        entry("cuCtxPushCurrent", 4000, ctx_push_current);
        entry("cuCtxPopCurrent", 4000, ctx_pop_current);
        entry("cuCtxSynchronize", 2000, ctx_synchronize);
        entry("cuStreamCreate", 2000, stream_create);
        entry("cuStreamDestroy", 4000, stream_destroy);
        entry("cuStreamQuery", 2000, stream_query);
        entry("cuStreamSynchronize", 2000, stream_synchronize);
        entry("cuStreamWaitEvent", 3020, stream_wait_event);
        entry("cuEventCreate", 2000, event_create);
        entry("cuEventRecord", 2000, event_record);
        entry("cuEventQuery", 2000, event_query);
        entry("cuEventSynchronize", 2000, event_synchronize);
        entry("cuEventDestroy", 4000, event_destroy);
        entry("cuMemcpyHtoD", 3020, memcpy_htod);
        entry("cuMemcpyDtoH", 3020, memcpy_dtoh);
        entry("cuMemcpyHtoDAsync", 3020, memcpy_htod_async);
        entry("cuMemcpyDtoHAsync", 3020, memcpy_dtoh_async);
        entry("cuLaunchHostFunc", 10000, launch_host_func);
        entry("cuMemGetInfo", 3020, mem_get_info);
    }

private:
    template <class F> void entry(const char* symbol, int version, F& slot) {
        void* found = nullptr;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        INFO(symbol);
        REQUIRE(resolver_(symbol, &found, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) == CUDA_SUCCESS);
        REQUIRE(found != nullptr);
        slot = reinterpret_cast<F>(found);
    }
    PFN_cuGetProcAddress_v12000 resolver_ = nullptr;
};

// Device 0's primary context, retained and current on the calling thread for the scope (streams
// and events are made in it, copies need it).
class current_context {
public:
    explicit current_context(const driver_calls& calls) : calls_(calls) {
        REQUIRE(calls_.init(0) == CUDA_SUCCESS);
        REQUIRE(calls_.primary_ctx_retain(&context_, 0) == CUDA_SUCCESS);
        REQUIRE(calls_.ctx_push_current(context_) == CUDA_SUCCESS);
    }
    current_context(const current_context&) = delete;
    current_context& operator=(const current_context&) = delete;
    ~current_context() {
        CUcontext popped = nullptr;
        (void)calls_.ctx_pop_current(&popped);
        (void)calls_.primary_ctx_release(0);
    }

private:
    const driver_calls& calls_;
    CUcontext context_ = nullptr;
};

// A stream made on the current context, synchronized and destroyed with the scope.
class scoped_stream {
public:
    scoped_stream(const driver_calls& calls, unsigned flags) : calls_(calls) {
        REQUIRE(calls_.stream_create(&stream_, flags) == CUDA_SUCCESS);
    }
    scoped_stream(const scoped_stream&) = delete;
    scoped_stream& operator=(const scoped_stream&) = delete;
    ~scoped_stream() {
        (void)calls_.stream_synchronize(stream_);
        (void)calls_.stream_destroy(stream_);
    }
    CUstream get() const noexcept { return stream_; }

private:
    const driver_calls& calls_;
    CUstream stream_ = nullptr;
};

// The fake driver, held open for the test (so its state outlives each allocator's dlclose), with
// its controls. Each instance starts from a fresh configuration.
class fake_driver {
public:
    explicit fake_driver(const fake_cuda_config* config = nullptr)
        : handle_(::dlopen(fake_cuda_driver_path().c_str(), RTLD_NOW | RTLD_LOCAL)) {
        REQUIRE(handle_ != nullptr);
        configure_ = symbol<decltype(&fake_cuda_configure)>("fake_cuda_configure");
        fail_ = symbol<decltype(&fake_cuda_fail)>("fake_cuda_fail");
        counts_ = symbol<decltype(&fake_cuda_get_counts)>("fake_cuda_get_counts");
        depth_ = symbol<decltype(&fake_cuda_context_depth)>("fake_cuda_context_depth");
        hold_ = symbol<decltype(&fake_cuda_hold_stream)>("fake_cuda_hold_stream");
        configure_(config);
    }
    fake_driver(const fake_driver&) = delete;
    fake_driver& operator=(const fake_driver&) = delete;
    ~fake_driver() { ::dlclose(handle_); }

    static fake_cuda_config defaults() {
        fake_cuda_config config{};
        config.devices = 1;
        config.driver_version = 13000;
        config.granularity = chunk;
        config.device_memory = 1ull << 30;
        config.vmm_supported = 1;
        config.posix_fd_supported = 1;
        config.sharing_entry_points = 1;
        return config;
    }

    void fail(fake_cuda_call call, unsigned successes, unsigned failures,
              CUresult code = CUDA_ERROR_OUT_OF_MEMORY) const {
        fail_(call, successes, failures, static_cast<int>(code));
    }
    fake_cuda_counts counts() const {
        fake_cuda_counts now{};
        counts_(&now);
        return now;
    }
    unsigned context_depth() const { return depth_(); }
    // Holds `stream`: work queued on it stays pending until let_go(), or the end of the scope (a
    // failed check leaves no stream held, so the stream's destruction cannot hang).
    class stream_hold {
    public:
        stream_hold(const fake_driver& fake, CUstream stream) : fake_(&fake), stream_(stream) {
            REQUIRE(fake_->hold_(stream_, 1) == 0);
        }
        stream_hold(const stream_hold&) = delete;
        stream_hold& operator=(const stream_hold&) = delete;
        ~stream_hold() { let_go(); }
        void let_go() {
            if (fake_ != nullptr) {
                (void)fake_->hold_(stream_, 0);
                fake_ = nullptr;
            }
        }

    private:
        const fake_driver* fake_;
        CUstream stream_;
    };
    stream_hold holding(CUstream stream) const { return stream_hold(*this, stream); }
    driver_calls calls() const { return driver_calls(handle_); }

    // Nothing held on the fake device, no context retained or left current, every call made
    // with a context.
    void require_idle() const {
        const fake_cuda_counts now = counts();
        CHECK(now.device_allocations == 0);
        CHECK(now.reservations == 0);
        CHECK(now.handles == 0);
        CHECK(now.mappings == 0);
        CHECK(now.device_bytes == 0);
        CHECK(now.primary_retains == 0);
        CHECK(now.calls_without_context == 0);
        CHECK(now.streams == 0);
        CHECK(now.events == 0);
        CHECK(now.stream_work_pending == 0);
        CHECK(context_depth() == 0);
    }

private:
    template <class F> F symbol(const char* name) {
        void* found = ::dlsym(handle_, name);
        REQUIRE(found != nullptr);
        return reinterpret_cast<F>(found);
    }

    void* handle_;
    decltype(&fake_cuda_configure) configure_ = nullptr;
    decltype(&fake_cuda_fail) fail_ = nullptr;
    decltype(&fake_cuda_get_counts) counts_ = nullptr;
    decltype(&fake_cuda_context_depth) depth_ = nullptr;
    decltype(&fake_cuda_hold_stream) hold_ = nullptr;
};

using module_ptr = std::shared_ptr<host::plugin_module>;

// Runs `body(fake, module)` on a fresh fake driver (`config`, or the environment's defaults) with
// the plugin loaded. Afterwards the plugin must unload and be unmapped, and the fake must hold
// nothing: no memory, no context retained or left current.
template <class Body> void with_cuda_plugin(const fake_cuda_config* config, Body&& body) {
    fake_driver fake(config);
    {
        module_ptr module = load_or_fail(cuda_plugin_path());
        body(fake, module);
        REQUIRE(module->try_unload());
    }
    CHECK_FALSE(is_mapped(cuda_plugin_path()));
    fake.require_idle();
}
template <class Body> void with_cuda_plugin(Body&& body) {
    with_cuda_plugin(nullptr, std::forward<Body>(body));
}

// Sets an environment variable for one scope, restoring the old value after.
class scoped_environment {
public:
    scoped_environment(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) {
            old_ = old;
            had_ = true;
        }
        ::setenv(name, value.c_str(), 1);
    }
    scoped_environment(const scoped_environment&) = delete;
    scoped_environment& operator=(const scoped_environment&) = delete;
    ~scoped_environment() {
        if (had_) {
            ::setenv(name_, old_.c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }

private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

// The host pointer behind a fake device address: the fake maps device memory into this process.
inline unsigned char* host_view(const allocation<cuda_device>& live, std::uint64_t offset = 0) {
    return reinterpret_cast<unsigned char*>(static_cast<std::uintptr_t>(live.address.value + offset));
}

} // namespace nxmem::test
