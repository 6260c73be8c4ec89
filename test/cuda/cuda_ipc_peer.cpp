// The importing process of the cuda-vmm IPC tests, a plain program started by fork + exec (a
// CUDA driver cannot be used in a forked child of a process that initialised it):
//   cuda_ipc_peer PLUGIN SOCKET_FD rw|ro
// It receives a prefix handle over SOCKET_FD, imports it into a cuda-vmm allocator on cuda:0,
// checks the accounting, maps the prefix into a sequence, reads the exporter's bytes through
// cuMemcpyDtoH (test/cuda/cuda_ipc_peer.hpp: exported_byte), writes the marker back when
// read-write, checks that a replay is refused and that unload is refused while the import lives,
// then closes the import and unloads. Exit status 0, or the step that failed (peer_step), with
// the reason on stderr. NXMEM_CUDA_DRIVER names the driver, as for the plugin.
#include "../../plugins/cuda/driver.hpp"
#include "cuda_ipc_peer.hpp"

#include <nxmem/host.hpp>
#include <nxmem/host/handle_transport.hpp>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

// The driver as this program uses it: copies, with device 0's primary context current.
struct copier {
    std::unique_ptr<cuda::driver> loaded;
    CUdevice device = 0;
    CUcontext context = nullptr;
    PFN_cuMemcpyHtoD_v3020 to_device = nullptr;
    PFN_cuMemcpyDtoH_v3020 to_host = nullptr;

    ~copier() {
        if (context != nullptr) {
            CUcontext popped = nullptr;
            (void)loaded->api().ctx_pop_current(&popped);
            (void)loaded->api().primary_ctx_release(device);
        }
    }

    result<void> start() {
        NXMEM_TRY(driver, cuda::driver::load("cuda_ipc_peer"));
        loaded = std::move(driver);
        const cuda::driver_api& api = loaded->api();
        NXMEM_TRY_VOID(loaded->check(api.init(0), [] { return "cuInit"; }));
        NXMEM_TRY_VOID(loaded->check(api.device_get(&device, 0), [] { return "cuDeviceGet"; }));
        NXMEM_TRY_VOID(loaded->check(api.primary_ctx_retain(&context, device), [] { return "cuDevicePrimaryCtxRetain"; }));
        NXMEM_TRY_VOID(loaded->check(api.ctx_push_current(context), [] { return "cuCtxPushCurrent"; }));
        NXMEM_TRY_VOID(loaded->entry("cuda_ipc_peer", "cuMemcpyHtoD", 3020, to_device));
        return loaded->entry("cuda_ipc_peer", "cuMemcpyDtoH", 3020, to_host);
    }
};

int failed(int step, const std::string& why) {
    std::cerr << "cuda_ipc_peer: step " << step << " (" << test::peer_step(step) << "): " << why << '\n';
    return step;
}

int run(const std::string& plugin, int socket, bool read_only) {
    copier copies;
    if (result<void> started = copies.start(); !started) {
        return failed(2, started.error().describe());
    }
    result<std::shared_ptr<host::plugin_module>> loaded = host::plugin_module::load(plugin);
    if (!loaded) {
        return failed(3, loaded.error().describe());
    }
    std::shared_ptr<host::plugin_module> module = loaded.value();
    std::optional<host::imported_memory<cuda_device>> imported;
    {
        result<host::plugin_allocator<cuda_device>> opened = host::open_allocator<cuda_device>(module, "cuda-vmm", 0);
        if (!opened) {
            return failed(3, opened.error().describe());
        }
        host::plugin_allocator<cuda_device>& vmm = opened.value();
        result<host::ipc_view<cuda_device>> sharing = vmm.ipc();
        result<host::shared_mapping_view<cuda_device>> mapping = vmm.shared_mapping();
        if (!sharing || !mapping) {
            return failed(3, "cuda-vmm offers no ipc or shared-mapping view");
        }
        result<host::ipc_handle> handle = host::receive_handle(socket);
        if (!handle) {
            return failed(4, handle.error().describe());
        }
        const std::uint32_t access = read_only ? NXMEM_IPC_READ_ONLY : NXMEM_IPC_READ_WRITE;
        result<host::imported_memory<cuda_device>> made = sharing.value().import(handle.value(), access);
        if (!made) {
            return failed(5, made.error().describe());
        }
        imported.emplace(std::move(made).value());
        const std::uint64_t size = imported->size();

        result<allocator_usage> usage = vmm.query_usage();
        if (!usage || usage.value().live_imports != 1 || usage.value().imported_bytes != imported->mapped_bytes() ||
            imported->mapped_bytes() < size || usage.value().mapped_bytes != 0 ||
            usage.value().shared_prefix_bytes != 0) {
            return failed(6, usage ? "live_imports " + std::to_string(usage.value().live_imports) +
                                         ", imported_bytes " + std::to_string(usage.value().imported_bytes) +
                                         ", shared_prefix_bytes " + std::to_string(usage.value().shared_prefix_bytes)
                                   : usage.error().describe());
        }

        result<allocation<cuda_device>> sequence = vmm.allocate(size, 256);
        if (!sequence) {
            return failed(7, sequence.error().describe());
        }
        result<prefix_commit> committed = mapping.value().commit_prefix(sequence.value(), imported->prefix());
        if (!committed || committed.value().newly_mapped_bytes != 0) {
            return failed(7, committed ? "the imported prefix was costed here" : committed.error().describe());
        }

        std::vector<unsigned char> bytes(size, 0);
        if (const CUresult code = copies.to_host(bytes.data(), sequence.value().address.value, size);
            code != CUDA_SUCCESS) {
            return failed(8, "cuMemcpyDtoH: " + copies.loaded->describe(code));
        }
        for (std::uint64_t index = 0; index < size; ++index) {
            if (bytes[index] != test::exported_byte(index)) {
                return failed(8, "byte " + std::to_string(index) + " is " + std::to_string(bytes[index]));
            }
        }
        if (!read_only) {
            if (const CUresult code = copies.to_device(sequence.value().address.value, test::importer_marker,
                                                       sizeof test::importer_marker);
                code != CUDA_SUCCESS) {
                return failed(9, "cuMemcpyHtoD: " + copies.loaded->describe(code));
            }
        }

        result<host::imported_memory<cuda_device>> replay = sharing.value().import(handle.value(), NXMEM_IPC_READ_ONLY);
        if (replay || replay.error().code != status_code::invalid_argument) {
            return failed(10, replay ? "it was imported twice" : replay.error().describe());
        }
        if (!vmm.release(sequence.value())) {
            return failed(10, "releasing the sequence failed");
        }
    } // the allocator and its views go; the import keeps the allocator alive

    result<host::unload_readiness> ready = module->readiness();
    if (!ready || ready.value().plugin.imports != 1 || ready.value().host.imports != 1 || module->try_unload()) {
        return failed(11, ready ? "the plugin reports " + std::to_string(ready.value().plugin.imports) +
                                      " imports, the host " + std::to_string(ready.value().host.imports)
                                : ready.error().describe());
    }
    if (result<void> closed = imported->close(); !closed) {
        return failed(12, closed.error().describe());
    }
    imported.reset();
    if (result<void> unloaded = module->try_unload(); !unloaded) {
        return failed(12, unloaded.error().describe());
    }
    return 0;
}

} // namespace

int main(int argc, char* argv[]) {
    if (argc != 4 || (std::string(argv[3]) != "rw" && std::string(argv[3]) != "ro")) {
        std::cerr << "usage: cuda_ipc_peer PLUGIN SOCKET_FD rw|ro\n";
        return 1;
    }
    return run(argv[1], std::atoi(argv[2]), std::string(argv[3]) == "ro");
}
