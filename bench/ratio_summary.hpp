// The in-run ratios bench/ exists for, computed from the runs Google Benchmark just reported:
// reporters that remember every run, then print the ratios after the benchmark table (console)
// or add them to the same JSON document as a "ratios" member (--benchmark_format=json).
#pragma once

#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::bench {

// What was measured for one benchmark (by its registered name, e.g. "round_trip/adapter/64B",
// and "threads/malloc/threads:2" for a thread count).
struct measured {
    double ns_per_iteration = 0; // real time
    std::map<std::string, double> counters;
};

// How one ratio is made: `numerator` / `denominator` (or their difference), each a benchmark
// name and a field: "ns" for the real time per iteration, else a counter's name. A name of the
// form "ratio:KEY" is the value of the ratio KEY listed before it (a ratio of two ratios, e.g. a
// pool's two-thread scaling against malloc's); its field is ignored. An empty denominator makes
// the figure the numerator's field alone (a count a benchmark reports, listed with the ratios).
struct ratio_spec {
    std::string key;
    std::string what;
    std::string numerator;
    std::string denominator;
    std::string field = "ns";
    bool difference = false;
    std::string denominator_field = {}; // empty: the same field as the numerator
};

struct ratio_value {
    const ratio_spec* spec;
    std::optional<double> value; // nullopt when a run is missing (filtered out, or skipped)
};

class run_memory {
public:
    void remember(const std::vector<benchmark::BenchmarkReporter::Run>& runs) {
        for (const auto& run : runs) {
            if (run.run_type != benchmark::BenchmarkReporter::Run::RT_Iteration || run.error_occurred) {
                continue;
            }
            // By the registered name, with the thread count where one was asked for; never the
            // suffixes that fixed iterations or a manual clock add.
            std::string name = run.run_name.function_name;
            if (!run.run_name.threads.empty()) {
                name += "/" + run.run_name.threads;
            }
            measured& entry = runs_[name];
            entry.ns_per_iteration = run.iterations == 0 ? 0 : run.real_accumulated_time * 1e9 /
                                                                   static_cast<double>(run.iterations);
            for (const auto& [name, counter] : run.counters) {
                entry.counters[name] = counter.value;
            }
        }
    }

    std::optional<double> field(const std::string& benchmark, const std::string& name) const {
        auto found = runs_.find(benchmark);
        if (found == runs_.end()) {
            return std::nullopt;
        }
        if (name == "ns") {
            return found->second.ns_per_iteration;
        }
        auto counter = found->second.counters.find(name);
        return counter == found->second.counters.end() ? std::nullopt : std::optional<double>(counter->second);
    }

    std::vector<ratio_value> evaluate(const std::vector<ratio_spec>& specs) const {
        std::vector<ratio_value> values;
        std::map<std::string, double> evaluated;
        auto operand = [&](const std::string& name, const std::string& wanted) -> std::optional<double> {
            if (name.rfind("ratio:", 0) == 0) {
                auto found = evaluated.find(name.substr(6));
                return found == evaluated.end() ? std::nullopt : std::optional<double>(found->second);
            }
            return field(name, wanted);
        };
        for (const ratio_spec& spec : specs) {
            std::optional<double> top = operand(spec.numerator, spec.field);
            std::optional<double> bottom =
                operand(spec.denominator, spec.denominator_field.empty() ? spec.field : spec.denominator_field);
            std::optional<double> value;
            if (spec.denominator.empty()) {
                value = top;
            } else if (top && bottom) {
                if (spec.difference) {
                    value = *top - *bottom;
                } else if (*bottom != 0) {
                    value = *top / *bottom;
                }
            }
            if (value) {
                evaluated[spec.key] = *value;
            }
            values.push_back({&spec, value});
        }
        return values;
    }

private:
    std::map<std::string, measured> runs_;
};

inline void print_ratio_table(std::ostream& out, const std::vector<ratio_value>& values) {
    out << "\nIn-run ratios (a / b, or a - b where signed):\n";
    int width = 0;
    for (const ratio_value& each : values) {
        width = std::max(width, static_cast<int>(each.spec->key.size()));
    }
    for (const ratio_value& each : values) {
        char number[32] = "n/a";
        if (each.value) {
            std::snprintf(number, sizeof number, each.spec->difference ? "%+.1f" : "%.3f", *each.value);
        }
        char line[512];
        std::snprintf(line, sizeof line, "  %-*s  %10s  %s\n", width, each.spec->key.c_str(), number,
                      each.spec->what.c_str());
        out << line;
    }
}

inline nlohmann::json ratio_json(const std::vector<ratio_value>& values) {
    nlohmann::json out = nlohmann::json::object();
    for (const ratio_value& each : values) {
        out[each.spec->key] = {{"value", each.value ? nlohmann::json(*each.value) : nlohmann::json()},
                               {"what", each.spec->what},
                               {"numerator", each.spec->numerator},
                               {"denominator", each.spec->denominator},
                               {"field", each.spec->field},
                               {"difference", each.spec->difference}};
    }
    return out;
}

// Extra context printed with the ratios (e.g. the load average after the thread runs).
using context_notes = std::map<std::string, double>;

class console_with_ratios : public benchmark::ConsoleReporter {
public:
    console_with_ratios(const std::vector<ratio_spec>& specs, const context_notes& notes)
        : specs_(specs), notes_(notes) {}
    void ReportRuns(const std::vector<Run>& runs) override {
        memory_.remember(runs);
        ConsoleReporter::ReportRuns(runs);
    }
    void Finalize() override {
        ConsoleReporter::Finalize();
        print_ratio_table(GetOutputStream(), memory_.evaluate(specs_));
        for (const auto& [name, value] : notes_) {
            GetOutputStream() << "  " << name << ": " << value << '\n';
        }
    }

private:
    const std::vector<ratio_spec>& specs_;
    const context_notes& notes_;
    run_memory memory_;
};

class json_with_ratios : public benchmark::JSONReporter {
public:
    json_with_ratios(const std::vector<ratio_spec>& specs, const context_notes& notes)
        : specs_(specs), notes_(notes) {}
    void ReportRuns(const std::vector<Run>& runs) override {
        memory_.remember(runs);
        JSONReporter::ReportRuns(runs);
    }
    // JSONReporter::Finalize closes the benchmark list and the document ("\n  ]\n}\n"); this closes
    // the list, then adds the ratios and the notes as two more members of the same document.
    void Finalize() override {
        nlohmann::json notes = notes_;
        GetOutputStream() << "\n  ],\n  \"ratios\": " << ratio_json(memory_.evaluate(specs_)).dump()
                          << ",\n  \"notes\": " << notes.dump() << "\n}\n";
    }

private:
    const std::vector<ratio_spec>& specs_;
    const context_notes& notes_;
    run_memory memory_;
};

// The main of a bench program once its benchmarks are registered (`ratios` made with them):
// runs those the command line selects and prints the table and the ratios, or one JSON document
// with --benchmark_format=json. Returns the exit status.
inline int run_with_ratios(int argc, char** argv, const std::vector<ratio_spec>& ratios, const context_notes& notes) {
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        json = json || std::string_view(argv[i]) == "--benchmark_format=json";
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 2;
    }
    std::unique_ptr<benchmark::BenchmarkReporter> reporter;
    if (json) {
        reporter = std::make_unique<json_with_ratios>(ratios, notes);
    } else {
        reporter = std::make_unique<console_with_ratios>(ratios, notes);
    }
    benchmark::RunSpecifiedBenchmarks(reporter.get());
    benchmark::Shutdown();
    return 0;
}

} // namespace nxmem::bench
