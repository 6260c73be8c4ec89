// cuda-vmm's shared prefixes against the fake driver, whose chunks are memfds: one physical
// allocation of whole chunks mapped at the start of many allocations, so a write through one is read
// through another, and the device pays for it once however many allocations share it.
#include "cuda_support.hpp"

#include <cstring>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::host_view;
using nxmem::test::mib;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("a write through one allocation's prefix is read through another",
          "[cuda][shared-mapping]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        auto mapping = value_or_fail(vmm.shared_mapping());
        const std::uint64_t prefix_size = 2 * chunk + 10; // three whole chunks
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        CHECK(fake.counts().handles == 1); // one physical allocation of three chunks, mapped nowhere yet
        CHECK(fake.counts().mappings == 0);

        const auto first = value_or_fail(vmm.allocate(8 * chunk, chunk));
        const auto second = value_or_fail(vmm.allocate(8 * chunk, chunk));
        // The second allocation has private chunks where the prefix goes: they are decommitted.
        REQUIRE(backing.commit(second, {0, 4 * chunk}));
        std::memset(host_view(second), 0x77, 4 * chunk);

        auto one = value_or_fail(mapping.commit_prefix(first, prefix));
        CHECK(one.shared_bytes == prefix_size);
        CHECK(one.newly_mapped_bytes == 3 * chunk); // the first mapping pays its whole chunks (C8)
        CHECK(one.sharers == 1);
        auto two = value_or_fail(mapping.commit_prefix(second, prefix));
        CHECK(two.newly_mapped_bytes == 0);
        CHECK(two.sharers == 2);
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 0);     // the prefix is costed apart
        CHECK(value_or_fail(backing.mapped_bytes(second)) == chunk); // chunk 3 stays private
        CHECK(fake.counts().handles == 2);  // the prefix's and one private chunk
        CHECK(fake.counts().mappings == 3); // one per sharer and the private one
        CHECK(fake.counts().device_bytes == 4 * chunk);
        const allocator_usage held = value_or_fail(vmm.query_usage());
        CHECK(held.mapped_bytes == chunk);               // the private chunk only
        CHECK(held.shared_prefix_bytes == 3 * chunk);    // the prefix once, whole chunks

        CHECK(host_view(second)[0] == 0);            // the prefix's memory, not the private chunk's
        CHECK(host_view(second, 3 * chunk)[0] == 0x77); // the private chunk it did not cover
        std::memcpy(host_view(first), "shared prefix", 14);
        host_view(first, 3 * chunk - 1)[0] = 0xEF; // the prefix's last chunk, past its size
        CHECK(std::memcmp(host_view(second), "shared prefix", 14) == 0);
        CHECK(host_view(second, 3 * chunk - 1)[0] == 0xEF);

        // Chunks under the prefix belong to it: commit and decommit leave them alone.
        REQUIRE(backing.commit(first, {0, 8 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 5 * chunk);
        REQUIRE(backing.decommit(first, {0, 8 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(first)) == 0);
        CHECK(std::memcmp(host_view(second), "shared prefix", 14) == 0);

        // One prefix per allocation; a prefix larger than the allocation does not fit.
        auto again = mapping.commit_prefix(first, prefix);
        REQUIRE_FALSE(again);
        CHECK(again.error().code == status_code::invalid_argument);
        const auto small = value_or_fail(vmm.allocate(chunk, chunk));
        auto too_big = mapping.commit_prefix(small, prefix);
        REQUIRE_FALSE(too_big);
        CHECK(too_big.error().code == status_code::invalid_argument);

        // The creator lets go; the mappings keep the prefix alive until their allocations go.
        REQUIRE(mapping.release_prefix(prefix));
        CHECK(value_or_fail(vmm.release(first)).unmapped_bytes == 0);
        CHECK(host_view(second, 3 * chunk - 1)[0] == 0xEF); // the other sharer still reads it
        CHECK(fake.counts().handles == 2);
        CHECK(value_or_fail(vmm.release(second)).unmapped_bytes == chunk);
        REQUIRE(vmm.release(small));
        CHECK(value_or_fail(module->readiness()).plugin.shared_prefixes == 0);
        CHECK(fake.counts().handles == 0); // the last sharer's release freed the prefix
    });
}

TEST_CASE("eight sequences sharing a 64 MiB prefix cost the device 64 MiB once",
          "[cuda][shared-mapping]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto mapping = value_or_fail(vmm.shared_mapping());
        constexpr std::uint64_t prefix_size = 64 * mib;
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        std::vector<allocation<cuda_device>> sequences;
        std::uint64_t newly_mapped = 0;
        for (int i = 0; i < 8; ++i) {
            sequences.push_back(value_or_fail(vmm.allocate(prefix_size + 4 * chunk, chunk)));
            newly_mapped += value_or_fail(mapping.commit_prefix(sequences.back(), prefix)).newly_mapped_bytes;
        }
        CHECK(newly_mapped == prefix_size);
        CHECK(fake.counts().device_bytes == prefix_size); // what cuMemGetInfo would deduct
        CHECK(fake.counts().mappings == 8); // one physical allocation, one mapping per sequence
        REQUIRE(mapping.release_prefix(prefix));
        for (const auto& sequence : sequences) {
            REQUIRE(vmm.release(sequence));
        }
        CHECK(fake.counts().device_bytes == 0);
    });
}

TEST_CASE("a prefix the driver cannot create or map leaves nothing behind",
          "[cuda][shared-mapping][faults]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        auto mapping = value_or_fail(vmm.shared_mapping());

        fake.fail(FAKE_CUDA_MEM_CREATE, 0, 1);
        auto refused = mapping.create_prefix(4 * chunk);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("cuMemCreate"));
        CHECK(fake.counts().handles == 0);
        CHECK(value_or_fail(module->readiness()).plugin.shared_prefixes == 0);

        auto prefix = value_or_fail(mapping.create_prefix(3 * chunk));
        const auto live = value_or_fail(vmm.allocate(4 * chunk, chunk));
        fake.fail(FAKE_CUDA_MEM_MAP, 0, 1, CUDA_ERROR_UNKNOWN);
        auto unmapped = mapping.commit_prefix(live, prefix);
        REQUIRE_FALSE(unmapped);
        CHECK(unmapped.error().code == status_code::internal_error);
        CHECK(fake.counts().mappings == 0);
        CHECK(value_or_fail(module->readiness()).plugin.views == 0);

        fake.fail(FAKE_CUDA_MEM_SET_ACCESS, 0, 1, CUDA_ERROR_UNKNOWN);
        REQUIRE_FALSE(mapping.commit_prefix(live, prefix));
        CHECK(fake.counts().mappings == 0);

        // Nothing is stuck: the same mapping now succeeds, and the allocation commits around it.
        CHECK(value_or_fail(mapping.commit_prefix(live, prefix)).newly_mapped_bytes == 3 * chunk);
        REQUIRE(backing.commit(live, {0, 4 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == chunk);
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(vmm.release(live));
    });
}
