// Threads allocate, commit, write, decommit, map a shared prefix and release through one cuda-vmm
// allocator (and one cuda-eager allocator) at once, against the fake driver, and then work on the
// same allocation; mapped_bytes must come out exact, the fake must hold nothing and the module
// must unload. Run under ThreadSanitizer by scripts/test. Bounded by iteration counts, never by
// sleeping.
#include "cuda_support.hpp"

#include <cstring>
#include <latch>
#include <thread>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::host_view;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

constexpr int worker_count = 2;
constexpr int iterations = 100;

struct allocators {
    host::plugin_allocator<cuda_device>& vmm;
    host::virtual_backing_view<cuda_device>& backing;
    host::shared_mapping_view<cuda_device>& mapping;
    const host::shared_prefix& prefix;
    host::plugin_allocator<cuda_device>& eager;
};

// One worker's loop; returns the number of operations that failed or misreported.
int work(allocators& use, int seed) {
    int failures = 0;
    const auto count = [&failures](bool ok) { failures += ok ? 0 : 1; };
    for (int i = 0; i < iterations; ++i) {
        const std::uint64_t chunks = 2 + static_cast<std::uint64_t>((seed * 7 + i) % 3);
        auto made = use.vmm.allocate(chunks * chunk + 100, 256);
        if (!made) {
            ++failures;
            continue;
        }
        const allocation<cuda_device> live = made.value();
        count(use.backing.commit(live, {0, chunks * chunk}).has_value());
        host_view(live)[0] = static_cast<unsigned char>(seed + 1);
        count(use.backing.commit(live, {chunks * chunk, 100}).has_value()); // the partial chunk
        count(use.backing.decommit(live, {chunk, chunk}).has_value());
        auto mapped = use.backing.mapped_bytes(live);
        count(mapped && mapped.value() == (chunks - 1) * chunk + 100);
        if (i % 4 == 0) {
            count(use.mapping.commit_prefix(live, use.prefix).has_value());
        }
        auto eager = use.eager.allocate(1 + static_cast<std::uint64_t>(i % 3) * 4096, 256);
        count(eager && use.eager.release(eager.value()).has_value());
        if (i % 2 == 0) {
            count(use.vmm.release(live).has_value());
        } else {
            count(use.vmm.enqueue_release(live).has_value());
            count(use.vmm.drain_releases().has_value());
        }
    }
    return failures;
}

} // namespace

TEST_CASE("threads share one cuda-vmm and one cuda-eager allocator", "[cuda][concurrency]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager");
        auto backing = value_or_fail(vmm.virtual_backing());
        auto mapping = value_or_fail(vmm.shared_mapping());
        const auto prefix = value_or_fail(mapping.create_prefix(chunk));
        allocators use{vmm, backing, mapping, prefix, eager};
        std::vector<int> failures(worker_count, 0);
        {
            std::latch start(worker_count);
            std::vector<std::jthread> workers;
            for (int seed = 0; seed < worker_count; ++seed) {
                workers.emplace_back([&, seed] {
                    start.arrive_and_wait();
                    failures[static_cast<std::size_t>(seed)] = work(use, seed);
                });
            }
        }
        for (int seed = 0; seed < worker_count; ++seed) {
            CHECK(failures[static_cast<std::size_t>(seed)] == 0);
        }
        // Every queued release retired; only the creator's reference keeps the prefix.
        REQUIRE(vmm.drain_releases());
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
        REQUIRE(mapping.release_prefix(prefix));
        CHECK(fake.counts().device_bytes == 0);
    });
}

TEST_CASE("threads commit and decommit disjoint chunks of one allocation", "[cuda][concurrency]") {
    test::with_cuda_plugin([&]([[maybe_unused]] fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        constexpr std::uint64_t chunks_per_worker = 3;
        const auto live = value_or_fail(vmm.allocate(worker_count * chunks_per_worker * chunk, chunk));
        std::vector<int> failures(worker_count, 0);
        {
            std::latch start(worker_count);
            std::vector<std::jthread> workers;
            for (int seed = 0; seed < worker_count; ++seed) {
                workers.emplace_back([&, seed] {
                    start.arrive_and_wait();
                    const std::uint64_t first = static_cast<std::uint64_t>(seed) * chunks_per_worker * chunk;
                    for (int i = 0; i < iterations; ++i) {
                        const byte_range mine{first, chunks_per_worker * chunk};
                        failures[static_cast<std::size_t>(seed)] +=
                            backing.commit(live, mine).has_value() ? 0 : 1;
                        failures[static_cast<std::size_t>(seed)] +=
                            backing.mapped_bytes(live).has_value() ? 0 : 1;
                        if (i + 1 < iterations) {
                            failures[static_cast<std::size_t>(seed)] +=
                                backing.decommit(live, mine).has_value() ? 0 : 1;
                        }
                    }
                });
            }
        }
        for (int seed = 0; seed < worker_count; ++seed) {
            CHECK(failures[static_cast<std::size_t>(seed)] == 0);
        }
        CHECK(value_or_fail(backing.mapped_bytes(live)) == worker_count * chunks_per_worker * chunk);
        CHECK(value_or_fail(vmm.release(live)).unmapped_bytes == worker_count * chunks_per_worker * chunk);
    });
}
