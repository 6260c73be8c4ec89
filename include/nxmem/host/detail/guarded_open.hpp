// Opening a plugin's library so that an exception thrown by one of its static initialisers (which
// dlopen runs) cannot take the host down.
//
// What glibc 2.36 does, measured (test/fault_injection, "a plugin whose initialiser throws"):
// - dlopen is declared noexcept (__THROW), so a caller such as Boost.DLL has no landing pad
//   around the call: the exception reaches it and std::terminate runs.
// - Called through a pointer whose type is not noexcept, inside a try, the exception unwinds
//   through the loader (glibc has unwind tables) and is caught. The library then stays in the
//   link map, initialised up to the throw, with one reference nobody holds; dlopen(RTLD_NOLOAD)
//   finds it, and two dlclose calls (that lookup's reference and the orphan) unmap it, running
//   the destructors of the statics that were constructed.
// - The loader's lock, taken by dlopen and released only on its normal return, stays held by the
//   loading thread: that thread can still load and unload, every other thread's dlopen/dlclose
//   blocks for the rest of the process. Nothing public releases it; the refusal says so.
// A plugin must therefore neither throw nor allocate while its library is opened (docs/PLUGINS.md);
// the kit's plugins run no dynamic initialiser at all.
#pragma once

#include <nxmem/abi/result.hpp>

#include <dlfcn.h>

#include <exception>
#include <filesystem>
#include <new>
#include <string>

namespace nxmem::host::detail {

// A reference to the library taken by run_initialisers, dropped when it goes (after the host's
// own Boost.DLL handle was taken, so the library is not closed in between).
class initialised_library {
public:
    initialised_library() noexcept = default;
    explicit initialised_library(void* handle) noexcept : handle_(handle) {}
    initialised_library(initialised_library&& other) noexcept : handle_(other.handle_) {
        other.handle_ = nullptr;
    }
    initialised_library& operator=(initialised_library&&) = delete;
    ~initialised_library() {
        if (handle_ != nullptr) {
            ::dlclose(handle_);
        }
    }

private:
    void* handle_ = nullptr;
};

// Whether `path` is mapped in this process (without loading it).
inline bool library_is_mapped(const std::filesystem::path& path) noexcept {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

// Drops the reference that a dlopen left behind when an initialiser threw out of it.
inline void close_orphaned_library(const std::filesystem::path& path) noexcept {
    void* found = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (found != nullptr) {
        ::dlclose(found); // the lookup's own reference
        ::dlclose(found); // the one the interrupted dlopen took and never returned
    }
}

// Opens `requested` (RTLD_NOW | RTLD_LOCAL) as Boost.DLL would, running its initialisers. An empty handle when dlopen
// itself failed (dlerror() says why; the caller's own load reports it); OUT_OF_MEMORY
// (std::bad_alloc) or CONTRACT_VIOLATION (anything else) when an initialiser threw, with the
// library closed again.
inline result<initialised_library> run_initialisers(const std::filesystem::path& requested) {
    if (requested.empty()) {
        return initialised_library(); // Boost.DLL refuses it
    }
    // The file Boost.DLL then opens: a bare file name is looked up in the current directory.
    const std::filesystem::path path =
        requested.has_parent_path() ? requested : std::filesystem::path(".") / requested;
    // Not noexcept, and read through a volatile so the compiler cannot see that it is dlopen:
    // the call then has a landing pad.
    using open_function = void* (*)(const char*, int);
    open_function volatile opener = &::dlopen;
    std::exception_ptr thrown;
    try {
        return initialised_library(opener(path.c_str(), RTLD_NOW | RTLD_LOCAL));
    } catch (...) {
        thrown = std::current_exception();
    }
    close_orphaned_library(path);
    status_code code = status_code::contract_violation;
    std::string what = "an exception of unknown type";
    try {
        std::rethrow_exception(thrown);
    } catch (const std::bad_alloc& failure) {
        code = status_code::out_of_memory;
        what = failure.what();
    } catch (const std::exception& failure) {
        what = failure.what();
    } catch (...) {
    }
    return fail(code,
                path.string() + ": a static initialiser threw (" + what +
                    ") while the library was being opened; a plugin must not throw or allocate "
                    "then. The library was closed again" +
                    (library_is_mapped(path) ? " but stays mapped" : " and unmapped") +
                    "; glibc's loader lock stays held by this thread, so loading or unloading "
                    "from any other thread of this process will block");
}

} // namespace nxmem::host::detail
