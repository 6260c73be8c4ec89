#include "bench.hpp"
#include "plugin_args.hpp"

#include "text_table.hpp"

#include <measure/plugin_figures.hpp>
#include <measure/pool_figures.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

namespace nxmem::tool {

namespace {

struct bench_options {
    std::string plugin;
    std::string mechanism;
    bool json = false;
    bool pool = false;
    std::uint64_t iterations = 200000;
    std::uint64_t live = 100000;
};

std::string format_value(const measure::figure& shown) {
    char text[64];
    if (shown.unit == "x" || shown.unit.empty()) {
        std::snprintf(text, sizeof text, "%.2f", shown.value);
    } else {
        std::snprintf(text, sizeof text, "%.1f", shown.value);
    }
    return text;
}

nlohmann::json to_json(const measure::plugin_bench_report& report, bool pooled) {
    nlohmann::json figures = nlohmann::json::object();
    for (const measure::figure& each : report.figures) {
        figures[each.key] = {{"value", each.value}, {"unit", each.unit}, {"what", each.what}};
    }
    return {{"plugin", report.plugin},
            {"mechanism", report.mechanism},
            {"pooled", pooled},
            {"load_average", report.load_average ? nlohmann::json(*report.load_average) : nlohmann::json()},
            {"figures", std::move(figures)}};
}

void print_text(std::ostream& out, const measure::plugin_bench_report& report, bool pooled) {
    out << report.plugin << ": mechanism '" << report.mechanism << "' on cpu:0" << (pooled ? ", pooled" : "") << "\n";
    text_table table({{"figure"}, {"value", text_table::align::right}, {"unit"}, {"what"}});
    for (const measure::figure& each : report.figures) {
        table.add_row({each.key, format_value(each), each.unit, each.what});
    }
    table.print(out, "  ");
    out << "Ratios come from one run of this process; absolute times depend on the machine.\n";
}

int run_bench(const bench_options& options) {
    measure::plugin_bench_options wanted;
    wanted.plugin = options.plugin;
    wanted.mechanism = options.mechanism;
    wanted.iterations = options.iterations;
    wanted.live = options.live;
    result<measure::plugin_bench_report> report =
        options.pool ? measure::run_pool_bench(wanted) : measure::run_plugin_bench(wanted);
    if (!report) {
        std::cerr << "nxmem bench: " << options.plugin << ": " << report.error().describe() << '\n';
        return exit_refused;
    }
    if (options.json) {
        std::cout << to_json(report.value(), options.pool).dump(2) << '\n';
    } else {
        print_text(std::cout, report.value(), options.pool);
    }
    std::cout.flush();
    if (!std::cout) {
        std::cerr << "nxmem bench: cannot write the report to standard output\n";
        return exit_refused;
    }
    return exit_ok;
}

} // namespace

subcommand add_bench(CLI::App& parent) {
    auto options = std::make_shared<bench_options>();
    CLI::App* bench = parent.add_subcommand(
        "bench", "Measure what the host boundary and a plugin's mechanism cost against malloc.");
    bench->footer(
        "Opens one mechanism on cpu:0 and measures, in this one process: allocate + release\n"
        "round trips through the host adapter, through the plugin's allocator table called\n"
        "directly, and with malloc + free, at 64 B, 4 KiB and 2 MiB; two threads against one,\n"
        "on one allocator and on one allocator each (with the load average, which skews these);\n"
        "the C heap kept per live allocation by the host and by the plugin; and, where the\n"
        "mechanism offers virtual backing, commit + decommit through the host's view against\n"
        "the plugin's table. Read the ratios: absolute times depend on the machine.\n"
        "\n"
        "With --pool: the mechanism opened pooled (nxmem::pool_allocator, default options) against\n"
        "the same unpooled and malloc: round trips at 64 B, 4 KiB, 64 KiB and 2 MiB; allocate +\n"
        "write every page + release of 2 MiB, with the minor page faults per cycle; two threads\n"
        "on one pool against one, beside malloc's own scaling; and the upstream calls the pool\n"
        "makes to hold --live 64 B allocations at once, and what it holds after trim(0).\n"
        "\n"
        "Exit status: 0 when every figure was measured, 1 when the plugin or mechanism was\n"
        "refused or a measured call failed, 2 on bad usage.");
    add_plugin_argument(*bench, options->plugin, "The plugin shared object (.so)")->required();
    add_mechanism_option(*bench, options->mechanism, "The mechanism (factory) to measure (default: the first serving cpu)");
    bench->add_flag("--json", options->json, "Print one JSON document and nothing else on standard output");
    bench->add_flag("--pool", options->pool, "Measure the mechanism behind a pool (nxmem::pool_allocator)");
    bench->add_option("--iterations", options->iterations,
                      "Round trips per timed run, per thread (a sixteenth of them at 2 MiB)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    bench->add_option("--live", options->live,
                      "Allocations held to measure heap bytes per allocation (with --pool: upstream crossings)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    return {bench, [options] { return run_bench(*options); }};
}

} // namespace nxmem::tool
