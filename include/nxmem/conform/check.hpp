// The result of one conformance check: pass, fail (what was expected and what came back), not
// applicable (and why), or warn: a failure of a rule not in force for the plugin (rules.hpp), printed
// and reported but not failing. Plain values, so a tool can print them, serialise them or send them
// through a pipe from the child process that ran them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace nxmem::conform {

enum class outcome : std::uint8_t { pass, fail, not_applicable, warn };

constexpr std::string_view outcome_name(outcome verdict) noexcept {
    switch (verdict) {
    case outcome::pass: return "pass";
    case outcome::fail: return "fail";
    case outcome::not_applicable: return "not_applicable";
    case outcome::warn: return "warn";
    }
    return "unknown";
}

// What one check found, before it is named: the body of every check returns one of these.
struct finding {
    outcome verdict = outcome::pass;
    std::string expected; // fail: what the contract asks for
    std::string actual;   // fail: what came back; not applicable: the reason
    std::string rule;     // fail, warn: the rule ids the plugin contradicts ("C7"); empty: the check's
};

inline finding passed() { return finding{}; }
inline finding failed(std::string expected, std::string actual) {
    return finding{outcome::fail, std::move(expected), std::move(actual), {}};
}
// A failure of one rule in particular (the suite turns it into a warning when the rule is not in
// force for the plugin).
inline finding failed_rule(std::string rule, std::string expected, std::string actual) {
    return finding{outcome::fail, std::move(expected), std::move(actual), std::move(rule)};
}
inline finding not_applicable(std::string reason) {
    return finding{outcome::not_applicable, {}, std::move(reason), {}};
}

// One check's result, named.
struct check_result {
    std::string id;    // stable, dotted: "misuse.misdescribed"
    std::string title; // one line: what passing proves
    outcome verdict = outcome::pass;
    std::string expected; // fail only
    std::string actual;   // fail, warn: what came back (warn: and why it does not fail); not applicable: the reason
    std::string rule;     // fail, warn: the rules contradicted, space-separated

    bool passed() const noexcept { return verdict == outcome::pass; }
    bool failed() const noexcept { return verdict == outcome::fail; }
    bool skipped() const noexcept { return verdict == outcome::not_applicable; }
    bool warned() const noexcept { return verdict == outcome::warn; }
};

inline check_result name_finding(std::string_view id, std::string_view title, finding found) {
    return check_result{std::string(id), std::string(title), found.verdict,
                        std::move(found.expected), std::move(found.actual), std::move(found.rule)};
}

} // namespace nxmem::conform
