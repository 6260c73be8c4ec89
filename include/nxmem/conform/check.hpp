// The result of one conformance check: pass, fail (what was expected and what came back) or not
// applicable (and why). Plain values, so a tool can print them, serialise them or send them
// through a pipe from the child process that ran them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace nxmem::conform {

enum class outcome : std::uint8_t { pass, fail, not_applicable };

constexpr std::string_view outcome_name(outcome verdict) noexcept {
    switch (verdict) {
    case outcome::pass: return "pass";
    case outcome::fail: return "fail";
    case outcome::not_applicable: return "not_applicable";
    }
    return "unknown";
}

// What one check found, before it is named: the body of every check returns one of these.
struct finding {
    outcome verdict = outcome::pass;
    std::string expected; // fail: what the contract asks for
    std::string actual;   // fail: what came back; not applicable: the reason
};

inline finding passed() { return finding{}; }
inline finding failed(std::string expected, std::string actual) {
    return finding{outcome::fail, std::move(expected), std::move(actual)};
}
inline finding not_applicable(std::string reason) {
    return finding{outcome::not_applicable, {}, std::move(reason)};
}

// One check's result, named.
struct check_result {
    std::string id;    // stable, dotted: "misuse.misdescribed"
    std::string title; // one line: what passing proves
    outcome verdict = outcome::pass;
    std::string expected; // fail only
    std::string actual;   // fail: what came back; not applicable: the reason

    bool passed() const noexcept { return verdict == outcome::pass; }
    bool failed() const noexcept { return verdict == outcome::fail; }
    bool skipped() const noexcept { return verdict == outcome::not_applicable; }
};

inline check_result name_finding(std::string_view id, std::string_view title, finding found) {
    return check_result{std::string(id), std::string(title), found.verdict,
                        std::move(found.expected), std::move(found.actual)};
}

} // namespace nxmem::conform
