// Fuzzes the import path of minor 3 (docs/ABI.md IP rules) end to end: the host's view, the kit's
// slot, abi::read_ipc_handle and posix-lazy's own checks of descriptors and opaque bytes. Each
// input damages a fresh, genuine export of a posix-lazy prefix or, when the last byte's bit 2 is
// set, of a posix-lazy allocation (share=memfd) of the same size: its record's bytes are overlaid
// with the input's, and each descriptor is replaced by one of a menu (the genuine memfd, a pipe,
// an unsealed memfd, a memfd of another size, a read-only descriptor, -1). Invariants: an import
// succeeds only for a record that still names the genuine file, kind, size, mechanism and device
// (and opaque bytes, but for the export id, which only guards against a replay);
// a refused import leaves nothing counted; a successful one counts one import of the memory's
// pages (an allocation's mapped readable where it says) and nothing once closed; a closed handle
// never imports again.
// Input: [struct_size u32][overlay count u8]([offset u8][byte u8])...[descriptor choices u8 x4][last u8]
// where the last byte is bit 0: import read-only, bit 1: export read-only, bit 2: an allocation.
#include "fuzz_support.hpp"

#include <nxmem/host.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

namespace nxmem::fuzz {
namespace {

constexpr std::uint64_t prefix_size = 2 * 4096 + 1;
constexpr std::uint64_t prefix_pages_bytes = 3 * 4096;

int memfd_of(std::uint64_t bytes, bool sealed) {
    const int fd = ::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    NXMEM_FUZZ_CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    if (sealed) {
        NXMEM_FUZZ_CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    }
    return fd;
}

struct fixture {
    std::shared_ptr<host::plugin_module> module;
    std::optional<host::plugin_allocator<cpu_device>> lazy;
    std::optional<host::shared_mapping_view<cpu_device>> mapping;
    std::optional<host::ipc_view<cpu_device>> sharing;
    host::shared_prefix prefix{};
    std::optional<host::plugin_allocator<cpu_device>> shared_lazy; // share=memfd: exports allocations
    std::optional<host::ipc_view<cpu_device>> allocation_sharing;
    std::optional<allocation<cpu_device>> exported;
    int pipe_ends[2] = {-1, -1};
    int unsealed = -1;
    int other_size = -1;

    fixture() {
        const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
        NXMEM_FUZZ_CHECK(path != nullptr);
        module = host::plugin_module::load(path).value();
        lazy.emplace(host::open_allocator<cpu_device>(module, "posix-lazy").value());
        mapping.emplace(lazy->shared_mapping().value());
        sharing.emplace(lazy->ipc().value());
        prefix = mapping->create_prefix(prefix_size).value();
        shared_lazy.emplace(host::open_allocator<cpu_device>(module, "posix-lazy", 0, "share=memfd").value());
        allocation_sharing.emplace(shared_lazy->ipc().value());
        exported = shared_lazy->allocate(prefix_size, 4096).value();
        shared_lazy->virtual_backing().value().commit(*exported, {0, prefix_size}).value();
        std::memset(exported->address, 0x6B, prefix_size);
        NXMEM_FUZZ_CHECK(::pipe2(pipe_ends, O_CLOEXEC) == 0);
        unsealed = memfd_of(prefix_pages_bytes, false);
        other_size = memfd_of(prefix_pages_bytes + 4096, true);
    }

    void check_nothing_imported() {
        const allocator_usage usage = lazy->query_usage().value();
        NXMEM_FUZZ_CHECK(usage.live_imports == 0 && usage.imported_bytes == 0);
        NXMEM_FUZZ_CHECK(module->readiness().value().plugin.imports == 0);
    }
};

fixture& shared_fixture() {
    static fixture* made = new fixture(); // lives for the process: the fuzzer never tears down
    return *made;
}

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    fixture& f = shared_fixture();
    input_reader in(data, size);
    const std::uint8_t access_choice = static_cast<std::uint8_t>(size > 0 ? data[size - 1] : 0);
    const std::uint32_t access = access_choice & 1u;
    const std::uint32_t exported_access =
        (access_choice & 2u) != 0 ? NXMEM_IPC_READ_ONLY : NXMEM_IPC_READ_WRITE;
    const bool of_allocation = (access_choice & 4u) != 0;
    host::ipc_handle genuine =
        (of_allocation ? f.allocation_sharing->export_allocation(*f.exported, exported_access)
                       : f.sharing->export_prefix(f.prefix, exported_access))
            .value();
    const NxmemIpcHandle original = genuine.record();

    std::uint32_t struct_size = in.u32();
    if (struct_size == 0) {
        struct_size = sizeof(NxmemIpcHandle); // the plain case
    }
    const std::size_t length = std::clamp<std::size_t>(struct_size, 4, NXMEM_MAX_STRUCT_SIZE + 8);
    NxmemIpcHandle base = original;
    base.struct_size = struct_size;
    const exact_bytes raw({reinterpret_cast<const std::uint8_t*>(&base), sizeof base}, length);
    const std::uint8_t overlays = in.u8() % 16;
    for (std::uint8_t index = 0; index < overlays; ++index) {
        const std::uint8_t offset = in.u8();
        const std::uint8_t value = in.u8();
        if (offset < length && offset >= sizeof(std::uint32_t)) {
            raw.data()[offset] = value;
        }
    }
    auto* record = reinterpret_cast<NxmemIpcHandle*>(raw.data());
    const bool whole = length >= sizeof(NxmemIpcHandle);
    if (whole) {
        for (std::uint32_t index = 0; index < NXMEM_IPC_MAX_FDS; ++index) {
            const std::uint8_t choice = in.u8() % 6;
            const int menu[] = {record->fds[index], f.pipe_ends[0], f.unsealed, f.other_size, -1,
                                original.fds[0]};
            record->fds[index] = menu[choice];
        }
    }

    result<host::imported_memory<cpu_device>> imported = f.sharing->import(*record, access);
    if (!imported) {
        f.check_nothing_imported();
        return 0;
    }
    // Accepted: it must still be the genuine export: its file (any descriptor of it), its size,
    // mechanism, device and opaque bytes, and an access the descriptor allows.
    NXMEM_FUZZ_CHECK(whole);
    struct stat accepted {}, exported {};
    NXMEM_FUZZ_CHECK(::fstat(record->fds[0], &accepted) == 0 && ::fstat(original.fds[0], &exported) == 0);
    NXMEM_FUZZ_CHECK(accepted.st_ino == exported.st_ino && accepted.st_dev == exported.st_dev);
    NXMEM_FUZZ_CHECK(record->mechanism_id == original.mechanism_id);
    NXMEM_FUZZ_CHECK(record->device.device_type == original.device.device_type &&
                     record->device.index == original.device.index);
    NXMEM_FUZZ_CHECK(record->kind == original.kind && record->size == original.size);
    // The opaque bytes but posix-lazy's export id (bytes 8 to 23): the id only guards against a
    // handle delivered twice, and another id names another export of the same file, which its
    // exporter could make anyway (ABI.md IP8).
    NXMEM_FUZZ_CHECK(record->opaque_length == original.opaque_length);
    NxmemIpcHandle compared = *record;
    std::memcpy(compared.opaque + 8, original.opaque + 8, 16);
    NXMEM_FUZZ_CHECK(std::memcmp(compared.opaque, original.opaque, original.opaque_length) == 0);
    NXMEM_FUZZ_CHECK(access == NXMEM_IPC_READ_ONLY || record->access == NXMEM_IPC_READ_WRITE);
    NXMEM_FUZZ_CHECK((::fcntl(record->fds[0], F_GETFL) & O_ACCMODE) ==
                     (record->access == NXMEM_IPC_READ_ONLY ? O_RDONLY : O_RDWR));
    const allocator_usage usage = f.lazy->query_usage().value();
    NXMEM_FUZZ_CHECK(usage.live_imports == 1 && usage.imported_bytes == prefix_pages_bytes);
    if (of_allocation) {
        const auto* memory = static_cast<const unsigned char*>(imported.value().address());
        NXMEM_FUZZ_CHECK(memory != nullptr && memory[0] == 0x6B && memory[prefix_size - 1] == 0x6B);
    }
    NXMEM_FUZZ_CHECK(imported.value().close().has_value());
    f.check_nothing_imported();
    NXMEM_FUZZ_CHECK(!f.sharing->import(*record, access)); // a replay, now closed
    f.check_nothing_imported();
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
