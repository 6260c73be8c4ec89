// Open options and the budget: options that do not parse or that nobody knows are refused by
// name; a charge past the budget asks the host to reclaim (re-entering the plugin is allowed),
// retries once, and otherwise fails with OUT_OF_MEMORY naming the budget.
#include "posix_support.hpp"

#include <dirent.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::page_size;
using nxmem::test::value_or_fail;

TEST_CASE("options that do not parse or that nobody knows are refused by name",
          "[posix][options][bad-input]") {
    const std::string mechanism = GENERATE(as<std::string>{}, "posix-eager", "posix-lazy");
    INFO("mechanism " << mechanism);
    auto module = load_or_fail(test::posix_plugin_path());
    struct refusal {
        const char* options;
        const char* named;
    };
    for (refusal bad : {refusal{"budget=lots", "budget"}, refusal{"colour=blue", "colour"},
                        refusal{"huge_pages=maybe", "huge_pages"}, refusal{"populate=2", "populate"},
                        refusal{"budget=0", "budget"}, refusal{"budget=12T", "budget"},
                        refusal{"budget=99999999999999999999", "budget"},
                        refusal{"huge_pages=1;huge_pages=0", "huge_pages"},
                        refusal{"populate", "populate"},
                        refusal{"budget=1M;colour=blue;flavour=mint", "flavour"}}) {
        INFO("options '" << bad.options << "'");
        auto refused = host::open_allocator<cpu_device>(module, mechanism, 0, bad.options);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
        CHECK_THAT(refused.error().message, Catch::Contains(bad.named));
    }
    CHECK(value_or_fail(module->readiness()).ready()); // nothing opened, nothing leaked
    for (const char* good : {"", "huge_pages=1;populate=0;budget=64M", "budget=4096\nhuge_pages=off",
                             " budget = 1G ; populate = true "}) {
        INFO("options '" << good << "'");
        auto opened = host::open_allocator<cpu_device>(module, mechanism, 0, good);
        CHECK(opened);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("each mechanism's own option is refused by the other and checked by its owner",
          "[posix][options][bad-input]") {
    auto module = load_or_fail(test::posix_plugin_path());
    struct refusal {
        const char* mechanism;
        const char* options;
        const char* named;
    };
    for (refusal bad : {refusal{"posix-lazy", "mmap_threshold=1M", "mmap_threshold"},
                        refusal{"posix-eager", "commit=allocate", "commit"},
                        refusal{"posix-eager", "mmap_threshold=big", "mmap_threshold"},
                        refusal{"posix-eager", "mmap_threshold=1M;mmap_threshold=2M", "mmap_threshold"},
                        refusal{"posix-lazy", "commit=sometimes", "commit"},
                        refusal{"posix-lazy", "commit=", "commit"},
                        refusal{"posix-eager", "share=memfd", "share"},
                        refusal{"posix-lazy", "share=anonymous", "share"},
                        refusal{"posix-eager", "max_imports=4", "max_imports"},
                        refusal{"posix-lazy", "max_imports=many", "max_imports"},
                        refusal{"posix-lazy", "max_imported_bytes=1T", "max_imported_bytes"}}) {
        INFO(bad.mechanism << " with options '" << bad.options << "'");
        auto refused = host::open_allocator<cpu_device>(module, bad.mechanism, 0, bad.options);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
        CHECK_THAT(refused.error().message, Catch::Contains(bad.named));
    }
    for (refusal good : {refusal{"posix-eager", "mmap_threshold=0", ""},
                         refusal{"posix-eager", "mmap_threshold=64M;budget=1G", ""},
                         refusal{"posix-lazy", "commit=explicit", ""},
                         refusal{"posix-lazy", "commit=allocate;huge_pages=1;populate=1", ""},
                         refusal{"posix-lazy", "share=private", ""},
                         refusal{"posix-lazy", "share=memfd;commit=allocate;huge_pages=1;populate=1", ""},
                         refusal{"posix-lazy", "max_imports=0;max_imported_bytes=64G", ""}}) {
        INFO(good.mechanism << " with options '" << good.options << "'");
        CHECK(host::open_allocator<cpu_device>(module, good.mechanism, 0, good.options));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-eager's mmap_threshold moves the switch from the C heap to whole mapped pages",
          "[posix][options]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        // What one allocation costs tells its path: exactly its size from the heap, whole pages
        // from mmap (usage() counts the cost; the allocation reports the size asked).
        auto cost_of = [](host::plugin_allocator<cpu_device>& eager, std::uint64_t size) {
            auto live = value_or_fail(eager.allocate(size, 16));
            std::memset(live.address, 0x5A, size); // usable, every byte
            const std::uint64_t cost = value_or_fail(eager.query_usage()).mapped_bytes;
            REQUIRE(eager.release(live));
            return cost;
        };
        const std::uint64_t ragged = 100 * 1024 + 1; // not a page multiple
        const std::uint64_t whole_pages = (ragged + page - 1) / page * page;
        auto by_default = open_or_fail<cpu_device>(module, "posix-eager");
        CHECK(cost_of(by_default, ragged) == ragged);
        CHECK(cost_of(by_default, (1u << 20) + 1) == (1u << 20) + page);

        auto low = open_or_fail<cpu_device>(module, "posix-eager", 0, "mmap_threshold=64k");
        CHECK(cost_of(low, ragged) == whole_pages);
        CHECK(cost_of(low, (64u << 10) - 1) == (64u << 10) - 1);

        auto high = open_or_fail<cpu_device>(module, "posix-eager", 0, "mmap_threshold=4M");
        CHECK(cost_of(high, (1u << 20) + 1) == (1u << 20) + 1);

        auto everything_mapped = open_or_fail<cpu_device>(module, "posix-eager", 0, "mmap_threshold=0");
        CHECK(cost_of(everything_mapped, 1) == page);
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-lazy with commit=allocate hands out committed, charged memory that decommits as usual",
          "[posix][options][budget]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy", 0,
                                             "commit=allocate;budget=" + std::to_string(16 * page));
        auto backing = value_or_fail(lazy.virtual_backing());
        const std::uint64_t ragged = 10 * page + 100;
        auto live = value_or_fail(lazy.allocate(ragged, page));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == ragged);
        std::memset(live.address, 0x5A, ragged); // usable without a commit
        CHECK(test::resident_pages(live.address, 11) == 11);
        auto usage = value_or_fail(lazy.query_usage());
        CHECK(usage.mapped_bytes == ragged);
        CHECK(usage.reserved_bytes == ragged);

        // Charged at allocate: 11 pages' worth is over a 16-page budget with 10 pages + 100 in use.
        auto refused = lazy.allocate(6 * page, page);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget="));
        CHECK(value_or_fail(lazy.query_usage()).live_allocations == 1); // nothing changed

        // Decommit gives pages (and budget) back; commit takes them again.
        REQUIRE(backing.decommit(live, {0, 8 * page}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == ragged - 8 * page);
        CHECK(test::resident_pages(live.address, 8) == 0);
        auto fits = value_or_fail(lazy.allocate(6 * page, page));
        REQUIRE(backing.commit(live, {0, 2 * page}));
        CHECK(static_cast<unsigned char*>(live.address)[0] == 0); // recommitted: zero-filled
        CHECK(value_or_fail(lazy.query_usage()).mapped_bytes == ragged); // 4 pages + 100, and 6 pages
        REQUIRE(lazy.release(live));
        REQUIRE(lazy.release(fits));
        CHECK(value_or_fail(lazy.query_usage()).mapped_bytes == 0);
        // The whole budget is free again.
        REQUIRE(lazy.release(value_or_fail(lazy.allocate(16 * page, page))));
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("an eager allocation past the budget asks the host, which may re-enter to free memory",
          "[posix][options][budget]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        std::optional<host::plugin_allocator<cpu_device>> eager;
        std::vector<allocation<cpu_device>> victims;
        std::vector<std::uint64_t> asked;
        auto evicting = [&](const host::reclaim_request& request) -> result<void> {
            asked.push_back(request.bytes_needed);
            CHECK(request.mechanism_id == eager->mechanism_id());
            if (victims.empty()) {
                return fail(status_code::out_of_memory, "nothing left to evict");
            }
            // Re-enters the plugin that is asking, on its own thread.
            NXMEM_TRY_VOID(eager->release(victims.back()));
            victims.pop_back();
            return boost::outcome_v2::success();
        };
        eager.emplace(value_or_fail(
            host::open_allocator<cpu_device>(module, "posix-eager", 0, "budget=1M", evicting)));
        victims.push_back(value_or_fail(eager->allocate(512 << 10, 64))); // mmap'd: whole pages
        victims.push_back(value_or_fail(eager->allocate(400 << 10, 64)));
        CHECK(asked.empty());
        auto fits = value_or_fail(eager->allocate(100 << 10, 64)); // 1012 KiB of 1024 KiB
        CHECK(asked.empty());

        auto fresh = value_or_fail(eager->allocate(256 << 10, 64));
        REQUIRE(asked.size() == 1);
        CHECK(asked[0] == (1012u << 10) + (256u << 10) - (1u << 20)); // exactly the shortfall
        CHECK(victims.size() == 1); // one eviction was enough

        // With nothing left to evict the host refuses: OUT_OF_MEMORY naming the budget.
        REQUIRE(eager->release(victims.back()));
        victims.clear();
        auto refused = eager->allocate(1 << 20, 64);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget=1048576"));
        CHECK_THAT(refused.error().message, Catch::Contains("nothing left to evict"));
        CHECK(asked.size() == 2);
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 2);

        // A budget larger than anything else still refuses what cannot fit at all.
        REQUIRE(eager->release(fits));
        REQUIRE(eager->release(fresh));
        auto whole = value_or_fail(eager->allocate(1 << 20, 64)); // exactly the budget
        REQUIRE(eager->release(whole));
        eager.reset();
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("a host without a reclaim hook gets OUT_OF_MEMORY naming the budget",
          "[posix][options][budget]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "posix-eager", 0, "budget=64k");
        CHECK_FALSE(eager.offers_reclaim());
        auto held = value_or_fail(eager.allocate(60 << 10, 8));
        auto refused = eager.allocate(8 << 10, 8);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget=65536"));
        CHECK_THAT(refused.error().message, Catch::Contains("no reclaim hook"));
        REQUIRE(eager.release(held));
        REQUIRE(eager.release(value_or_fail(eager.allocate(8 << 10, 8))));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("a lazy commit past the budget asks the host; a refusal changes nothing",
          "[posix][options][budget]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        std::optional<host::virtual_backing_view<cpu_device>> backing;
        std::optional<allocation<cpu_device>> victim;
        int reclaims = 0;
        bool willing = true;
        auto decommitting = [&](const host::reclaim_request& request) -> result<void> {
            ++reclaims;
            if (!willing || !victim) {
                return fail(status_code::out_of_memory, "the governor refuses");
            }
            // Re-enters the plugin: decommits the victim's pages on this thread.
            NXMEM_TRY_VOID(backing->decommit(*victim, {0, request.bytes_needed}));
            return boost::outcome_v2::success();
        };
        auto lazy = value_or_fail(host::open_allocator<cpu_device>(
            module, "posix-lazy", 0, "budget=" + std::to_string(16 * page), decommitting));
        backing.emplace(value_or_fail(lazy.virtual_backing()));
        auto mapping = value_or_fail(lazy.shared_mapping());

        // Reservations cost nothing: only commits are charged.
        victim = value_or_fail(lazy.allocate(64 * page, page));
        const auto live = value_or_fail(lazy.allocate(64 * page, page));
        REQUIRE(backing->commit(*victim, {0, 12 * page}));
        REQUIRE(backing->commit(live, {0, 4 * page})); // 16 of 16 pages
        CHECK(reclaims == 0);
        REQUIRE(backing->commit(live, {0, 4 * page})); // committed already: charges nothing
        CHECK(reclaims == 0);

        REQUIRE(backing->commit(live, {4 * page, 2 * page})); // 2 pages short
        CHECK(reclaims == 1);
        CHECK(value_or_fail(backing->mapped_bytes(*victim)) == 10 * page);
        CHECK(value_or_fail(backing->mapped_bytes(live)) == 6 * page);

        willing = false;
        auto refused = backing->commit(live, {8 * page, 4 * page});
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget=" + std::to_string(16 * page)));
        CHECK_THAT(refused.error().message, Catch::Contains("the governor refuses"));
        CHECK(reclaims == 2);
        CHECK(value_or_fail(backing->mapped_bytes(live)) == 6 * page); // nothing changed

        // Prefixes are charged their whole pages from creation to destruction.
        auto too_big = mapping.create_prefix(page);
        REQUIRE_FALSE(too_big);
        CHECK(too_big.error().code == status_code::out_of_memory);
        CHECK(reclaims == 3); // asked, refused
        REQUIRE(backing->decommit(*victim, {0, 64 * page}));
        auto prefix = value_or_fail(mapping.create_prefix(3 * page));
        REQUIRE(mapping.commit_prefix(live, prefix)); // replaces 3 committed private pages
        CHECK(value_or_fail(backing->mapped_bytes(live)) == 3 * page);
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(backing->commit(*victim, {0, 10 * page})); // 3 + 3 + 10 = 16
        CHECK(reclaims == 3);

        REQUIRE(lazy.release(*victim));
        REQUIRE(lazy.release(live)); // the prefix's pages go back with its last mapping
        const auto whole = value_or_fail(lazy.allocate(16 * page, page));
        REQUIRE(backing->commit(whole, {0, 16 * page}));
        CHECK(reclaims == 3);
        REQUIRE(lazy.release(whole));
        backing.reset();
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("a host that reclaims too little leaves the charge refused", "[posix][options][budget]") {
    auto module = load_or_fail(test::posix_plugin_path());
    {
        int reclaims = 0;
        auto pretending = [&](const host::reclaim_request&) -> result<void> {
            ++reclaims; // says yes, frees nothing
            return boost::outcome_v2::success();
        };
        auto eager = value_or_fail(
            host::open_allocator<cpu_device>(module, "posix-eager", 0, "budget=100k", pretending));
        auto held = value_or_fail(eager.allocate(90 << 10, 8));
        auto refused = eager.allocate(20 << 10, 8);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("even after the host reclaimed"));
        CHECK(reclaims == 1); // asked once, retried once
        REQUIRE(eager.release(held));
    }
    REQUIRE(module->try_unload());
}

namespace {
std::size_t open_descriptors() {
    std::size_t count = 0;
    DIR* listing = ::opendir("/proc/self/fd");
    REQUIRE(listing != nullptr);
    while (const dirent* entry = ::readdir(listing)) {
        count += entry->d_name[0] != '.';
    }
    ::closedir(listing);
    return count;
}
} // namespace

TEST_CASE("posix-lazy with share=memfd commits, decommits and releases a memfd's pages like private ones",
          "[posix][options]") {
    const std::uint64_t page = page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    const std::size_t descriptors_before = open_descriptors();
    for (const char* options : {"share=memfd", "share=memfd;commit=allocate"}) {
        INFO("options " << options);
        auto lazy = open_or_fail<cpu_device>(module, "posix-lazy", 0, options);
        auto backing = value_or_fail(lazy.virtual_backing());
        const std::uint64_t ragged = 10 * page + 100;
        auto live = value_or_fail(lazy.allocate(ragged, page));
        CHECK(open_descriptors() == descriptors_before + 1); // the allocation's memfd
        REQUIRE(backing.commit(live, {0, ragged}));
        auto* bytes = static_cast<unsigned char*>(live.address);
        std::memset(bytes, 0x5A, ragged);
        CHECK(test::resident_pages(live.address, 11) == 11);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == ragged);
        // A decommit punches the pages out of the file: gone from memory, not only unmapped.
        REQUIRE(backing.decommit(live, {0, 8 * page}));
        CHECK(test::resident_pages(live.address, 8) == 0);
        CHECK(test::resident_pages(bytes + 8 * page, 3) == 3);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == ragged - 8 * page);
        REQUIRE(backing.commit(live, {0, 2 * page}));
        CHECK(bytes[0] == 0); // recommitted: zero-filled
        CHECK(bytes[8 * page] == 0x5A);
        // A prefix mapped over its start replaces the file's pages there (punched out too).
        auto mapping = value_or_fail(lazy.shared_mapping());
        auto prefix = value_or_fail(mapping.create_prefix(4 * page));
        REQUIRE(mapping.commit_prefix(live, prefix));
        bytes[0] = 0x11;
        CHECK(value_or_fail(backing.mapped_bytes(live)) == ragged - 8 * page);
        REQUIRE(lazy.release(live));
        REQUIRE(mapping.release_prefix(prefix));
        const allocator_usage usage = value_or_fail(lazy.query_usage());
        CHECK(usage.live_allocations == 0);
        CHECK(usage.mapped_bytes == 0);
        CHECK(open_descriptors() == descriptors_before); // released: the memfd is closed
    }
    REQUIRE(module->try_unload());
}
