// The blocks the plugin kit gives a mechanism author (issue 35, item 5): rounding that refuses to
// wrap and mapping at any alignment (pages.hpp), the budget loop (budget.hpp), a table of shared
// prefixes that owns their descriptors (prefix_table.hpp), and the opaque bytes and replay
// protection of imports (import_guard.hpp); and that <nxmem/plugin.hpp> alone names them all.
#include <nxmem/plugin.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

using namespace nxmem;

TEST_CASE("round_up refuses to wrap past 2^64 and rounds everything else up", "[plugin-kit]") {
    CHECK(plugin::round_up(1, 4096, "m").value() == 4096);
    CHECK(plugin::round_up(4096, 4096, "m").value() == 4096);
    CHECK(plugin::round_up(UINT64_MAX - 4095, 4096, "m").value() == UINT64_MAX - 4095);
    const result<std::uint64_t> wrapped = plugin::round_up(UINT64_MAX - 4094, 4096, "m");
    REQUIRE_FALSE(wrapped);
    CHECK(wrapped.error().code == status_code::out_of_memory);
    CHECK_THAT(wrapped.error().message, Catch::Contains("overflow"));
    const std::uint64_t page = plugin::page_bytes();
    CHECK(page >= 4096);
    CHECK((page & (page - 1)) == 0);
}

TEST_CASE("map_aligned serves any alignment from mmap, keeping only what it was asked for", "[plugin-kit]") {
    const std::uint64_t page = plugin::page_bytes();
    for (const std::uint64_t alignment : {page, 64 * page, std::uint64_t{2} << 20, std::uint64_t{1} << 26}) {
        INFO("alignment " << alignment);
        const result<std::uint64_t> mapped =
            plugin::map_aligned(3 * page, alignment, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, "m");
        REQUIRE(mapped);
        CHECK(mapped.value() % alignment == 0);
        static_cast<unsigned char*>(reinterpret_cast<void*>(mapped.value()))[3 * page - 1] = 1;
        CHECK(plugin::unmap(mapped.value(), 3 * page) == 0);
    }
    const result<std::uint64_t> absurd =
        plugin::map_aligned(UINT64_MAX - page + 1, std::uint64_t{1} << 40, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, "m");
    REQUIRE_FALSE(absurd);
    CHECK(absurd.error().code == status_code::out_of_memory);
}

namespace {

// A host callback table whose reclaim hook runs `on_reclaim`.
struct test_host {
    std::function<NxmemStatusCode(std::uint64_t)> on_reclaim;
    NxmemHostCallbacks table = [] {
        auto made = abi::make_struct<NxmemHostCallbacks>();
        made.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        return made;
    }();
    plugin::host_link link(bool offer_reclaim) {
        table.host_context = this;
        table.request_reclaim = offer_reclaim ? &reclaim : nullptr;
        return plugin::host_link::read(&table, NXMEM_ABI_MINOR).value();
    }
    static NxmemStatusCode reclaim(void* context, const NxmemReclaimRequest* request, NxmemStatus*) {
        return static_cast<test_host*>(context)->on_reclaim(request->bytes_needed);
    }
};

} // namespace

TEST_CASE("the budget loop charges, asks the host to reclaim the shortfall, retries, and gives back a failed charge",
          "[plugin-kit]") {
    test_host host;
    SECTION("a host that frees memory: the retry fits") {
        plugin::byte_budget budget(1000, host.link(true), 7, device_id{NXMEM_DEVICE_CPU, 0}, "m");
        REQUIRE(budget.charged<int>(800, [] { return result<int>(1); }));
        std::uint64_t asked = 0;
        host.on_reclaim = [&](std::uint64_t bytes) {
            asked = bytes;
            budget.credit(800); // the host released an allocation of ours
            return NXMEM_STATUS_OK;
        };
        REQUIRE(budget.charged<int>(500, [] { return result<int>(2); }));
        CHECK(asked == 300);
        CHECK(budget.in_use() == 500);
    }
    SECTION("a host that declines: OUT_OF_MEMORY, nothing charged") {
        plugin::byte_budget budget(1000, host.link(true), 7, device_id{NXMEM_DEVICE_CPU, 0}, "m");
        host.on_reclaim = [](std::uint64_t) { return NXMEM_STATUS_HOST_REFUSED; };
        const result<int> refused = budget.charged<int>(1500, [] { return result<int>(1); });
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK(budget.in_use() == 0);
    }
    SECTION("no reclaim hook offered: OUT_OF_MEMORY saying so (H6)") {
        plugin::byte_budget budget(1000, host.link(false), 7, device_id{NXMEM_DEVICE_CPU, 0}, "m");
        const result<int> refused = budget.charged<int>(1500, [] { return result<int>(1); });
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("no reclaim hook"));
    }
    SECTION("the making fails after the charge: the charge is given back (E12)") {
        plugin::byte_budget budget(1000, host.link(false), 7, device_id{NXMEM_DEVICE_CPU, 0}, "m");
        const result<int> failed =
            budget.charged<int>(600, [] { return result<int>(fail(status_code::out_of_memory, "mmap failed")); });
        REQUIRE_FALSE(failed);
        CHECK(budget.in_use() == 0);
    }
}

TEST_CASE("a prefix table owns its prefixes' descriptors: each closes when its last holder lets go", "[plugin-kit]") {
    struct prefix {
        plugin::owned_fd fd;
    };
    plugin::prefix_table<prefix> table;
    const int fd = ::memfd_create("kit-prefix", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    const std::uint64_t id = table.next_id();
    table.insert(id, std::make_shared<prefix>(prefix{plugin::owned_fd(fd)}));
    CHECK(table.size() == 1);
    {
        std::shared_ptr<prefix> mapped = table.find(id, "m").value(); // a mapping holds it
        CHECK(table.take(id) != nullptr);
        CHECK(::fcntl(fd, F_GETFD) != -1); // still held by the mapping
    }
    CHECK(::fcntl(fd, F_GETFD) == -1); // closed with its last holder
    CHECK_FALSE(table.find(id, "m"));
    CHECK(table.next_id() != id); // ids are never reused

    const int second = ::memfd_create("kit-prefix", MFD_CLOEXEC);
    REQUIRE(second >= 0);
    table.insert(table.next_id(), std::make_shared<prefix>(prefix{plugin::owned_fd(second)}));
    CHECK(table.take_all() == 1);
    CHECK(::fcntl(second, F_GETFD) == -1);
}

TEST_CASE("an import's opaque bytes are read back only as written, and each export is admitted once",
          "[plugin-kit]") {
    struct fields {
        std::uint64_t size;
    };
    using record = plugin::opaque_record<fields>;
    record written;
    written.tag = record::tag_of("kitalloc");
    written.id = plugin::new_export_id().value();
    written.fields.size = 12345;
    auto handle = abi::make_struct<NxmemIpcHandle>();
    written.write_to(handle);
    CHECK(handle.opaque_length == sizeof(record));

    const result<record> read = record::read_from(handle, "kitalloc", "m");
    REQUIRE(read);
    CHECK(read.value().fields.size == 12345);
    CHECK(read.value().id == written.id);
    CHECK_FALSE(record::read_from(handle, "kitpfx", "m")); // another kind's tag
    NxmemIpcHandle short_handle = handle;
    short_handle.opaque_length -= 1;
    CHECK_FALSE(record::read_from(short_handle, "kitalloc", "m"));

    CHECK(plugin::new_export_id().value() != written.id);
    plugin::replay_guard guard;
    CHECK(guard.admit(written.id, "m"));
    const result<void> replayed = guard.admit(written.id, "m");
    REQUIRE_FALSE(replayed);
    CHECK(replayed.error().code == status_code::invalid_argument);
    CHECK_THAT(replayed.error().message, Catch::Contains("replay"));
    guard.forget(written.id);
    CHECK(guard.admit(written.id, "m"));
}

TEST_CASE("import limits bound what a peer can make an allocator import, by count and by bytes (IP18)",
          "[plugin-kit]") {
    SECTION("the options set the bounds; absent ones keep their defaults") {
        plugin::options given = plugin::options::parse("max_imports=2; max_imported_bytes=1M").value();
        const plugin::import_bounds bounds = plugin::import_bounds::take(given).value();
        CHECK(bounds.max_imports == 2);
        CHECK(bounds.max_bytes == (1u << 20));
        plugin::options none = plugin::options::parse("").value();
        const plugin::import_bounds defaults = plugin::import_bounds::take(none).value();
        CHECK(defaults.max_imports == 1024);
        CHECK(defaults.max_bytes == plugin::import_bounds::physical_memory_bytes());
        plugin::options malformed = plugin::options::parse("max_imports=many").value();
        CHECK_FALSE(plugin::import_bounds::take(malformed));
    }
    plugin::import_limits limits(plugin::import_bounds{2, 100});
    SECTION("BUSY naming the count while two imports are alive; a release makes room") {
        REQUIRE(limits.reserve(10, "m"));
        REQUIRE(limits.reserve(10, "m"));
        const result<void> third = limits.reserve(10, "m");
        REQUIRE_FALSE(third);
        CHECK(third.error().code == status_code::busy);
        CHECK_THAT(third.error().message, Catch::Contains("max_imports=2"));
        CHECK(limits.imports() == 2); // the refusal counted nothing
        CHECK(limits.bytes() == 20);
        limits.release(10);
        CHECK(limits.reserve(10, "m"));
    }
    SECTION("BUSY naming the bytes when the alive imports leave too few; INVALID_ARGUMENT for a "
            "handle larger than the limit alone") {
        REQUIRE(limits.reserve(60, "m"));
        const result<void> short_of_room = limits.reserve(41, "m");
        REQUIRE_FALSE(short_of_room);
        CHECK(short_of_room.error().code == status_code::busy);
        CHECK_THAT(short_of_room.error().message, Catch::Contains("max_imported_bytes=100"));
        CHECK(limits.reserve(40, "m")); // exactly the room left
        const result<void> never = limits.reserve(101, "m");
        REQUIRE_FALSE(never);
        CHECK(never.error().code == status_code::invalid_argument);
        CHECK(limits.imports() == 2);
        CHECK(limits.bytes() == 100);
    }
    SECTION("max_imports=0 accepts no import") {
        plugin::import_limits closed(plugin::import_bounds{0, 100});
        const result<void> refused = closed.reserve(1, "m");
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
    }
}

TEST_CASE("committed granules: an entry made before a prefix's mapping, which then takes the committed "
          "granules out of the allocation's cost", "[plugin-kit]") {
    constexpr std::uint64_t granule = 4096;
    plugin::committed_granules granules(granule);
    plugin::allocation_record record{};
    record.address = 0x100000;
    record.size = 5 * granule + 100;
    REQUIRE(granules.commit(record, byte_range{0, 3 * granule}));
    granules.make_entry(record.address, record.size); // it has one: nothing changes
    CHECK(granules.mapped_bytes(record.address) == 3 * granule);
    CHECK(granules.map_prefix(record.address, record.size, 2 * granule - 1) == 2 * granule);
    CHECK(granules.mapped_bytes(record.address) == granule);
    // The prefix's granules stay its own: a commit over them maps only what lies past them.
    std::uint64_t mapped_from = 0;
    REQUIRE(granules.commit(record, byte_range{0, record.size}, [&](byte_range part) -> result<void> {
        mapped_from = part.offset;
        return success();
    }));
    CHECK(mapped_from == 2 * granule);
    CHECK(granules.mapped_bytes(record.address) == 3 * granule + 100);
    CHECK(granules.forget(record.address) == 3 * granule + 100);

    plugin::allocation_record fresh = record;
    fresh.address = 0x200000;
    granules.make_entry(fresh.address, fresh.size); // no commit yet: costs nothing
    CHECK(granules.mapped_bytes(fresh.address) == 0);
    CHECK(granules.map_prefix(fresh.address, fresh.size, granule) == 0);
    CHECK(granules.total_mapped_bytes() == 0);
}
