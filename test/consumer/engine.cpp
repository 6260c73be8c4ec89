// The smallest engine, built out of tree against nxmem as an integrator builds it (Meson
// subproject, pkg-config, CMake find_package; test/consumer/run.sh). It loads the posix plugin,
// allocates, writes, shares a prefix, releases everything through the owning handles, unloads, and
// checks with dlopen(RTLD_NOLOAD) that the library is no longer mapped.
//
// Usage: engine [PLUGIN.so]   (default: nxmem_posix.so in NXMEM_CONSUMER_PLUGIN_DIR, when the build
//                              system defines it from nxmem's plugin directory)
#include <nxmem/host.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>
#include <string>

namespace {

bool is_mapped(const std::string& path) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        return false;
    }
    ::dlclose(handle);
    return true;
}

bool filled_with(std::span<const std::byte> bytes, std::byte value) {
    return std::all_of(bytes.begin(), bytes.end(), [value](std::byte b) { return b == value; });
}

nxmem::result<void> fail_because(std::string why) {
    return nxmem::fail(nxmem::status_code::internal_error, std::move(why));
}

// Everything the engine holds is owned here, so it is all released when this returns, early or not.
nxmem::result<void> use(const std::shared_ptr<nxmem::host::plugin_module>& module) {
    using nxmem::cpu_device;
    using nxmem::host::owned_allocation;
    using nxmem::host::owned_prefix;

    NXMEM_TRY(eager, nxmem::host::open_allocator<cpu_device>(module, "posix-eager"));
    NXMEM_TRY(block, owned_allocation<cpu_device>::allocate(eager, 1 << 20, 4096));
    const std::span bytes(static_cast<std::byte*>(block->address), block->size);
    std::memset(bytes.data(), 0x5a, bytes.size());
    if (!filled_with(bytes, std::byte{0x5a})) {
        return fail_because("the eager allocation did not keep what was written");
    }
    NXMEM_TRY(report, block.reset());
    if (report.state != nxmem::release_state::complete) {
        return fail_because("the eager release was not complete");
    }

    // A shared prefix mapped at the start of a lazy allocation, written through it.
    NXMEM_TRY(lazy, nxmem::host::open_allocator<cpu_device>(module, "posix-lazy"));
    NXMEM_TRY(mapping, lazy.shared_mapping());
    NXMEM_TRY(prefix, owned_prefix<cpu_device>::create(mapping, 64 << 10));
    NXMEM_TRY(sequence, owned_allocation<cpu_device>::allocate(lazy, 256 << 10, 4096));
    NXMEM_TRY(commit, mapping.commit_prefix(sequence.get(), prefix.get()));
    if (commit.sharers != 1) {
        return fail_because("a fresh prefix reports " + std::to_string(commit.sharers) + " sharers");
    }
    const std::span shared(static_cast<std::byte*>(sequence->address), commit.shared_bytes);
    std::memset(shared.data(), 0x3c, shared.size());
    if (!filled_with(shared, std::byte{0x3c})) {
        return fail_because("the shared prefix did not keep what was written");
    }
    return boost::outcome_v2::success();
}

} // namespace

int main(int argc, char** argv) {
#ifdef NXMEM_CONSUMER_PLUGIN_DIR
    std::filesystem::path plugin = std::filesystem::path(NXMEM_CONSUMER_PLUGIN_DIR) / "nxmem_posix.so";
#else
    std::filesystem::path plugin;
#endif
    if (argc > 1) {
        plugin = argv[1];
    }
    if (plugin.empty()) {
        std::cerr << "usage: engine PLUGIN.so\n";
        return 2;
    }
    plugin = std::filesystem::absolute(plugin);

    auto loaded = nxmem::host::plugin_module::load(plugin);
    if (!loaded) {
        std::cerr << "engine: " << loaded.error().describe() << '\n';
        return 1;
    }
    std::shared_ptr<nxmem::host::plugin_module> module = std::move(loaded).value();
    if (auto used = use(module); !used) {
        std::cerr << "engine: " << used.error().describe() << '\n';
        return 1;
    }
    if (auto unloaded = module->try_unload(); !unloaded) {
        std::cerr << "engine: unload refused: " << unloaded.error().describe() << '\n';
        return 1;
    }
    if (is_mapped(plugin.string())) {
        std::cerr << "engine: " << plugin.string() << " is still mapped after the unload\n";
        return 1;
    }
    std::cout << "engine: " << plugin.string() << ": allocated, wrote, shared, released, unloaded, unmapped\n";
    return 0;
}
