#include "conform_oom.hpp"

#include "allocation_failure.hpp"
#include "child_process.hpp"
#include "oom_sequence.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace nxmem::tool {

namespace {

// The sweep of one mechanism, run in a child of its own (which forks one more per run of the
// sequence): its report, or why the sweep itself did not finish.
struct mechanism_sweep {
    fault::sweep_report report;
    std::string stopped; // "" when the sweep finished
};

mechanism_sweep sweep_mechanism(const conform_request& request, const std::string& mechanism,
                                device_id device) {
    // Each run of the sequence has --timeout; the sweep as a whole only needs a bound.
    constexpr unsigned sweep_bound_seconds = 86400;
    const child_outcome outcome = run_in_child(
        [&](const emit_function& emit) {
            fault::sequence_subject subject;
            subject.path = request.path;
            subject.mechanism = mechanism;
            subject.device = device;
            subject.options = request.mechanism_options;
            subject.timeout_seconds = request.timeout_seconds;
            static fault::sweep_report report; // a few KiB: not on the stack
            fault::sweep(subject, fault::side::plugin, false, report);
            nlohmann::json unclean = nlohmann::json::array();
            for (std::uint64_t each = 0; each < report.unclean && each < fault::sweep_report::kept;
                 ++each) {
                unclean.push_back(report.first_unclean[each]);
            }
            emit({{"event", "sweep"},
                  {"allocations", report.allocations},
                  {"loading", report.allocations_to_load},
                  {"clean_failure", report.clean_failure},
                  {"runs", report.runs},
                  {"unclean", report.unclean},
                  {"first_unclean", unclean}});
        },
        sweep_bound_seconds);
    mechanism_sweep swept;
    swept.stopped = outcome.finished() ? "" : outcome.ending(sweep_bound_seconds);
    for (const nlohmann::json& event : outcome.events) {
        if (event.value("event", "") == "error") {
            swept.stopped = "an exception escaped: " + event.value("message", "");
        }
        if (event.value("event", "") != "sweep") {
            continue;
        }
        fault::sweep_report& report = swept.report;
        report.allocations = event.value("allocations", std::uint64_t{0});
        report.allocations_to_load = event.value("loading", std::uint64_t{0});
        std::snprintf(report.clean_failure, sizeof report.clean_failure, "%s",
                      event.value("clean_failure", "").c_str());
        report.runs = event.value("runs", std::uint64_t{0});
        report.unclean = event.value("unclean", std::uint64_t{0});
        int kept = 0;
        for (const nlohmann::json& text : event.value("first_unclean", nlohmann::json::array())) {
            if (kept < fault::sweep_report::kept && text.is_string()) {
                std::snprintf(report.first_unclean[kept++], sizeof report.first_unclean[0], "%s",
                              text.get<std::string>().c_str());
            }
        }
    }
    return swept;
}

conform_check make_check(const char* id, const char* title, bool passed, std::string expected,
                         std::string actual) {
    conform_check check;
    check.result.id = id;
    check.result.title = title;
    check.result.verdict = passed ? conform::outcome::pass : conform::outcome::fail;
    check.result.expected = std::move(expected);
    check.result.actual = std::move(actual);
    check.rule = "Out of memory";
    return check;
}

mechanism_run run_mechanism_oom(const conform_request& request, const std::string& name,
                                device_id device) {
    mechanism_run run;
    run.name = name;
    run.device = device_label(device);
    const char* failed_functions = fault::c_allocation_functions_replaced()
                                       ? "operator new, malloc, calloc, realloc, posix_memalign, "
                                         "aligned_alloc, memalign"
                                       : "operator new (a sanitizer build: not the malloc family)";
    const mechanism_sweep swept = sweep_mechanism(request, name, device);
    if (!swept.stopped.empty()) {
        run.crash = "the sweep stopped: " + swept.stopped;
        return run;
    }
    const fault::sweep_report& report = swept.report;
    const bool clean = report.clean_failure[0] == '\0';
    run.checks.push_back(make_check(
        "oom.clean_run", "the standard sequence runs without a failure", clean,
        "every step succeeds and the library unloads, unmapped, with nothing left",
        clean ? std::to_string(report.allocations) + " plugin allocations (" +
                    std::to_string(report.allocations_to_load) + " while loading)"
              : std::string(report.clean_failure)));
    if (!clean) {
        return run;
    }
    std::string first_unclean;
    for (std::uint64_t each = 0; each < report.unclean && each < fault::sweep_report::kept; ++each) {
        first_unclean += (first_unclean.empty() ? "" : "; ") + std::string(report.first_unclean[each]);
    }
    run.checks.push_back(make_check(
        "oom.every_allocation", "every plugin allocation of the sequence can fail",
        report.unclean == 0,
        "each of the " + std::to_string(report.allocations) + " plugin allocations (" +
            failed_functions +
            "), failed once, ends as a clean refusal: OUT_OF_MEMORY or the step's documented "
            "code, counts unchanged, the call then succeeds, nothing leaked, the library unmapped",
        report.unclean == 0
            ? "all " + std::to_string(report.runs) + " ended cleanly"
            : std::to_string(report.unclean) + " of " + std::to_string(report.runs) +
                  " did not: " + first_unclean +
                  (report.unclean > fault::sweep_report::kept ? "; ..." : "")));
    return run;
}

} // namespace

plugin_run run_oom(const conform_request& request) {
    fault::learn_runtime_objects(); // before any plugin is loaded: in the children only
    plugin_run run;
    run.path = request.path;
    std::vector<listed_mechanism> listed;
    list_mechanisms(request, run, listed);
    if (run.load_error) {
        return run;
    }
    if (auto unlisted = unlisted_mechanism(request, listed)) {
        run.load_error = std::move(unlisted);
        return run;
    }
    for (const listed_mechanism& mechanism : listed) {
        if (asks_for(request, mechanism.name)) {
            run.mechanisms.push_back(run_mechanism_oom(
                request, mechanism.name, request.device ? *request.device : mechanism.device));
        }
    }
    return run;
}

} // namespace nxmem::tool
