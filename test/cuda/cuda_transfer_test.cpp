// The transfer layer and GPU memory on the fake driver (docs/TRANSFER.md, "Device memory"): a
// cuda-plugin allocation, opened through the host, is described as memory kind `device` with its
// device index; registering it is refused with UNSUPPORTED_CAPABILITY naming what is missing (the
// fake's device memory is mapped in this process, so handing it to UCX as host memory would
// "work": that must not happen), nothing is leased, and a transfer naming it is refused.
#include "cuda_support.hpp"

#include <nxmem/transfer.hpp>

#include <cstring>
#include <vector>

using namespace nxmem;
using nxmem::test::fake_driver;
using nxmem::test::open_or_fail;
using nxmem::test::value_or_fail;

namespace {

// Whether UCX here reaches CUDA memory at all (a cuda transport among its memory domains): the
// oracle for which refusal the agent must give.
bool ucx_reaches_cuda() {
    ucp_config_t* config = nullptr;
    REQUIRE(ucp_config_read(nullptr, nullptr, &config) == UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    ucp_context_h context = nullptr;
    const ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    REQUIRE(status == UCS_OK);
    ucp_context_attr_t attributes{};
    attributes.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    REQUIRE(ucp_context_query(context, &attributes) == UCS_OK);
    ucp_cleanup(context);
    return (attributes.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

} // namespace

TEST_CASE("a cuda allocation is device memory to the transfer layer: described with its device, never "
          "registered as host memory",
          "[cuda][transfer]") {
    fake_cuda_config two = fake_driver::defaults();
    two.devices = 2;
    test::with_cuda_plugin(&two, [&](fake_driver&, const test::module_ptr& module) {
        for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
            INFO("mechanism " << mechanism);
            auto gpu = open_or_fail<cuda_device>(module, mechanism, 1);
            const allocation<cuda_device> live = value_or_fail(gpu.allocate(1 << 20, 4096));
            if (std::string(mechanism) == "cuda-vmm") {
                value_or_fail(value_or_fail(gpu.virtual_backing()).commit(live, byte_range{0, live.size}));
            }

            const transfer::descriptor described = transfer::describe(live);
            CHECK(described.kind == transfer::memory_kind::device);
            CHECK(described.device == 1);
            CHECK(described.address == live.address.value);
            CHECK(described.length == live.size);

            // UCX's choice of transports: a cuda transport, where this UCX has one, is among them.
            auto agent = value_or_fail(transfer::agent::start({"gpu-side", "", false}));
            const result<transfer::registration> refused = agent.register_allocation(gpu, live);
            REQUIRE_FALSE(refused);
            CHECK(refused.error().code == status_code::unsupported_capability);
            CHECK_THAT(refused.error().message, Catch::Contains("cuda:1 memory (1048576 bytes at 0x"));
            if (ucx_reaches_cuda()) {
                CHECK_THAT(refused.error().message, Catch::Contains("its device path is a design, not built"));
            } else {
                CHECK_THAT(refused.error().message,
                           Catch::Contains("this UCX has no cuda transport (cuda_copy, cuda_ipc)"));
            }
            // Nothing registered, nothing leased: the allocation releases at once.
            CHECK(agent.registration_count() == 0);
            CHECK(value_or_fail(module->readiness()).host.registrations == 0);

            // A transfer whose local block is the device allocation is refused before anything is
            // issued, against a peer with a host region of the same length.
            std::vector<std::byte> host_memory(live.size);
            auto host_side = value_or_fail(transfer::agent::start({"host-side", "tcp", false}));
            auto registered = value_or_fail(host_side.register_memory(host_memory.data(), host_memory.size()));
            auto gpu_agent = value_or_fail(transfer::agent::start({"gpu-reader", "tcp", false}));
            auto peer = value_or_fail(gpu_agent.connect(value_or_fail(host_side.metadata())));
            value_or_fail(peer.load_regions(value_or_fail(host_side.export_regions({&registered}))));
            transfer::descriptor_list local;
            value_or_fail(local.add(described));
            transfer::descriptor_list remote;
            value_or_fail(remote.add(value_or_fail(registered.describe(0, live.size))));
            const result<transfer::transfer_request> read = gpu_agent.read(peer, local, remote);
            REQUIRE_FALSE(read);
            CHECK(read.error().code == status_code::unsupported_capability);
            CHECK_THAT(read.error().message, Catch::Contains("block 0 is device memory"));
            peer.disconnect(true);

            CHECK(value_or_fail(gpu.release(live)).state == release_state::complete);
        }
    });
}
