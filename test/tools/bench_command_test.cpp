// `nxmem bench` on the posix plugin, with a tiny iteration count: every figure is printed, in
// text and in valid JSON, and a bad plugin or mechanism is a clear error with a non-zero exit.
// Environment: NXMEM_TOOL (the nxmem executable), NXMEM_POSIX_PLUGIN.
#include <measure/plugin_figures.hpp>
#include <measure/pool_figures.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct command_output {
    int status = -1;
    std::string text; // standard output, and standard error when asked for
};

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    REQUIRE(value != nullptr);
    return value;
}

// Runs `nxmem bench ARGUMENTS` (arguments already quoted for the shell).
command_output run_bench(const std::string& arguments, bool with_errors = false) {
    const std::string command = "'" + environment("NXMEM_TOOL") + "' bench --iterations 50 --live 50 " +
                                arguments + (with_errors ? " 2>&1" : "");
    command_output out;
    FILE* pipe = ::popen(command.c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) {
        out.text.append(buffer, got);
    }
    const int status = ::pclose(pipe);
    out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

std::string posix_plugin() { return "'" + environment("NXMEM_POSIX_PLUGIN") + "'"; }

} // namespace

TEST_CASE("nxmem bench prints every figure for a mechanism, in text") {
    for (const auto& [mechanism, virtual_backing] : {std::pair{"posix-eager", false}, {"posix-lazy", true}}) {
        const command_output out = run_bench(posix_plugin() + " --mechanism " + mechanism);
        INFO(out.text);
        REQUIRE(out.status == 0);
        CHECK(out.text.find(std::string("mechanism '") + mechanism + "'") != std::string::npos);
        for (const std::string& key : nxmem::measure::plugin_figure_keys(virtual_backing)) {
            INFO(key);
            CHECK(out.text.find("  " + key + " ") != std::string::npos);
        }
        if (!virtual_backing) {
            CHECK(out.text.find("range.") == std::string::npos);
        }
    }
}

TEST_CASE("nxmem bench --json prints one document with every figure as a number") {
    const command_output out = run_bench(posix_plugin() + " --mechanism posix-lazy --json");
    INFO(out.text);
    REQUIRE(out.status == 0);
    const nlohmann::json report = nlohmann::json::parse(out.text); // throws (fails) when invalid
    CHECK(report.at("mechanism") == "posix-lazy");
    CHECK((report.at("load_average").is_number() || report.at("load_average").is_null()));
    const nlohmann::json& figures = report.at("figures");
    const auto keys = nxmem::measure::plugin_figure_keys(true);
    CHECK(figures.size() == keys.size());
    for (const std::string& key : keys) {
        INFO(key);
        REQUIRE(figures.contains(key));
        CHECK(figures.at(key).at("value").is_number());
        CHECK(figures.at(key).at("unit").is_string());
    }
}

TEST_CASE("nxmem bench --pool prints every pooled figure, for a mechanism with and without virtual backing") {
    for (const char* mechanism : {"posix-eager", "posix-lazy"}) {
        const command_output out = run_bench(posix_plugin() + " --pool --json --mechanism " + mechanism);
        INFO(out.text);
        REQUIRE(out.status == 0);
        const nlohmann::json report = nlohmann::json::parse(out.text);
        CHECK(report.at("mechanism") == mechanism);
        CHECK(report.at("pooled") == true);
        const nlohmann::json& figures = report.at("figures");
        const auto keys = nxmem::measure::pool_figure_keys();
        CHECK(figures.size() == keys.size());
        for (const std::string& key : keys) {
            INFO(key);
            REQUIRE(figures.contains(key));
            CHECK(figures.at(key).at("value").is_number());
        }
        // Counts, not timings: 50 live 64 B allocations take at least one upstream call, and
        // trim(0) with nothing live gives everything back.
        CHECK(figures.at("crossings.live").at("value") == 50);
        CHECK(figures.at("crossings.upstream_calls").at("value").get<double>() >= 1);
        CHECK(figures.at("crossings.held_after_trim").at("value") == 0);
    }
    const command_output text = run_bench(posix_plugin() + " --pool");
    INFO(text.text);
    REQUIRE(text.status == 0);
    CHECK(text.text.find("mechanism 'posix-eager' on cpu:0, pooled") != std::string::npos);
    for (const std::string& key : nxmem::measure::pool_figure_keys()) {
        INFO(key);
        CHECK(text.text.find("  " + key + " ") != std::string::npos);
    }
}

TEST_CASE("nxmem bench picks the first cpu mechanism when none is named") {
    const command_output out = run_bench(posix_plugin());
    INFO(out.text);
    REQUIRE(out.status == 0);
    CHECK(out.text.find("mechanism 'posix-eager'") != std::string::npos);
}

TEST_CASE("nxmem bench names an unknown mechanism and fails") {
    const command_output out = run_bench(posix_plugin() + " --mechanism no-such-mechanism", true);
    INFO(out.text);
    CHECK(out.status == 1);
    CHECK(out.text.find("no mechanism named 'no-such-mechanism'") != std::string::npos);
    CHECK(out.text.find("posix-eager") != std::string::npos); // the ones it has
}

TEST_CASE("nxmem bench refuses a file that is not a plugin") {
    const command_output out = run_bench("'" + environment("NXMEM_NOT_A_PLUGIN") + "'", true);
    INFO(out.text);
    CHECK(out.status == 1);
    CHECK(out.text.find("nxmem bench: ") != std::string::npos);
    CHECK(out.text.find("cannot load") != std::string::npos);
}

TEST_CASE("nxmem bench without a plugin is a usage error") {
    const std::string command = "'" + environment("NXMEM_TOOL") + "' bench >/dev/null 2>&1";
    const int status = std::system(command.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
}
