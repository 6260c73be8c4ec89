// The budget option: a ceiling on the device memory an allocator holds, counted in whole chunks
// for cuda-vmm. A charge past it asks the host to reclaim (re-entering the plugin is allowed),
// retries once, and otherwise fails with OUT_OF_MEMORY naming the budget, changing nothing.
#include "cuda_support.hpp"

#include <optional>
#include <string>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::value_or_fail;

TEST_CASE("a cuda-vmm commit past the budget asks the host, which may decommit to make room",
          "[cuda][vmm][budget]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        std::optional<host::virtual_backing_view<cuda_device>> backing;
        std::optional<allocation<cuda_device>> victim;
        std::vector<std::uint64_t> asked;
        bool willing = true;
        auto decommitting = [&](const host::reclaim_request& request) -> result<void> {
            asked.push_back(request.bytes_needed);
            if (!willing || !victim) {
                return fail(status_code::out_of_memory, "the governor refuses");
            }
            // Re-enters the plugin on this thread.
            return backing->decommit(*victim, {0, request.bytes_needed});
        };
        auto vmm = value_or_fail(host::open_allocator<cuda_device>(
            module, "cuda-vmm", 0, "budget=" + std::to_string(8 * chunk), decommitting));
        backing.emplace(value_or_fail(vmm.virtual_backing()));
        auto mapping = value_or_fail(vmm.shared_mapping());

        // A partial last chunk is charged whole: the device gives nothing smaller.
        victim = value_or_fail(vmm.allocate(16 * chunk, chunk));
        const auto live = value_or_fail(vmm.allocate(5 * chunk + 1, chunk));
        REQUIRE(backing->commit(*victim, {0, 6 * chunk}));
        REQUIRE(backing->commit(live, {5 * chunk, 1})); // 7 of 8 chunks
        CHECK(value_or_fail(backing->mapped_bytes(live)) == 1);
        REQUIRE(backing->commit(live, {0, chunk})); // 8 of 8
        CHECK(asked.empty());

        REQUIRE(backing->commit(live, {chunk, 2 * chunk})); // two chunks short
        REQUIRE(asked.size() == 1);
        CHECK(asked[0] == 2 * chunk);
        CHECK(value_or_fail(backing->mapped_bytes(*victim)) == 4 * chunk);

        willing = false;
        auto refused = backing->commit(live, {3 * chunk, 2 * chunk});
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget=" + std::to_string(8 * chunk)));
        CHECK_THAT(refused.error().message, Catch::Contains("the governor refuses"));
        CHECK(value_or_fail(backing->mapped_bytes(live)) == 3 * chunk + 1); // nothing changed
        CHECK(fake.counts().device_bytes == 8 * chunk);

        // Prefixes are charged their whole chunks from creation to destruction.
        auto too_big = mapping.create_prefix(1);
        REQUIRE_FALSE(too_big);
        CHECK(too_big.error().code == status_code::out_of_memory);
        CHECK(fake.counts().handles == 8);
        REQUIRE(backing->decommit(*victim, {0, 16 * chunk}));
        auto prefix = value_or_fail(mapping.create_prefix(1));
        REQUIRE(mapping.commit_prefix(*victim, prefix));
        REQUIRE(mapping.release_prefix(prefix));
        REQUIRE(backing->commit(*victim, {chunk, 3 * chunk})); // 4 + 1 + 3 = 8

        REQUIRE(vmm.release(*victim));
        REQUIRE(vmm.release(live));
        const auto whole = value_or_fail(vmm.allocate(8 * chunk, chunk));
        REQUIRE(backing->commit(whole, {0, 8 * chunk})); // the budget is whole again
        REQUIRE(vmm.release(whole));
        backing.reset();
    });
}

TEST_CASE("a cuda-eager allocation past the budget asks the host and otherwise fails cleanly",
          "[cuda][eager][budget]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        std::optional<host::plugin_allocator<cuda_device>> eager;
        std::vector<allocation<cuda_device>> victims;
        int reclaims = 0;
        auto evicting = [&](const host::reclaim_request&) -> result<void> {
            ++reclaims;
            if (victims.empty()) {
                return fail(status_code::out_of_memory, "nothing left to evict");
            }
            NXMEM_TRY_VOID(eager->release(victims.back()));
            victims.pop_back();
            return boost::outcome_v2::success();
        };
        eager.emplace(value_or_fail(
            host::open_allocator<cuda_device>(module, "cuda-eager", 0, "budget=1M", evicting)));
        victims.push_back(value_or_fail(eager->allocate(600 << 10, 256)));
        const auto held = value_or_fail(eager->allocate(400 << 10, 256));
        CHECK(reclaims == 0);
        const auto fresh = value_or_fail(eager->allocate(200 << 10, 256));
        CHECK(reclaims == 1);
        CHECK(victims.empty());
        auto refused = eager->allocate(1 << 20, 256);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("budget=1048576"));
        CHECK_THAT(refused.error().message, Catch::Contains("nothing left to evict"));
        CHECK(fake.counts().device_allocations == 2);
        REQUIRE(eager->release(held));
        REQUIRE(eager->release(fresh));
        eager.reset();
    });
}
