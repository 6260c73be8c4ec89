// cuda-vmm shares shared prefixes across processes (minor 3) on the fake driver, whose physical
// memory is memfds and whose shareable handles are real descriptors: a prefix exported here is
// imported by another process (cuda_ipc_peer, fork + exec), which reads the bytes written here
// and writes back bytes read here. In-process: the accounting of an import, forged handles
// refused with nothing mapped, read-only imports, and a driver or device that cannot share.
#include "cuda_ipc_peer.hpp"
#include "cuda_support.hpp"

#include <nxmem/host/handle_transport.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::host_view;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

constexpr std::uint64_t prefix_size = 2 * chunk + 10; // three whole chunks

std::size_t open_descriptors() {
    std::size_t count = 0;
    if (DIR* listing = ::opendir("/proc/self/fd")) {
        while (::readdir(listing) != nullptr) {
            ++count;
        }
        ::closedir(listing);
    }
    return count;
}

std::string peer_path() {
    const char* path = std::getenv("NXMEM_CUDA_IPC_PEER");
    REQUIRE(path != nullptr);
    return path;
}

// An exporter: cuda-vmm with a prefix of `prefix_size` mapped into one allocation and filled
// with exported_byte().
struct exporter {
    host::plugin_allocator<cuda_device> vmm;
    host::shared_mapping_view<cuda_device> mapping;
    host::ipc_view<cuda_device> sharing;
    host::shared_prefix prefix;
    allocation<cuda_device> filled;

    explicit exporter(const test::module_ptr& module)
        : vmm(open_or_fail<cuda_device>(module, "cuda-vmm")), mapping(value_or_fail(vmm.shared_mapping())),
          sharing(value_or_fail(vmm.ipc())), prefix(value_or_fail(mapping.create_prefix(prefix_size))),
          filled(value_or_fail(vmm.allocate(4 * chunk, chunk))) {
        REQUIRE(mapping.commit_prefix(filled, prefix));
        for (std::uint64_t index = 0; index < prefix_size; ++index) {
            host_view(filled)[index] = test::exported_byte(index);
        }
    }
    void release() {
        REQUIRE(vmm.release(filled));
        REQUIRE(mapping.release_prefix(prefix));
    }
};

// The bytes at `address` are the exported ones.
bool holds_exported_bytes(const unsigned char* address) {
    for (std::uint64_t index = 0; index < prefix_size; ++index) {
        if (address[index] != test::exported_byte(index)) {
            return false;
        }
    }
    return true;
}

// Imports `record` and expects `code`, with nothing mapped, reserved or kept by the driver.
void require_refused(fake_driver& fake, host::ipc_view<cuda_device>& sharing, const NxmemIpcHandle& record,
                     status_code code, std::uint32_t access = NXMEM_IPC_READ_WRITE) {
    const fake_cuda_counts before = fake.counts();
    result<host::imported_memory<cuda_device>> imported = sharing.import(record, access);
    REQUIRE_FALSE(imported);
    INFO(imported.error().describe());
    CHECK(imported.error().code == code);
    const fake_cuda_counts after = fake.counts();
    CHECK(after.handles == before.handles);
    CHECK(after.mappings == before.mappings);
    CHECK(after.reservations == before.reservations);
}

} // namespace

TEST_CASE("a cuda-vmm prefix is read and written by another process", "[cuda][ipc][two-process]") {
    const std::string access = GENERATE(as<std::string>{}, "rw", "ro");
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        const std::size_t descriptors = open_descriptors();
        {
            exporter made(module);
            const allocator_usage before = value_or_fail(made.vmm.query_usage());
            test::importer_process importer(peer_path(), test::cuda_plugin_path(), access);
            REQUIRE(importer.started());
            {
                host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
                CHECK(handle.record().fd_count == 1);
                CHECK(handle.size() == prefix_size);
                REQUIRE(host::send_handle(importer.socket(), handle.record()));
            } // this process's descriptor is closed: the importer holds its own
            const int status = importer.finish();
            INFO("the importing process failed at: " << test::peer_step(status));
            REQUIRE(status == 0);
            if (access == "rw") {
                CHECK(std::strcmp(reinterpret_cast<const char*>(host_view(made.filled)), test::importer_marker) == 0);
            } else {
                CHECK(host_view(made.filled)[0] == test::exported_byte(0)); // nothing written back
            }
            // The exporter's accounting is its own: the import elsewhere changed nothing here.
            CHECK(value_or_fail(made.vmm.query_usage()) == before);
            CHECK(fake.counts().imported_handles == 0);
            made.release();
        }
        CHECK(open_descriptors() == descriptors);
    });
}

TEST_CASE("an exporter's release leaves the exported memory to the importer", "[cuda][ipc][two-process]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        test::importer_process importer(peer_path(), test::cuda_plugin_path(), "rw");
        REQUIRE(importer.started());
        {
            exporter made(module);
            host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
            made.release(); // before the importer has even received the handle
            const allocator_usage released = value_or_fail(made.vmm.query_usage());
            CHECK(released.shared_prefix_bytes == 0); // the exporter's accounting dropped (IP10)
            CHECK(fake.counts().device_bytes == 0);   // this process holds no device memory now
            REQUIRE(host::send_handle(importer.socket(), handle.record()));
        }
        const int status = importer.finish();
        INFO("the importing process failed at: " << test::peer_step(status));
        CHECK(status == 0);
    });
}

TEST_CASE("an imported cuda-vmm prefix is costed apart, mapped like a created one and closed once",
          "[cuda][ipc]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        exporter made(module);
        host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
        // Another allocator stands for another process: imports are per allocator.
        auto importer = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto sharing = value_or_fail(importer.ipc());
        auto mapping = value_or_fail(importer.shared_mapping());
        auto imported = value_or_fail(sharing.import(handle));
        CHECK(imported.kind() == NXMEM_IPC_PREFIX);
        CHECK(imported.size() == prefix_size);
        CHECK(imported.mapped_bytes() == 3 * chunk);
        CHECK(fake.counts().imported_handles == 1);

        allocator_usage usage = value_or_fail(importer.query_usage());
        CHECK(usage.live_imports == 1);
        CHECK(usage.imported_bytes == 3 * chunk);
        CHECK(usage.shared_prefix_bytes == 0);
        CHECK(usage.mapped_bytes == 0);
        CHECK(value_or_fail(module->readiness()).plugin.imports == 1);

        auto sequence = value_or_fail(importer.allocate(5 * chunk, chunk));
        auto committed = value_or_fail(mapping.commit_prefix(sequence, imported.prefix()));
        CHECK(committed.newly_mapped_bytes == 0); // the exporter's memory, costed there
        CHECK(committed.shared_bytes == prefix_size);
        CHECK(holds_exported_bytes(host_view(sequence)));
        host_view(sequence, 7)[0] = 0xAB; // one memory: the exporter sees the importer's write
        CHECK(host_view(made.filled, 7)[0] == 0xAB);
        CHECK(value_or_fail(importer.virtual_backing()).commit(sequence, {0, 5 * chunk}));
        CHECK(value_or_fail(importer.query_usage()).mapped_bytes == 2 * chunk); // past the prefix only

        // A replay while it lives, and after it is closed, is refused (IP8).
        require_refused(fake, sharing, handle.record(), status_code::invalid_argument);
        REQUIRE(imported.close());
        usage = value_or_fail(importer.query_usage());
        CHECK(usage.live_imports == 0);
        CHECK(usage.imported_bytes == 3 * chunk); // the sequence still maps it (IP10)
        CHECK(value_or_fail(module->readiness()).plugin.imports == 0);
        require_refused(fake, sharing, handle.record(), status_code::invalid_argument);
        CHECK(host_view(sequence, 7)[0] == 0xAB);
        REQUIRE(importer.release(sequence));
        CHECK(value_or_fail(importer.query_usage()).imported_bytes == 0);
        CHECK(fake.counts().imported_handles == 0);
        made.release();
    });
}

TEST_CASE("unload is refused while a cuda-vmm import lives", "[cuda][ipc]") {
    test::with_cuda_plugin([&](fake_driver&, const test::module_ptr& module) {
        std::optional<host::imported_memory<cuda_device>> imported;
        {
            exporter made(module);
            host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
            auto importer = open_or_fail<cuda_device>(module, "cuda-vmm");
            imported.emplace(value_or_fail(value_or_fail(importer.ipc()).import(handle)));
            made.release();
        }
        const host::unload_readiness ready = value_or_fail(module->readiness());
        CHECK(ready.plugin.imports == 1);
        CHECK(ready.host.imports == 1);
        const result<void> refused = module->try_unload();
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::busy);
        REQUIRE(imported->close());
        imported.reset();
    });
}

TEST_CASE("a read-only import maps the prefix without write permission", "[cuda][ipc]") {
    test::with_cuda_plugin([&](fake_driver&, const test::module_ptr& module) {
        exporter made(module);
        // A CUDA shareable handle cannot forbid a writable mapping: read-only exports are refused.
        result<host::ipc_handle> read_only = made.sharing.export_prefix(made.prefix, NXMEM_IPC_READ_ONLY);
        REQUIRE_FALSE(read_only);
        CHECK(read_only.error().code == status_code::unsupported_capability);
        // Nor are allocations: their private memory is one physical allocation per chunk.
        result<host::ipc_handle> allocation_handle = made.sharing.export_allocation(made.filled);
        REQUIRE_FALSE(allocation_handle);
        CHECK(allocation_handle.error().code == status_code::unsupported_capability);

        host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
        auto importer = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto sharing = value_or_fail(importer.ipc());
        auto imported = value_or_fail(sharing.import(handle, NXMEM_IPC_READ_ONLY));
        auto sequence = value_or_fail(importer.allocate(3 * chunk, chunk));
        REQUIRE(value_or_fail(importer.shared_mapping()).commit_prefix(sequence, imported.prefix()));
        CHECK(holds_exported_bytes(host_view(sequence)));
        // A write faults: tried in a child, which must die of SIGSEGV.
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::signal(SIGSEGV, SIG_DFL); // a sanitizer's handler would report and abort instead
            host_view(sequence)[0] = 1;
            std::_Exit(0);
        }
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        CHECK(WIFSIGNALED(status));
        CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
        // An imported read-only prefix is not exported read-write.
        result<host::ipc_handle> forwarded = sharing.export_prefix(imported.prefix());
        REQUIRE_FALSE(forwarded);
        CHECK(forwarded.error().code == status_code::invalid_argument);
        REQUIRE(importer.release(sequence));
        REQUIRE(imported.close());
        made.release();
    });
}

TEST_CASE("forged cuda-vmm handles are refused with nothing mapped", "[cuda][ipc]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        exporter made(module);
        host::ipc_handle handle = value_or_fail(made.sharing.export_prefix(made.prefix));
        auto importer = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto sharing = value_or_fail(importer.ipc());
        const std::size_t descriptors = open_descriptors();
        // Offsets in the opaque bytes (plugins/cuda/sharing.hpp, vmm_handle_opaque).
        constexpr std::size_t tag_at = 0;
        constexpr std::size_t uuid_at = 24;
        constexpr std::size_t length_at = 40;
        constexpr std::size_t granularity_at = 48;
        const auto with_opaque = [&](std::size_t at, std::uint64_t value) {
            NxmemIpcHandle forged = handle.record();
            std::memcpy(forged.opaque + at, &value, sizeof value);
            return forged;
        };

        SECTION("another mechanism's handle") {
            NxmemIpcHandle forged = handle.record();
            forged.mechanism_id = 0x504f5802; // posix-lazy's
            require_refused(fake, sharing, forged, status_code::wrong_mechanism);
        }
        SECTION("the opaque bytes are not a cuda-vmm export") {
            require_refused(fake, sharing, with_opaque(tag_at, 0x31584950534f504e), status_code::invalid_argument);
        }
        SECTION("the opaque bytes are short") {
            NxmemIpcHandle forged = handle.record();
            forged.opaque_length -= 8;
            require_refused(fake, sharing, forged, status_code::invalid_argument);
        }
        SECTION("two descriptors") {
            NxmemIpcHandle forged = handle.record();
            forged.fd_count = 2;
            forged.fds[1] = forged.fds[0];
            require_refused(fake, sharing, forged, status_code::invalid_argument);
        }
        SECTION("another GPU's export") {
            require_refused(fake, sharing, with_opaque(uuid_at, 0x1234), status_code::invalid_argument);
        }
        SECTION("another granularity") {
            require_refused(fake, sharing, with_opaque(granularity_at, 2 * chunk), status_code::invalid_argument);
        }
        SECTION("a size the opaque bytes do not describe") {
            NxmemIpcHandle forged = handle.record();
            forged.size = 5 * chunk;
            require_refused(fake, sharing, forged, status_code::invalid_argument);
        }
        SECTION("a size larger than the memory behind the descriptor, consistently claimed") {
            NxmemIpcHandle forged = with_opaque(length_at, 4 * chunk);
            forged.size = 4 * chunk;
            require_refused(fake, sharing, forged, status_code::invalid_argument);
        }
        SECTION("a pipe") {
            int pipe_ends[2];
            REQUIRE(::pipe(pipe_ends) == 0);
            NxmemIpcHandle forged = handle.record();
            forged.fds[0] = pipe_ends[0];
            require_refused(fake, sharing, forged, status_code::invalid_argument);
            ::close(pipe_ends[0]);
            ::close(pipe_ends[1]);
        }
        SECTION("a memfd the driver did not make") {
            const int stranger = ::memfd_create("not-device-memory", MFD_CLOEXEC);
            REQUIRE(stranger >= 0);
            REQUIRE(::ftruncate(stranger, static_cast<off_t>(3 * chunk)) == 0);
            NxmemIpcHandle forged = handle.record();
            forged.fds[0] = stranger;
            require_refused(fake, sharing, forged, status_code::invalid_argument);
            ::close(stranger);
        }
        SECTION("the driver fails the import: the handle may be imported later") {
            fake.fail(FAKE_CUDA_MEM_IMPORT, 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
            require_refused(fake, sharing, handle.record(), status_code::out_of_memory);
            REQUIRE(value_or_fail(sharing.import(handle)).close());
        }
        CHECK(open_descriptors() == descriptors); // an import keeps nothing of a refused handle
        CHECK(value_or_fail(importer.query_usage()).live_imports == 0);
        made.release();
    });
}

TEST_CASE("a failed export writes no descriptor", "[cuda][ipc]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        exporter made(module);
        const std::size_t descriptors = open_descriptors();
        fake.fail(FAKE_CUDA_MEM_EXPORT, 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
        result<host::ipc_handle> failed = made.sharing.export_prefix(made.prefix);
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code == status_code::out_of_memory);
        CHECK(open_descriptors() == descriptors);
        made.release();
    });
}

TEST_CASE("cuda-vmm does not offer IPC where the driver or the device cannot share", "[cuda][ipc]") {
    fake_cuda_config config = fake_driver::defaults();
    SECTION("a driver without the shareable-handle entry points") { config.sharing_entry_points = 0; }
    SECTION("a device that does not export POSIX file descriptors") { config.posix_fd_supported = 0; }
    test::with_cuda_plugin(&config, [&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        CHECK((vmm.capabilities() & NXMEM_CAP_IPC) == 0);
        CHECK((vmm.capabilities() & NXMEM_CAP_SHARED_MAPPING) != 0);
        result<host::ipc_view<cuda_device>> sharing = vmm.ipc();
        REQUIRE_FALSE(sharing);
        CHECK(sharing.error().code == status_code::unsupported_capability);
        // Prefixes still work, made without the handle type the device lacks.
        auto mapping = value_or_fail(vmm.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        auto sequence = value_or_fail(vmm.allocate(3 * chunk, chunk));
        REQUIRE(mapping.commit_prefix(sequence, prefix));
        CHECK(fake.counts().mappings == 1);
        REQUIRE(vmm.release(sequence));
        REQUIRE(mapping.release_prefix(prefix));
    });
}
