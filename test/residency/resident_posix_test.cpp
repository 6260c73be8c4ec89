// resident_pool over posix-lazy, the production host plugin: what the process's resident memory
// does (/proc/self/smaps_rollup) when a pool of weights sleeps with each policy, and the bytes at
// the same addresses after wake.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>
#include <nxmem/residency.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace nxmem;

namespace {
constexpr std::uint64_t mib = 1024 * 1024;
constexpr std::uint64_t weight_bytes = 64 * mib;

using resident = resident_pool<host::plugin_allocator<cpu_device>>;

template <class T> T value_or_fail(result<T> made) {
    if (!made.has_value()) {
        FAIL(made.error().describe());
    }
    return std::move(made).value();
}

// The process's resident bytes now (Rss of /proc/self/smaps_rollup).
std::uint64_t resident_bytes() {
    std::ifstream rollup("/proc/self/smaps_rollup");
    std::string key;
    std::uint64_t kilobytes = 0;
    while (rollup >> key) {
        if (key == "Rss:") {
            rollup >> kilobytes;
            return kilobytes * 1024;
        }
    }
    FAIL("no Rss in /proc/self/smaps_rollup");
    return 0;
}

std::shared_ptr<resident> open_weights(const std::shared_ptr<host::plugin_module>& module) {
    auto upstream = value_or_fail(host::open_allocator<cpu_device>(module, "posix-lazy"));
    pool_options options;
    options.reserve_bytes = 512 * mib;
    return std::make_shared<resident>("weights", options, std::move(upstream));
}

// 64 MiB of weights as a model has them: 48 tensors of 1 MiB (spans), 4 of 4 MiB, small biases.
std::vector<allocation<cpu_device>> load_weights(resident& pool) {
    std::vector<allocation<cpu_device>> tensors;
    for (int index = 0; index < 48; ++index) {
        tensors.push_back(value_or_fail(pool.allocate(mib, 64)));
    }
    for (int index = 0; index < 4; ++index) {
        tensors.push_back(value_or_fail(pool.allocate(4 * mib, 64)));
    }
    for (int index = 0; index < 64; ++index) {
        tensors.push_back(value_or_fail(pool.allocate(4096, 64)));
    }
    std::uint64_t seed = 0x9e3779b97f4a7c15ULL;
    for (const auto& tensor : tensors) {
        auto* words = static_cast<std::uint64_t*>(tensor.address);
        for (std::uint64_t at = 0; at < tensor.size / 8; ++at) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            words[at] = seed;
        }
    }
    return tensors;
}

std::vector<std::vector<std::byte>> copies_of(const std::vector<allocation<cpu_device>>& tensors) {
    std::vector<std::vector<std::byte>> copies;
    for (const auto& tensor : tensors) {
        const auto* bytes = static_cast<const std::byte*>(tensor.address);
        copies.emplace_back(bytes, bytes + tensor.size);
    }
    return copies;
}
bool bitwise_equal(const std::vector<allocation<cpu_device>>& tensors, const std::vector<std::vector<std::byte>>& copies) {
    for (std::size_t index = 0; index < tensors.size(); ++index) {
        if (std::memcmp(tensors[index].address, copies[index].data(), tensors[index].size) != 0) {
            return false;
        }
    }
    return true;
}
} // namespace

TEST_CASE("posix-lazy weights asleep with a file backup: resident memory drops by at least 95% of them; awake, "
          "bitwise equal at the same addresses",
          "[residency][posix]") {
    auto module = test::load_or_fail(test::plugin_path("NXMEM_POSIX_PLUGIN"));
    auto pool = open_weights(module);
    auto tensors = load_weights(*pool);
    const auto copies = copies_of(tensors);
    std::vector<void*> addresses;
    for (const auto& tensor : tensors) {
        addresses.push_back(tensor.address);
    }
    const std::string directory = std::filesystem::temp_directory_path().string();

    const std::uint64_t awake = resident_bytes();
    const auto slept = value_or_fail(pool->sleep(sleep_policy::file_in(directory)));
    const std::uint64_t asleep = resident_bytes();
    const std::uint64_t dropped = awake > asleep ? awake - asleep : 0;
    INFO("resident awake " << awake << " B, asleep " << asleep << " B, weights " << weight_bytes << " B");
    CHECK(slept.bytes >= weight_bytes);
    CHECK(dropped * 100 >= weight_bytes * 95);
    const auto usage = value_or_fail(pool->upstream().query_usage());
    CHECK(pool->residency().committed_bytes == 0);
    CHECK(pool->residency().asleep_bytes == slept.bytes);
    // What the plugin says is committed: its reservation only, nothing mapped.
    INFO("posix-lazy mapped " << usage.mapped_bytes);
    CHECK(usage.mapped_bytes == 0);

    value_or_fail(pool->wake());
    for (std::size_t index = 0; index < tensors.size(); ++index) {
        CHECK(tensors[index].address == addresses[index]);
    }
    CHECK(bitwise_equal(tensors, copies));
    CHECK(value_or_fail(pool->upstream().query_usage()).mapped_bytes >= weight_bytes);
}

TEST_CASE("posix-lazy: discard gives the memory back and a refilled cache reads what was written; host keeps it "
          "resident (the backup is in host memory)",
          "[residency][posix]") {
    auto module = test::load_or_fail(test::plugin_path("NXMEM_POSIX_PLUGIN"));
    auto pool = open_weights(module);
    auto tensors = load_weights(*pool);
    const auto copies = copies_of(tensors);

    const std::uint64_t awake = resident_bytes();
    value_or_fail(pool->sleep(sleep_policy::discard()));
    const std::uint64_t asleep = resident_bytes();
    CHECK((awake > asleep ? awake - asleep : 0) * 100 >= weight_bytes * 95);
    value_or_fail(pool->wake());
    for (std::size_t index = 0; index < tensors.size(); ++index) {
        std::memcpy(tensors[index].address, copies[index].data(), tensors[index].size);
    }
    CHECK(bitwise_equal(tensors, copies));

    value_or_fail(pool->sleep(sleep_policy::host()));
    CHECK(pool->residency().backed_up_bytes >= weight_bytes);
    value_or_fail(pool->wake());
    CHECK(bitwise_equal(tensors, copies));
    for (const auto& tensor : tensors) {
        REQUIRE(pool->release(tensor));
    }
}

TEST_CASE("residency as HOST.md shows it: a tagged pool slept to a file and woken by every tag", "[residency][posix][docs]") {
    auto module = test::load_or_fail(test::plugin_path("NXMEM_POSIX_PLUGIN"));
    nxmem::pool_options options;
    options.reserve_bytes = 8ull << 30; // address space, not memory
    auto weights = std::make_shared<nxmem::resident_pool<nxmem::host::plugin_allocator<nxmem::cpu_device>>>(
        "weights", options, nxmem::host::open_allocator<nxmem::cpu_device>(module, "posix-lazy").value());
    auto tensor = weights->allocate(64 << 20, 64).value();
    std::memset(tensor.address, 0x5a, tensor.size);

    nxmem::residency_tags tags;
    tags.add(weights);
    auto slept = tags.sleep(std::vector<std::string>{"weights"},
                            nxmem::sleep_policy::file_in(std::filesystem::temp_directory_path()));
    REQUIRE(slept.has_value());
    CHECK(slept.value().bytes >= tensor.size);
    CHECK(weights->residency().backup_location == "an unnamed file in " + std::filesystem::temp_directory_path().string());
    auto woken = tags.wake({});
    REQUIRE(woken.has_value());
    CHECK(static_cast<unsigned char*>(tensor.address)[tensor.size - 1] == 0x5a);
    REQUIRE(weights->release(tensor));
}
