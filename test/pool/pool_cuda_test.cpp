// The pool over the cuda plugin's fake driver: device addresses the host never touches,
// cuda-eager by allocation and cuda-vmm by commit (device memory given back by trim, as
// cuMemGetInfo would show), and the plugin unloading with the fake left holding nothing.
#include "../cuda/cuda_support.hpp"

#include <nxmem/host/pooled_allocator.hpp>

#include <vector>

using namespace nxmem;
using test::mib;

namespace {
template <class T> T value_or_fail(result<T> made) {
    if (!made.has_value()) {
        FAIL(made.error().describe());
    }
    return std::move(made).value();
}
} // namespace

TEST_CASE("pooled cuda-eager: many allocations, one cuMemAlloc per chunk, nothing left after trim", "[pool][cuda]") {
    test::with_cuda_plugin([](test::fake_driver& fake, const test::module_ptr& module) {
        auto pool = value_or_fail(host::open_pooled_allocator<cuda_device>(module, "cuda-eager"));
        std::vector<allocation<cuda_device>> live;
        for (int i = 0; i < 4000; ++i) {
            live.push_back(value_or_fail(pool->allocate(512, 256)));
        }
        live.push_back(value_or_fail(pool->allocate(3 * mib, 256)));
        CHECK(fake.counts().device_allocations == 2);
        for (const auto& one : live) {
            REQUIRE(pool->release_by_address(one.address));
        }
        CHECK(fake.counts().device_allocations == 2); // kept, idle
        pool->trim(0);
        CHECK(fake.counts().device_allocations == 0);
        CHECK(fake.counts().device_bytes == 0);
    });
}

TEST_CASE("pooled cuda-vmm grows by commit and trim gives the device memory back", "[pool][cuda]") {
    test::with_cuda_plugin([](test::fake_driver& fake, const test::module_ptr& module) {
        pool_options pooling;
        pooling.reserve_bytes = 256 * mib;
        auto pool = value_or_fail(host::open_pooled_allocator<cuda_device>(module, "cuda-vmm", 0, {}, pooling));
        REQUIRE(pool->grows_by_commit());
        CHECK(pool->chunk_bytes() == test::chunk);
        CHECK(fake.counts().device_bytes == 0); // reserved only
        std::vector<allocation<cuda_device>> live;
        for (std::uint64_t made = 0; made <= test::chunk; made += 8192) {
            live.push_back(value_or_fail(pool->allocate(8192, 256)));
        }
        CHECK(fake.counts().reservations == 1);
        CHECK(fake.counts().device_bytes == 2 * test::chunk);
        CHECK(pool->usage().upstream_commits == 2);
        for (const auto& one : live) {
            REQUIRE(pool->release(one));
        }
        CHECK(fake.counts().device_bytes == 2 * test::chunk); // idle in the pool
        CHECK(pool->trim(0) == 2 * test::chunk);
        CHECK(fake.counts().device_bytes == 0);
        CHECK(pool->usage().upstream_decommits == 2);
        // Spans are pieces of the reservation's arena, committed in the device's 2 MiB granules.
        auto three = value_or_fail(pool->allocate(3 * mib, 256)); // 4 MiB: two granules
        auto one = value_or_fail(pool->allocate(1 * mib, 256));   // 2 MiB, just above it
        CHECK(cuda_device::to_wire(one.address) == cuda_device::to_wire(three.address) + 4 * mib);
        CHECK(fake.counts().reservations == 1);
        CHECK(fake.counts().device_bytes == 6 * mib);
        REQUIRE(pool->release_by_address(three.address));
        REQUIRE(pool->release(one));
        CHECK(pool->trim(0) == 6 * mib);
        CHECK(fake.counts().device_bytes == 0);
    });
}
