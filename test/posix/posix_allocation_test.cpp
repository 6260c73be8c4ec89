// The allocate/release checks every conforming mechanism passes, for posix-eager and posix-lazy:
// sizes from one byte to megabytes, alignments from 1 to 2 MiB, memory writable over its whole
// size, live allocations disjoint, counters back at zero, the module really unloaded. And the
// malformed or impossible requests: each a clear status, nothing changed, nothing leaked.
#include "posix_support.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace nxmem;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

// posix-lazy reserves only: its memory is usable once committed.
void make_usable(host::plugin_allocator<cpu_device>& allocator, const allocation<cpu_device>& made) {
    if (allocator.mechanism_name() == "posix-lazy") {
        auto backing = value_or_fail(allocator.virtual_backing());
        REQUIRE(backing.commit(made, {0, made.size}));
        CHECK(value_or_fail(backing.mapped_bytes(made)) == made.size);
    }
}

} // namespace

TEST_CASE("posix mechanisms allocate, write and release every size and alignment", "[posix][suite]") {
    const std::string mechanism = GENERATE(as<std::string>{}, "posix-eager", "posix-lazy");
    INFO("mechanism " << mechanism);
    const std::string path = test::posix_plugin_path();
    auto module = load_or_fail(path);
    {
        const host::factory_info* factory = module->find_factory(mechanism);
        REQUIRE(factory != nullptr);
        CHECK(factory->device_types == (1ull << NXMEM_DEVICE_CPU));
        auto allocator = open_or_fail<cpu_device>(module, mechanism);
        CHECK((allocator.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) != 0);
        CHECK((allocator.capabilities() & NXMEM_CAP_HOST_RECLAIM) != 0);

        std::vector<allocation<cpu_device>> live;
        std::uint64_t last_id = 0;
        for (std::uint64_t size : {1ull, 7ull, 64ull, 4096ull, 65537ull, (256ull << 10) - 1,
                                   256ull << 10, 1ull << 20, (3ull << 20) + 5}) {
            for (std::uint64_t alignment : {1ull, 8ull, 64ull, 4096ull, 65536ull, 2ull << 20}) {
                auto made = value_or_fail(allocator.allocate(size, alignment));
                CHECK(made.size == size);
                CHECK(made.alignment == alignment);
                CHECK(cpu_device::to_wire(made.address) % alignment == 0);
                CHECK(made.allocation_id > last_id);
                last_id = made.allocation_id;
                make_usable(allocator, made);
                std::memset(made.address, 0xA5, size); // writable over the whole size
                live.push_back(made);
            }
        }
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
        for (const auto& made : live) {
            spans.emplace_back(cpu_device::to_wire(made.address),
                               cpu_device::to_wire(made.address) + made.size);
        }
        std::sort(spans.begin(), spans.end());
        for (std::size_t i = 1; i < spans.size(); ++i) {
            CHECK(spans[i - 1].second <= spans[i].first);
        }
        for (const auto& made : live) { // nothing overwrote anything
            const auto* bytes = static_cast<const unsigned char*>(made.address);
            CHECK((bytes[0] == 0xA5 && bytes[made.size - 1] == 0xA5));
        }
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.allocations == live.size());
        CHECK(readiness.plugin.allocations == live.size());

        for (const auto& made : live) {
            auto report = value_or_fail(allocator.release(made));
            CHECK(report.state == release_state::complete);
            CHECK(report.unmapped_bytes >= made.size); // eager: whole pages when mmap'd
            CHECK(report.residual_owned_bytes == 0);
        }
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(path));
}

TEST_CASE("posix mechanisms serve the cpu device type only", "[posix][bad-input]") {
    auto module = load_or_fail(test::posix_plugin_path());
    for (const char* mechanism : {"posix-eager", "posix-lazy"}) {
        auto refused = host::open_allocator<cuda_device>(module, mechanism);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::wrong_device);
        auto second_cpu = host::open_allocator<cpu_device>(module, mechanism, 1);
        CHECK(second_cpu); // any cpu index: host memory is one pool
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("malformed and impossible allocations are refused and change nothing",
          "[posix][bad-input]") {
    const std::string mechanism = GENERATE(as<std::string>{}, "posix-eager", "posix-lazy");
    INFO("mechanism " << mechanism);
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto allocator = open_or_fail<cpu_device>(module, mechanism);
        for (auto [size, alignment] : {std::pair{0ull, 8ull}, std::pair{64ull, 0ull},
                                       std::pair{64ull, 3ull}, std::pair{64ull, 48ull}}) {
            auto refused = allocator.allocate(size, alignment);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::invalid_argument);
        }
        // Sizes and alignments the system cannot satisfy: OUT_OF_MEMORY, never a crash.
        for (auto [size, alignment] :
             {std::pair{1ull << 63, 8ull}, std::pair{~0ull, 8ull}, std::pair{~0ull - 4096, 4096ull},
              std::pair{1ull << 62, 2ull << 20}, std::pair{64ull, 1ull << 63},
              std::pair{1ull << 20, 1ull << 62}}) {
            INFO("size " << size << ", alignment " << alignment);
            auto refused = allocator.allocate(size, alignment);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::out_of_memory);
            CHECK_THAT(refused.error().message, Catch::Contains(mechanism));
        }
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.plugin.allocations == 0);
        CHECK(readiness.host.allocations == 0);

        // A release that misdescribes a live allocation is refused; the allocation stays live.
        auto live = value_or_fail(allocator.allocate(100, 8));
        auto wrong = live;
        wrong.size = 99;
        auto refused = allocator.release(wrong);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
        REQUIRE(allocator.release(live));
        auto twice = allocator.release(live);
        REQUIRE_FALSE(twice);
        CHECK(twice.error().code == status_code::unknown_allocation);
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEST_CASE("posix-eager's usage query counts live allocations at their cost", "[posix][eager][usage]") {
    const std::uint64_t page = test::page_size();
    auto module = load_or_fail(test::posix_plugin_path());
    {
        auto eager = open_or_fail<cpu_device>(module, "posix-eager");
        REQUIRE((eager.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0);
        const auto small = value_or_fail(eager.allocate(100, 16));      // the heap: its size
        const auto large = value_or_fail(eager.allocate(1 << 20, page)); // mmap: whole pages
        auto usage = value_or_fail(eager.query_usage());
        CHECK(usage.live_allocations == 2);
        CHECK(usage.reserved_bytes == 100 + (1u << 20));
        CHECK(usage.mapped_bytes == usage.reserved_bytes);
        CHECK(usage.shared_prefix_bytes == 0);
        CHECK(usage.quarantined_bytes == 0);
        REQUIRE(eager.release(small));
        REQUIRE(eager.release(large));
        CHECK(value_or_fail(eager.query_usage()) == nxmem::allocator_usage{});
    }
    REQUIRE(module->try_unload());
}
