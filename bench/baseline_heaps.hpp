// jemalloc and mimalloc as in-run baselines beside glibc's malloc, without either becoming the
// process's malloc: both are dlopen'd with RTLD_LOCAL and called by their own entry points
// (jemalloc's mallocx/dallocx, mimalloc's mi_malloc, mi_malloc_aligned and mi_free), so every other allocation in the
// process, the pool's and the host's included, stays glibc's. Debian builds both unprefixed
// (linking either would replace malloc); the packages are libjemalloc-dev and libmimalloc-dev.
//
// jemalloc keeps its thread state in initial-exec TLS, which glibc can give a dlopen'd library
// only from its small optional static TLS reserve (512 bytes): dlopen fails with "cannot allocate
// memory in static TLS block". ensure_static_tls_for_dlopen() re-executes the program once with
// the reserve raised (GLIBC_TUNABLES=glibc.rtld.optional_static_tls), before anything else runs.
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace nxmem::bench {

inline constexpr const char* static_tls_tunable = "glibc.rtld.optional_static_tls=65536";

// Call first thing in main: re-executes the program with the tunable when it is not set yet
// (and returns when it is, or when exec fails: jemalloc's baseline then says why it is missing).
inline void ensure_static_tls_for_dlopen(char** argv) {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    if (tunables != nullptr && std::strstr(tunables, "glibc.rtld.optional_static_tls") != nullptr) {
        return;
    }
    const std::string raised = tunables != nullptr && *tunables != '\0'
                                   ? std::string(tunables) + ":" + static_tls_tunable
                                   : std::string(static_tls_tunable);
    ::setenv("GLIBC_TUNABLES", raised.c_str(), 1);
    ::execv("/proc/self/exe", argv);
}

// One dlopen'd allocator: `allocate(size)` and `release(address)` through its own entry points.
class baseline_heap {
public:
    // nullopt, with the reason in `problem`, when the library or a symbol is missing.
    static std::optional<baseline_heap> jemalloc(std::string& problem) {
        return open("libjemalloc.so.2", "mallocx", nullptr, "dallocx", true, problem);
    }
    static std::optional<baseline_heap> mimalloc(std::string& problem) {
        return open("libmimalloc.so.2", "mi_malloc", "mi_malloc_aligned", "mi_free", false, problem);
    }

    // `alignment` a power of two; malloc's own (16) takes each heap's plain malloc path.
    void* allocate(std::uint64_t size, std::uint64_t alignment) const noexcept {
        const auto bytes = static_cast<std::size_t>(size);
        if (flagged_) { // MALLOCX_LG_ALIGN(log2 alignment), 0 for malloc's own
            return flagged_allocate_(bytes, alignment <= 16 ? 0 : std::countr_zero(alignment));
        }
        return alignment <= 16 ? plain_allocate_(bytes) : aligned_allocate_(bytes, static_cast<std::size_t>(alignment));
    }
    void release(void* address) const noexcept {
        if (flagged_) {
            flagged_release_(address, 0);
        } else {
            plain_release_(address);
        }
    }

private:
    using flagged_allocate = void* (*)(std::size_t, int);
    using flagged_release = void (*)(void*, int);
    using plain_allocate = void* (*)(std::size_t);
    using aligned_allocate = void* (*)(std::size_t, std::size_t);
    using plain_release = void (*)(void*);

    // `aligned_name` only for a heap without flags (nullptr for jemalloc's mallocx).
    static std::optional<baseline_heap> open(const char* library, const char* allocate_name, const char* aligned_name,
                                             const char* release_name, bool flagged, std::string& problem) {
        // Never closed: a library whose threads' caches may still point into it stays loaded.
        void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            problem = std::string("cannot load ") + library + ": " + ::dlerror();
            return std::nullopt;
        }
        void* allocate = ::dlsym(handle, allocate_name);
        void* aligned = aligned_name != nullptr ? ::dlsym(handle, aligned_name) : allocate;
        void* release = ::dlsym(handle, release_name);
        if (allocate == nullptr || aligned == nullptr || release == nullptr) {
            problem = std::string(library) + " lacks " + allocate_name + ", its aligned form or " + release_name;
            return std::nullopt;
        }
        baseline_heap made;
        made.flagged_ = flagged;
        if (flagged) {
            made.flagged_allocate_ = reinterpret_cast<flagged_allocate>(allocate);
            made.flagged_release_ = reinterpret_cast<flagged_release>(release);
        } else {
            made.plain_allocate_ = reinterpret_cast<plain_allocate>(allocate);
            made.aligned_allocate_ = reinterpret_cast<aligned_allocate>(aligned);
            made.plain_release_ = reinterpret_cast<plain_release>(release);
        }
        return made;
    }

    bool flagged_ = false;
    flagged_allocate flagged_allocate_ = nullptr;
    flagged_release flagged_release_ = nullptr;
    plain_allocate plain_allocate_ = nullptr;
    aligned_allocate aligned_allocate_ = nullptr;
    plain_release plain_release_ = nullptr;
};

// A measure route (see bench/measure/routes.hpp) over a baseline heap.
class baseline_route {
public:
    using handle = void*;
    explicit baseline_route(const baseline_heap& heap) : heap_(&heap) {}
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        void* memory = heap_->allocate(size, alignment);
        return memory == nullptr ? std::nullopt : std::optional<handle>(memory);
    }
    bool release(handle memory) {
        heap_->release(memory);
        return true;
    }

private:
    const baseline_heap* heap_;
};

} // namespace nxmem::bench
