// docs/CONFORMANCE.md's rule-to-check table against docs/ABI.md (issue 23, item 6): every numbered
// rule of the contract names the conformance checks that judge it, or is judged by the host alone
// with the reason, or is owed a check (naming the project's tests that pin it meanwhile); and
// every check the table names exists.
#include <nxmem/conform.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_doc(const char* name) {
    const char* root = std::getenv("NXMEM_SOURCE_ROOT");
    REQUIRE(root != nullptr);
    std::ifstream file(std::string(root) + "/docs/" + name);
    REQUIRE(file.good());
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
}

// The rule ids ABI.md defines: "**Q7.**" at the start of a line.
std::set<std::string> abi_rules() {
    const std::string text = read_doc("ABI.md");
    const std::regex rule(R"(^\*\*([A-Z]{1,2}[0-9]+)\.\*\*)", std::regex::multiline);
    std::set<std::string> ids;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), rule); it != std::sregex_iterator(); ++it) {
        ids.insert((*it)[1]);
    }
    return ids;
}

// The table's rows: rule id -> what judges it.
std::multimap<std::string, std::string> table_rows() {
    const std::string text = read_doc("CONFORMANCE.md");
    const std::size_t start = text.find("## Rule to check");
    REQUIRE(start != std::string::npos);
    const std::size_t end = text.find("\n## ", start + 1);
    std::istringstream section(text.substr(start, end - start));
    const std::regex row(R"(^\| ([A-Z]{1,2}[0-9]+) \| (.*) \|$)");
    std::multimap<std::string, std::string> rows;
    for (std::string line; std::getline(section, line);) {
        std::smatch found;
        if (std::regex_match(line, found, row)) {
            rows.emplace(found[1], found[2]);
        }
    }
    return rows;
}

} // namespace

TEST_CASE("every rule of ABI.md names its checks in CONFORMANCE.md, or why the host alone judges it",
          "[conform][docs]") {
    const std::set<std::string> rules = abi_rules();
    const std::multimap<std::string, std::string> rows = table_rows();
    REQUIRE(rules.size() > 100); // the parse found the rules
    for (const std::string& rule : rules) {
        INFO("rule " << rule);
        CHECK(rows.count(rule) == 1);
    }
    const std::regex check_id(R"(`([a-z_]+\.[a-z_]+)`)");
    for (const auto& [rule, judged_by] : rows) {
        INFO("rule " << rule << ": " << judged_by);
        CHECK(rules.count(rule) == 1); // no row for a rule ABI.md does not have
        if (judged_by.rfind("host alone:", 0) == 0) {
            CHECK(judged_by.size() > std::string("host alone: ").size() + 10); // with the reason
            continue;
        }
        if (judged_by.rfind("owed:", 0) == 0) {
            // A rule no check judges yet: the row names the project's tests that pin it.
            CHECK(judged_by.find("test/") != std::string::npos);
            continue;
        }
        std::size_t named = 0;
        for (auto it = std::sregex_iterator(judged_by.begin(), judged_by.end(), check_id);
             it != std::sregex_iterator(); ++it) {
            INFO("check " << (*it)[1]);
            // The suite's checks, and the two `nxmem conform --oom` reports (tools/nxmem/conform_oom.cpp).
            const bool oom_check = (*it)[1] == "oom.clean_run" || (*it)[1] == "oom.every_allocation";
            CHECK((oom_check || nxmem::conform::find_check((*it)[1].str()) != nullptr));
            ++named;
        }
        CHECK(named > 0);
    }
}

TEST_CASE("every check of the suite is named by some rule", "[conform][docs]") {
    const std::multimap<std::string, std::string> rows = table_rows();
    for (const nxmem::conform::check_definition& check : nxmem::conform::all_checks) {
        INFO("check " << check.id);
        bool named = false;
        for (const auto& [rule, judged_by] : rows) {
            named = named || judged_by.find("`" + std::string(check.id) + "`") != std::string::npos;
        }
        CHECK(named);
    }
}
