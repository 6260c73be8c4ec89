// Helpers for the cuda plugin's tests: where the plugin and the fake driver are, and the fake's
// controls (fake_cuda_control.h), reached through the same loaded instance the plugin uses.
#pragma once

#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <cuda.h>
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
