// The system calls posix mechanisms make, counted without timing and without strace: this
// executable is linked with --export-dynamic and defines mmap, munmap, mprotect and madvise, so
// the plugin's calls (through its PLT) land here first; each is counted while counting is on and
// handed on to the next definition (the C library's, or a sanitizer's). It is linked with the
// counting operator new of test/detail as well, so the heap allocations of host, kit and plugin
// (whose containers and shared_ptrs allocate with it) are counted the same way.
#include "posix_support.hpp"

#include "../detail/counting_new.hpp"

#include <dlfcn.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::page_size;
using nxmem::test::value_or_fail;

namespace {

struct syscall_counts {
    std::atomic<bool> counting{false};
    std::atomic<int> mmap{0};
    std::atomic<int> mmap_fixed{0};
    std::atomic<int> munmap{0};
    std::atomic<int> mprotect{0};
    std::atomic<int> madvise{0};
    // The n-th mprotect(PROT_READ | PROT_WRITE) in the window fails with ENOMEM (0: none does),
    // as the kernel's count of mappings makes it fail.
    std::atomic<int> failing_read_write_mprotect{0};
    std::size_t allocations = 0; // operator new, in the window
};
syscall_counts counts;

template <class F> F next_definition(const char* name) {
    return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

// Counts what `body` calls; the counts are reset first.
template <class Body> void count_calls(Body&& body) {
    counts.mmap = 0;
    counts.mmap_fixed = 0;
    counts.munmap = 0;
    counts.mprotect = 0;
    counts.madvise = 0;
    const std::size_t allocations_before = test::allocations;
    counts.counting = true;
    body();
    counts.counting = false;
    counts.allocations = test::allocations - allocations_before;
}

bool counting() { return counts.counting.load(std::memory_order_relaxed); }

// Runs `body(allocator, view)` on posix-lazy in a freshly loaded plugin, which must unload after.
template <class Body> void with_lazy(Body&& body, const std::string& options = {}) {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy", 0, options);
        auto backing = value_or_fail(lazy.virtual_backing());
        body(lazy, backing);
    }
    REQUIRE(module->try_unload());
}

} // namespace

extern "C" {
void* mmap(void* address, std::size_t length, int protection, int flags, int fd, off_t offset) {
    static const auto next = next_definition<void* (*)(void*, std::size_t, int, int, int, off_t)>("mmap");
    if (counting()) {
        ++((flags & MAP_FIXED) != 0 ? counts.mmap_fixed : counts.mmap);
    }
    return next(address, length, protection, flags, fd, offset);
}
int munmap(void* address, std::size_t length) {
    static const auto next = next_definition<int (*)(void*, std::size_t)>("munmap");
    if (counting()) {
        ++counts.munmap;
    }
    return next(address, length);
}
int mprotect(void* address, std::size_t length, int protection) {
    static const auto next = next_definition<int (*)(void*, std::size_t, int)>("mprotect");
    if (counting()) {
        ++counts.mprotect;
        if (protection == (PROT_READ | PROT_WRITE) && counts.failing_read_write_mprotect > 0 &&
            --counts.failing_read_write_mprotect == 0) {
            errno = ENOMEM;
            return -1;
        }
    }
    return next(address, length, protection);
}
int madvise(void* address, std::size_t length, int advice) {
    static const auto next = next_definition<int (*)(void*, std::size_t, int)>("madvise");
    if (counting()) {
        ++counts.madvise;
    }
    return next(address, length, advice);
}
}

TEST_CASE("the interposed calls are the ones the plugin makes", "[posix][syscalls]") {
    // If the plugin's calls bypassed this executable (a static link, a direct system call), every
    // count below would read zero and prove nothing: check that one mapping is seen.
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "posix-eager");
        count_calls([&] {
            auto live = value_or_fail(eager.allocate(2ull << 20, 64));
            REQUIRE(eager.release(live));
        });
        if (counts.mmap == 0) {
            WARN("the plugin's mmap did not reach this executable's definition");
        }
        REQUIRE(counts.mmap == 1);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-eager maps and unmaps 2 MiB with one call each, as a raw mmap and munmap do",
          "[posix][syscalls]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "posix-eager");
        count_calls([&] {
            auto live = value_or_fail(eager.allocate(2ull << 20, 64));
            REQUIRE(eager.release(live));
        });
        CHECK(counts.mmap == 1);
        CHECK(counts.munmap == 1);
        CHECK(counts.mmap_fixed + counts.mprotect + counts.madvise == 0);
        // A small allocation is the C heap's: no call of the plugin's own.
        count_calls([&] {
            auto live = value_or_fail(eager.allocate(64, 16));
            REQUIRE(eager.release(live));
        });
        CHECK(counts.mmap + counts.munmap + counts.mmap_fixed + counts.mprotect + counts.madvise == 0);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-lazy makes one system call per step: reserve, commit, decommit, release",
          "[posix][syscalls][lazy]") {
    const std::uint64_t page = page_size();
    with_lazy([&](auto& lazy, auto& backing) {
        const std::uint64_t size = 2ull << 20;
        allocation<cpu_device> live{};
        count_calls([&] { live = value_or_fail(lazy.allocate(size, page)); });
        CHECK(counts.mmap == 1); // the reservation, page-aligned already: nothing to trim
        CHECK(counts.munmap + counts.mmap_fixed + counts.mprotect + counts.madvise == 0);

        count_calls([&] { REQUIRE(backing.commit(live, {0, size})); });
        CHECK(counts.mprotect == 1);
        CHECK(counts.mmap + counts.munmap + counts.mmap_fixed + counts.madvise == 0);
        std::memset(live.address, 0x5A, size);

        // Decommit drops the pages and reserves the range again in one call.
        count_calls([&] { REQUIRE(backing.decommit(live, {0, size})); });
        CHECK(counts.mmap_fixed == 1);
        CHECK(counts.mmap + counts.munmap + counts.mprotect + counts.madvise == 0);
        CHECK(test::resident_pages(live.address, size / page) == 0);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);

        // Recommitted, the pages read zero: the old contents are gone.
        REQUIRE(backing.commit(live, {0, page}));
        CHECK(static_cast<unsigned char*>(live.address)[0] == 0);

        count_calls([&] { REQUIRE(lazy.release(live)); });
        CHECK(counts.munmap == 1);
        CHECK(counts.mmap + counts.mmap_fixed + counts.mprotect + counts.madvise == 0);
    });
}

TEST_CASE("posix-lazy: a commit the kernel refuses half-way gives back what it committed (E12)",
          "[posix][syscalls][lazy]") {
    const std::uint64_t page = page_size();
    with_lazy([&](auto& lazy, auto& backing) {
        const std::uint64_t size = 8 * page;
        auto live = value_or_fail(lazy.allocate(size, page));
        // Pages 1, 3 and 5 committed: committing [0, 8 pages) fills four gaps, one call each.
        for (const std::uint64_t committed_page : {1, 3, 5}) {
            REQUIRE(backing.commit(live, {committed_page * page, page}));
        }
        static_cast<unsigned char*>(live.address)[page] = 0x11;
        REQUIRE(value_or_fail(backing.mapped_bytes(live)) == 3 * page);

        counts.failing_read_write_mprotect = 3; // the third gap's, after two went through
        count_calls([&] {
            const result<void> refused = backing.commit(live, {0, size});
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::out_of_memory);
            CHECK_THAT(refused.error().message, Catch::Matchers::Contains("mprotect"));
        });
        counts.failing_read_write_mprotect = 0;
        // Three tries, then the two gaps made accessible given back: nothing changed.
        CHECK(counts.mprotect == 5);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 3 * page);
        CHECK(static_cast<unsigned char*>(live.address)[page] == 0x11);

        REQUIRE(backing.commit(live, {0, size}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == size);
        CHECK(static_cast<unsigned char*>(live.address)[page] == 0x11);
        REQUIRE(lazy.release(live));
    });
}

TEST_CASE("posix-lazy commits and decommits a range over and over without a heap allocation",
          "[posix][syscalls][lazy]") {
    const std::uint64_t page = page_size();
    with_lazy([&](auto& lazy, auto& backing) {
        const std::uint64_t size = 2ull << 20;
        auto live = value_or_fail(lazy.allocate(size, page));
        const byte_range range{0, 16 * page};
        // The first commit records the run; afterwards its node is reused.
        REQUIRE(backing.commit(live, range));
        REQUIRE(backing.decommit(live, range));
        constexpr int cycles = 100;
        bool ok = true;
        count_calls([&] {
            for (int i = 0; i < cycles; ++i) {
                ok = backing.commit(live, range).has_value() && backing.decommit(live, range).has_value() && ok;
            }
        });
        REQUIRE(ok);
        CHECK(counts.allocations == 0);
        CHECK(counts.mprotect == cycles);
        CHECK(counts.mmap_fixed == cycles);
        CHECK(counts.mmap + counts.munmap + counts.madvise == 0);
        REQUIRE(lazy.release(live));
    });
}

// Heap allocations are not asserted here: the plugin makes two per cycle (the reservation and its
// committed run), but the host's live table also regrows a shard now and then.
TEST_CASE("posix-lazy's allocate + commit + decommit + release, repeated, makes four system calls a cycle",
          "[posix][syscalls][lazy]") {
    const std::uint64_t page = page_size();
    with_lazy([&](auto& lazy, auto& backing) {
        const std::uint64_t size = 2ull << 20;
        const byte_range all{0, size};
        const auto cycle = [&] {
            auto live = lazy.allocate(size, page);
            return live.has_value() && backing.commit(live.value(), all).has_value() &&
                   backing.decommit(live.value(), all).has_value() && lazy.release(live.value()).has_value();
        };
        constexpr int cycles = 100;
        REQUIRE(cycle());
        bool ok = true;
        count_calls([&] {
            for (int i = 0; i < cycles; ++i) {
                ok = cycle() && ok;
            }
        });
        REQUIRE(ok);
        CHECK(counts.mmap == cycles);
        CHECK(counts.mprotect == cycles);
        CHECK(counts.mmap_fixed == cycles);
        CHECK(counts.munmap == cycles);
        CHECK(counts.madvise == 0);
    });
}

TEST_CASE("posix-eager's mmap_threshold decides which sizes make a system call",
          "[posix][syscalls][options]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        // 512 KiB: mapped by default, from the C heap under a 1 MiB threshold (glibc's own
        // mmap threshold has grown past it once a block that size was freed: warm it first).
        auto high = open_or_fail<cpu_device>(module, "posix-eager", 0, "mmap_threshold=1M");
        std::free(std::malloc(4u << 20));
        REQUIRE(high.release(value_or_fail(high.allocate(512u << 10, 16))));
        count_calls([&] { REQUIRE(high.release(value_or_fail(high.allocate(512u << 10, 16)))); });
        CHECK(counts.mmap + counts.munmap + counts.mmap_fixed + counts.mprotect + counts.madvise == 0);

        // 64 KiB: the C heap's by default, one mmap and one munmap under a 64 KiB threshold.
        auto low = open_or_fail<cpu_device>(module, "posix-eager", 0, "mmap_threshold=64k");
        count_calls([&] { REQUIRE(low.release(value_or_fail(low.allocate(64u << 10, 16)))); });
        CHECK(counts.mmap == 1);
        CHECK(counts.munmap == 1);
        CHECK(counts.mmap_fixed + counts.mprotect + counts.madvise == 0);
    }
    REQUIRE(module->try_unload());
}

// What an engine's tensor costs: allocate, use every byte, release. commit=allocate makes it two
// calls where the explicit commit makes three.
TEST_CASE("posix-lazy with commit=allocate makes a used tensor one mmap and one munmap, no mprotect",
          "[posix][syscalls][lazy][options]") {
    const std::uint64_t page = page_size();
    const std::uint64_t size = 2ull << 20;
    constexpr int cycles = 100;
    int explicit_calls = 0;
    with_lazy([&](auto& lazy, auto& backing) {
        count_calls([&] {
            for (int i = 0; i < cycles; ++i) {
                auto live = value_or_fail(lazy.allocate(size, page));
                REQUIRE(backing.commit(live, {0, size}));
                std::memset(live.address, 0x5A, size);
                REQUIRE(lazy.release(live));
            }
        });
        CHECK(counts.mmap == cycles);
        CHECK(counts.mprotect == cycles);
        CHECK(counts.munmap == cycles);
        explicit_calls = counts.mmap + counts.mprotect + counts.munmap + counts.mmap_fixed + counts.madvise;
    });
    with_lazy(
        [&](auto& lazy, auto& backing) {
            count_calls([&] {
                for (int i = 0; i < cycles; ++i) {
                    auto live = value_or_fail(lazy.allocate(size, page));
                    REQUIRE(backing.commit(live, {0, size})); // committed already: no call
                    std::memset(live.address, 0x5A, size);
                    REQUIRE(lazy.release(live));
                }
            });
            CHECK(counts.mmap == cycles);
            CHECK(counts.munmap == cycles);
            CHECK(counts.mprotect + counts.mmap_fixed + counts.madvise == 0);
            const int calls = counts.mmap + counts.mprotect + counts.munmap + counts.mmap_fixed + counts.madvise;
            CHECK(calls * 3 == explicit_calls * 2);
        },
        "commit=allocate");
}
