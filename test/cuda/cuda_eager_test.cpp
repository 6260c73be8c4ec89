// cuda-eager against the fake driver: cuMemAlloc'ed memory, aligned as asked, costed at once,
// released with an outcome; driver failures become statuses and change nothing.
#include "cuda_support.hpp"

#include <cstring>
#include <vector>

using namespace nxmem;
using nxmem::test::fake_driver;
using nxmem::test::load_or_fail;
using nxmem::test::host_view;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("cuda-eager allocates device memory, aligned as asked, and costs it at once",
          "[cuda][eager]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager");
        CHECK(eager.capabilities() ==
              (NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE | NXMEM_CAP_HOST_RECLAIM |
               NXMEM_CAP_USAGE_QUERY | NXMEM_CAP_FENCED_RELEASE | NXMEM_CAP_COPY));
        CHECK(eager.declared_minor() == 4);
        std::vector<allocation<cuda_device>> live;
        std::uint64_t expected_bytes = 0;
        for (std::uint64_t alignment : {1ull, 256ull, 4096ull, 65536ull}) {
            for (std::uint64_t size : {1ull, 1000ull, 1ull << 20}) {
                INFO("size " << size << ", alignment " << alignment);
                live.push_back(value_or_fail(eager.allocate(size, alignment)));
                CHECK(live.back().address.value % alignment == 0);
                std::memset(host_view(live.back()), 0x5A, size); // the whole size is there
                expected_bytes += size + (alignment > 256 ? alignment - 256 : 0);
            }
        }
        CHECK(fake.counts().device_allocations == live.size());
        CHECK(fake.counts().device_bytes == expected_bytes);
        CHECK(value_or_fail(module->readiness()).plugin.allocations == live.size());
        const allocator_usage held = value_or_fail(eager.query_usage());
        CHECK(held.live_allocations == live.size());
        CHECK(held.mapped_bytes == expected_bytes);
        for (const auto& one : live) {
            const release_report report = value_or_fail(eager.release(one));
            CHECK(report.state == release_state::complete);
            CHECK(report.unmapped_bytes ==
                  one.size + (one.alignment > 256 ? one.alignment - 256 : 0));
        }
        CHECK(fake.counts().device_bytes == 0);
        CHECK(value_or_fail(eager.query_usage()) == allocator_usage{});
    });
}

TEST_CASE("cuda-eager reports the driver's failures and changes nothing", "[cuda][eager][faults]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager");
        SECTION("out of device memory") {
            auto refused = eager.allocate(2ull << 30, 256); // the fake device has 1 GiB
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::out_of_memory);
            CHECK_THAT(refused.error().message, Catch::Contains("cuMemAlloc of 2147483648 bytes failed"));
            CHECK_THAT(refused.error().message, Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY"));
        }
        SECTION("an over-aligned allocation the driver refuses") {
            fake.fail(FAKE_CUDA_MEM_ALLOC, 0, 1);
            auto refused = eager.allocate(4096, 65536);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::out_of_memory);
        }
        SECTION("a free the driver refuses leaves the allocation live") {
            const auto held = value_or_fail(eager.allocate(4096, 4096));
            fake.fail(FAKE_CUDA_MEM_FREE, 0, 1, CUDA_ERROR_UNKNOWN);
            auto refused = eager.release(held);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::internal_error);
            CHECK_THAT(refused.error().message, Catch::Contains("cuMemFree"));
            CHECK(value_or_fail(module->readiness()).plugin.allocations == 1);
            CHECK(value_or_fail(eager.release(held)).unmapped_bytes == 4096 + 4096 - 256);
        }
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
        CHECK(fake.counts().device_bytes == 0);
    });
}

TEST_CASE("closing an allocator frees what the host left live", "[cuda][eager][vmm]") {
    fake_driver fake;
    auto module = load_or_fail(test::cuda_plugin_path());
    {
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager");
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        (void)value_or_fail(eager.allocate(1 << 20, 65536));
        const auto reserved = value_or_fail(vmm.allocate(8 * test::chunk, 1));
        REQUIRE(backing.commit(reserved, {0, 4 * test::chunk}));
        CHECK(fake.counts().device_bytes == (1 << 20) + 65536 - 256 + 4 * test::chunk);
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
    CHECK_FALSE(test::is_mapped(test::cuda_plugin_path()));
    fake.require_idle();
}
