#include "conform_report.hpp"

#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>

namespace nxmem::tool {

namespace {

std::string_view label(conform::outcome verdict) {
    switch (verdict) {
    case conform::outcome::pass: return "PASS";
    case conform::outcome::fail: return "FAIL";
    case conform::outcome::not_applicable: return "N/A ";
    case conform::outcome::warn: return "WARN";
    }
    return "????";
}

std::string counts(const mechanism_run& mechanism) {
    return std::to_string(mechanism.count(conform::outcome::pass)) + " passed, " +
           std::to_string(mechanism.count(conform::outcome::fail)) + " failed, " +
           std::to_string(mechanism.count(conform::outcome::not_applicable)) + " not applicable" +
           (mechanism.count(conform::outcome::warn) == 0
                ? std::string()
                : ", " + std::to_string(mechanism.count(conform::outcome::warn)) + " warned (not failing)");
}

// Text safe inside an XML attribute or element: the five entities escaped, and control characters
// other than tab, newline and carriage return (not allowed in XML 1.0) replaced.
std::string xml_escape(std::string_view text) {
    std::string escaped;
    escaped.reserve(text.size());
    for (char c : text) {
        switch (c) {
        case '&': escaped += "&amp;"; break;
        case '<': escaped += "&lt;"; break;
        case '>': escaped += "&gt;"; break;
        case '"': escaped += "&quot;"; break;
        case '\'': escaped += "&apos;"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
                escaped += '?';
            } else {
                escaped += c;
            }
        }
    }
    return escaped;
}

std::string failure_text(const conform::check_result& result) {
    return "expected " + result.expected + ", got " + result.actual;
}

} // namespace

void print_conform_text(std::ostream& out, const std::vector<plugin_run>& runs) {
    std::size_t mechanisms = 0;
    std::size_t conforming = 0;
    std::size_t crashed = 0;
    std::size_t timed_out = 0;
    std::size_t refused = 0;
    for (const plugin_run& run : runs) {
        out << "plugin " << run.path << '\n';
        if (run.load_error) {
            out << "  REFUSED " << *run.load_error << "\n\n";
            ++refused;
            continue;
        }
        for (const mechanism_run& mechanism : run.mechanisms) {
            ++mechanisms;
            out << "  mechanism " << mechanism.name << " on " << mechanism.device << '\n';
            std::size_t width = 0;
            for (const conform_check& check : mechanism.checks) {
                width = std::max(width, check.result.id.size());
            }
            for (const conform_check& check : mechanism.checks) {
                const conform::check_result& result = check.result;
                out << "    " << label(result.verdict) << "  " << result.id
                    << std::string(width - result.id.size() + 2, ' ') << result.title;
                if (result.failed() || result.warned()) {
                    out << " (expected " << result.expected << ", got " << result.actual
                        << (result.rule.empty() ? std::string() : "; rule " + result.rule) << ')';
                } else if (!result.actual.empty()) {
                    // a skip's reason, or what a pass measured (oom.clean_run's allocation count)
                    out << " (" << result.actual << ')';
                }
                out << '\n';
            }
            if (mechanism.crash) {
                out << (mechanism.timed_out ? "    TIMEOUT " : "    CRASH ") << *mechanism.crash << '\n';
                ++(mechanism.timed_out ? timed_out : crashed);
            }
            conforming += mechanism.conforms() ? 1 : 0;
            out << "    " << mechanism.name << ": " << counts(mechanism)
                << (!mechanism.crash ? "" : mechanism.timed_out ? ", timed out" : ", crashed")
                << (mechanism.conforms() ? " -- conforms" : " -- DOES NOT CONFORM") << "\n\n";
        }
    }
    out << "summary: " << mechanisms << " mechanism(s) in " << runs.size() << " plugin(s): "
        << conforming << " conform, " << (mechanisms - conforming) << " do not (" << crashed
        << " crashed, " << timed_out << " timed out)";
    if (refused > 0) {
        out << "; " << refused << " plugin(s) refused";
    }
    out << '\n';
}

nlohmann::ordered_json conform_to_json(const std::vector<plugin_run>& runs) {
    nlohmann::ordered_json plugins = nlohmann::ordered_json::array();
    for (const plugin_run& run : runs) {
        nlohmann::ordered_json plugin;
        plugin["path"] = run.path;
        plugin["conforms"] = run.conforms();
        plugin["load_error"] = run.load_error ? nlohmann::ordered_json(*run.load_error) : nullptr;
        nlohmann::ordered_json mechanisms = nlohmann::ordered_json::array();
        for (const mechanism_run& mechanism : run.mechanisms) {
            nlohmann::ordered_json entry;
            entry["name"] = mechanism.name;
            entry["device"] = mechanism.device;
            entry["conforms"] = mechanism.conforms();
            const bool crashed = mechanism.crash && !mechanism.timed_out;
            const bool hung = mechanism.crash && mechanism.timed_out;
            entry["crash"] = crashed ? nlohmann::ordered_json(*mechanism.crash) : nullptr;
            entry["timeout"] = hung ? nlohmann::ordered_json(*mechanism.crash) : nullptr;
            entry["passed"] = mechanism.count(conform::outcome::pass);
            entry["failed"] = mechanism.count(conform::outcome::fail);
            entry["not_applicable"] = mechanism.count(conform::outcome::not_applicable);
            entry["warned"] = mechanism.count(conform::outcome::warn);
            nlohmann::ordered_json checks = nlohmann::ordered_json::array();
            for (const conform_check& check : mechanism.checks) {
                nlohmann::ordered_json item;
                item["id"] = check.result.id;
                item["title"] = check.result.title;
                item["rule"] = check.rule;
                item["outcome"] = conform::outcome_name(check.result.verdict);
                if (check.result.failed() || check.result.warned()) {
                    item["expected"] = check.result.expected;
                    item["actual"] = check.result.actual;
                    item["rules"] = check.result.rule; // the rule ids contradicted, space-separated
                } else if (check.result.skipped()) {
                    item["reason"] = check.result.actual;
                } else if (!check.result.actual.empty()) {
                    item["detail"] = check.result.actual; // what a pass measured (oom.clean_run)
                }
                checks.push_back(std::move(item));
            }
            entry["checks"] = std::move(checks);
            mechanisms.push_back(std::move(entry));
        }
        plugin["mechanisms"] = std::move(mechanisms);
        plugins.push_back(std::move(plugin));
    }
    return plugins;
}

void write_conform_junit(std::ostream& out, const std::vector<plugin_run>& runs) {
    std::size_t tests = 0;
    std::size_t failures = 0;
    std::size_t skipped = 0;
    for (const plugin_run& run : runs) {
        tests += run.load_error ? 1 : 0;
        failures += run.load_error ? 1 : 0;
        for (const mechanism_run& mechanism : run.mechanisms) {
            tests += mechanism.checks.size();
            failures += mechanism.count(conform::outcome::fail);
            skipped += mechanism.count(conform::outcome::not_applicable);
        }
    }
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out << "<testsuites name=\"nxmem conform\" tests=\"" << tests << "\" failures=\"" << failures
        << "\" skipped=\"" << skipped << "\" errors=\"0\">\n";
    for (const plugin_run& run : runs) {
        const std::string plugin = std::filesystem::path(run.path).filename().string();
        if (run.load_error) {
            out << "  <testsuite name=\"" << xml_escape(plugin) << "\" tests=\"1\" failures=\"1\" "
                << "skipped=\"0\" errors=\"0\">\n"
                << "    <testcase classname=\"" << xml_escape(plugin) << "\" name=\"plugin.load\">\n"
                << "      <failure message=\"" << xml_escape(*run.load_error) << "\"/>\n"
                << "    </testcase>\n  </testsuite>\n";
            continue;
        }
        for (const mechanism_run& mechanism : run.mechanisms) {
            const std::string suite = plugin + ":" + mechanism.name;
            out << "  <testsuite name=\"" << xml_escape(suite) << "\" tests=\""
                << mechanism.checks.size() << "\" failures=\""
                << mechanism.count(conform::outcome::fail) << "\" skipped=\""
                << mechanism.count(conform::outcome::not_applicable) << "\" errors=\"0\">\n";
            out << "    <properties>\n      <property name=\"device\" value=\""
                << xml_escape(mechanism.device) << "\"/>\n";
            if (mechanism.crash) {
                out << "      <property name=\"" << (mechanism.timed_out ? "timeout" : "crash")
                    << "\" value=\"" << xml_escape(*mechanism.crash)
                    << "\"/>\n";
            }
            out << "    </properties>\n";
            for (const conform_check& check : mechanism.checks) {
                const conform::check_result& result = check.result;
                out << "    <testcase classname=\"" << xml_escape(suite) << "\" name=\""
                    << xml_escape(result.id) << "\"";
                if (result.passed()) {
                    out << "/>\n";
                    continue;
                }
                out << ">\n";
                if (result.failed()) {
                    out << "      <failure message=\"" << xml_escape(failure_text(result))
                        << "\" type=\"" << xml_escape(check.rule) << "\">"
                        << xml_escape(result.title + ": " + failure_text(result)) << "</failure>\n";
                } else if (result.warned()) {
                    // A warning does not fail: the case passes and says why in its output.
                    out << "      <system-out>" << xml_escape("WARN (rule " + result.rule + "): " + failure_text(result))
                        << "</system-out>\n";
                } else {
                    out << "      <skipped message=\"" << xml_escape(result.actual) << "\"/>\n";
                }
                out << "    </testcase>\n";
            }
            out << "  </testsuite>\n";
        }
    }
    out << "</testsuites>\n";
}

} // namespace nxmem::tool
