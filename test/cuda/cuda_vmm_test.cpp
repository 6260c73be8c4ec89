// cuda-vmm against the fake driver: reservations cost nothing; commit creates, maps and opens
// chunks; decommit unmaps and releases them; mapped bytes are exact; every driver failure
// undoes what the call did; releases the driver refuses are quarantined; deferred releases retire.
#include "cuda_support.hpp"

#include <cstring>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::fake_driver;
using nxmem::test::host_view;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

TEST_CASE("cuda-vmm commits and decommits chunk by chunk, costing exactly what is mapped",
          "[cuda][vmm]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        CHECK(vmm.capabilities() == (NXMEM_CAP_VIRTUAL_BACKING | NXMEM_CAP_SHARED_MAPPING |
                                     NXMEM_CAP_DEFERRED_RELEASE | NXMEM_CAP_STRUCTURED_RELEASE |
                                     NXMEM_CAP_HOST_RECLAIM | NXMEM_CAP_USAGE_QUERY | NXMEM_CAP_IPC |
                                     NXMEM_CAP_FENCED_RELEASE | NXMEM_CAP_COPY));
        CHECK(vmm.declared_minor() == 4);
        auto backing = value_or_fail(vmm.virtual_backing());
        CHECK(backing.commit_granularity() == chunk); // the device's allocation granularity

        // 7.5 chunks: reserved as 8 whole chunks, aligned to at least a chunk.
        const std::uint64_t size = 7 * chunk + chunk / 2;
        const auto live = value_or_fail(vmm.allocate(size, 64));
        CHECK(live.address.value % chunk == 0);
        CHECK(fake.counts().reservations == 1);
        CHECK(fake.counts().device_bytes == 0); // a reservation costs nothing
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);

        REQUIRE(backing.commit(live, {0, 2 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * chunk);
        CHECK(fake.counts().handles == 2);
        CHECK(fake.counts().mappings == 2);
        CHECK(fake.counts().device_bytes == 2 * chunk);
        std::memset(host_view(live), 0x42, 2 * chunk); // mapped and open for access

        REQUIRE(backing.commit(live, {chunk, chunk})); // committed already: a no-op
        CHECK(fake.counts().calls[FAKE_CUDA_MEM_CREATE] == 2);

        // The last, partial chunk: the range reaches the end; it costs its bytes within the
        // allocation, and the device its whole chunk.
        REQUIRE(backing.commit(live, {7 * chunk, chunk / 2}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * chunk + chunk / 2);
        CHECK(fake.counts().device_bytes == 3 * chunk);
        host_view(live, size - 1)[0] = 1;

        // A run of three gaps' worth is one cuMemSetAccess.
        const auto set_access_before = fake.counts().calls[FAKE_CUDA_MEM_SET_ACCESS];
        REQUIRE(backing.commit(live, {2 * chunk, 3 * chunk}));
        CHECK(fake.counts().calls[FAKE_CUDA_MEM_SET_ACCESS] == set_access_before + 1);
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 5 * chunk + chunk / 2);

        REQUIRE(backing.decommit(live, {chunk, 2 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 3 * chunk + chunk / 2);
        CHECK(fake.counts().handles == 4);
        CHECK(fake.counts().device_bytes == 4 * chunk);
        REQUIRE(backing.decommit(live, {chunk, 2 * chunk})); // uncommitted already: a no-op
        CHECK(host_view(live)[0] == 0x42);                  // chunk 0 kept its contents

        // Recommitted memory is fresh memory.
        REQUIRE(backing.commit(live, {chunk, chunk}));
        CHECK(host_view(live, chunk)[0] == 0);

        SECTION("ranges must be chunk-granular") {
            for (byte_range bad : {byte_range{4096, chunk}, byte_range{0, chunk + 4096},
                                   byte_range{chunk / 2, chunk / 2}}) {
                INFO("range [" << bad.offset << ", +" << bad.length << ")");
                auto refused = backing.commit(live, bad);
                REQUIRE_FALSE(refused);
                CHECK(refused.error().code == status_code::invalid_argument);
                CHECK_THAT(refused.error().message, Catch::Contains("chunk-granular (2097152 bytes"));
                CHECK(backing.decommit(live, bad).error().code == status_code::invalid_argument);
            }
            CHECK(value_or_fail(backing.mapped_bytes(live)) == 4 * chunk + chunk / 2);
        }

        const allocator_usage held = value_or_fail(vmm.query_usage());
        CHECK(held.live_allocations == 1);
        CHECK(held.reserved_bytes == size);
        CHECK(held.mapped_bytes == 4 * chunk + chunk / 2);
        CHECK(held.shared_prefix_bytes == 0);
        CHECK(held.quarantined_bytes == 0);

        const release_report report = value_or_fail(vmm.release(live));
        CHECK(report.state == release_state::complete);
        CHECK(report.unmapped_bytes == 4 * chunk + chunk / 2);
        CHECK(value_or_fail(vmm.query_usage()) == allocator_usage{});
    });
}

TEST_CASE("a commit the driver fails undoes its own chunks and changes nothing else",
          "[cuda][vmm][faults]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        const auto live = value_or_fail(vmm.allocate(8 * chunk, chunk));
        REQUIRE(backing.commit(live, {chunk, chunk}));
        struct fault_case {
            fake_cuda_call call;
            unsigned successes;
            CUresult code;
            status_code expected;
            const char* named;
        };
        const fault_case fault = GENERATE(
            fault_case{FAKE_CUDA_MEM_CREATE, 1, CUDA_ERROR_OUT_OF_MEMORY, status_code::out_of_memory,
                       "cuMemCreate of 2097152 bytes failed: CUDA_ERROR_OUT_OF_MEMORY"},
            fault_case{FAKE_CUDA_MEM_MAP, 2, CUDA_ERROR_UNKNOWN, status_code::internal_error,
                       "cuMemMap of 2097152 bytes"},
            fault_case{FAKE_CUDA_MEM_SET_ACCESS, 0, CUDA_ERROR_UNKNOWN, status_code::internal_error,
                       "cuMemSetAccess"});
        INFO("fault in call " << fault.call);
        const fake_cuda_counts before = fake.counts();
        fake.fail(fault.call, fault.successes, 1, fault.code);
        // Chunk 0, then chunks 2-4: the second gap fails; the first stays committed.
        auto refused = backing.commit(live, {0, 5 * chunk});
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == fault.expected);
        CHECK_THAT(refused.error().message, Catch::Contains(fault.named));
        const fake_cuda_counts after = fake.counts();
        if (fault.call == FAKE_CUDA_MEM_SET_ACCESS) {
            CHECK(value_or_fail(backing.mapped_bytes(live)) == chunk); // the first gap failed
            CHECK(after.handles == before.handles);
        } else {
            CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * chunk); // chunks 0 and 1
            CHECK(after.handles == before.handles + 1);
        }
        CHECK(after.mappings == after.handles);
        CHECK(after.device_bytes == after.handles * chunk);
        // Nothing is stuck: the same commit now succeeds.
        REQUIRE(backing.commit(live, {0, 5 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 5 * chunk);
        REQUIRE(vmm.release(live));
    });
}

TEST_CASE("a reservation the driver refuses is OUT_OF_MEMORY or INTERNAL_ERROR, nothing recorded",
          "[cuda][vmm][faults]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        fake.fail(FAKE_CUDA_MEM_ADDRESS_RESERVE, 0, 1);
        auto refused = vmm.allocate(chunk, 1);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::out_of_memory);
        CHECK_THAT(refused.error().message, Catch::Contains("cuMemAddressReserve of 2097152 bytes"));
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
        auto absurd = vmm.allocate(UINT64_MAX - 5, 1);
        REQUIRE_FALSE(absurd);
        CHECK(absurd.error().code == status_code::out_of_memory);
    });
}

TEST_CASE("a decommit the driver refuses keeps the chunk committed and says so",
          "[cuda][vmm][faults]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        const auto live = value_or_fail(vmm.allocate(4 * chunk, chunk));
        REQUIRE(backing.commit(live, {0, 4 * chunk}));
        fake.fail(FAKE_CUDA_MEM_UNMAP, 2, 1, CUDA_ERROR_UNKNOWN);
        auto refused = backing.decommit(live, {0, 4 * chunk});
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::internal_error);
        CHECK_THAT(refused.error().message, Catch::Contains("cuMemUnmap"));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 2 * chunk); // two went, two stay
        CHECK(fake.counts().mappings == 2);
        REQUIRE(backing.decommit(live, {0, 4 * chunk}));
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);
        REQUIRE(vmm.release(live));
    });
}

TEST_CASE("a release the driver refuses in part is quarantined, and the residue freed at close",
          "[cuda][vmm][faults][release]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        const auto live = value_or_fail(vmm.allocate(4 * chunk, chunk));
        REQUIRE(backing.commit(live, {0, 3 * chunk}));
        fake.fail(FAKE_CUDA_MEM_UNMAP, 1, 1, CUDA_ERROR_UNKNOWN); // the second chunk stays
        const release_report report = value_or_fail(vmm.release(live));
        CHECK(report.state == release_state::quarantined);
        CHECK(report.unmapped_bytes == 2 * chunk);
        CHECK(report.residual_owned_bytes == chunk);
        CHECK(vmm.quarantined_bytes() == chunk);
        const allocator_usage kept_usage = value_or_fail(vmm.query_usage());
        CHECK(kept_usage.live_allocations == 0);
        CHECK(kept_usage.mapped_bytes == 0);
        CHECK(kept_usage.quarantined_bytes == chunk);
        CHECK(value_or_fail(module->readiness()).plugin.allocations == 0);
        CHECK(fake.counts().reservations == 1); // the range is kept, never reissued
        CHECK(fake.counts().mappings == 1);

        SECTION("only the address range is kept") {
            const auto other = value_or_fail(vmm.allocate(chunk, chunk));
            fake.fail(FAKE_CUDA_MEM_ADDRESS_FREE, 0, 1, CUDA_ERROR_UNKNOWN);
            const release_report kept = value_or_fail(vmm.release(other));
            CHECK(kept.state == release_state::quarantined);
            CHECK(kept.unmapped_bytes == 0);
            CHECK(kept.residual_owned_bytes == chunk); // the reserved range
        }
    }); // with_cuda_plugin finds the fake idle: the allocator gave the residue back at close
}

TEST_CASE("queued releases retire at the next drain, in order, crediting their bytes",
          "[cuda][vmm][release]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm");
        auto backing = value_or_fail(vmm.virtual_backing());
        std::vector<std::uint64_t> tickets;
        for (std::uint64_t chunks = 1; chunks <= 3; ++chunks) {
            const auto live = value_or_fail(vmm.allocate(chunks * chunk, chunk));
            REQUIRE(backing.commit(live, {0, chunks * chunk}));
            tickets.push_back(value_or_fail(vmm.enqueue_release(live)));
        }
        CHECK(value_or_fail(module->readiness()).plugin.queued_releases == 3);
        CHECK(value_or_fail(vmm.query_usage()).live_allocations == 3); // queued ones count
        CHECK(value_or_fail(vmm.query_usage()).mapped_bytes == 6 * chunk);
        CHECK(fake.counts().device_bytes == 6 * chunk); // queued memory is still held
        const auto completions = value_or_fail(vmm.drain_releases());
        REQUIRE(completions.size() == 3);
        for (std::size_t i = 0; i < completions.size(); ++i) {
            CHECK(completions[i].ticket == tickets[i]);
            CHECK(completions[i].report.state == release_state::complete);
            CHECK(completions[i].report.unmapped_bytes == (i + 1) * chunk);
        }
        CHECK(fake.counts().device_bytes == 0);
    });
}
