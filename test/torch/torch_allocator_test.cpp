// PyTorch's CPU tensors served by the posix plugin through nxmem::pytorch::cpu_allocator (issue 22):
// the same model gives the same bits as with PyTorch's allocator, every tensor made after the
// install comes from the plugin, and everything goes back when the tensors die.
//
// Installations are immortal and global, so the sections run in the order written, in one
// process: the reference run with PyTorch's own allocator comes first.
#include "torch_installation.hpp"
#include "transformer_workload.hpp"

#include <catch2/catch.hpp>

#include <nxmem/heap_allocator.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

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

// oneDNN's convolution (aten::mkldnn_convolution, what PyTorch's default CPU convolution runs)
// at batch 4: oneDNN allocates its scratch memory through c10's raw_allocate/raw_deallocate, which
// require a DataPtr whose context is its data pointer. Returns the output's bytes.
std::vector<unsigned char> onednn_convolution() {
    ::torch::manual_seed(1);
    const at::Tensor input = ::torch::randn({4, 3, 32, 32});
    const at::Tensor weight = ::torch::randn({16, 3, 3, 3});
    const at::Tensor bias = ::torch::randn({16});
    at::Tensor output = at::mkldnn_convolution(input, weight, bias, {1, 1}, {1, 1}, {1, 1}, 1).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(output.data_ptr());
    return {bytes, bytes + output.nbytes()};
}

const std::vector<unsigned char>& reference_convolution() {
    static const std::vector<unsigned char> bytes = onednn_convolution(); // PyTorch's allocator
    return bytes;
}

} // namespace

TEST_CASE("the model gives the same bits through nxmem as through PyTorch's allocator, and the "
          "plugin gets everything back", "[torch]") {
    at::set_num_threads(1);
    const auto& reference = reference_outcome();
    REQUIRE(at::hasMKLDNN());
    REQUIRE(at::globalContext().userEnabledMkldnn()); // PyTorch's default, left on
    REQUIRE(onednn_convolution() == reference_convolution()); // reproducible on PyTorch's own
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
                // Direct mode used to abort here (raw_allocate's context == data assertion).
                CHECK(onednn_convolution() == reference_convolution());
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
        CHECK(plugin->query_usage().value().live_allocations == 1);
    }
    CHECK(plugin->query_usage().value().live_allocations == 0);
    CHECK(adapter.failed_releases() == 0);
}

TEST_CASE("a plugin allocator used directly gives DataPtrs whose context is their data, and c10's "
          "raw interface works", "[torch]") {
    auto module = host::plugin_module::load(posix_plugin()).value();
    auto plugin = std::make_shared<host::plugin_allocator<cpu_device>>(
        host::open_allocator<cpu_device>(module, "posix-eager").value());
    STATIC_REQUIRE_FALSE(pytorch::releases_by_address<host::plugin_allocator<cpu_device>>);
    auto& adapter = pytorch::cpu_allocator<host::plugin_allocator<cpu_device>>::create(plugin);
    {
        c10::DataPtr tensor_memory = adapter.allocate(5000);
        CHECK(tensor_memory.get() == tensor_memory.get_context()); // what raw_allocate asserts
        CHECK(tensor_memory.get_deleter() == adapter.raw_deleter());
    }
    REQUIRE(adapter.raw_deleter() != nullptr); // raw_deallocate asserts it
    // oneDNN's way: raw_allocate, then raw_deallocate with the pointer alone, in any order.
    std::vector<void*> raw;
    for (std::size_t bytes : {1u, 3000u, 1u << 20, 64u}) {
        raw.push_back(adapter.raw_allocate(bytes));
        REQUIRE(raw.back() != nullptr);
    }
    CHECK(plugin->query_usage().value().live_allocations == raw.size());
    adapter.raw_deallocate(raw[2]);
    adapter.raw_deallocate(raw[0]);
    adapter.raw_deallocate(raw[3]);
    adapter.raw_deallocate(raw[1]);
    CHECK(plugin->query_usage().value().live_allocations == 0);
    CHECK(adapter.failed_releases() == 0);
    // An address it never handed out (another allocator's memory, which c10 routes to the current
    // allocator's raw_deallocate) is counted as a failed release and left alone.
    alignas(64) static unsigned char foreign[64];
    adapter.raw_deallocate(foreign);
    CHECK(adapter.failed_releases() == 1);
    adapter.raw_deallocate(raw[0]); // released already
    CHECK(adapter.failed_releases() == 2);
    CHECK(plugin->query_usage().value().live_allocations == 0);
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

TEST_CASE("NXMEM_TORCH_POOLED reads the usual spellings of true and false and refuses the rest", "[torch]") {
    for (const char* pooled : {"1", "true", "TRUE", "yes", "Yes", "on", "ON", ""}) {
        INFO(pooled);
        CHECK(installation::pooled_from_environment(pooled));
    }
    CHECK(installation::pooled_from_environment(nullptr)); // unset: the default
    for (const char* direct : {"0", "false", "False", "no", "NO", "off", "Off"}) {
        INFO(direct);
        CHECK_FALSE(installation::pooled_from_environment(direct));
    }
    for (const char* unreadable : {"2", "maybe", " 0", "fals", "offf"}) {
        INFO(unreadable);
        CHECK_THROWS_WITH(installation::pooled_from_environment(unreadable),
                          Catch::Contains(std::string("NXMEM_TORCH_POOLED=") + unreadable + " is neither"));
    }
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

// Run on its own (the Meson test `torch adapter limit`): it uses up every adapter the process can
// have.
TEST_CASE("the 17th adapter is refused with a message that says why, and an install is refused "
          "before it loads anything", "[torch-limit]") {
    REQUIRE(pytorch::cpu_allocator_limit == 16);
    REQUIRE(pytorch::cpu_allocators_left() == 16);
    auto heap = std::make_shared<heap_allocator>();
    for (std::size_t made = 0; made < 16; ++made) {
        pytorch::cpu_allocator<heap_allocator>::create(heap);
    }
    CHECK(pytorch::cpu_allocators_left() == 0);
    const std::string limit = "already has 16 nxmem PyTorch allocators";
    const std::string why = "each install makes one that lives until the process exits";
    CHECK_THROWS_WITH(pytorch::cpu_allocator<heap_allocator>::create(heap),
                      Catch::Contains(limit) && Catch::Contains(why));
    CHECK(pytorch::cpu_allocators_left() == 0); // a refused claim takes nothing
    // Refused before the plugin is loaded: the path is never tried.
    CHECK_THROWS_WITH(installation::install("/nonexistent/plugin.so", "posix-eager", "", false),
                      Catch::Contains(limit) && Catch::Contains(why) && !Catch::Contains("cannot load"));
}
