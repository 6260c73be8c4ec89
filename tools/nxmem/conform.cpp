#include "conform.hpp"

#include "conform_oom.hpp"
#include "conform_report.hpp"
#include "conform_run.hpp"
#include "plugin_args.hpp"
#include "plugin_paths.hpp"

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace nxmem::tool {

namespace {

struct conform_options {
    std::vector<std::string> plugins;
    std::vector<std::string> mechanisms;
    std::string device;
    bool json = false;
    std::string junit;
    unsigned timeout_seconds = 300;
    std::string mechanism_options;
    bool oom = false;
    std::uint64_t model_seed = 1;    // model.sequences (--seed)
    unsigned model_steps = 5000;     // model.sequences (--steps)
    std::string rules;               // --rules: judge by an older release's rule set
};

int run_conform(const conform_options& options) {
    std::vector<std::string> paths = options.plugins;
    bool problems = false;
    if (paths.empty()) {
        plugin_list defaults = default_plugins();
        for (const std::string& problem : defaults.problems) {
            std::cerr << "nxmem conform: " << problem << '\n';
            problems = true;
        }
        if (defaults.paths.empty()) {
            std::cerr << "nxmem conform: no plugins to check: " << defaults.source
                      << " names none; name plugin files as arguments\n";
            return exit_refused;
        }
        paths = std::move(defaults.paths);
    }

    std::vector<plugin_run> runs;
    for (const std::string& path : paths) {
        conform_request request;
        request.path = path;
        request.mechanisms = options.mechanisms;
        if (!options.device.empty()) {
            request.device = parse_device(options.device); // already validated
        }
        request.timeout_seconds = options.timeout_seconds;
        request.mechanism_options = options.mechanism_options;
        request.model_seed = options.model_seed;
        request.model_steps = options.model_steps;
        if (!options.rules.empty()) {
            request.rules = conform::parse_rule_set(options.rules); // already validated
        }
        runs.push_back(options.oom ? run_oom(request) : run_conformance(request));
    }

    if (options.json) {
        std::cout << conform_to_json(runs).dump(2) << '\n';
    } else {
        print_conform_text(std::cout, runs);
    }
    if (!options.junit.empty()) {
        std::ofstream file(options.junit);
        write_conform_junit(file, runs);
        file.close();
        if (!file) {
            std::cerr << "nxmem conform: cannot write " << options.junit << '\n';
            return exit_refused;
        }
    }
    std::cout.flush();
    for (const plugin_run& run : runs) {
        if (!run.conforms()) {
            return exit_refused;
        }
    }
    return problems ? exit_refused : exit_ok;
}

} // namespace

subcommand add_conform(CLI::App& parent) {
    auto options = std::make_shared<conform_options>();
    CLI::App* conform = parent.add_subcommand(
        "conform", "Check plugins against every rule of the contract (the conformance suite).");
    conform->footer(
        "Each mechanism is checked in a child process of its own, on device 0 of the first\n"
        "device type it serves (or on --device). A mechanism that crashes is reported as\n"
        "'crashed (signal N) during check ID' with the results it sent before; the other\n"
        "mechanisms are still checked. Every check reads PASS, FAIL (expected, got) or N/A\n"
        "(why), or WARN: a rule that entered after the minor the plugin declares was\n"
        "published, which does not fail it (docs/ABI.md, \"Contract revisions\");\n"
        "docs/CONFORMANCE.md lists the checks with the rule each enforces.\n"
        "\n"
        + default_plugins_help() +
        "\n"
        "Exit status: 0 when every mechanism conforms, 1 when any check failed, a mechanism\n"
        "crashed or a plugin was refused, 2 on bad usage.");
    add_plugin_argument(*conform, options->plugins, "Plugin shared objects (.so) to check");
    conform->add_option("--mechanism", options->mechanisms,
                        "Check only the mechanism of this name (repeat it for several)")
        ->type_name("NAME")
        ->allow_extra_args(false); // one name per --mechanism: the plugin paths follow
    conform
        ->add_option("--device", options->device,
                     "Check on this device instead of each mechanism's first: cpu:0, cuda:1, ...")
        ->type_name("TYPE:INDEX")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                return parse_device(text) ? std::string()
                                          : "expected TYPE:INDEX with TYPE one of cpu, cuda, hip, "
                                            "level_zero";
            },
            std::string()));
    auto* json = conform->add_flag(
        "--json", options->json,
        "Print one JSON document (an array, one object per plugin) and nothing else on standard "
        "output");
    conform
        ->add_option("--junit", options->junit,
                     "Also write a JUnit XML report to FILE: one testsuite per mechanism, one "
                     "testcase per check")
        ->type_name("FILE")
        ->excludes(json);
    add_mechanism_options_option(*conform, options->mechanism_options,
                                 "Open every mechanism checked with these options (key=value entries "
                                 "separated by ';'), e.g. budget=1M so that callbacks.reclaim_pressure applies");
    conform->add_flag("--oom", options->oom,
                      "Instead of the checks, fail each allocation the plugin makes in the "
                      "standard sequence, one per child process, and require a clean refusal "
                      "each time (docs/CONFORMANCE.md, \"Out of memory in the plugin\")");
    conform->add_option("--seed", options->model_seed,
                        "Seed of model.sequences' random operation sequences (default 1); a failure "
                        "names the seed and steps that replay it")
        ->type_name("N");
    conform->add_option("--steps", options->model_steps,
                        "About how many operations model.sequences runs per mechanism (default "
                        "5000; 0 skips it)")
        ->type_name("N");
    conform
        ->add_option("--rules", options->rules,
                     "Judge by the rules of an older release: 1.N (its last release), a date "
                     "YYYY-MM-DD or '1.N (YYYY-MM-DD)'; rules that entered later only warn. Releases: " +
                         conform::release_names())
        ->type_name("VERSION")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                return conform::parse_rule_set(text) ? std::string()
                                                     : "no release " + text + "; releases: " +
                                                           conform::release_names();
            },
            std::string()));
    conform->add_option("--timeout", options->timeout_seconds,
                        "Seconds one mechanism's checks may take before they count as hung "
                        "(default 300)")
        ->type_name("SECONDS")
        ->check(CLI::Range(1u, 86400u));
    return {conform, [options] { return run_conform(*options); }};
}

} // namespace nxmem::tool
