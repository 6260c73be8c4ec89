// docs/CONFORMANCE.md's rule-to-check table against docs/ABI.md (issue 23, item 6): every numbered
// rule of the contract names the conformance checks that judge it, or is judged by the host alone
// with the reason, or is owed a check (naming the project's tests that pin it meanwhile); and
// every check the table names exists.
#include <nxmem/conform.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

// ---- issue 35: the revision each rule entered, the rules each check judges, the permissions ----

namespace {

// docs/ABI.md's revision table: rule id -> {"1.2 (2026-12-01)", host protection reason}.
std::map<std::string, std::pair<std::string, std::string>> revision_rows() {
    const std::string text = read_doc("ABI.md");
    const std::size_t start = text.find("## Contract revisions");
    REQUIRE(start != std::string::npos);
    const std::size_t end = text.find("\n## ", start + 1);
    std::istringstream section(text.substr(start, end - start));
    const std::regex row(R"(^\| ([A-Z]{1,2}[0-9]+) \| (1\.[0-9]+ \([0-9-]+\)) \| (.*) \|$)");
    std::map<std::string, std::pair<std::string, std::string>> rows;
    for (std::string line; std::getline(section, line);) {
        std::smatch found;
        if (std::regex_match(line, found, row)) {
            INFO(line);
            CHECK(rows.count(found[1]) == 0); // one row per rule
            rows[found[1]] = {found[2], found[3]};
        }
    }
    return rows;
}

std::string read_source(const char* relative) {
    const char* root = std::getenv("NXMEM_SOURCE_ROOT");
    REQUIRE(root != nullptr);
    std::ifstream file(std::string(root) + "/" + relative);
    REQUIRE(file.good());
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
}

} // namespace

TEST_CASE("every rule of ABI.md states the revision it entered, as rules.hpp has it", "[conform][docs]") {
    const std::set<std::string> rules = abi_rules();
    const auto rows = revision_rows();
    for (const std::string& rule : rules) {
        INFO("rule " << rule);
        REQUIRE(rows.count(rule) == 1);
        const nxmem::conform::rule_revision* table = nxmem::conform::find_rule(rule);
        REQUIRE(table != nullptr);
        CHECK(rows.at(rule).first == table->revision());
        CHECK(rows.at(rule).second == std::string(table->host_protection));
    }
    for (const nxmem::conform::rule_revision& table : nxmem::conform::contract_rules) {
        INFO("rules.hpp names " << table.id);
        CHECK(rules.count(std::string(table.id)) == 1);
        // Each entered in a release the table lists.
        bool released = false;
        for (const nxmem::conform::contract_release& release : nxmem::conform::contract_releases) {
            released = released || (release.minor == table.minor && release.date == table.entered);
        }
        CHECK(released);
    }
    CHECK(rows.size() == nxmem::conform::contract_rules.size());
}

TEST_CASE("the rules each check judges in rules.hpp are the rule table's, read backwards", "[conform][docs]") {
    const std::multimap<std::string, std::string> rows = table_rows();
    std::map<std::string, std::set<std::string>> from_docs; // check -> rules naming it
    const std::regex check_id(R"(`([a-z_]+\.[a-z_]+)`)");
    for (const auto& [rule, judged_by] : rows) {
        if (judged_by.rfind("host alone:", 0) == 0) {
            continue;
        }
        for (auto it = std::sregex_iterator(judged_by.begin(), judged_by.end(), check_id);
             it != std::sregex_iterator(); ++it) {
            from_docs[(*it)[1]].insert(rule);
        }
    }
    from_docs.erase("oom.clean_run"); // nxmem conform --oom's reports, not checks of the suite
    from_docs.erase("oom.every_allocation");
    std::map<std::string, std::set<std::string>> from_table;
    for (const nxmem::conform::check_rules& entry : nxmem::conform::rules_by_check) {
        std::istringstream ids{std::string(entry.rules)};
        for (std::string id; ids >> id;) {
            from_table[std::string(entry.check)].insert(id);
        }
    }
    CHECK(from_docs == from_table);
}

TEST_CASE("a rule that entered after the minor a plugin declares binds it as a warning", "[conform][rules]") {
    using nxmem::conform::rule_set;
    rule_set minor0{0, std::nullopt};
    rule_set minor2{2, std::nullopt};
    rule_set minor3{3, std::nullopt};
    // D10 entered 1.2 (2026-12-01): after minors 0 to 2 were published, before minor 3.
    CHECK(minor0.not_in_force("D10"));
    CHECK(minor2.not_in_force("D10"));
    CHECK(minor3.enforced("D10"));
    // C7 entered with minor 2.
    CHECK(minor0.not_in_force("C7"));
    CHECK(minor2.enforced("C7"));
    // A rule of the first contract binds every plugin; so does one the host needs (E9).
    CHECK(minor0.enforced("C8"));
    CHECK(minor0.enforced("E9"));
    // A minor newer than every release, or an unknown minor, is judged by every rule.
    CHECK(rule_set{9, std::nullopt}.enforced("D10"));
    CHECK(rule_set{}.enforced("D10"));
    // --rules: an older release's rule set.
    const auto release_1_1 = nxmem::conform::parse_rule_set("1.1");
    REQUIRE(release_1_1);
    CHECK(release_1_1->date == "2026-11-29");
    CHECK(rule_set{3, release_1_1}.not_in_force("D10"));
    CHECK(rule_set{3, release_1_1}.enforced("V6"));
    CHECK(nxmem::conform::parse_rule_set("1.2")->date == "2026-12-01"); // a minor: its last release
    CHECK(nxmem::conform::parse_rule_set("2026-11-30")->minor == 2);
    CHECK(nxmem::conform::parse_rule_set("1.3 (2026-12-02)")->date == "2026-12-02");
    CHECK_FALSE(nxmem::conform::parse_rule_set("1.9"));
    CHECK_FALSE(nxmem::conform::parse_rule_set("2026-11-28"));
    // A failure blamed on several rules warns only when none of them is in force.
    CHECK(minor0.none_in_force("(D10)"));
    CHECK_FALSE(minor0.none_in_force("G5 C8"));
    CHECK_FALSE(minor0.none_in_force("no rule named"));
    CHECK(rule_set::rule_ids_in("(G3, G5: a legal range; NXMEM_CAP_IPC, Q17x, IP14)") ==
          std::vector<std::string>{"G3", "G5", "IP14"});
}

TEST_CASE("every permission of ABI.md is exercised both ways by a fixture", "[conform][docs]") {
    const std::string text = read_doc("ABI.md");
    // Markers: *[permission NAME: READING | READING]* (the text may wrap inside one).
    std::map<std::string, std::set<std::string>> permissions;
    const std::regex marker(R"(\[permission\s+([a-z0-9-]+):\s*([^\]]+)\])");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), marker); it != std::sregex_iterator(); ++it) {
        std::string readings = (*it)[2];
        std::replace(readings.begin(), readings.end(), '\n', ' ');
        std::istringstream split(readings);
        for (std::string reading; std::getline(split, reading, '|');) {
            reading = std::regex_replace(reading, std::regex(R"(^\s+|\s+$)"), "");
            reading = std::regex_replace(reading, std::regex(R"(\s+)"), " ");
            permissions[(*it)[1]].insert(reading);
        }
    }
    REQUIRE(permissions.size() >= 8);
    // Every sentence of a rule that grants a mechanism or plugin a choice carries a marker.
    const std::regex rule_start(R"(^\*\*([A-Z]{1,2}[0-9]+)\.\*\*)");
    const std::regex grants(R"(\b([Mm]echanism|[Pp]lugin) may\b|\bmay refuse\b|\bleaves? [^.]*\balone\b)");
    std::istringstream lines(text);
    std::string paragraph;
    std::string rule;
    auto judge = [&] {
        if (!rule.empty() && std::regex_search(paragraph, grants)) {
            INFO("rule " << rule << " grants a choice: " << paragraph.substr(0, 300));
            CHECK(paragraph.find("[permission") != std::string::npos);
        }
        paragraph.clear();
        rule.clear();
    };
    for (std::string line; std::getline(lines, line);) {
        std::smatch found;
        if (line.empty() || std::regex_search(line, found, rule_start) || line.rfind("#", 0) == 0) {
            judge();
            if (!line.empty() && std::regex_search(line, found, rule_start)) {
                rule = found[1];
            }
        }
        paragraph += " " + line;
    }
    judge();
    // test/conform/permissions.txt: PERMISSION | READING | PLUGIN | MECHANISM | ARGS
    std::map<std::string, std::set<std::string>> fixtures;
    std::istringstream registry(read_source("test/conform/permissions.txt"));
    for (std::string line; std::getline(registry, line);) {
        if (line.empty() || line[0] == '#') {
            continue;
        }
        std::vector<std::string> fields;
        std::istringstream split(line);
        for (std::string field; std::getline(split, field, '|');) {
            fields.push_back(std::regex_replace(field, std::regex(R"(^\s+|\s+$)"), ""));
        }
        INFO(line);
        REQUIRE(fields.size() >= 4);
        CHECK(permissions.count(fields[0]) == 1); // a fixture for a permission the text has
        fixtures[fields[0]].insert(fields[1]);
    }
    for (const auto& [permission, readings] : permissions) {
        INFO("permission " << permission);
        CHECK(readings.size() >= 2);
        CHECK(fixtures[permission] == readings);
    }
}
