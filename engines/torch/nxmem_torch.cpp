// nxmem_torch.so: PyTorch's CPU allocator served by an nxmem plugin, loadable from Python with
// torch.ops.load_library (docs/TORCH.md). Registers torch.ops.nxmem.{install, uninstall, usage,
// trim, owns} and, for tagged tensors that sleep and wake, {use_tag, sleep, wake_up, residency,
// tags}; reads NXMEM_TORCH_PLUGIN and friends when loaded, so an unmodified script runs on a
// plugin. Links the libc10/libtorch_cpu of the interpreter's torch (it must: a second copy of
// c10 fails with "linked both statically and dynamically"), with the C++11 string ABI.
#include "torch_installation.hpp"

#include <torch/library.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

using nxmem::torch_engine::installation;
using nxmem::torch_engine::tagged_pools;
using nxmem::torch_engine::usage_figures;

// Runs an op's body: a c10::Error leaves as it is (Python's RuntimeError with its message); any
// other C++ exception (std::bad_alloc, a filesystem error) becomes a c10::Error naming the op.
template <class Body> auto guarded(const char* op, Body&& body) -> decltype(body()) {
    try {
        return body();
    } catch (const c10::Error&) {
        throw;
    } catch (const std::exception& failure) {
        TORCH_CHECK(false, "nxmem: ", op, ": ", failure.what());
    }
    std::abort(); // not reached
}

c10::Dict<std::string, std::int64_t> as_dict(const usage_figures& figures) {
    c10::Dict<std::string, std::int64_t> dict;
    for (const auto& [name, value] : figures) {
        dict.insert(name, static_cast<std::int64_t>(value));
    }
    return dict;
}

void install(const std::string& plugin, const std::string& mechanism, const std::string& options,
             bool pooled) {
    guarded("install", [&] { installation::install(plugin, mechanism, options, pooled); });
}

void uninstall() {
    guarded("uninstall", [] { installation::uninstall(); });
}

c10::Dict<std::string, std::int64_t> usage() {
    return guarded("usage", [] { return as_dict(installation::usage()); });
}

std::int64_t trim() {
    return guarded("trim", [] { return static_cast<std::int64_t>(installation::trim()); });
}

bool owns(const at::Tensor& tensor) {
    return guarded("owns", [&] { return tensor.has_storage() && installation::owns(tensor.storage().data_ptr()); });
}

std::string use_tag(const std::string& tag) {
    return guarded("use_tag", [&] { return installation::use_tag(tag); });
}

c10::Dict<std::string, std::int64_t> sleep_tags(const std::vector<std::string>& tags, const std::string& policy) {
    return guarded("sleep", [&] { return as_dict(installation::sleep(tags, policy)); });
}

c10::Dict<std::string, std::int64_t> wake_up(const std::vector<std::string>& tags) {
    return guarded("wake_up", [&] { return as_dict(installation::wake(tags)); });
}

c10::Dict<std::string, std::int64_t> residency(const std::string& tag) {
    return guarded("residency", [&] { return as_dict(tagged_pools::get().residency(tag)); });
}

std::vector<std::string> tags() {
    return guarded("tags", [] { return tagged_pools::get().tags(); });
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
    m.def("use_tag(str tag) -> str", &use_tag);
    m.def("sleep(str[] tags, str policy) -> Dict(str, int)", &sleep_tags);
    m.def("wake_up(str[] tags) -> Dict(str, int)", &wake_up);
    m.def("residency(str tag) -> Dict(str, int)", &residency);
    m.def("tags() -> str[]", &tags);
}
