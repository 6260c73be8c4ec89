// The checks of issue 35's slip classes (edges, failure paths, options, outputs and statuses,
// precedence, borrowing, racing queries) against a fixture slip each (fixtures/slips_plugin.cpp):
// each slip fails the check of its class, naming what it did; and every production mechanism (the
// test plugin's conforming ones, posix, the C example, cuda on the fake driver) passes every one of
// them. The checks' rules, with the release they entered, are pinned in docs/ABI.md.
#include "../support/conform_results.hpp"
#include "../support/plugin_paths.hpp"

#include <nxmem/conform.hpp>
#include <nxmem/conform/detail/heap_fill_pause.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

// The checks this file is about.
const std::vector<std::string_view>& slip_checks() {
    static const std::vector<std::string_view> ids{
        "edges.sizes",       "edges.ranges",       "rollback.refused_calls",        "options.grammar",
        "outputs.every_path", "misuse.precedence", "statuses.untouched_on_success", "borrowing.after_open",
        "borrowing.request_cap", "concurrency.usage_consistent", "capability.deferred_release",
        "callbacks.completion_enqueues", "callbacks.reclaim_pressure", "options.numbers",
        "factories.fresh_after_release"};
    return ids;
}

std::vector<conform::check_result> run_slip_checks(const conform::subject& target,
                                                   const conform::suite_options& options = {}) {
    std::vector<conform::check_result> results;
    for (std::string_view id : slip_checks()) {
        const conform::check_definition* check = conform::find_check(id);
        REQUIRE(check != nullptr);
        results.push_back(conform::run_check(*check, target, options));
    }
    return results;
}

void require_passes(const std::string& path, const std::string& mechanism, device_id device,
                    const std::string& options = {}) {
    INFO("mechanism " << mechanism << " with options '" << options << "'");
    conform::suite_options suite;
    suite.mechanism_options = options;
    const auto results = run_slip_checks(conform::subject{path, mechanism, device, options}, suite);
    INFO(test::failures_of(results));
    CHECK(test::failed_ids(results).empty());
    std::size_t passed = 0;
    for (const auto& result : results) {
        passed += result.passed() ? 1 : 0;
    }
    CHECK(passed >= 6); // most of them apply to every mechanism
}

} // namespace

TEST_CASE("each planted slip fails the check of its class, naming what it did", "[conform][slips]") {
    const char* path = std::getenv("NXMEM_SLIPS_PLUGIN");
    REQUIRE(path != nullptr);
    struct expectation {
        const char* mechanism;
        const char* check;
        const char* options;
        const char* named; // the failure says this
    };
    const expectation slip = GENERATE(
        expectation{"truncated-size", "edges.sizes", "", "short of the size asked"},
        expectation{"wrapping-range", "edges.ranges", "", "offset + length wraps"},
        expectation{"leaky-budget", "rollback.refused_calls", "", "NxmemAllocatorUsage.reserved_bytes went from"},
        expectation{"counts-refused-open", "rollback.refused_calls", "", "NxmemUnloadReport.live_allocators went from"},
        expectation{"options-past-length", "options.grammar", "", "SIGSEGV"},
        expectation{"first-known-wins", "options.grammar", "mmap_threshold=64k", "the open succeeded"},
        expectation{"raw-echo", "options.grammar", "", "valid UTF-8 without control bytes"},
        expectation{"large-output-overrun", "outputs.every_path", "", "1048577 bytes"},
        expectation{"status-on-success", "statuses.untouched_on_success", "", "changed the status at offset"},
        expectation{"values-before-device", "misuse.precedence", "", "M10: the first fault"},
        expectation{"keeps-options", "borrowing.after_open", "mmap_threshold=64k", "SIGSEGV"},
        expectation{"writes-callbacks", "borrowing.after_open", "", "SIGSEGV"},
        expectation{"scans-above-cap", "borrowing.request_cap", "", "SIGSEGV"},
        expectation{"racy-usage", "concurrency.usage_consistent", "", "wrapped below zero"},
        expectation{"ticket-in-32-bits", "capability.deferred_release", "", "retired 4294967294 4294967295 0 1 2"},
        expectation{"budget-in-32-bits", "options.numbers", "budget=1M", "the number cut to 32 bits"},
        expectation{"drain-drops-new", "callbacks.completion_enqueues", "", "retired 4294967294 4294967295 4294967296"},
        expectation{"reclaim-charges-twice", "callbacks.reclaim_pressure", "", "the budget kept a charge"});
    INFO("mechanism " << slip.mechanism << ", check " << slip.check);
    conform::suite_options options;
    options.mechanism_options = slip.options;
    const conform::subject target{path, slip.mechanism, device_id{NXMEM_DEVICE_CPU, 0}, slip.options};
    const auto results = conform::run_checks(target, {slip.check}, options);
    REQUIRE(results.size() == 1);
    INFO(results[0].expected << " / " << results[0].actual);
    CHECK(results[0].failed());
    CHECK_THAT(results[0].expected + " " + results[0].actual, Catch::Contains(slip.named));
}

TEST_CASE("a factory table cleared on release and handed out again fails factories.fresh_after_release",
          "[conform][slips]") {
    const char* path = std::getenv("NXMEM_STALE_FACTORIES_PLUGIN");
    REQUIRE(path != nullptr);
    const conform::subject target{path, "minimal-c", device_id{NXMEM_DEVICE_CPU, 0}};
    const auto results = conform::run_checks(target, {"factories.fresh_after_release", "factories.names"});
    REQUIRE(results.size() == 2);
    INFO(results[0].expected << " / " << results[0].actual);
    CHECK(results[0].failed());
    CHECK_THAT(results[0].actual, Catch::Contains("type tag") && Catch::Contains("handed out again"));
    CHECK(results[1].passed()); // one list at a time is fine: only the second is stale
}

TEST_CASE("the production mechanisms pass every slip check", "[conform][slips]") {
    SECTION("the test plugin's conforming mechanisms") {
        for (const char* mechanism : {"eager", "legacy-1-0", "lazy"}) {
            require_passes(test::testplugin_path(), mechanism, device_id{NXMEM_DEVICE_CPU, 0});
        }
    }
    SECTION("the C example") {
        require_passes(test::minimal_c_plugin_path(), "minimal-c", device_id{NXMEM_DEVICE_CPU, 0});
    }
    SECTION("posix, plain and with options (a budget, the grammar fuzzed around them)") {
        const char* posix = std::getenv("NXMEM_POSIX_PLUGIN");
        if (posix == nullptr) {
            WARN("NXMEM_POSIX_PLUGIN is not set: posix not checked");
            return;
        }
        require_passes(posix, "posix-eager", device_id{NXMEM_DEVICE_CPU, 0});
        require_passes(posix, "posix-eager", device_id{NXMEM_DEVICE_CPU, 0}, "budget=8M;mmap_threshold=64k;populate=0");
        require_passes(posix, "posix-lazy", device_id{NXMEM_DEVICE_CPU, 0});
        require_passes(posix, "posix-lazy", device_id{NXMEM_DEVICE_CPU, 0}, "share=memfd");
    }
    SECTION("cuda on the fake driver") {
        const char* cuda = std::getenv("NXMEM_CUDA_PLUGIN");
        if (cuda == nullptr) {
            WARN("NXMEM_CUDA_PLUGIN is not set: cuda not checked");
            return;
        }
        for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
            require_passes(cuda, mechanism, device_id{NXMEM_DEVICE_CUDA, 0});
        }
    }
}

TEST_CASE("every slip check states the rule it proves and when that rule entered", "[conform][slips]") {
    STATIC_REQUIRE(!conform::check_edges_sizes::revision.host_needs_it);
    STATIC_REQUIRE(conform::check_rollback_refused_calls::revision.host_needs_it);
    for (const conform::check_revision& revision :
         {conform::check_edges_sizes::revision, conform::check_edges_ranges::revision,
          conform::check_rollback_refused_calls::revision, conform::check_options_grammar::revision,
          conform::check_outputs_every_path::revision, conform::check_statuses_untouched_on_success::revision,
          conform::check_misuse_precedence::revision, conform::check_borrowing_after_open::revision,
          conform::check_borrowing_request_cap::revision, conform::check_concurrency_usage_consistent::revision,
          conform::check_options_numbers::revision, conform::check_capability_copy::revision,
          conform::check_capability_fenced_release::revision}) {
        INFO(revision.rules);
        CHECK_FALSE(revision.rules.empty());
        CHECK(revision.entered == "2026-12-04");
        CHECK(revision.why_needed.size() > 20);
    }
    // Minor 4's tables bind the plugins that declare it; older ones have no such table.
    STATIC_REQUIRE(conform::check_capability_copy::revision.minor == "1.4");
    STATIC_REQUIRE(conform::check_capability_fenced_release::revision.minor == "1.4");
    // Rules of the first contract: every plugin is bound already.
    STATIC_REQUIRE(conform::check_factories_fresh_after_release::revision.entered == "2026-11-29");
}

// ---- minor 4: copies and fenced release (checks_streams.hpp) ----

TEST_CASE("each planted slip of a copy or a fenced release fails its minor-4 check alone, naming what it did",
          "[conform][slips][streams]") {
    const char* path = std::getenv("NXMEM_SLIPS_PLUGIN");
    REQUIRE(path != nullptr);
    struct expectation {
        const char* mechanism;
        const char* check;
        const char* other; // the other minor-4 check: passes, or does not apply
        const char* named;
    };
    const expectation slip = GENERATE(
        expectation{"copies-what-fits", "capability.copy", "capability.fenced_release",
                    "the last 100 bytes and 100 past the end"},
        expectation{"retires-before-fence", "capability.fenced_release", "capability.copy", "before its fence"},
        expectation{"queues-past-max-fences", "capability.fenced_release", "capability.copy",
                    "fence_count NXMEM_MAX_FENCES + 1"});
    INFO("mechanism " << slip.mechanism << ", check " << slip.check);
    const conform::subject target{path, slip.mechanism, device_id{NXMEM_DEVICE_CPU, 0}};
    const auto results = conform::run_checks(target, {slip.check, slip.other});
    REQUIRE(results.size() == 2);
    INFO(results[0].expected << " / " << results[0].actual);
    CHECK(results[0].failed());
    CHECK_THAT(results[0].expected + " " + results[0].actual, Catch::Contains(slip.named));
    INFO(results[1].id << ": " << results[1].expected << " / " << results[1].actual);
    CHECK((results[1].passed() || results[1].skipped()));
}

TEST_CASE("the production mechanisms pass capability.copy and capability.fenced_release where they offer them",
          "[conform][slips][streams]") {
    struct expectation {
        std::string path;
        const char* mechanism;
        device_id device;
        const char* options;
        bool copies; // offers the copy table: must pass; otherwise not applicable
        bool fences; // waits on host timelines
    };
    std::vector<expectation> mechanisms;
    for (const char* mechanism : {"eager", "legacy-1-0", "lazy"}) {
        mechanisms.push_back({test::testplugin_path(), mechanism, {NXMEM_DEVICE_CPU, 0}, "", false, false});
    }
    if (const char* posix = std::getenv("NXMEM_POSIX_PLUGIN")) {
        mechanisms.push_back({posix, "posix-eager", {NXMEM_DEVICE_CPU, 0}, "", true, false});
        mechanisms.push_back({posix, "posix-lazy", {NXMEM_DEVICE_CPU, 0}, "", true, true});
        mechanisms.push_back({posix, "posix-lazy", {NXMEM_DEVICE_CPU, 0}, "share=memfd", true, true});
    } else {
        WARN("NXMEM_POSIX_PLUGIN is not set: posix not checked");
    }
    if (const char* cuda = std::getenv("NXMEM_CUDA_PLUGIN")) {
        for (const char* mechanism : {"cuda-eager", "cuda-vmm"}) {
            mechanisms.push_back({cuda, mechanism, {NXMEM_DEVICE_CUDA, 0}, "", true, true});
        }
    } else {
        WARN("NXMEM_CUDA_PLUGIN is not set: cuda not checked");
    }
    for (const expectation& expected : mechanisms) {
        INFO("mechanism " << expected.mechanism << " with options '" << expected.options << "'");
        conform::suite_options options;
        options.mechanism_options = expected.options;
        const conform::subject target{expected.path, expected.mechanism, expected.device, expected.options};
        const auto results = conform::run_checks(target, {"capability.copy", "capability.fenced_release"}, options);
        REQUIRE(results.size() == 2);
        INFO(test::failures_of(results) << results[0].actual << " / " << results[1].actual);
        CHECK(results[0].verdict == (expected.copies ? conform::outcome::pass : conform::outcome::not_applicable));
        CHECK(results[1].verdict == (expected.fences ? conform::outcome::pass : conform::outcome::not_applicable));
    }
}

// glibc's own heap only: under a sanitizer (checks_accounting.hpp says which) malloc is the
// sanitizer's, which fills blocks its own way and ignores mallopt.
#if defined(__GLIBC__) && defined(M_PERTURB) && !defined(NXMEM_CONFORM_SANITIZED_HEAP)
TEST_CASE("edges.sizes turns glibc's heap fill off while it probes, and back on from the environment after",
          "[conform][slips]") {
    // A block above glibc's largest dynamic mmap threshold (32 MiB) is always mapped afresh, so it
    // comes from the kernel zeroed; with M_PERTURB p, malloc fills it with p ^ 0xff. The
    // 2^32 + 4096-byte probe must not be written (heap_fill_pause.hpp).
    auto fresh_block_filled_with = [](unsigned char byte) {
        constexpr std::size_t size = 64u << 20;
        auto* block = static_cast<unsigned char*>(std::malloc(size));
        REQUIRE(block != nullptr);
        const bool filled = std::all_of(block, block + size, [byte](unsigned char seen) { return seen == byte; });
        std::free(block);
        return filled;
    };
    const char* before = std::getenv("MALLOC_PERTURB_");
    const std::string saved = before == nullptr ? "" : before;
    REQUIRE(::setenv("MALLOC_PERTURB_", "90", 1) == 0); // 0x5a: blocks filled with 0xa5
    ::mallopt(M_PERTURB, 0x5a);
    CHECK(fresh_block_filled_with(0xa5));
    {
        const conform::detail::heap_fill_pause pause;
        CHECK(fresh_block_filled_with(0x00));
    }
    CHECK(fresh_block_filled_with(0xa5));
    if (saved.empty()) {
        ::unsetenv("MALLOC_PERTURB_");
        ::mallopt(M_PERTURB, 0);
    } else {
        ::setenv("MALLOC_PERTURB_", saved.c_str(), 1);
        ::mallopt(M_PERTURB, std::atoi(saved.c_str()));
    }
}
#endif
