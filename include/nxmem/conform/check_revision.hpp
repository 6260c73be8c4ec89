// When the rule a check judges entered the contract, so a verdict can be a warning for a plugin
// written before it (docs/ABI.md, "Contract revisions"): a check whose rule entered after the
// minor a plugin declares fails it only when the host cannot protect itself without the rule.
// The checks of failure paths, edges, options, outputs, precedence, borrowing and racing queries
// (checks_rollback.hpp ... checks_usage_race.hpp) each state theirs as `revision`.
#pragma once

#include <string_view>

namespace nxmem::conform {

struct check_revision {
    std::string_view rules;        // the numbered rules of docs/ABI.md the check proves: "E12"
    std::string_view minor;        // the minor whose plugins the rule binds: "1.0" (every one)
    std::string_view entered;      // the release it entered in, as a date: "2026-12-04"
    bool host_needs_it = false;    // without it the host cannot protect itself: fails old plugins too
    std::string_view why_needed;   // when host_needs_it: why; otherwise how the host copes
};

} // namespace nxmem::conform
