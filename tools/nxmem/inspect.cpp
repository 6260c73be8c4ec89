#include "inspect.hpp"

#include "inspection.hpp"
#include "plugin_paths.hpp"
#include "report_json.hpp"
#include "report_text.hpp"
#include "version_range_arg.hpp"

#include <nxmem/host/load_options.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace nxmem::tool {

namespace {

struct inspect_options {
    bool json = false;
    std::string host_range;
    std::vector<std::string> plugins;
};

int run_inspect(const inspect_options& options) {
    host::load_options load;
    if (!options.host_range.empty()) {
        // Already checked by the option's validator; parsed again here for the value.
        result<abi::version_range> range = parse_version_range(options.host_range);
        if (!range) {
            std::cerr << "nxmem inspect: --host-range " << range.error().message << '\n';
            return exit_usage;
        }
        load.host_range = range.value();
    }

    std::vector<std::string> paths = options.plugins;
    bool problems = false;
    if (paths.empty()) {
        plugin_list defaults = default_plugins();
        for (const std::string& problem : defaults.problems) {
            std::cerr << "nxmem inspect: " << problem << '\n';
            problems = true;
        }
        if (defaults.paths.empty()) {
            std::cerr << "nxmem inspect: no plugins to inspect: " << defaults.source
                      << " names none; name plugin files as arguments\n";
            return exit_refused;
        }
        paths = std::move(defaults.paths);
    }

    std::vector<plugin_report> reports;
    reports.reserve(paths.size());
    for (const std::string& path : paths) {
        reports.push_back(inspect_plugin(path, load));
    }

    if (options.json) {
        std::cout << to_json(reports).dump(2) << '\n';
    } else {
        print_text(std::cout, reports);
    }
    std::cout.flush();
    if (!std::cout) {
        std::cerr << "nxmem inspect: cannot write the report to standard output\n";
        return exit_refused;
    }

    for (const plugin_report& report : reports) {
        if (!report.loaded()) {
            return exit_refused;
        }
    }
    return problems ? exit_refused : exit_ok;
}

} // namespace

subcommand add_inspect(CLI::App& parent) {
    auto options = std::make_shared<inspect_options>();
    CLI::App* inspect = parent.add_subcommand(
        "inspect", "Load plugins and show what they offer, what the host accepts, and whether "
                   "they unload cleanly.");
    inspect->footer(
        "For each plugin: the negotiated ABI version and both ranges (with a note when a newer\n"
        "plugin is clamped to an older host), each mechanism (factory) with its mechanism id,\n"
        "device types and declared table minor; each mechanism is opened once on device 0 of\n"
        "the first device type it serves (cpu, cuda or hip) to show its allocator table minor,\n"
        "capabilities and views, or why the host refused it. Then both unload tallies, the\n"
        "unload itself, and whether the library is really unmapped afterwards.\n"
        "\n"
        + default_plugins_help() +
        "\n"
        "Exit status: 0 when every plugin loaded (a refused mechanism is reported, not an\n"
        "error), 1 when any plugin was refused, 2 on bad usage.");
    inspect->add_flag("--json", options->json,
                      "Print one JSON document (an array, one object per plugin) and nothing else "
                      "on standard output");
    inspect
        ->add_option("--host-range", options->host_range,
                     "The ABI range the host offers, e.g. 1.0-1.0 to act as an older host "
                     "(default: everything this build speaks, " +
                         abi::supported_range.describe() + ")")
        ->type_name("MAJOR.MIN-MAJOR.MAX")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                result<abi::version_range> range = parse_version_range(text);
                return range ? std::string() : range.error().message;
            },
            std::string())); // the type name already shows the form
    inspect->add_option("PLUGIN", options->plugins, "Plugin shared objects (.so) to inspect")
        ->type_name("PATH");
    return {inspect, [options] { return run_inspect(*options); }};
}

} // namespace nxmem::tool
