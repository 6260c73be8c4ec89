// The conformance checks around callbacks, deferred release and negotiation
// (include/nxmem/conform/checks_callbacks.hpp): each broken fixture mechanism fails exactly the
// check of the rule it breaks and passes the others; the conforming ones pass them (not merely
// "not applicable"); and the kit rules those checks rely on (D10, D11, H6) hold.
#include "../support/plugin_paths.hpp"
#include "../support/conform_results.hpp"

#include <nxmem/conform.hpp>
#include <nxmem/host.hpp>
#include <nxmem/nxmem_plugin_helpers.h>
#include <nxmem/plugin/options.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace nxmem;

namespace {

std::string broken_callbacks_path() { return test::plugin_path("NXMEM_BROKEN_CALLBACKS_PLUGIN"); }

using test::failed_ids;
using test::failures_of;

using test::result_of;

// Short waits: a conforming plugin returns from a re-entering call in microseconds.
conform::suite_options quick_options() {
    conform::suite_options options;
    options.reentry_wait_ms = 1000;
    options.model_steps = 0; // model.sequences has its own fixtures (model_test.cpp)
    return options;
}

const char* const new_checks[] = {"negotiation.invalid_ranges", "callbacks.retain_release",
                                  "misuse.queued_release", "callbacks.completion_reentry",
                                  "callbacks.reclaim_pressure"};

} // namespace

TEST_CASE("each broken callback mechanism fails exactly the check of the rule it breaks",
          "[conform][callbacks]") {
    struct expectation {
        const char* mechanism;
        const char* failure;
        const char* reported; // in the failure's actual text
    };
    const expectation broken = GENERATE(
        expectation{"unretained", "callbacks.retain_release", "allocators 0"},
        expectation{"locked-completion", "callbacks.completion_reentry",
                    "holds a lock across release_completed"},
        expectation{"locked-reclaim", "callbacks.reclaim_pressure",
                    "holds a lock across request_reclaim"},
        expectation{"releasable-queued", "misuse.queued_release", "OK: the plugin released it"});
    INFO("mechanism " << broken.mechanism);
    const auto results = conform::run_mechanism_checks(broken_callbacks_path(), broken.mechanism,
                                                       device_id{NXMEM_DEVICE_CPU, 0}, quick_options());
    INFO(failures_of(results));
    CHECK(failed_ids(results) == std::set<std::string>{broken.failure});
    CHECK_THAT(result_of(results, broken.failure).actual, Catch::Contains(broken.reported));
}

TEST_CASE("the conforming callback mechanisms pass every check, the new ones applying",
          "[conform][callbacks]") {
    struct expectation {
        const char* mechanism;
        std::set<std::string> applying; // new checks that must pass, not be skipped
    };
    const expectation good = GENERATE(
        expectation{"plain", {"negotiation.invalid_ranges", "callbacks.retain_release"}},
        expectation{"deferred",
                    {"callbacks.retain_release", "misuse.queued_release", "callbacks.completion_reentry"}},
        expectation{"asking-reclaim", {"callbacks.retain_release", "callbacks.reclaim_pressure"}});
    INFO("mechanism " << good.mechanism);
    const auto results = conform::run_mechanism_checks(broken_callbacks_path(), good.mechanism,
                                                       device_id{NXMEM_DEVICE_CPU, 0}, quick_options());
    INFO(failures_of(results));
    CHECK(failed_ids(results).empty());
    for (const std::string& id : good.applying) {
        INFO(id << ": " << result_of(results, id).actual);
        CHECK(result_of(results, id).passed());
    }
}

TEST_CASE("the test plugin's and the C example's mechanisms pass the new checks",
          "[conform][callbacks]") {
    struct subject_case {
        std::string path;
        const char* mechanism;
    };
    const subject_case target = GENERATE(subject_case{"testplugin", "eager"},
                                         subject_case{"testplugin", "lazy"},
                                         subject_case{"testplugin", "legacy-1-0"},
                                         subject_case{"testplugin", "callback-probe"},
                                         subject_case{"minimal_c", "minimal-c"});
    const std::string path =
        target.path == "testplugin" ? test::testplugin_path() : test::minimal_c_plugin_path();
    INFO("mechanism " << target.mechanism);
    const auto results = conform::run_checks(
        conform::subject{path, target.mechanism, device_id{NXMEM_DEVICE_CPU, 0}},
        {new_checks[0], new_checks[1], new_checks[2], new_checks[3], new_checks[4]}, quick_options());
    INFO(failures_of(results));
    CHECK(failed_ids(results).empty());
    CHECK(result_of(results, "negotiation.invalid_ranges").passed());
    CHECK(result_of(results, "callbacks.retain_release").passed());
    if (std::string(target.mechanism) == "lazy") {
        CHECK(result_of(results, "callbacks.completion_reentry").passed()); // D11 on the kit
        CHECK(result_of(results, "misuse.queued_release").passed());       // D9 on the kit
    }
    if (std::string(target.mechanism) == "callback-probe") {
        CHECK(result_of(results, "callbacks.reclaim_pressure").passed());
    }
}

TEST_CASE("a plugin accepting an inverted host range fails exactly negotiation.invalid_ranges",
          "[conform][callbacks]") {
    const auto results =
        conform::run_mechanism_checks(test::plugin_path("NXMEM_BROKEN_NEGOTIATION_PLUGIN"),
                                      "lenient-negotiation", device_id{NXMEM_DEVICE_CPU, 0});
    INFO(failures_of(results));
    CHECK(failed_ids(results) == std::set<std::string>{"negotiation.invalid_ranges"});
    CHECK_THAT(result_of(results, "negotiation.invalid_ranges").expected,
               Catch::Contains("INVALID_ARGUMENT for the host range"));
}

TEST_CASE("H6: reclaim under a posix budget is called, honoured and refused; without a hook the "
          "allocation over budget is OUT_OF_MEMORY (when NXMEM_POSIX_PLUGIN is set)",
          "[conform][callbacks][posix]") {
    const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
    if (path == nullptr || *path == '\0') {
        WARN("NXMEM_POSIX_PLUGIN is not set: the posix plugin is not checked");
        return;
    }
    conform::suite_options options = quick_options();
    options.mechanism_options = "budget=1M";
    const auto budgeted = conform::run_checks(
        conform::subject{path, "posix-eager", device_id{NXMEM_DEVICE_CPU, 0}, "budget=1M"},
        {"callbacks.reclaim_pressure"}, options);
    REQUIRE(budgeted.size() == 1);
    INFO(budgeted[0].expected << " / " << budgeted[0].actual);
    CHECK(budgeted[0].passed());

    // Without a budget nothing asks: not applicable, and the reason says how to make it apply.
    const auto unlimited = conform::run_checks(
        conform::subject{path, "posix-eager", device_id{NXMEM_DEVICE_CPU, 0}},
        {"callbacks.reclaim_pressure"}, quick_options());
    REQUIRE(unlimited.size() == 1);
    CHECK(unlimited[0].skipped());
    CHECK_THAT(unlimited[0].actual, Catch::Contains("--options"));

    // H6 directly, through the host: no reclaim hook, over budget, OUT_OF_MEMORY.
    auto module = host::plugin_module::load(path);
    REQUIRE(module);
    {
        auto allocator = host::open_allocator<cpu_device>(module.value(), "posix-eager", 0, "budget=64k");
        REQUIRE(allocator);
        auto first = allocator.value().allocate(64 * 1024, 64);
        REQUIRE(first);
        auto over = allocator.value().allocate(4096, 64);
        REQUIRE_FALSE(over);
        CHECK(over.error().code == status_code::out_of_memory);
        CHECK_THAT(over.error().message, Catch::Contains("no reclaim hook"));
        REQUIRE(allocator.value().release(first.value()));
    }
    REQUIRE(module.value()->try_unload());
}

TEST_CASE("D10: without release_completed the kit offers no deferred release", "[conform][callbacks]") {
    const conform::subject lazy{test::testplugin_path(), "lazy", device_id{NXMEM_DEVICE_CPU, 0}};
    {
        auto opened = conform::detail::callback_allocator::open(lazy, nullptr);
        REQUIRE(opened);
        CHECK((opened.value()->capabilities() & NXMEM_CAP_DEFERRED_RELEASE) == 0);
        CHECK(opened.value()->slots().table().enqueue_release == nullptr);
        CHECK(opened.value()->slots().table().drain_releases == nullptr);
    }
    conform::detail::callback_host only_reclaim;
    only_reclaim.on_reclaim = [](const NxmemReclaimRequest&, NxmemStatus*) { return NXMEM_STATUS_OK; };
    {
        auto opened = conform::detail::callback_allocator::open(lazy, only_reclaim.table());
        REQUIRE(opened);
        CHECK((opened.value()->capabilities() & NXMEM_CAP_DEFERRED_RELEASE) == 0);
    }
    conform::detail::callback_host with_completion;
    with_completion.on_completed = [](const NxmemReleaseCompletion&) {};
    {
        auto opened = conform::detail::callback_allocator::open(lazy, with_completion.table());
        REQUIRE(opened);
        CHECK((opened.value()->capabilities() & NXMEM_CAP_DEFERRED_RELEASE) != 0);
        CHECK(opened.value()->slots().table().enqueue_release != nullptr);
    }
}

TEST_CASE("a check that does not return is reported as a hang at the step it reached",
          "[conform][callbacks]") {
    struct gate {
        std::mutex mutex;
        std::condition_variable opened;
        bool open = false;
    };
    auto blocking = std::make_shared<gate>(); // shared: the abandoned thread outlives this scope
    const conform::finding found = conform::detail::within_deadline(
        std::chrono::milliseconds(100), [blocking](conform::detail::step_log& steps) {
            steps.at("waiting for the test");
            std::unique_lock lock(blocking->mutex);
            blocking->opened.wait(lock, [&] { return blocking->open; });
            return conform::passed();
        });
    CHECK(found.verdict == conform::outcome::fail);
    CHECK_THAT(found.actual, Catch::Contains("hang") && Catch::Contains("waiting for the test"));
    {
        std::lock_guard lock(blocking->mutex);
        blocking->open = true; // the abandoned thread ends
    }
    blocking->opened.notify_all();
}

TEST_CASE("X9: the kit's option grammar", "[conform][options]") {
    auto parsed = plugin::options::parse(" ; budget = 1M ;;\n\tname=a=b ;empty=\r\n;");
    REQUIRE(parsed);
    CHECK(parsed.value().take("budget") == std::optional<std::string>("1M"));
    CHECK(parsed.value().take("name") == std::optional<std::string>("a=b")); // split at the first '='
    CHECK(parsed.value().take("empty") == std::optional<std::string>(""));
    CHECK(parsed.value().take("Budget") == std::nullopt); // keys are case-sensitive
    CHECK(parsed.value().refuse_unknown("m"));
    CHECK(plugin::options::parse("").has_value());
    CHECK(plugin::options::parse(" ;\n; ").has_value());
    for (const char* refused : {"budget", "=1M", " = 1M", "budget=1;budget=2", "a=1; a =2"}) {
        INFO(refused);
        auto wrong = plugin::options::parse(refused);
        REQUIRE_FALSE(wrong);
        CHECK(wrong.error().code == status_code::invalid_argument);
    }
    auto unknown = plugin::options::parse("budget=1M;colour=red");
    REQUIRE(unknown);
    (void)unknown.value().take("budget");
    auto refusal = unknown.value().refuse_unknown("posix-eager");
    REQUIRE_FALSE(refusal);
    CHECK_THAT(refusal.error().message, Catch::Contains("'colour'"));
    CHECK_FALSE(plugin::options::parse(std::string(NXMEM_MAX_OPTIONS_BYTES + 1, ';')));
}

namespace {
// The entries of `text` as the C helpers read them; nullopt when nxmem_option_check refuses it.
std::optional<std::vector<std::pair<std::string, std::string>>> c_options(const std::string& text) {
    NxmemStatus status = nxmem::abi::make_status();
    if (nxmem_option_check(text.data(), text.size(), &status) != NXMEM_STATUS_OK) {
        CHECK(std::string(status.message).find("option") != std::string::npos);
        return std::nullopt;
    }
    std::vector<std::pair<std::string, std::string>> entries;
    const char* cursor = text.data();
    NxmemOptionEntry entry;
    while (nxmem_option_next(&cursor, text.data() + text.size(), &entry, &status) == 1) {
        entries.emplace_back(std::string(entry.key, entry.key_length),
                             std::string(entry.value, entry.value_length));
    }
    return entries;
}
} // namespace

TEST_CASE("X9: the C helpers read options exactly as the kit does", "[conform][options]") {
    for (const std::string& text : std::vector<std::string>{"", " ; budget = 1M ;;\n\tname=a=b ;empty=\r\n;", "budget", "=1M", " = 1M",
          "budget=1;budget=2", "a=1; a =2", "a=1\nb=2", "x= y z ", ";;;", "k=v;K=w",
          std::string(NXMEM_MAX_OPTIONS_BYTES + 1, ';')}) {
        INFO("'" << text << "'");
        auto kit = plugin::options::parse(text);
        auto c = c_options(text);
        REQUIRE(kit.has_value() == c.has_value());
        if (!c) {
            continue;
        }
        for (const auto& [key, value] : *c) {
            CHECK(kit.value().take(key) == std::optional<std::string>(value));
        }
        CHECK(kit.value().refuse_unknown("m")); // the C reader saw every entry the kit did
    }
}

TEST_CASE("M10: with several faults the first in precedence order decides the code",
          "[conform][misuse]") {
    const std::string path = GENERATE(as<std::string>{}, "testplugin", "minimal_c");
    const bool kit = path == "testplugin";
    INFO(path);
    auto module = host::plugin_module::load(kit ? test::testplugin_path() : test::minimal_c_plugin_path());
    REQUIRE(module);
    {
        auto allocator = host::open_allocator<cpu_device>(module.value(), kit ? "eager" : "minimal-c");
        REQUIRE(allocator);
        const conform::detail::raw_slots slots(allocator.value());
        auto code_of = [&](const NxmemAllocRequest& request, std::uint32_t output_size) {
            NxmemAllocResult out = nxmem::abi::make_struct<NxmemAllocResult>();
            out.struct_size = output_size;
            NxmemStatus status = nxmem::abi::make_status();
            const NxmemStatusCode code =
                slots.table().allocate(allocator.value().raw_table(), &request, &out, &status);
            if (code == NXMEM_STATUS_OK) {
                (void)slots.deallocate(conform::detail::raw_slots::describe(request, out));
            }
            return code;
        };
        NxmemAllocRequest everything_wrong = slots.request(0, 3); // bad size and alignment
        everything_wrong.mechanism_id ^= 0x100;
        everything_wrong.device.index += 1;
        everything_wrong.flags = 1;
        // (1) the form of the records: an output too small for the result
        CHECK(code_of(everything_wrong, 4) == NXMEM_STATUS_INVALID_ARGUMENT);
        // (2) mechanism, (3) device, (4) values
        CHECK(code_of(everything_wrong, sizeof(NxmemAllocResult)) == NXMEM_STATUS_WRONG_MECHANISM);
        NxmemAllocRequest wrong_device = everything_wrong;
        wrong_device.mechanism_id = slots.mechanism_id();
        CHECK(code_of(wrong_device, sizeof(NxmemAllocResult)) == NXMEM_STATUS_WRONG_DEVICE);
        NxmemAllocRequest bad_values = wrong_device;
        bad_values.device = slots.device().to_wire();
        CHECK(code_of(bad_values, sizeof(NxmemAllocResult)) == NXMEM_STATUS_INVALID_ARGUMENT);
        // (5) not live beats (6) misdescribed; (3) device beats (5)
        auto live = slots.allocate(256, 64);
        REQUIRE(live);
        NxmemAllocation stranger = live.value();
        stranger.address += 8;
        stranger.size += 1;
        CHECK(slots.deallocate(stranger).code == NXMEM_STATUS_UNKNOWN_ALLOCATION);
        stranger.device.index += 1;
        CHECK(slots.deallocate(stranger).code == NXMEM_STATUS_WRONG_DEVICE);
        CHECK(slots.deallocate(live.value()).ok());
    }
    REQUIRE(module.value()->try_unload());
}
