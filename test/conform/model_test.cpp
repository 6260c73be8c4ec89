// The model check (model.sequences, include/nxmem/conform/model/) against slips planted one per
// class in the production posix-lazy mechanism (fixtures/model_slips_plugin.cpp): each must fail
// model.sequences, with a message that names the step and blames the figure, and fail nothing it
// does not break; the same seed replays the same failure. The conforming mechanisms pass it in
// test/conform/suite_test.cpp, which runs every check.
#include "../support/conform_results.hpp"

#include <nxmem/conform.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <string>

using namespace nxmem;

namespace {

std::string slips_path() {
    const char* path = std::getenv("NXMEM_MODEL_SLIPS_PLUGIN");
    REQUIRE(path != nullptr);
    return path;
}

} // namespace

TEST_CASE("each planted slip fails model.sequences, naming the step and the figure", "[conform][model]") {
    struct expectation {
        const char* mechanism;
        std::set<std::string> failures; // exactly these checks fail
        const char* blamed;              // the message names this
    };
    const expectation slip = GENERATE(
        expectation{"usage-skips-queued", {"model.sequences"}, "NxmemAllocatorUsage.live_allocations"},
        expectation{"private-prefix", {"capability.ipc", "model.sequences"}, "each sharer got a copy"},
        // The address may fall aligned by chance; then the release or mapped_bytes is blamed.
        expectation{"coarse-alignment", {"model.sequences"}, "(allocate)"},
        expectation{"short-request-accepted", {"model.sequences"}, "NxmemAllocation of struct_size"},
        expectation{"shared-totals", {"capability.ipc", "model.sequences"}, "NxmemAllocatorUsage."},
        expectation{"miscounted-drain", {"model.sequences"}, "*retired"},
        expectation{"lenient-prefix-retain", {"model.sequences", "capability.shared_mapping"}, "a prefix that is gone"},
        expectation{"clears-short-output", {"model.sequences"}, "too short for its baseline was written"},
        // Its completion inside enqueue_release also overtakes a fenced release queued before it (F4).
        expectation{"double-completion", {"model.sequences", "capability.deferred_release", "concurrency.threads",
                                              "callbacks.completion_enqueues", "capability.fenced_release"},
                    "NxmemUnloadReport.live_allocations"});
    INFO("mechanism " << slip.mechanism);
    // 20000 steps from seed 1 catch every slip; the default 5000 catch all but private-prefix,
    // whose fault shows only with two sharers of one prefix.
    conform::suite_options options;
    options.model_steps = 20000;
    const auto results =
        conform::run_mechanism_checks(slips_path(), slip.mechanism, device_id{NXMEM_DEVICE_CPU, 0}, options);
    INFO(test::failures_of(results));
    CHECK(test::failed_ids(results) == slip.failures);
    const conform::check_result& model = test::result_of(results, "model.sequences");
    CHECK_THAT(model.actual, Catch::Contains(slip.blamed));
    CHECK_THAT(model.actual, Catch::Contains("step "));
    CHECK_THAT(model.actual, Catch::Contains("replay: --seed 1 --steps 20000"));
    // Every figure the failure depends on is named: the steps before it, with their sizes (issue 35).
    CHECK_THAT(model.actual, Catch::Contains("{the steps before it: step 0 (open_allocator) on cpu:0 -> allocator #"));
    if (std::string(slip.mechanism) == "private-prefix") {
        CHECK_THAT(model.actual, Catch::Matches(".*commit_shared_prefix\\) of prefix #[0-9]+ \\([0-9]+ B, granule 4096\\) into "
                                                "allocation #[0-9]+ of allocator #[0-9]+ \\([0-9]+ B at alignment [0-9]+\\).*"));
    }
    if (std::string(slip.mechanism) == "double-completion") {
        // Blame (issue 23): a completion inside enqueue_release (D7) is no concurrent drain (D11).
        CHECK_THAT(test::result_of(results, "callbacks.completion_reentry").actual, !Catch::Contains("D11"));
    }
}

TEST_CASE("a model-check failure replays from its seed, and other seeds explore other sequences",
          "[conform][model]") {
    const conform::subject target{slips_path(), "miscounted-drain", device_id{NXMEM_DEVICE_CPU, 0}};
    conform::suite_options options;
    options.model_seed = 7;
    const auto first = conform::run_checks(target, {"model.sequences"}, options);
    const auto again = conform::run_checks(target, {"model.sequences"}, options);
    REQUIRE(first.size() == 1);
    REQUIRE(again.size() == 1);
    CHECK(first[0].failed());
    CHECK(first[0].actual == again[0].actual); // same seed, same shrunk sequence
    CHECK_THAT(first[0].actual, Catch::Contains("replay: --seed 7"));
    options.model_steps = 0;
    const auto none = conform::run_checks(target, {"model.sequences"}, options);
    CHECK(none[0].skipped());
}
