// Opening the cuda mechanisms: without a driver the plugin still loads, lists its mechanisms and
// unloads, and every open that cannot work fails with a status that names why (no driver, no
// device, an ordinal the driver lacks, a driver too old, no virtual memory management), leaking
// nothing. An open allocator holds the device's primary context, and only while it lives.
#include "cuda_support.hpp"

#include <string>

using namespace nxmem;
using nxmem::test::fake_driver;
using nxmem::test::load_or_fail;
using nxmem::test::open_or_fail;
using nxmem::test::scoped_environment;
using nxmem::test::value_or_fail;

namespace {

// Opens `mechanism` on cuda:`index`; requires it to fail with `code` and a message holding each
// of `named`; requires the module to be idle and to unload after.
void require_refused(const std::string& mechanism, std::int32_t index, status_code code,
                     std::initializer_list<std::string> named) {
    INFO("mechanism " << mechanism << " on cuda:" << index);
    auto module = load_or_fail(test::cuda_plugin_path());
    auto refused = host::open_allocator<cuda_device>(module, mechanism, index);
    REQUIRE_FALSE(refused);
    INFO(refused.error().describe());
    CHECK(refused.error().code == code);
    CHECK_THAT(refused.error().message, Catch::Contains(mechanism + " on cuda:" + std::to_string(index) + ": "));
    for (const std::string& word : named) {
        CHECK_THAT(refused.error().message, Catch::Contains(word));
    }
    CHECK(value_or_fail(module->readiness()).ready());
    REQUIRE(module->try_unload());
    module.reset();
    CHECK_FALSE(test::is_mapped(test::cuda_plugin_path()));
}

} // namespace

TEST_CASE("without a driver the plugin loads, lists its mechanisms, refuses to open and unloads",
          "[cuda][driver]") {
    const std::string missing = "/nonexistent/libcuda.so.1";
    scoped_environment no_driver("NXMEM_CUDA_DRIVER", missing);
    {
        auto module = load_or_fail(test::cuda_plugin_path());
        REQUIRE(module->factories().size() == 2);
        for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
            const host::factory_info* factory = module->find_factory(mechanism);
            REQUIRE(factory != nullptr);
            CHECK(factory->serves(NXMEM_DEVICE_CUDA));
            CHECK_FALSE(factory->serves(NXMEM_DEVICE_CPU));
        }
        REQUIRE(module->try_unload());
    }
    CHECK_FALSE(test::is_mapped(test::cuda_plugin_path()));
    for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
        require_refused(mechanism, 0, status_code::wrong_device, {"no CUDA driver", missing});
    }
}

TEST_CASE("a library that is not a CUDA driver is refused by name", "[cuda][driver]") {
    scoped_environment not_a_driver("NXMEM_CUDA_DRIVER", "libm.so.6");
    for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
        require_refused(mechanism, 0, status_code::wrong_device,
                        {"no CUDA driver", "libm.so.6 exports no cuDriverGetVersion"});
    }
}

TEST_CASE("a cpu device is refused before the driver is touched", "[cuda][driver]") {
    fake_driver fake;
    auto module = load_or_fail(test::cuda_plugin_path());
    auto refused = host::open_allocator<cpu_device>(module, "cuda-vmm", 0);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code == status_code::wrong_device);
    CHECK(fake.counts().primary_retains == 0);
    REQUIRE(module->try_unload());
}

TEST_CASE("every open that cannot work names why and leaks nothing", "[cuda][driver]") {
    const std::string mechanism = GENERATE(as<std::string>{}, "cuda-eager", "cuda-vmm");
    SECTION("no device") {
        fake_cuda_config none = fake_driver::defaults();
        none.devices = 0;
        fake_driver fake(&none);
        require_refused(mechanism, 0, status_code::wrong_device,
                        {"no CUDA device", "cuInit", "CUDA_ERROR_NO_DEVICE"});
        fake.require_idle();
    }
    SECTION("an ordinal the driver does not have") {
        fake_driver fake;
        require_refused(mechanism, 3, status_code::wrong_device, {"device 3 of 1"});
        require_refused(mechanism, -1, status_code::wrong_device, {"negative index"}); // the kit refuses it (Q16)
        fake.require_idle();
    }
    SECTION("a driver older than the plugin needs") {
        fake_cuda_config old = fake_driver::defaults();
        old.driver_version = 11040;
        fake_driver fake(&old);
        require_refused(mechanism, 0, status_code::version_mismatch,
                        {"version 11.4", "older than the CUDA 12.0"});
        fake.require_idle();
    }
    SECTION("the primary context cannot be retained") {
        fake_driver fake;
        fake.fail(FAKE_CUDA_PRIMARY_CTX_RETAIN, 0, 1, CUDA_ERROR_UNKNOWN);
        require_refused(mechanism, 0, status_code::internal_error,
                        {"cuDevicePrimaryCtxRetain failed", "CUDA_ERROR_UNKNOWN"});
        fake.require_idle();
    }
}

TEST_CASE("a device without virtual memory management serves cuda-eager only", "[cuda][driver]") {
    fake_cuda_config no_vmm = fake_driver::defaults();
    no_vmm.vmm_supported = 0;
    fake_driver fake(&no_vmm);
    require_refused("cuda-vmm", 0, status_code::wrong_device,
                    {"does not support virtual memory management"});
    auto module = load_or_fail(test::cuda_plugin_path());
    {
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager");
        REQUIRE(eager.release(value_or_fail(eager.allocate(4096, 256))));
    }
    REQUIRE(module->try_unload());
    fake.require_idle();
}

TEST_CASE("an allocator holds the primary context of its device from open to close",
          "[cuda][driver]") {
    fake_cuda_config two = fake_driver::defaults();
    two.devices = 2;
    test::with_cuda_plugin(&two, [&](fake_driver& fake, const test::module_ptr& module) {
        auto eager = open_or_fail<cuda_device>(module, "cuda-eager", 1);
        CHECK(eager.device() == device_id{NXMEM_DEVICE_CUDA, 1});
        CHECK(fake.counts().primary_retains == 1);
        {
            auto vmm = open_or_fail<cuda_device>(module, "cuda-vmm", 0);
            CHECK(fake.counts().primary_retains == 2);
            REQUIRE(vmm.release(value_or_fail(vmm.allocate(1, 1))));
        }
        CHECK(fake.counts().primary_retains == 1);
        REQUIRE(eager.release(value_or_fail(eager.allocate(1, 1))));
        // Every driver call ran with the context pushed, and popped again.
        CHECK(fake.context_depth() == 0);
        CHECK(fake.counts().calls_without_context == 0);
    });
}

TEST_CASE("options that do not parse or that nobody knows are refused by name",
          "[cuda][options][bad-input]") {
    const std::string mechanism = GENERATE(as<std::string>{}, "cuda-eager", "cuda-vmm");
    INFO("mechanism " << mechanism);
    fake_driver fake;
    auto module = load_or_fail(test::cuda_plugin_path());
    for (const char* bad : {"budget=lots", "budget=0", "huge_pages=1", "budget=1M;colour=blue"}) {
        INFO("options '" << bad << "'");
        auto refused = host::open_allocator<cuda_device>(module, mechanism, 0, bad);
        REQUIRE_FALSE(refused);
        CHECK(refused.error().code == status_code::invalid_argument);
    }
    CHECK(fake.counts().primary_retains == 0); // each refusal let go of what it took
    CHECK(host::open_allocator<cuda_device>(module, mechanism, 0, "budget=64M"));
    REQUIRE(module->try_unload());
    fake.require_idle();
}
