#include "inspect.hpp"

#include "child_process.hpp"
#include "inspection.hpp"
#include "plugin_paths.hpp"
#include "report_json.hpp"
#include "report_text.hpp"
#include "version_range_arg.hpp"

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/detail/contained_call.hpp>
#include <nxmem/conform/detail/guarded_memory.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/host/load_options.hpp>

#include <dlfcn.h>

#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::tool {

namespace {

struct inspect_options {
    bool json = false;
    std::string host_range;
    std::vector<std::string> plugins;
};

// Seconds one plugin's inspection may take before it counts as hung.
constexpr unsigned inspect_timeout_seconds = 60;

// One plugin's report as the child rendered it, or, when the child did not finish, what it did.
struct rendered_report {
    bool loaded = false;
    std::string text;
    nlohmann::ordered_json json;
};

// Calls NxmemNegotiate with the host's range again, in a child of its own, with a status and a
// response that each end at a PROT_NONE page: what the plugin wrote past, if anything.
std::optional<std::string> diagnose_negotiate(const std::string& path, const abi::version_range& host_range) {
    conform::detail::contained_result<NxmemStatusCode> called =
        conform::detail::run_contained<NxmemStatusCode>([&]() -> NxmemStatusCode {
            void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
            auto negotiate = library == nullptr ? nullptr
                                                : reinterpret_cast<NxmemNegotiateFn>(
                                                      ::dlsym(library, NXMEM_EXPORT_NEGOTIATE));
            auto status = conform::detail::guarded_status(sizeof(NxmemStatus), 0);
            auto response = conform::detail::guarded_bytes::make(sizeof(NxmemNegotiateResponse),
                                                                 "an NxmemNegotiateResponse");
            if (negotiate == nullptr || !status || !response) {
                return NXMEM_STATUS_INTERNAL_ERROR; // nothing to diagnose: the report says why
            }
            *response->as<NxmemNegotiateResponse>() = abi::make_struct<NxmemNegotiateResponse>();
            auto request = abi::make_struct<NxmemNegotiateRequest>();
            request.host_range = host_range.to_wire();
            return negotiate(&request, response->as<NxmemNegotiateResponse>(),
                             status->as<NxmemStatus>());
        });
    if (called.value) {
        return std::nullopt;
    }
    return "NxmemNegotiate, called again with buffers that end at a PROT_NONE page: " + called.failure;
}

rendered_report inspect_contained(const std::string& path, const host::load_options& load) {
    const child_outcome outcome = run_in_child(
        [&](const emit_function& emit) {
            const conform::listen_to_steps steps(
                [&](std::string_view step) { emit({{"event", "step"}, {"text", step}}); });
            const plugin_report report = inspect_plugin(path, load);
            std::ostringstream text;
            print_text(text, report);
            emit({{"event", "report"},
                  {"loaded", report.loaded()},
                  {"text", text.str()},
                  {"json", to_json(report).dump()}});
        },
        inspect_timeout_seconds);
    rendered_report rendered;
    for (const nlohmann::json& event : outcome.events) {
        if (event.value("event", "") == "report") {
            rendered.loaded = event.value("loaded", false);
            rendered.text = event.value("text", "");
            rendered.json = nlohmann::ordered_json::parse(event.value("json", "{}"));
        }
    }
    // Negotiation again, with buffers that end at a PROT_NONE page: an overrun that did not
    // crash the inspection (or crashed it) is named, with the offset it wrote at.
    const std::optional<std::string> overrun = diagnose_negotiate(path, load.host_range);
    if (outcome.finished() && !rendered.json.is_null()) {
        if (overrun) {
            rendered.loaded = false; // a plugin that writes past the host's buffers is refused
            rendered.text += "  overrun    " + *overrun + "\n";
            rendered.json["overrun"] = *overrun;
        }
        return rendered;
    }
    const std::string verb = outcome.timed_out ? "timed out" : "crashed";
    std::string stopped = outcome.ending(inspect_timeout_seconds);
    if (!outcome.last_step.empty()) {
        stopped += " at step \"" + outcome.last_step + "\"";
    }
    rendered.loaded = false;
    rendered.text = path + "\n  " + verb + (outcome.timed_out ? "  " : "    ") + stopped + "\n";
    if (overrun) {
        rendered.text += "  overrun    " + *overrun + "\n";
    }
    rendered.json = {{"path", path},
                     {"loaded", false},
                     {outcome.timed_out ? "timed_out" : "crashed", stopped},
                     {"overrun", overrun ? nlohmann::ordered_json(*overrun) : nullptr}};
    return rendered;
}

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

    // Each plugin is inspected in a child of its own: a plugin that crashes or hangs is reported
    // as such, with the step it was at, and the others are still inspected.
    std::vector<rendered_report> reports;
    reports.reserve(paths.size());
    for (const std::string& path : paths) {
        reports.push_back(inspect_contained(path, load));
    }

    std::size_t refused = 0;
    if (options.json) {
        nlohmann::ordered_json all = nlohmann::ordered_json::array();
        for (const rendered_report& report : reports) {
            all.push_back(report.json);
        }
        std::cout << all.dump(2) << '\n';
    } else {
        for (std::size_t i = 0; i < reports.size(); ++i) {
            std::cout << (i > 0 ? "\n" : "") << reports[i].text;
        }
    }
    for (const rendered_report& report : reports) {
        refused += report.loaded ? 0 : 1;
    }
    if (!options.json && reports.size() > 1) {
        std::cout << '\n'
                  << reports.size() << " plugins: " << reports.size() - refused << " loaded, "
                  << refused << " refused\n";
    }
    std::cout.flush();
    if (!std::cout) {
        std::cerr << "nxmem inspect: cannot write the report to standard output\n";
        return exit_refused;
    }
    if (refused > 0) {
        return exit_refused;
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
        ->type_name("PATH")
        ->transform(as_plugin_path, std::string(), std::string());
    return {inspect, [options] { return run_inspect(*options); }};
}

} // namespace nxmem::tool
