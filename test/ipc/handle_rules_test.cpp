// The rules of an imported handle (docs/ABI.md IP1-IP12), in one process: a handle is untrusted
// input, so a forged or damaged one is refused with a clear status and nothing is mapped or kept.
// The genuine handle comes from posix-lazy's own export; each case damages one thing of it.
#include "../posix/posix_support.hpp"

#include <nxmem/abi/ipc_handle.hpp>
#include <nxmem/host/handle_transport.hpp>
#include <nxmem/host/ipc_view.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
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
    NxmemAllocatorVtable* raw = fixture.lazy.raw_table();
    const NxmemIpcVtable* slots = fixture.lazy.checked_table().ipc;
    REQUIRE(slots != nullptr);
    NxmemImport described = nxmem::abi::make_struct<NxmemImport>();
    described.kind = NXMEM_IPC_PREFIX;
    described.mechanism_id = fixture.lazy.mechanism_id();
    described.device = fixture.lazy.device().to_wire();
    described.import_id = second.import_id();
    described.size = second.size();
    described.access = second.access();
    described.prefix = second.prefix().to_wire();
    NxmemStatus status = nxmem::abi::make_status();
    NxmemImport misdescribed = described;
    misdescribed.size += 1;
    CHECK(slots->close_import(raw, &misdescribed, &status) == NXMEM_STATUS_INVALID_ARGUMENT);
    REQUIRE(second.close());
    CHECK(slots->close_import(raw, &described, &status) == NXMEM_STATUS_UNKNOWN_ALLOCATION);
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
            CHECK(lazy.declared_minor() == 3);
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
