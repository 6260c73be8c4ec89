// The rules of an imported handle (docs/ABI.md IP1-IP14), in one process: a handle is untrusted
// input, so a forged or damaged one is refused with a clear status and nothing is mapped or kept.
// The genuine handle comes from posix-lazy's own export; each case damages one thing of it.
// Allocations (IP14) are exported by an allocator opened with share=memfd and imported by another
// opened without it.
#include "../posix/posix_support.hpp"

#include <nxmem/abi/ipc_handle.hpp>
#include <nxmem/conform.hpp>
#include <nxmem/host/handle_transport.hpp>
#include <nxmem/host/ipc_view.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

constexpr std::uint64_t prefix_size = 3 * 4096 + 100;

struct sharing_fixture {
    std::shared_ptr<host::plugin_module> module = load_or_fail(test::posix_plugin_path());
    host::plugin_allocator<cpu_device> lazy = open_or_fail<cpu_device>(module, "posix-lazy");
    host::shared_mapping_view<cpu_device> mapping = value_or_fail(lazy.shared_mapping());
    host::ipc_view<cpu_device> sharing = value_or_fail(lazy.ipc());
    host::shared_prefix prefix = value_or_fail(mapping.create_prefix(prefix_size));

    host::ipc_handle export_prefix(std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        return value_or_fail(sharing.export_prefix(prefix, access));
    }
    // Nothing imported is left: no live import, no imported bytes, the plugin's unload report
    // counts only the one prefix this fixture created.
    void check_nothing_imported() {
        const allocator_usage usage = value_or_fail(lazy.query_usage());
        CHECK(usage.live_imports == 0);
        CHECK(usage.imported_bytes == 0);
        const host::unload_readiness ready = value_or_fail(module->readiness());
        CHECK(ready.plugin.imports == 0);
        CHECK(ready.host.imports == 0);
        CHECK(ready.plugin.shared_prefixes == 1);
    }
    ~sharing_fixture() { (void)mapping.release_prefix(prefix); }
};

// A sealed memfd of `bytes` bytes opened `flags`, for forged descriptors.
int sealed_memfd(std::uint64_t bytes, bool seal = true) {
    const int fd = ::memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    if (seal) {
        REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    }
    return fd;
}

void check_refused(sharing_fixture& fixture, const NxmemIpcHandle& forged, status_code expected,
                   const std::string& words, std::uint32_t access = NXMEM_IPC_READ_WRITE) {
    auto imported = fixture.sharing.import(forged, access);
    REQUIRE_FALSE(imported);
    CHECK(imported.error().code == expected);
    CHECK_THAT(imported.error().message, Catch::Contains(words));
    fixture.check_nothing_imported();
}

// An exporter of allocations (share=memfd) and an importer (default options) on one module.
struct allocation_fixture {
    static constexpr std::uint64_t size = 3 * 4096 + 100;
    static constexpr std::uint64_t whole_pages = 4 * 4096;
    std::shared_ptr<host::plugin_module> module = load_or_fail(test::posix_plugin_path());
    host::plugin_allocator<cpu_device> exporter =
        open_or_fail<cpu_device>(module, "posix-lazy", 0, "share=memfd");
    host::plugin_allocator<cpu_device> importer = open_or_fail<cpu_device>(module, "posix-lazy");
    host::ipc_view<cpu_device> exporting = value_or_fail(exporter.ipc());
    host::ipc_view<cpu_device> importing = value_or_fail(importer.ipc());
    std::optional<allocation<cpu_device>> live = value_or_fail(exporter.allocate(size, 4096));

    allocation_fixture() {
        auto backing = value_or_fail(exporter.virtual_backing());
        REQUIRE(backing.commit(*live, {0, size}));
        auto* bytes = static_cast<unsigned char*>(live->address);
        for (std::uint64_t index = 0; index < size; ++index) {
            bytes[index] = static_cast<unsigned char>(index * 7 + 1);
        }
    }
    ~allocation_fixture() {
        if (live) {
            (void)exporter.release(*live);
        }
    }
    host::ipc_handle export_allocation(std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        return value_or_fail(exporting.export_allocation(*live, access));
    }
    bool reads_the_pattern(const void* address) const {
        const auto* bytes = static_cast<const unsigned char*>(address);
        for (std::uint64_t index = 0; index < size; ++index) {
            if (bytes[index] != static_cast<unsigned char>(index * 7 + 1)) {
                return false;
            }
        }
        return true;
    }
    void check_nothing_imported() {
        const allocator_usage usage = value_or_fail(importer.query_usage());
        CHECK(usage.live_imports == 0);
        CHECK(usage.imported_bytes == 0);
        CHECK(value_or_fail(module->readiness()).plugin.imports == 0);
    }
    void check_refused(const NxmemIpcHandle& forged, status_code expected, const std::string& words,
                       std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        auto imported = importing.import(forged, access);
        REQUIRE_FALSE(imported);
        CHECK(imported.error().code == expected);
        CHECK_THAT(imported.error().message, Catch::Contains(words));
        check_nothing_imported();
    }
};

// The record the host passes back to close `imported`, for calling the plugin's slot directly.
NxmemImport described_import(const host::plugin_allocator<cpu_device>& allocator,
                             const host::imported_memory<cpu_device>& imported) {
    NxmemImport described = nxmem::abi::make_struct<NxmemImport>();
    described.kind = imported.kind();
    described.mechanism_id = allocator.mechanism_id();
    described.device = allocator.device().to_wire();
    described.import_id = imported.import_id();
    described.size = imported.size();
    described.access = imported.access();
    if (imported.kind() == NXMEM_IPC_PREFIX) {
        described.prefix = imported.prefix().to_wire();
    } else {
        described.address = reinterpret_cast<std::uint64_t>(imported.address());
    }
    return described;
}

// Closes `described` through the plugin's own close_import slot, bypassing the host's owner.
NxmemStatusCode close_through_slot(const host::plugin_allocator<cpu_device>& allocator,
                                   const NxmemImport& described) {
    const NxmemIpcVtable* slots = allocator.checked_table().ipc;
    REQUIRE(slots != nullptr);
    NxmemStatus status = nxmem::abi::make_status();
    return slots->close_import(allocator.raw_table(), &described, &status);
}

// Whether writing one byte at `address` kills a child process with SIGSEGV. The child restores
// the default handler first (a sanitizer's would report and exit instead).
bool write_faults_in_child(void* address) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::signal(SIGSEGV, SIG_DFL);
        ::signal(SIGBUS, SIG_DFL);
        *static_cast<volatile unsigned char*>(address) = 1;
        ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

} // namespace

TEST_CASE("IP1-IP3: a malformed handle record is refused before anything is mapped", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    const NxmemIpcHandle good = genuine.record();
    const auto damaged = [&](const std::function<void(NxmemIpcHandle&)>& damage) {
        NxmemIpcHandle copy = good;
        damage(copy);
        return copy;
    };
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.struct_size = 8; }),
                  status_code::invalid_argument, "struct_size");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.struct_size = 8192; }),
                  status_code::invalid_argument, "4096");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.abi_minor = 2; }),
                  status_code::invalid_argument, "minor 2");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.kind = 3; }),
                  status_code::invalid_argument, "unknown kind 3");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.access = 2; }),
                  status_code::invalid_argument, "unknown access 2");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.size = 0; }),
                  status_code::invalid_argument, "0 bytes");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.fd_count = 5; }),
                  status_code::invalid_argument, "5 descriptors");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.fds[0] = -3; }),
                  status_code::invalid_argument, "descriptor 0 is -3");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.opaque_length = 65; }),
                  status_code::invalid_argument, "65 opaque bytes");
    // The mechanism's own checks: its opaque bytes, its descriptor count, the claimed size.
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.opaque[0] ^= 1; }),
                  status_code::invalid_argument, "not a posix-lazy prefix export");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.size += 4096; }),
                  status_code::invalid_argument, "not a posix-lazy prefix export");
    // Within the last page the file would still fit: the opaque bytes hold the size exactly
    // (the fuzz campaign of session 9 found this accepted; seed regression-size-within-last-page).
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.size += 1; }),
                  status_code::invalid_argument, "not a posix-lazy prefix export");
    check_refused(fixture, damaged([](NxmemIpcHandle& h) { h.fd_count = 0; }),
                  status_code::invalid_argument, "1 descriptor");
    // A record from a larger future header is read by the request rule: unknown bytes must be 0.
    struct larger {
        NxmemIpcHandle known;
        std::uint64_t future;
    } bigger{good, 1};
    bigger.known.struct_size = sizeof bigger;
    check_refused(fixture, bigger.known, status_code::invalid_argument, "is not zero");
    // The genuine record still imports: none of the refusals consumed it.
    auto imported = fixture.sharing.import(good);
    REQUIRE(imported);
    CHECK(imported.value().mapped_bytes() == 4 * 4096);
    REQUIRE(imported.value().close());
}

TEST_CASE("IP4: a handle of another mechanism or device is refused", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    NxmemIpcHandle other_mechanism = genuine.record();
    other_mechanism.mechanism_id = 0x504f5801; // posix-eager's
    check_refused(fixture, other_mechanism, status_code::wrong_mechanism, "mechanism");
    NxmemIpcHandle other_device = genuine.record();
    other_device.device.index = 1;
    check_refused(fixture, other_device, status_code::wrong_device, "index 1");
}

TEST_CASE("IP7: a descriptor of the wrong kind, size, seals or access is refused", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    const std::uint64_t whole_pages = 4 * 4096;
    const auto with_descriptor = [&](int fd, std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        NxmemIpcHandle forged = genuine.record();
        forged.fds[0] = fd;
        forged.access = access;
        return forged;
    };
    int pipe_ends[2];
    REQUIRE(::pipe2(pipe_ends, O_CLOEXEC) == 0);
    check_refused(fixture, with_descriptor(pipe_ends[0]), status_code::invalid_argument,
                  "not a regular file");
    ::close(pipe_ends[0]);
    ::close(pipe_ends[1]);

    const int unsealed = sealed_memfd(whole_pages, false);
    check_refused(fixture, with_descriptor(unsealed), status_code::invalid_argument, "not sealed");
    ::close(unsealed);

    const int short_file = sealed_memfd(whole_pages - 4096);
    check_refused(fixture, with_descriptor(short_file), status_code::invalid_argument,
                  "holds 12288 bytes");
    ::close(short_file);

    // A read-write descriptor in a handle that claims read-only (an exporter's lie).
    const int writable = sealed_memfd(whole_pages);
    check_refused(fixture, with_descriptor(writable, NXMEM_IPC_READ_ONLY),
                  status_code::invalid_argument, "access mode", NXMEM_IPC_READ_ONLY);
    ::close(writable);
}

TEST_CASE("IP8, IP9: a handle imports once; a closed import closes once", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    auto first = value_or_fail(fixture.sharing.import(genuine));
    auto replay = fixture.sharing.import(genuine);
    REQUIRE_FALSE(replay);
    CHECK(replay.error().code == status_code::invalid_argument);
    CHECK_THAT(replay.error().message, Catch::Contains("replay"));
    REQUIRE(first.close());
    CHECK(first.close()); // the RAII owner's second close is a no-op
    auto after_close = fixture.sharing.import(genuine);
    REQUIRE_FALSE(after_close);
    CHECK_THAT(after_close.error().message, Catch::Contains("replay"));
    fixture.check_nothing_imported();

    // The plugin itself refuses a second close of the same import.
    host::ipc_handle again = fixture.export_prefix();
    auto second = value_or_fail(fixture.sharing.import(again));
    const NxmemImport described = described_import(fixture.lazy, second);
    NxmemImport misdescribed = described;
    misdescribed.size += 1;
    CHECK(close_through_slot(fixture.lazy, misdescribed) == NXMEM_STATUS_INVALID_ARGUMENT);
    REQUIRE(second.close());
    CHECK(close_through_slot(fixture.lazy, described) == NXMEM_STATUS_UNKNOWN_ALLOCATION);
    fixture.check_nothing_imported();
}

TEST_CASE("IP10, IP11: an import is costed apart and pins the module until it is closed", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    std::string path = test::posix_plugin_path();
    {
        auto imported = value_or_fail(fixture.sharing.import(genuine));
        auto sequence = value_or_fail(fixture.lazy.allocate(prefix_size, 4096));
        auto committed = value_or_fail(fixture.mapping.commit_prefix(sequence, imported.prefix()));
        CHECK(committed.shared_bytes == prefix_size);
        CHECK(committed.newly_mapped_bytes == 0); // the exporter's cost, not the importer's
        const allocator_usage usage = value_or_fail(fixture.lazy.query_usage());
        CHECK(usage.live_imports == 1);
        CHECK(usage.imported_bytes == 4 * 4096);
        CHECK(usage.shared_prefix_bytes == 4 * 4096); // the fixture's own prefix only
        CHECK(usage.mapped_bytes == 0);
        auto refused = fixture.module->try_unload();
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::busy);
        CHECK_THAT(refused.error().message, Catch::Contains("imports 1"));
        // Closing the import leaves the sequence's mapping (its own reference) in place.
        REQUIRE(imported.close());
        CHECK(value_or_fail(fixture.lazy.query_usage()).imported_bytes == 4 * 4096);
        REQUIRE(fixture.lazy.release(sequence));
        CHECK(value_or_fail(fixture.lazy.query_usage()).imported_bytes == 0);
    }
    fixture.check_nothing_imported();
}

TEST_CASE("IP12: without minor 3, or for a mechanism that cannot share, there is no ipc view",
          "[ipc]") {
    {
        auto module = load_or_fail(test::posix_plugin_path());
        {
            auto eager = open_or_fail<cpu_device>(module, "posix-eager");
            CHECK((eager.capabilities() & NXMEM_CAP_IPC) == 0);
            auto none = eager.ipc();
            REQUIRE_FALSE(none);
            CHECK(none.error().code == status_code::unsupported_capability);

            auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
            CHECK((lazy.capabilities() & NXMEM_CAP_IPC) != 0);
            CHECK(lazy.declared_minor() == 4); // minor 4: copies and fenced release
            auto sharing = value_or_fail(lazy.ipc());
            auto sequence = value_or_fail(lazy.allocate(4096, 4096));
            auto refused = sharing.export_allocation(sequence);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::unsupported_capability);
            REQUIRE(lazy.release(sequence));
        }
        REQUIRE(module->try_unload());
    }
    // One library loaded once at a time: its negotiated minor is the library's.
    host::load_options older;
    older.host_range = nxmem::abi::version_range{NXMEM_ABI_MAJOR, 0, 2};
    auto module_1_2 = load_or_fail(test::posix_plugin_path(), older);
    auto lazy_1_2 = open_or_fail<cpu_device>(module_1_2, "posix-lazy");
    CHECK(lazy_1_2.effective_minor() == 2);
    CHECK((lazy_1_2.capabilities() & NXMEM_CAP_IPC) == 0);
    CHECK(lazy_1_2.checked_table().ipc == nullptr);
    CHECK_FALSE(lazy_1_2.ipc());
}

TEST_CASE("the transport carries a handle's descriptors and refuses a stream socket", "[ipc]") {
    sharing_fixture fixture;
    host::ipc_handle genuine = fixture.export_prefix();
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) == 0);
    REQUIRE(host::send_handle(pair[0], genuine.record()));
    host::ipc_handle received = value_or_fail(host::receive_handle(pair[1]));
    CHECK(received.record().fd_count == 1);
    CHECK(received.record().fds[0] != genuine.record().fds[0]); // a new descriptor, same file
    CHECK(std::memcmp(received.record().opaque, genuine.record().opaque, 64) == 0);
    auto imported = value_or_fail(fixture.sharing.import(received));
    REQUIRE(imported.close());

    // A record naming a descriptor that did not arrive with it is refused.
    const NxmemIpcHandle bare = genuine.record();
    REQUIRE(::send(pair[0], &bare, sizeof bare, 0) == static_cast<ssize_t>(sizeof bare));
    auto mismatched = host::receive_handle(pair[1]);
    REQUIRE_FALSE(mismatched);
    CHECK_THAT(mismatched.error().message, Catch::Contains("names 1 descriptors and 0 arrived"));
    ::close(pair[0]);
    ::close(pair[1]);

    int stream[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stream) == 0);
    auto refused = host::send_handle(stream[0], genuine.record());
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::Contains("SOCK_SEQPACKET"));
    ::close(stream[0]);
    ::close(stream[1]);
}

TEST_CASE("IP14: an allocation is shared only with share=memfd, mapped whole in the importer",
          "[ipc]") {
    allocation_fixture fixture;
    host::ipc_handle genuine = fixture.export_allocation();
    CHECK(genuine.kind() == NXMEM_IPC_ALLOCATION);
    CHECK(genuine.size() == allocation_fixture::size);
    auto imported = value_or_fail(fixture.importing.import(genuine));
    CHECK(imported.kind() == NXMEM_IPC_ALLOCATION);
    CHECK(imported.size() == allocation_fixture::size);
    CHECK(imported.mapped_bytes() == allocation_fixture::whole_pages);
    REQUIRE(imported.address() != fixture.live->address);
    CHECK(fixture.reads_the_pattern(imported.address()));
    // Two mappings of one file: a write through either is read through the other.
    static_cast<unsigned char*>(imported.address())[5] = 0xEE;
    CHECK(static_cast<unsigned char*>(fixture.live->address)[5] == 0xEE);
    static_cast<unsigned char*>(fixture.live->address)[5] = static_cast<unsigned char>(5 * 7 + 1);

    // The importer counts the mapping apart (IP10); the exporter still counts its committed pages.
    const allocator_usage imported_usage = value_or_fail(fixture.importer.query_usage());
    CHECK(imported_usage.live_imports == 1);
    CHECK(imported_usage.imported_bytes == allocation_fixture::whole_pages);
    CHECK(imported_usage.live_allocations == 0);
    CHECK(imported_usage.mapped_bytes == 0);
    CHECK(value_or_fail(fixture.exporter.query_usage()).mapped_bytes == allocation_fixture::size);
    auto refused = fixture.module->try_unload();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::busy);

    // A decommit by the exporter frees the pages for every process: the importer reads zeros.
    auto backing = value_or_fail(fixture.exporter.virtual_backing());
    REQUIRE(backing.decommit(*fixture.live, {0, 4096}));
    CHECK(static_cast<const unsigned char*>(imported.address())[1] == 0);
    REQUIRE(backing.commit(*fixture.live, {0, 4096}));
    for (std::uint64_t index = 0; index < 4096; ++index) {
        static_cast<unsigned char*>(fixture.live->address)[index] = static_cast<unsigned char>(index * 7 + 1);
    }

    // The exporter's release drops its accounting; the import stays valid and unchanged (IP13).
    REQUIRE(fixture.exporter.release(*fixture.live));
    fixture.live.reset();
    const allocator_usage exporter_usage = value_or_fail(fixture.exporter.query_usage());
    CHECK(exporter_usage.live_allocations == 0);
    CHECK(exporter_usage.mapped_bytes == 0);
    CHECK(fixture.reads_the_pattern(imported.address()));
    CHECK(value_or_fail(fixture.importer.query_usage()).imported_bytes == allocation_fixture::whole_pages);
    REQUIRE(imported.close());
    fixture.check_nothing_imported();

    // Without share=memfd an allocation is private memory: UNSUPPORTED_CAPABILITY naming the option.
    auto private_one = value_or_fail(fixture.importer.allocate(4096, 4096));
    auto unsupported = fixture.importing.export_allocation(private_one);
    REQUIRE_FALSE(unsupported);
    CHECK(unsupported.error().code == status_code::unsupported_capability);
    CHECK_THAT(unsupported.error().message, Catch::Contains("share=memfd"));
    REQUIRE(fixture.importer.release(private_one));
}

TEST_CASE("IP14: a forged, mislabelled, resized, replayed or closed allocation handle is refused",
          "[ipc]") {
    allocation_fixture fixture;
    host::ipc_handle genuine = fixture.export_allocation();
    const NxmemIpcHandle good = genuine.record();
    NxmemIpcHandle as_prefix = good;
    as_prefix.kind = NXMEM_IPC_PREFIX;
    fixture.check_refused(as_prefix, status_code::invalid_argument, "not a posix-lazy prefix export");
    NxmemIpcHandle forged = good;
    forged.opaque[3] ^= 0x40;
    fixture.check_refused(forged, status_code::invalid_argument, "not a posix-lazy allocation export");
    for (const std::uint64_t grown : {std::uint64_t{4096}, std::uint64_t{1}}) {
        NxmemIpcHandle resized = good;
        resized.size += grown;
        fixture.check_refused(resized, status_code::invalid_argument, "not a posix-lazy allocation export");
    }
    const int other_size = sealed_memfd(allocation_fixture::whole_pages + 4096);
    NxmemIpcHandle wrong_file = good;
    wrong_file.fds[0] = other_size;
    fixture.check_refused(wrong_file, status_code::invalid_argument, "holds 20480 bytes");
    ::close(other_size);
    NxmemIpcHandle other_mechanism = good;
    other_mechanism.mechanism_id = 0x504f5801;
    fixture.check_refused(other_mechanism, status_code::wrong_mechanism, "mechanism");

    // A prefix's handle relabelled as an allocation is refused too.
    auto mapping = value_or_fail(fixture.exporter.shared_mapping());
    auto prefix = value_or_fail(mapping.create_prefix(allocation_fixture::size));
    host::ipc_handle prefix_handle = value_or_fail(fixture.exporting.export_prefix(prefix));
    NxmemIpcHandle as_allocation = prefix_handle.record();
    as_allocation.kind = NXMEM_IPC_ALLOCATION;
    fixture.check_refused(as_allocation, status_code::invalid_argument,
                          "not a posix-lazy allocation export");

    // An allocation a prefix is mapped over does not export: its file lacks the prefix's bytes.
    auto covered = value_or_fail(fixture.exporter.allocate(2 * allocation_fixture::whole_pages, 4096));
    REQUIRE(mapping.commit_prefix(covered, prefix));
    auto refused = fixture.exporting.export_allocation(covered);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::invalid_argument);
    CHECK_THAT(refused.error().message, Catch::Contains("export the prefix"));
    REQUIRE(fixture.exporter.release(covered));
    REQUIRE(mapping.release_prefix(prefix));

    // Replays: while the first import lives, and after it is closed; a misdescribed and a second
    // close, straight through the plugin's slot.
    auto first = value_or_fail(fixture.importing.import(good));
    auto again = fixture.importing.import(good);
    REQUIRE_FALSE(again);
    CHECK(again.error().code == status_code::invalid_argument);
    CHECK_THAT(again.error().message, Catch::Contains("replay"));
    const NxmemImport described = described_import(fixture.importer, first);
    NxmemImport elsewhere = described;
    elsewhere.address += 4096;
    CHECK(close_through_slot(fixture.importer, elsewhere) == NXMEM_STATUS_INVALID_ARGUMENT);
    NxmemImport as_prefix_import = described;
    as_prefix_import.kind = NXMEM_IPC_PREFIX;
    CHECK(close_through_slot(fixture.importer, as_prefix_import) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(fixture.reads_the_pattern(first.address())); // still mapped
    REQUIRE(first.close());
    CHECK(close_through_slot(fixture.importer, described) == NXMEM_STATUS_UNKNOWN_ALLOCATION);
    fixture.check_refused(good, status_code::invalid_argument, "replay");
}

TEST_CASE("IP5, IP14: a read-only allocation import cannot be written: a write faults", "[ipc]") {
    allocation_fixture fixture;
    const std::uint64_t page = 4096;
    {
        host::ipc_handle read_only = fixture.export_allocation(NXMEM_IPC_READ_ONLY);
        fixture.check_refused(read_only.record(), status_code::invalid_argument,
                              "read-write import of a read-only", NXMEM_IPC_READ_WRITE);
        auto imported = value_or_fail(fixture.importing.import(read_only, NXMEM_IPC_READ_ONLY));
        CHECK(fixture.reads_the_pattern(imported.address()));
        CHECK(write_faults_in_child(imported.address()));
        CHECK(::mprotect(imported.address(), page, PROT_READ | PROT_WRITE) != 0);
        REQUIRE(imported.close());
    }
    {
        // A read-only import of a read-write handle maps through a read-only descriptor.
        host::ipc_handle read_write = fixture.export_allocation(NXMEM_IPC_READ_WRITE);
        auto imported = value_or_fail(fixture.importing.import(read_write, NXMEM_IPC_READ_ONLY));
        CHECK(write_faults_in_child(imported.address()));
        CHECK(::mprotect(imported.address(), page, PROT_READ | PROT_WRITE) != 0);
        REQUIRE(imported.close());
    }
    // The exporter's own mapping stays writable.
    static_cast<unsigned char*>(fixture.live->address)[0] = 1;
    CHECK_FALSE(write_faults_in_child(fixture.live->address));
    fixture.check_nothing_imported();
}

TEST_CASE("IP5: a read-only import of a read-write prefix handle maps it unwritable", "[ipc]") {
    // The importer keeps a read-only descriptor of the file, not the handle's read-write one, so
    // a sequence mapping the imported prefix can neither write it nor mprotect it writable.
    sharing_fixture fixture;
    host::ipc_handle read_write = fixture.export_prefix(NXMEM_IPC_READ_WRITE);
    {
        auto imported = value_or_fail(fixture.sharing.import(read_write, NXMEM_IPC_READ_ONLY));
        CHECK(imported.access() == NXMEM_IPC_READ_ONLY);
        auto sequence = value_or_fail(fixture.lazy.allocate(prefix_size, 4096));
        REQUIRE(fixture.mapping.commit_prefix(sequence, imported.prefix()));
        CHECK(write_faults_in_child(sequence.address));
        CHECK(::mprotect(sequence.address, 4096, PROT_READ | PROT_WRITE) != 0);
        CHECK(errno == EACCES);
        // Exporting it on read-write is refused; read-only it goes on.
        auto widened = fixture.sharing.export_prefix(imported.prefix(), NXMEM_IPC_READ_WRITE);
        REQUIRE_FALSE(widened);
        CHECK_THAT(widened.error().message, Catch::Contains("imported read-only"));
        REQUIRE(fixture.lazy.release(sequence));
        REQUIRE(imported.close());
    }
    fixture.check_nothing_imported();
}

TEST_CASE("nxmem conform's capability.ipc exchanges an allocation when the mechanism shares them",
          "[ipc][conform]") {
    // With share=memfd the check's allocation round trip runs (a child reads and writes it);
    // without, posix-lazy answers UNSUPPORTED_CAPABILITY for allocations and the check still passes
    // on its prefix round trip.
    for (const char* options : {"share=memfd", ""}) {
        INFO("options '" << options << "'");
        const auto results = conform::run_checks(
            conform::subject{test::posix_plugin_path(), "posix-lazy", device_id{NXMEM_DEVICE_CPU, 0}, options},
            {"capability.ipc"});
        REQUIRE(results.size() == 1);
        INFO(results[0].expected << " / " << results[0].actual);
        CHECK(results[0].passed());
    }
}
