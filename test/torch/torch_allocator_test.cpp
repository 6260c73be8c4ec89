// PyTorch's CPU tensors served by the posix plugin through nxmem::pytorch::cpu_allocator (issue 22):
// the same model gives the same bits as with PyTorch's allocator, every tensor made after the
// install comes from the plugin, and everything goes back when the tensors die.
//
// Installations are immortal and global, so the sections run in the order written, in one
// process: the reference run with PyTorch's own allocator comes first.
#include "torch_installation.hpp"
#include "transformer_workload.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <thread>

namespace {

using namespace nxmem;
using nxmem::torch_engine::installation;
using nxmem::torch_engine::installed_allocator;

std::string posix_plugin() {
    const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
    REQUIRE(path != nullptr);
    return path;
}

std::uint64_t figure(const installed_allocator& installed, const std::string& name) {
    for (const auto& [key, value] : installed.usage()) {
        if (key == name) {
            return value;
        }
    }
    FAIL("no usage figure called " << name);
    return 0;
}

// Every tensor a workload holds (outputs, parameters, gradients, the optimizer's momenta).
void require_all_served_by(const installed_allocator& installed,
                           const torch_engine::transformer_workload& workload, const at::Tensor& output) {
    CHECK(installed.owns(output.storage().data_ptr()));
    CHECK(installed.owns(workload.input().storage().data_ptr()));
    for (const at::Tensor& weight : workload.parameters()) {
        CHECK(installed.owns(weight.storage().data_ptr()));
        REQUIRE(weight.grad().defined());
        CHECK(installed.owns(weight.grad().storage().data_ptr()));
    }
}

const torch_engine::workload_outcome& reference_outcome() {
    // Made before any installation: PyTorch's own allocator.
    static const torch_engine::workload_outcome outcome = torch_engine::run_workload(torch_engine::small_transformer, 3);
    return outcome;
}

} // namespace

TEST_CASE("the model gives the same bits through nxmem as through PyTorch's allocator, and the "
          "plugin gets everything back", "[torch]") {
    at::set_num_threads(1);
    const auto& reference = reference_outcome();
    c10::Allocator* pytorch_allocator = c10::GetCPUAllocator();
    at::Tensor made_before = torch::ones({1024});

    for (const char* mechanism : {"posix-eager", "posix-lazy"}) {
        for (bool pooled : {false, true}) {
            DYNAMIC_SECTION(mechanism << (pooled ? " pooled" : " direct")) {
                installed_allocator& installed =
                    installation::install(posix_plugin(), mechanism, "", pooled);
                REQUIRE(c10::GetCPUAllocator() == &installed.allocator());
                CHECK_FALSE(installed.owns(made_before.storage().data_ptr()));
                {
                    torch_engine::transformer_workload workload(torch_engine::small_transformer);
                    at::Tensor output = workload.forward();
                    workload.train_step();
                    require_all_served_by(installed, workload, output);
                    CHECK(figure(installed, "plugin_live_allocations") > 0);
                    // The plugin's unload is refused while a tensor lives, the host counting
                    // what the tensors hold from it.
                    CHECK(installed.module()->readiness().value().host.allocations > 0);
                    auto unload = installed.module()->try_unload();
                    REQUIRE_FALSE(unload.has_value());
                    CHECK_THAT(unload.error().describe(), Catch::Contains("allocations"));
                }
                {
                    const torch_engine::workload_outcome through_nxmem =
                        torch_engine::run_workload(torch_engine::small_transformer, 3);
                    CHECK(through_nxmem.bitwise_equal(reference));
                    CHECK(installed.owns(through_nxmem.output.storage().data_ptr()));
                }
                // The tensors are gone: once the pool is trimmed the plugin holds nothing.
                installed.trim();
                // The pool over posix-lazy keeps one reservation (address space, nothing mapped).
                const bool reserves = pooled && std::string(mechanism) == "posix-lazy";
                CHECK(figure(installed, "plugin_live_allocations") == (reserves ? 1 : 0));
                CHECK(figure(installed, "plugin_mapped_bytes") == 0);
                CHECK(figure(installed, "failed_releases") == 0);
                if (pooled) {
                    CHECK(figure(installed, "pool_live_allocations") == 0);
                    CHECK(figure(installed, "pool_held_bytes") == 0);
                }
                CHECK(installed.module()->readiness().value().host.allocations == (reserves ? 1 : 0));

                installation::uninstall();
                CHECK(c10::GetCPUAllocator() == pytorch_allocator);
            }
        }
    }
    // The tensor made before the first installation still has PyTorch's deleter.
    CHECK(made_before.sum().item<float>() == 1024.0f);
}

TEST_CASE("a tensor outlives the uninstall and is released by its own allocator", "[torch]") {
    installed_allocator& installed = installation::install(posix_plugin(), "posix-eager", "", false);
    at::Tensor survivor = torch::full({4096}, 2.0f);
    installation::uninstall();
    at::Tensor after = torch::full({4096}, 3.0f);
    CHECK(installed.owns(survivor.storage().data_ptr()));
    CHECK_FALSE(installed.owns(after.storage().data_ptr()));
    CHECK(figure(installed, "plugin_live_allocations") == 1);
    survivor.reset();
    CHECK(figure(installed, "plugin_live_allocations") == 0);
}

TEST_CASE("size 0 allocates nothing and its DataPtr is deleted safely", "[torch]") {
    auto module = host::plugin_module::load(posix_plugin()).value();
    auto plugin = std::make_shared<host::plugin_allocator<cpu_device>>(
        host::open_allocator<cpu_device>(module, "posix-eager").value());
    auto& adapter = pytorch::cpu_allocator<host::plugin_allocator<cpu_device>>::create(plugin);
    {
        c10::DataPtr empty = adapter.allocate(0);
        CHECK(empty.get() == nullptr);
        CHECK(plugin->query_usage().value().live_allocations == 0);
        CHECK_FALSE(adapter.owns(empty));
    }
    {
        c10::DataPtr one = adapter.allocate(1);
        REQUIRE(one.get() != nullptr);
        CHECK(reinterpret_cast<std::uintptr_t>(one.get()) % pytorch::tensor_alignment == 0);
        CHECK(adapter.owns(one));
        CHECK(one.get_context() != one.get()); // the context is the allocation's record
        CHECK(plugin->query_usage().value().live_allocations == 1);
    }
    CHECK(plugin->query_usage().value().live_allocations == 0);
    // Direct use of a plugin allocator cannot release by address: c10's raw interface is off.
    STATIC_REQUIRE_FALSE(pytorch::releases_by_address<host::plugin_allocator<cpu_device>>);
    CHECK(adapter.raw_deleter() == nullptr);
}

TEST_CASE("over a pool the context is the data pointer and c10's raw interface works", "[torch]") {
    auto module = host::plugin_module::load(posix_plugin()).value();
    auto pool = host::open_pooled_allocator<cpu_device>(module, "posix-eager").value();
    using pool_type = pool_allocator<host::plugin_allocator<cpu_device>>;
    STATIC_REQUIRE(pytorch::releases_by_address<pool_type>);
    auto& adapter = pytorch::cpu_allocator<pool_type>::create(pool);
    REQUIRE(adapter.raw_deleter() != nullptr);
    void* raw = adapter.raw_allocate(3000);
    REQUIRE(raw != nullptr);
    CHECK(pool->usage().live_allocations == 1);
    adapter.raw_deallocate(raw);
    CHECK(pool->usage().live_allocations == 0);
    c10::DataPtr empty = adapter.allocate(0);
    CHECK(empty.get() == nullptr);
    CHECK(pool->usage().live_allocations == 0);
}

TEST_CASE("threads allocate and free tensors through one adapter at once", "[torch]") {
    installed_allocator& installed = installation::install(posix_plugin(), "posix-eager", "", true);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([t] {
            for (int i = 0; i < 200; ++i) {
                at::Tensor x = torch::full({(i % 7 + 1) * 1000}, static_cast<float>(t));
                if (x.sum().item<float>() != static_cast<float>(t * (i % 7 + 1) * 1000)) {
                    std::abort();
                }
            }
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    installation::uninstall();
    installed.trim();
    CHECK(figure(installed, "plugin_mapped_bytes") == 0);
    CHECK(figure(installed, "failed_releases") == 0);
}

TEST_CASE("a bad install raises with the reason and leaves PyTorch's allocator working", "[torch]") {
    c10::Allocator* before = c10::GetCPUAllocator();
    CHECK_THROWS_WITH(installation::install("/nonexistent/plugin.so", "posix-eager", "", true),
                      Catch::Contains("cannot load /nonexistent/plugin.so"));
    CHECK_THROWS_WITH(installation::install(posix_plugin(), "no-such-mechanism", "", false),
                      Catch::Contains("no mechanism called 'no-such-mechanism'"));
    CHECK(c10::GetCPUAllocator() == before);
    CHECK(torch::ones({16}).sum().item<float>() == 16.0f);
}

// A tensor that lives until the process exits: its deleter runs during static destruction, after
// main returned; the installation it needs is immortal, so this must exit cleanly (meson checks
// the exit status of the whole process).
namespace {
at::Tensor lives_until_exit;
}
TEST_CASE("a tensor alive at exit is released during static destruction", "[torch][exit]") {
    installation::install(posix_plugin(), "posix-lazy", "", true);
    lives_until_exit = torch::full({1 << 20}, 1.0f);
    installation::uninstall();
    CHECK(lives_until_exit.sum().item<float>() == static_cast<float>(1 << 20));
}
