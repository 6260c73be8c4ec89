// Test helpers around a loaded module: load-or-fail, "is this library still mapped?", and
// symbols read out of the loaded module itself.
#pragma once

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <memory>
#include <string>

namespace nxmem::test {

// Whether the dynamic loader still has `path` mapped (RTLD_NOLOAD never maps anything).
inline bool is_mapped(const std::string& path) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

inline std::shared_ptr<host::plugin_module> load_or_fail(const std::string& path,
                                                          const host::load_options& options = {}) {
    auto loaded = host::plugin_module::load(path, options);
    if (!loaded) {
        FAIL("loading " << path << " failed: " << loaded.error().describe());
    }
    return loaded.value();
}

template <Device D>
host::plugin_allocator<D> open_or_fail(const std::shared_ptr<host::plugin_module>& module,
                                       const std::string& mechanism, std::int32_t index = 0,
                                       const std::string& options = {}) {
    auto opened = host::open_allocator<D>(module, mechanism, index, options);
    if (!opened) {
        FAIL("opening " << mechanism << " failed: " << opened.error().describe());
    }
    return std::move(opened).value();
}

// Fails the test with the error's text when `outcome` is a failure; returns the value.
template <class T> T value_or_fail(result<T> outcome) {
    if (!outcome) {
        FAIL(outcome.error().describe());
    }
    if constexpr (!std::is_void_v<T>) {
        return std::move(outcome).value();
    }
}

// Keeps a library mapped independently of the module, so a counter can be read out of the
// loaded module after the host has released everything. Closes on destruction.
class library_handle {
public:
    explicit library_handle(const std::string& path) : handle_(::dlopen(path.c_str(), RTLD_NOW)) {
        REQUIRE(handle_ != nullptr);
    }
    library_handle(const library_handle&) = delete;
    library_handle& operator=(const library_handle&) = delete;
    ~library_handle() { close(); }
    void close() {
        if (handle_ != nullptr) {
            ::dlclose(handle_);
            handle_ = nullptr;
        }
    }
    // Calls the module's own exported `std::uint64_t name()`.
    std::uint64_t counter(const char* name) const {
        void* symbol = ::dlsym(handle_, name);
        REQUIRE(symbol != nullptr);
        return reinterpret_cast<std::uint64_t (*)()>(symbol)();
    }

private:
    void* handle_;
};

} // namespace nxmem::test
