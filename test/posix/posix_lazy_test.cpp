// posix-lazy's virtual backing, checked against the kernel: mincore shows committed pages
// resident once written and decommitted pages gone; mapped_bytes is exact at every step; ranges
// that are not page-granular change nothing; populate and huge_pages have their effect.
#include "posix_support.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::page_size;
using nxmem::test::resident_pages;
using nxmem::test::value_or_fail;

namespace {

// The VmFlags line of the mapping that contains `address`, from /proc/self/smaps.
std::string vm_flags_at(const void* address) {
    const auto wanted = reinterpret_cast<std::uintptr_t>(address);
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t first = 0;
        std::uintptr_t end = 0;
        char dash = 0;
        std::istringstream range(line);
        if (range >> std::hex >> first >> dash >> end && dash == '-' &&
            line.find(':') > line.find(' ')) {
            inside = first <= wanted && wanted < end;
        } else if (inside && line.rfind("VmFlags:", 0) == 0) {
            return line;
        }
    }
    return {};
}

// Whether this kernel knows MADV_POPULATE_WRITE (Linux 5.14).
bool kernel_populates() {
    const std::uint64_t page = page_size();
    void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(probe != MAP_FAILED);
    const bool known = ::madvise(probe, page, 23 /* MADV_POPULATE_WRITE */) == 0;
    ::munmap(probe, page);
    return known;
}

// Whether this kernel has transparent huge pages (MADV_HUGEPAGE is EINVAL without them).
bool kernel_has_thp() {
    return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

} // namespace

TEST_CASE("commit makes pages usable and decommit gives them back to the kernel",
          "[posix][lazy]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        const std::uint64_t size = 16 * page + 100;
        const auto live = value_or_fail(lazy.allocate(size, 64));
        CHECK(cpu_device::to_wire(live.address) % page == 0); // reservations are page aligned
        auto* bytes = static_cast<unsigned char*>(live.address);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);
        CHECK(resident_pages(bytes, 17) == 0);

        REQUIRE(backing.commit(live, {0, 4 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4 * page);
        std::memset(bytes, 0x5A, 4 * page);
        CHECK(resident_pages(bytes, 4) == 4);
        CHECK(resident_pages(bytes + 4 * page, 13) == 0);

        // Committing committed pages is a no-op that succeeds; so is overlapping them.
        REQUIRE(backing.commit(live, {page, page}));
        REQUIRE(backing.commit(live, {2 * page, 4 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 6 * page);
        CHECK(bytes[page] == 0x5A); // the data stayed

        // The partial last page counts by its bytes within the allocation.
        REQUIRE(backing.commit(live, {16 * page, 100}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 6 * page + 100);
        std::memset(bytes + 16 * page, 0x11, 100);
        CHECK(resident_pages(bytes + 16 * page, 1) == 1);

        REQUIRE(backing.decommit(live, {page, 2 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4 * page + 100);
        CHECK(resident_pages(bytes + page, 2) == 0); // really returned
        CHECK(resident_pages(bytes, 1) == 1);
        CHECK(resident_pages(bytes + 3 * page, 1) == 1);
        CHECK(bytes[0] == 0x5A);
        CHECK(bytes[3 * page] == 0x5A);

        // Decommitting decommitted pages is a no-op that succeeds.
        REQUIRE(backing.decommit(live, {page, page}));
        REQUIRE(backing.decommit(live, {8 * page, 4 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 4 * page + 100);

        // Recommitted pages come back zero-filled.
        REQUIRE(backing.commit(live, {page, page}));
        CHECK(bytes[page] == 0);
        CHECK(bytes[page + page - 1] == 0);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 5 * page + 100);

        auto report = value_or_fail(lazy.release(live));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 5 * page + 100);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("ranges that are not page-granular are refused and change nothing",
          "[posix][lazy][bad-input]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        const auto live = value_or_fail(lazy.allocate(8 * page + 100, page));
        REQUIRE(backing.commit(live, {0, 2 * page}));
        for (bool commit : {true, false}) {
            for (byte_range bad : {byte_range{100, page}, byte_range{0, 100},
                                   byte_range{page, page + 1}, byte_range{8 * page, 99},
                                   byte_range{9 * page, page}, byte_range{0, 0},
                                   byte_range{page, ~0ull - 100}, byte_range{~0ull - 4095, 8192}}) {
                INFO((commit ? "commit" : "decommit") << " [" << bad.offset << ", +" << bad.length
                                                      << ")");
                auto refused = commit ? backing.commit(live, bad) : backing.decommit(live, bad);
                REQUIRE_FALSE(refused);
                CHECK(refused.error().code == status_code::invalid_argument);
            }
        }
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * page);
        CHECK(resident_pages(live.address, 9) == 0); // committed but never written
        REQUIRE(lazy.release(live));
        auto gone = backing.mapped_bytes(live);
        REQUIRE_FALSE(gone);
        CHECK(gone.error().code == status_code::unknown_allocation);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("populate=1 pre-faults what is committed", "[posix][lazy][options]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy", 0, "populate=1");
        auto backing = value_or_fail(lazy.virtual_backing());
        const auto live = value_or_fail(lazy.allocate(64 * page, page));
        REQUIRE(backing.commit(live, {0, 32 * page}));
        // Resident without a single write. A kernel older than 5.14 cannot populate: there the
        // option quietly does nothing.
        const bool populates = kernel_populates();
        if (!populates) {
            WARN("this kernel has no MADV_POPULATE_WRITE: populate=1 is a no-op here");
        }
        CHECK(resident_pages(live.address, 32) == (populates ? 32u : 0u));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 32 * page);
        CHECK(resident_pages(static_cast<char*>(live.address) + 32 * page, 32) == 0);
        REQUIRE(lazy.release(live));

        auto eager = open_or_fail<cpu_device>(module, "posix-eager", 0, "populate=1");
        const auto mapped = value_or_fail(eager.allocate(1 << 20, page));
        CHECK(resident_pages(mapped.address, (1 << 20) / page) == (populates ? (1 << 20) / page : 0));
        REQUIRE(eager.release(mapped));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("huge_pages=1 aligns large mappings to 2 MiB and advises huge pages",
          "[posix][lazy][options]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        for (const char* mechanism : {"posix-lazy", "posix-eager"}) {
            INFO("mechanism " << mechanism);
            auto allocator = open_or_fail<cpu_device>(module, mechanism, 0, "huge_pages=1");
            const auto large = value_or_fail(allocator.allocate(4 << 20, 64));
            CHECK(cpu_device::to_wire(large.address) % (2 << 20) == 0);
            if (kernel_has_thp()) {
                CHECK_THAT(vm_flags_at(large.address), Catch::Contains(" hg"));
            }
            const auto small = value_or_fail(allocator.allocate(64 << 10, 64));
            CHECK_THAT(vm_flags_at(small.address), !Catch::Contains(" hg"));
            REQUIRE(allocator.release(large));
            REQUIRE(allocator.release(small));
        }
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("deferred release retires at once and reports what was mapped",
          "[posix][lazy][deferred-release]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        auto backing = value_or_fail(lazy.virtual_backing());
        std::vector<std::uint64_t> tickets;
        for (std::uint64_t pages = 1; pages <= 3; ++pages) {
            const auto live = value_or_fail(lazy.allocate(8 * page, page));
            REQUIRE(backing.commit(live, {0, pages * page}));
            tickets.push_back(value_or_fail(lazy.enqueue_release(live)));
        }
        auto retired = value_or_fail(lazy.drain_releases());
        REQUIRE(retired.size() == 3);
        for (std::size_t i = 0; i < retired.size(); ++i) {
            CHECK(retired[i].ticket == tickets[i]);
            CHECK(retired[i].report.state == release_state::complete);
            CHECK(retired[i].report.unmapped_bytes == (i + 1) * page);
        }
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("the commit granularity is the page, or the huge page with huge_pages", "[posix][lazy][granularity]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto plain = open_or_fail<cpu_device>(module, "posix-lazy");
        CHECK(value_or_fail(plain.virtual_backing()).commit_granularity() == page_size());
        auto huge = open_or_fail<cpu_device>(module, "posix-lazy", 0, "huge_pages=1");
        CHECK(value_or_fail(huge.virtual_backing()).commit_granularity() == (2u << 20));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("the usage query sums live reservations, committed bytes and prefixes",
          "[posix][lazy][usage]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        REQUIRE((lazy.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0);
        CHECK(value_or_fail(lazy.query_usage()) == nxmem::allocator_usage{});
        auto backing = value_or_fail(lazy.virtual_backing());
        auto mapping = value_or_fail(lazy.shared_mapping());
        const auto first = value_or_fail(lazy.allocate(8 * page, page));
        const auto second = value_or_fail(lazy.allocate(page + 10, 8));
        REQUIRE(backing.commit(first, {2 * page, 3 * page}));
        REQUIRE(backing.commit(second, {0, page + 10})); // a partial last page, up to the end
        const auto prefix = value_or_fail(mapping.create_prefix(page + 1));
        const std::uint64_t ticket = value_or_fail(lazy.enqueue_release(second));
        (void)ticket;
        auto usage = value_or_fail(lazy.query_usage());
        CHECK(usage.live_allocations == 2); // the queued one has not retired yet
        CHECK(usage.reserved_bytes == 8 * page + page + 10);
        CHECK(usage.mapped_bytes == value_or_fail(backing.mapped_bytes(first)) + page + 10);
        CHECK(usage.mapped_bytes == 3 * page + page + 10);
        CHECK(usage.shared_prefix_bytes == 2 * page); // whole pages, charged at create
        CHECK(usage.quarantined_bytes == 0);
        REQUIRE(value_or_fail(lazy.drain_releases()).size() == 1);
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(lazy.release(first));
        CHECK(value_or_fail(lazy.query_usage()) == nxmem::allocator_usage{});
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("posix copies (minor 4): eager anywhere, lazy only in committed pages, a prefix through "
          "its file",
          "[posix][lazy][copy]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        std::vector<std::byte> in(300);
        for (std::size_t at = 0; at < in.size(); ++at) {
            in[at] = static_cast<std::byte>(at * 13 + 1);
        }
        std::vector<std::byte> out(in.size());

        auto eager = open_or_fail<cpu_device>(module, "posix-eager");
        REQUIRE((eager.capabilities() & NXMEM_CAP_COPY) != 0);
        const auto small = value_or_fail(eager.allocate(1000, 64));
        REQUIRE(eager.copy_from_host(small, 700, in));
        REQUIRE(eager.copy_to_host(small, 700, out));
        CHECK(out == in);
        CHECK(eager.copy_to_host(small, 701, out).error().code == status_code::invalid_argument);
        // posix copies only synchronously (stream_kinds 0): a copy on a stream is refused by the
        // host before the plugin is called, and nothing moves.
        CHECK(eager.copy_stream_kinds() == 0);
        std::atomic<std::uint64_t> timeline{0};
        const auto on_timeline = host::fence::host_timeline(timeline, 1, eager.device());
        std::vector<std::byte> untouched(in.size(), std::byte{0x5a});
        const auto refused = eager.copy_to_host(small, 700, untouched, on_timeline);
        REQUIRE(!refused);
        CHECK(refused.error().code == status_code::unsupported_capability);
        CHECK(refused.error().message.find("copies") != std::string::npos);
        CHECK(untouched == std::vector<std::byte>(in.size(), std::byte{0x5a}));
        REQUIRE(eager.release(small));

        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        REQUIRE((lazy.capabilities() & NXMEM_CAP_COPY) != 0);
        auto backing = value_or_fail(lazy.virtual_backing());
        const auto live = value_or_fail(lazy.allocate(4 * page, page));
        // Uncommitted: refused before anything is touched (the pages stay reserved, PROT_NONE).
        CHECK(lazy.copy_from_host(live, page - 100, in).error().code == status_code::invalid_argument);
        REQUIRE(backing.commit(live, {0, page}));
        CHECK(lazy.copy_from_host(live, page - 100, in).error().code == status_code::invalid_argument);
        REQUIRE(backing.commit(live, {page, page}));
        REQUIRE(lazy.copy_from_host(live, page - 100, in));
        REQUIRE(lazy.copy_to_host(live, page - 100, out));
        CHECK(out == in);
        CHECK(std::memcmp(reinterpret_cast<const std::byte*>(live.address) + page - 100, in.data(),
                          in.size()) == 0);

        auto mapping = value_or_fail(lazy.shared_mapping());
        const host::shared_prefix prefix = value_or_fail(mapping.create_prefix(2 * page));
        REQUIRE(lazy.copy_from_host(prefix, page + 5, in));
        std::vector<std::byte> back(in.size());
        REQUIRE(lazy.copy_to_host(prefix, page + 5, back));
        CHECK(back == in);
        CHECK(lazy.copy_to_host(prefix, 2 * page - 10, back).error().code == status_code::invalid_argument);
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(lazy.release(live));
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-lazy waits on host timelines: a fenced release retires after its counter reaches "
          "the value, in enqueue order",
          "[posix][lazy][fenced-release]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy");
        REQUIRE((lazy.capabilities() & NXMEM_CAP_FENCED_RELEASE) != 0);
        CHECK(lazy.fence_kinds() == (1u << NXMEM_FENCE_HOST_TIMELINE));
        std::atomic<std::uint64_t> done{0};
        const auto fenced = value_or_fail(lazy.allocate(2 * page, page));
        const auto plain = value_or_fail(lazy.allocate(2 * page, page));
        const std::array fences{host::fence::host_timeline(done, 2, lazy.device())};
        const std::uint64_t first = value_or_fail(lazy.release_after(fenced, fences));
        const std::uint64_t second = value_or_fail(lazy.enqueue_release(plain));
        CHECK(value_or_fail(module->readiness()).plugin.queued_releases == 2); // the plugin holds it
        done.store(1);
        CHECK(value_or_fail(lazy.drain_releases()).empty());
        CHECK_FALSE(value_or_fail(module->readiness()).ready());
        done.store(2);
        const auto retired = value_or_fail(lazy.drain_releases());
        REQUIRE(retired.size() == 2);
        CHECK(retired[0].ticket == first);
        CHECK(retired[1].ticket == second);
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}
