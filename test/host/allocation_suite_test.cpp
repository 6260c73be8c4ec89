// One suite of allocate/release checks, run for every conforming mechanism and every device tag
// it serves: the same checks whatever implements the mechanism. The checks themselves are the
// conformance suite's (include/nxmem/conform/checks_allocation.hpp), so `nxmem conform` and these
// tests can never drift apart.
#include "../support/loaded.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/conform.hpp>
#include <nxmem/host.hpp>

#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

using namespace nxmem;
using nxmem::test::load_or_fail;

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

// Runs the named conformance checks; each must pass, or not apply where `may_not_apply` says so.
void require_checks(const conform::subject& target, std::initializer_list<std::string_view> ids,
                    std::string_view may_not_apply = {}) {
    for (const conform::check_result& result : conform::run_checks(target, ids)) {
        INFO(result.id << " (" << result.title << "): expected " << result.expected << ", got "
                       << result.actual);
        if (result.id == may_not_apply) {
            CHECK_FALSE(result.failed());
        } else {
            CHECK(result.passed());
        }
    }
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
    const std::string path = test::plugin_path(mechanism.plugin_variable);
    const conform::subject target{path, mechanism.name, device_id{D::type, 0}};
    // Sizes from 1 byte to 1 MiB at alignments from 1 to 64 KiB: aligned, host-assigned monotonic
    // ids, writable over the whole size (host memory only), disjoint, counted by both tallies and
    // released; host memory is written, opaque device addresses are not.
    require_checks(target,
                   {"allocation.basic", "allocation.sizes_alignments", "allocation.writable",
                    "allocation.no_overlap", "allocation.accounting"},
                   std::is_same_v<D, cpu_device> ? std::string_view{} : "allocation.writable");
    auto module = load_or_fail(path);
    CHECK(test::value_or_fail(module->readiness()).ready());
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
    const conform::subject target{test::plugin_path(mechanism.plugin_variable), mechanism.name,
                                  device_id{D::type, 0}};
    // Size 0 and alignments 0, 3 and 48 are refused with INVALID_ARGUMENT by the plugin itself
    // (the raw slot, past the host), and nothing is allocated.
    require_checks(target, {"allocation.malformed", "misuse.unknown_flags", "misuse.request_tail"});
}
