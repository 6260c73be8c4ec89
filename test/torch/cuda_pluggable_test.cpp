// nxmem_torch_cuda.so called as PyTorch's CUDAPluggableAllocator calls it (dlopen, dlsym of the
// names it is given, malloc(size, device, stream) / free(ptr, size, device, stream) /
// record_stream(ptr, stream)), with the device's primary context current as PyTorch's runtime
// leaves it, over the fake driver's streams: a stream takes back what it freed at once, another
// stream takes it at once too with a wait on the freeing stream's event, while that stream is
// held (its work not run), and a free the module cannot match changes nothing.
// Environment: NXMEM_TORCH_CUDA (the module), NXMEM_TORCH_CUDA_PLUGIN, NXMEM_CUDA_DRIVER and
// NXMEM_FAKE_CUDA_DRIVER (the fake; unset on a GPU, where no stream is held).
#include "device_context.hpp" // plugins/cuda
#include "fake_cuda_control.h"

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/types.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace {

struct pluggable {
    void* (*malloc)(ssize_t, int, CUstream) = nullptr;
    void (*free)(void*, ssize_t, int, CUstream) = nullptr;
    void (*record_stream)(void*, CUstream) = nullptr;
    unsigned long long (*trim)() = nullptr;
    const char* (*last_error)() = nullptr;
};

template <class F> void resolve(void* library, const char* name, F& function) {
    function = reinterpret_cast<F>(::dlsym(library, name));
    REQUIRE(function != nullptr);
}

// The module, loaded once for the process (PyTorch never unloads it either).
const pluggable& module() {
    static const pluggable loaded = [] {
        const char* path = std::getenv("NXMEM_TORCH_CUDA");
        REQUIRE(path != nullptr);
        void* library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
        REQUIRE(library != nullptr);
        pluggable entry;
        resolve(library, "nxmem_cuda_malloc", entry.malloc);
        resolve(library, "nxmem_cuda_free", entry.free);
        resolve(library, "nxmem_cuda_record_stream", entry.record_stream);
        resolve(library, "nxmem_cuda_trim", entry.trim);
        resolve(library, "nxmem_cuda_last_error", entry.last_error);
        return entry;
    }();
    return loaded;
}

// The caller's side of the driver: device 0's primary context current, two streams of its own.
class caller_streams {
public:
    caller_streams() {
        auto opened = nxmem::cuda::device_context::open("caller", {NXMEM_DEVICE_CUDA, 0});
        REQUIRE(opened.has_value());
        device_ = std::move(opened).value();
        const auto& api = device_->api();
        REQUIRE(api.primary_ctx_retain(&context_, device_->device()) == CUDA_SUCCESS);
        REQUIRE(api.ctx_push_current(context_) == CUDA_SUCCESS);
        REQUIRE(api.stream_create(&first, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        REQUIRE(api.stream_create(&second, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        // Over the fake driver a stream can be held, so its work stays queued; on a GPU
        // (scripts/gpu-check, NXMEM_FAKE_CUDA_DRIVER unset) the work is whatever is queued.
        if (const char* fake = std::getenv("NXMEM_FAKE_CUDA_DRIVER"); fake != nullptr) {
            fake_ = ::dlopen(fake, RTLD_NOW | RTLD_NOLOAD);
            REQUIRE(fake_ != nullptr);
            resolve(fake_, "fake_cuda_hold_stream", hold_stream_);
        }
    }
    // Holds (or lets go) `stream` where the driver is the fake; true elsewhere.
    bool hold(CUstream stream, int held) { return hold_stream_ == nullptr || hold_stream_(stream, held) == 0; }
    ~caller_streams() {
        const auto& api = device_->api();
        hold(first, 0);
        hold(second, 0);
        (void)api.stream_destroy(first); // waits for the stream's work
        (void)api.stream_destroy(second);
        CUcontext popped = nullptr;
        (void)api.ctx_pop_current(&popped);
        (void)api.primary_ctx_release(device_->device());
        if (fake_ != nullptr) {
            ::dlclose(fake_);
        }
    }
    caller_streams(const caller_streams&) = delete;
    caller_streams& operator=(const caller_streams&) = delete;

    CUstream first = nullptr;
    CUstream second = nullptr;

private:
    int (*hold_stream_)(CUstream, int) = nullptr;
    std::unique_ptr<nxmem::cuda::device_context> device_;
    CUcontext context_ = nullptr;
    void* fake_ = nullptr;
};

} // namespace

TEST_CASE("the CUDAPluggableAllocator entry points, called as PyTorch calls them, reuse in stream order",
          "[pool][streams][torch-cuda]") {
    const pluggable& torch = module();
    caller_streams streams;

    SECTION("a stream takes back at once what it freed") {
        void* first = torch.malloc(4096, 0, streams.first);
        REQUIRE(first != nullptr);
        torch.free(first, 4096, 0, streams.first);
        void* again = torch.malloc(4096, 0, streams.first);
        CHECK(again == first);
        torch.free(again, 4096, 0, streams.first);
    }
    SECTION("another stream takes it at once too, waiting on the event of the stream that freed it") {
        REQUIRE(streams.hold(streams.first, 1)); // its work stays queued
        void* first = torch.malloc(8192, 0, streams.first);
        REQUIRE(first != nullptr);
        torch.free(first, 8192, 0, streams.first);
        void* other = torch.malloc(8192, 0, streams.second);
        CHECK(other == first);
        REQUIRE(streams.hold(streams.first, 0));
        torch.free(other, 8192, 0, streams.second);
    }
    SECTION("record_stream: used on a second stream, its release fences both") {
        void* block = torch.malloc(16384, 0, streams.first);
        REQUIRE(block != nullptr);
        torch.record_stream(block, streams.second);
        CHECK(std::string(torch.last_error()).find("no live allocation") == std::string::npos);
        torch.free(block, 16384, 0, streams.first);
        void* again = torch.malloc(16384, 0, streams.first);
        CHECK(again == block);
        torch.free(again, 16384, 0, streams.first);
    }
    SECTION("a free the module cannot match changes nothing, and says why") {
        void* block = torch.malloc(4096, 0, streams.first);
        REQUIRE(block != nullptr);
        torch.free(static_cast<char*>(block) + 512, 4096, 0, streams.first);
        CHECK(std::string(torch.last_error()).find("no live allocation") != std::string::npos);
        torch.free(block, 1024, 0, streams.first);
        CHECK(std::string(torch.last_error()).find("free of 1024 bytes") != std::string::npos);
        CHECK(torch.malloc(0, 0, streams.first) == nullptr);
        torch.free(block, 4096, 0, streams.first);
        CHECK(torch.malloc(4096, 0, streams.first) == block);
        torch.free(block, 4096, 0, streams.first);
    }
}
