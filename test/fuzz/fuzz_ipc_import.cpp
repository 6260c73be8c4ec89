// Fuzzes the import path of minor 3 (docs/ABI.md IP rules) end to end: the host's view, the kit's
// slot, abi::read_ipc_handle and posix-lazy's own checks of descriptors and opaque bytes. Each
// input damages a fresh, genuine export of a posix-lazy prefix or, when the last byte's bit 2 is
// set, of a posix-lazy allocation (share=memfd) of the same size: its record's bytes are overlaid
// with the input's, and each descriptor is replaced by one of a menu (the genuine memfd, a pipe,
// an unsealed memfd, a memfd of another size, a read-only descriptor, -1). Invariants: an import
// succeeds only for a record that still names the genuine file, kind, size, mechanism and device
// (and opaque bytes, but for the export id, which only guards against a replay); a refused
// import leaves nothing counted and is never OUT_OF_MEMORY; a successful one counts one import of
// the memory's pages (an allocation's mapped readable where it says) and nothing once closed; a
// closed handle never imports again.
// Descriptor-state attacks (the last byte's bit 3; issue 31): descriptor 0 is then a memfd the
// input makes as a hostile exporter would, of the handle's size, filled, and changed "between send
// and import": cut by a page, grown by a page or cut to one page, with the seals the input picks
// (size, write, future write, final) added before or after the change, the descriptor reopened
// read-only or not. Such a file imports only if it is safe: its size sealed and exactly the
// handle's whole pages, not sealed against writes for a read-write import, opened as the handle
// says; and every page of what was imported then reads without a fault.
// Input: [struct_size u32][overlay count u8]([offset u8][byte u8])...[descriptor choices u8 x4]
//        [state u8][seals u8][last u8]
// where the last byte is bit 0: import read-only, bit 1: export read-only, bit 2: an allocation,
// bit 3: a descriptor-state attack; state is bits 0-1: the size change (none, one page less, one
// page more, one page in all), bit 2: seals added before the change (else after), bit 3: the
// descriptor reopened read-only; seals is a set of F_SEAL_* bits (masked to the five there are).
#include "fuzz_support.hpp"

#include <nxmem/host.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
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

// A memfd of `bytes` bytes filled with 0x6B, changed as `state` and sealed with `seals` says
// (see the input format above); a new descriptor the caller closes.
int hostile_memfd(std::uint64_t bytes, std::uint8_t state, std::uint8_t seals) {
    const int fd = ::memfd_create("fuzz-hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    NXMEM_FUZZ_CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    NXMEM_FUZZ_CHECK(memory != MAP_FAILED);
    std::memset(memory, 0x6B, bytes);
    ::munmap(memory, bytes);
    const int chosen = seals & (F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_FUTURE_WRITE);
    const std::uint64_t sizes[] = {bytes, bytes - 4096, bytes + 4096, 4096};
    const bool seal_first = (state & 4u) != 0;
    if (seal_first) {
        (void)::fcntl(fd, F_ADD_SEALS, chosen);
    }
    (void)::ftruncate(fd, static_cast<off_t>(sizes[state & 3u])); // refused when sealed: fine
    if (!seal_first) {
        (void)::fcntl(fd, F_ADD_SEALS, chosen);
    }
    if ((state & 8u) == 0) {
        return fd;
    }
    const int reader = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_CLOEXEC);
    NXMEM_FUZZ_CHECK(reader >= 0);
    ::close(fd);
    return reader;
}

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
    const bool hostile_descriptor = (access_choice & 8u) != 0;
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
    const std::uint8_t state = in.u8();
    const std::uint8_t seals = in.u8();
    int hostile = -1;
    if (whole && hostile_descriptor) {
        hostile = hostile_memfd(prefix_pages_bytes, state, seals);
        record->fds[0] = hostile;
    }
    struct closer {
        int fd;
        ~closer() {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    } close_hostile{hostile};

    result<host::imported_memory<cpu_device>> imported = f.sharing->import(*record, access);
    if (!imported) {
        // Never OUT_OF_MEMORY, on which an engine frees memory (ABI.md IP17).
        NXMEM_FUZZ_CHECK(imported.error().code != status_code::out_of_memory);
        f.check_nothing_imported();
        return 0;
    }
    // Accepted: it must still be the genuine export: its file (any descriptor of it), its size,
    // mechanism, device and opaque bytes, and an access the descriptor allows.
    NXMEM_FUZZ_CHECK(whole);
    struct stat accepted {}, exported {};
    NXMEM_FUZZ_CHECK(::fstat(record->fds[0], &accepted) == 0 && ::fstat(original.fds[0], &exported) == 0);
    if (record->fds[0] == hostile) {
        // A hostile exporter's file: only a safe one imports (its size sealed and the handle's,
        // writable unless the import is read-only).
        const int held = ::fcntl(hostile, F_GET_SEALS);
        NXMEM_FUZZ_CHECK(held >= 0 && (held & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
        NXMEM_FUZZ_CHECK(static_cast<std::uint64_t>(accepted.st_size) == prefix_pages_bytes);
        NXMEM_FUZZ_CHECK(access == NXMEM_IPC_READ_ONLY || (held & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) == 0);
    } else {
        NXMEM_FUZZ_CHECK(accepted.st_ino == exported.st_ino && accepted.st_dev == exported.st_dev);
    }
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
        for (std::uint64_t offset = 0; offset < prefix_pages_bytes; offset += 4096) {
            NXMEM_FUZZ_CHECK(memory[offset] == 0x6B); // every page is there (no SIGBUS)
        }
    } else if (hostile >= 0) {
        // A prefix is mapped only when a sequence maps it: every page must be there.
        auto sequence = f.lazy->allocate(prefix_pages_bytes, 4096).value();
        const auto mapped = f.mapping->commit_prefix(sequence, imported.value().prefix());
        NXMEM_FUZZ_CHECK(mapped.has_value());
        for (std::uint64_t offset = 0; offset < prefix_pages_bytes; offset += 4096) {
            NXMEM_FUZZ_CHECK(static_cast<const volatile unsigned char*>(sequence.address)[offset] == 0x6B);
        }
        NXMEM_FUZZ_CHECK(f.lazy->release(sequence).has_value());
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
