// nxmem_torch.so: PyTorch's CPU allocator served by an nxmem plugin, loadable from Python with
// torch.ops.load_library (docs/TORCH.md). Registers torch.ops.nxmem.{install, uninstall, usage,
// trim, owns}; reads NXMEM_TORCH_PLUGIN and friends when loaded, so an unmodified script runs on a
// plugin. Links the libc10/libtorch_cpu of the interpreter's torch (it must: a second copy of
// c10 fails with "linked both statically and dynamically"), with the C++11 string ABI.
#include "torch_installation.hpp"

#include <torch/library.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using nxmem::torch_engine::installation;

void install(const std::string& plugin, const std::string& mechanism, const std::string& options,
             bool pooled) {
    installation::install(plugin, mechanism, options, pooled);
}

void uninstall() { installation::uninstall(); }

c10::Dict<std::string, std::int64_t> usage() {
    c10::Dict<std::string, std::int64_t> figures;
    for (const auto& [name, value] : installation::usage()) {
        figures.insert(name, static_cast<std::int64_t>(value));
    }
    return figures;
}

std::int64_t trim() { return static_cast<std::int64_t>(installation::trim()); }

bool owns(const at::Tensor& tensor) {
    return tensor.has_storage() && installation::owns(tensor.storage().data_ptr());
}

// This object holds the deleters of every tensor it served: it must never be unmapped (Python's
// ctypes never dlcloses, but an engine might). RTLD_NODELETE on our own path pins it for good.
void pin_this_library() {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&pin_this_library), &self) != 0 && self.dli_fname != nullptr) {
        (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    }
}

// NXMEM_TORCH_PLUGIN=path [NXMEM_TORCH_MECHANISM=posix-eager] [NXMEM_TORCH_OPTIONS=...]
// [NXMEM_TORCH_POOLED=1|0, or true/false, yes/no, on/off]: install when the library is loaded. A
// failure, a value of NXMEM_TORCH_POOLED it cannot read included, keeps PyTorch's allocator and
// says why on stderr (an exception cannot leave a library's constructor).
[[gnu::constructor]] void install_from_environment() {
    pin_this_library();
    const char* plugin = std::getenv("NXMEM_TORCH_PLUGIN");
    if (plugin == nullptr || *plugin == '\0') {
        return;
    }
    const char* mechanism = std::getenv("NXMEM_TORCH_MECHANISM");
    const char* options = std::getenv("NXMEM_TORCH_OPTIONS");
    const char* pooled = std::getenv("NXMEM_TORCH_POOLED");
    try {
        installation::install(plugin, mechanism != nullptr ? mechanism : "posix-eager",
                              options != nullptr ? options : "",
                              installation::pooled_from_environment(pooled));
    } catch (const c10::Error& failure) {
        std::fprintf(stderr, "nxmem_torch: NXMEM_TORCH_PLUGIN=%s not installed, PyTorch's allocator kept: %s\n",
                     plugin, failure.what_without_backtrace());
    } catch (const std::exception& failure) {
        std::fprintf(stderr, "nxmem_torch: NXMEM_TORCH_PLUGIN=%s not installed, PyTorch's allocator kept: %s\n",
                     plugin, failure.what());
    }
}

} // namespace

TORCH_LIBRARY(nxmem, m) {
    m.def("install(str plugin, str mechanism, str options=\"\", bool pooled=True) -> ()", &install);
    m.def("uninstall() -> ()", &uninstall);
    m.def("usage() -> Dict(str, int)", &usage);
    m.def("trim() -> int", &trim);
    m.def("owns(Tensor tensor) -> bool", &owns);
}
