// A resident pool over cuda-vmm on the fake driver: asleep with a host (or file) backup, the
// device holds none of the pool's memory (cuMemGetInfo reports it free); awake, every byte is
// back at the same device address (the backup goes through the plugin's copies, ABI 1.4); a wake the device cannot satisfy leaves the pool asleep.
#include "cuda_support.hpp"

#include <nxmem/residency.hpp>

#include <cstring>
#include <filesystem>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {
using resident_device_pool = resident_pool<host::plugin_allocator<cuda_device>>;

std::uint64_t free_device_bytes(fake_driver& fake) {
    const auto calls = fake.calls();
    test::current_context context(calls);
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    REQUIRE(calls.mem_get_info(&free_bytes, &total_bytes) == CUDA_SUCCESS);
    return free_bytes;
}

std::vector<std::byte> pattern_of(std::uint64_t size, std::uint8_t seed) {
    std::vector<std::byte> bytes(size);
    for (std::uint64_t at = 0; at < size; ++at) {
        bytes[at] = static_cast<std::byte>(seed + at * 13);
    }
    return bytes;
}
} // namespace

TEST_CASE("cuda-vmm resident pool: asleep with a host backup the device's memory is free; awake every byte is "
          "back at its address",
          "[cuda][residency]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        const std::uint64_t free_at_start = free_device_bytes(fake);
        pool_options options;
        options.reserve_bytes = 256 * test::mib;
        auto pool = std::make_shared<resident_device_pool>("weights", options, open_or_fail<cuda_device>(module, "cuda-vmm"));
        std::vector<allocation<cuda_device>> tensors;
        std::vector<std::vector<std::byte>> contents;
        for (std::uint64_t size : {std::uint64_t{4096}, 3 * test::mib, 9 * test::mib}) {
            tensors.push_back(value_or_fail(pool->allocate(size, 256)));
            contents.push_back(pattern_of(size, static_cast<std::uint8_t>(tensors.size())));
            std::memcpy(test::host_view(tensors.back()), contents.back().data(), size); // the fake's device memory is the host's
        }
        const std::uint64_t free_awake = free_device_bytes(fake);
        CHECK(free_awake < free_at_start);

        for (const auto& policy : {sleep_policy::host(), sleep_policy::file_in(std::filesystem::temp_directory_path())}) {
            INFO("policy " << policy.describe());
            const auto slept = value_or_fail(pool->sleep(policy));
            CHECK(slept.backed_up_bytes == free_at_start - free_awake);
            CHECK(fake.counts().device_bytes == 0);
            CHECK(fake.counts().handles == 0);
            CHECK(free_device_bytes(fake) == free_at_start);
            const auto refused = pool->allocate(4096, 256);
            REQUIRE_FALSE(refused.has_value());
            CHECK(refused.error().code == status_code::busy);

            value_or_fail(pool->wake());
            CHECK(free_device_bytes(fake) == free_awake);
            for (std::size_t index = 0; index < tensors.size(); ++index) {
                CHECK(std::memcmp(test::host_view(tensors[index]), contents[index].data(), tensors[index].size) == 0);
            }
        }

        // A device that has no memory for the wake: the pool stays asleep, its backup kept.
        value_or_fail(pool->sleep(sleep_policy::host()));
        fake.fail(FAKE_CUDA_MEM_CREATE, 1, 1);
        const auto refused = pool->wake();
        REQUIRE_FALSE(refused.has_value());
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("stays asleep"));
        CHECK(pool->state() == residency_state::asleep);
        CHECK(fake.counts().device_bytes == 0);
        CHECK(pool->residency().backed_up_bytes == free_at_start - free_awake);
        value_or_fail(pool->wake());
        CHECK(std::memcmp(test::host_view(tensors.back()), contents.back().data(), tensors.back().size) == 0);
        for (const auto& tensor : tensors) {
            REQUIRE(pool->release(tensor));
        }
    });
}
