// One suite of allocate/release checks, run for every conforming mechanism and every device tag
// it serves: the same checks whatever implements the mechanism.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

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

struct conforming_mechanism {
    const char* plugin_variable;
    const char* name;
    bool serves_cuda;
};

constexpr conforming_mechanism conforming[] = {
    {"NXMEM_TESTPLUGIN", "eager", true},
    {"NXMEM_TESTPLUGIN", "legacy-1-0", true},
    {"NXMEM_TESTPLUGIN", "lazy", true},
    {"NXMEM_MINIMAL_C_PLUGIN", "minimal-c", false},
};

template <Device D> std::uint64_t wire_address(const allocation<D>& live) {
    return D::to_wire(live.address);
}

} // namespace

TEMPLATE_TEST_CASE("allocate and release round-trip through the boundary", "[suite]", cpu_device,
                   cuda_device) {
    using D = TestType;
    const conforming_mechanism mechanism = GENERATE(from_range(std::begin(conforming), std::end(conforming)));
    if (D::type == NXMEM_DEVICE_CUDA && !mechanism.serves_cuda) {
        return; // this mechanism serves host memory only; the cpu instantiation covers it
    }
    INFO("mechanism " << mechanism.name << " on " << D::name);
    auto module = load_or_fail(test::plugin_path(mechanism.plugin_variable));
    {
        auto allocator = open_or_fail<D>(module, mechanism.name);
        CHECK(allocator.device() == device_id{D::type, 0});

        std::vector<allocation<D>> live;
        std::uint64_t last_id = 0;
        for (std::uint64_t size : {1ull, 7ull, 64ull, 4096ull, 65537ull, 1ull << 20}) {
            for (std::uint64_t alignment : {1ull, 8ull, 64ull, 4096ull}) {
                auto made = value_or_fail(allocator.allocate(size, alignment));
                CHECK(made.size == size);
                CHECK(made.alignment == alignment);
                CHECK(wire_address(made) % alignment == 0);
                CHECK(made.allocation_id > last_id); // host-assigned, monotonic
                CHECK(made.mechanism_id == allocator.mechanism_id());
                last_id = made.allocation_id;
                if constexpr (std::is_same_v<D, cpu_device>) {
                    std::memset(made.address, 0xA5, size); // writable over the whole size
                }
                live.push_back(made);
            }
        }
        // Distinct live allocations never overlap.
        std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
        for (const auto& made : live) {
            spans.emplace_back(wire_address(made), wire_address(made) + made.size);
        }
        std::sort(spans.begin(), spans.end());
        for (std::size_t i = 1; i < spans.size(); ++i) {
            CHECK(spans[i - 1].second <= spans[i].first);
        }
        auto readiness = value_or_fail(module->readiness());
        CHECK(readiness.host.allocations == live.size());
        CHECK(readiness.plugin.allocations == live.size());

        for (const auto& made : live) {
            CHECK(value_or_fail(allocator.release(made)).state == release_state::complete);
        }
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
}

TEMPLATE_TEST_CASE("malformed requests are refused and change nothing", "[suite]", cpu_device,
                   cuda_device) {
    using D = TestType;
    const conforming_mechanism mechanism = GENERATE(from_range(std::begin(conforming), std::end(conforming)));
    if (D::type == NXMEM_DEVICE_CUDA && !mechanism.serves_cuda) {
        return;
    }
    INFO("mechanism " << mechanism.name << " on " << D::name);
    auto module = load_or_fail(test::plugin_path(mechanism.plugin_variable));
    {
        auto allocator = open_or_fail<D>(module, mechanism.name);
        for (auto [size, alignment] : {std::pair{0ull, 8ull}, std::pair{64ull, 0ull},
                                       std::pair{64ull, 3ull}, std::pair{64ull, 48ull}}) {
            auto refused = allocator.allocate(size, alignment);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::invalid_argument);
        }
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
    }
    REQUIRE(module->try_unload());
}
