// The contract's rules with the revision each entered, and the rule set a plugin is judged by.
// The contract does not move under plugins already written (docs/ABI.md, "Contract revisions"): a
// rule that entered after the minor a plugin declares was published is, for that plugin, a warning,
// unless the host cannot protect itself without it (the rule says why). `nxmem conform --rules`
// judges by an older release's rule set. This table is the one source: docs/ABI.md's revision table
// is checked against it by test/conform/rule_table_test.cpp, so text and table never disagree.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::conform {

// A published state of the contract: the newest minor it describes and the day it was published.
struct contract_release {
    std::uint32_t minor = 0;
    std::string_view date; // YYYY-MM-DD, so dates compare as text

    std::string name() const { return "1." + std::to_string(minor) + " (" + std::string(date) + ")"; }
};

// Every release, oldest first. Minors 0 and 1 were published together.
inline constexpr std::array contract_releases{
    contract_release{1, "2026-11-29"}, // minors 0 and 1: the first contract
    contract_release{2, "2026-11-30"}, // minor 2: commit granularity, usage query, flags versioned like slots
    contract_release{2, "2026-12-01"}, // rules added within minor 2 (callbacks, accounting, boundaries)
    contract_release{3, "2026-12-02"}, // minor 3: sharing across processes
    contract_release{3, "2026-12-04"}, // C8 and C8a one rule (every reading conforms); R13, S9, IP15-IP18 (hostile tables and peers)
    contract_release{4, "2026-12-04"}, // minor 4: stream-ordered release and copies (V13, F1-F7, CP1-CP4)
};

// One numbered rule of docs/ABI.md: the release it entered, and, when it binds every plugin
// whatever minor it declares, why the host cannot protect itself without it.
struct rule_revision {
    std::string_view id;
    std::uint32_t minor = 0;         // of the release it entered
    std::string_view entered;        // that release's date
    std::string_view host_protection; // empty: a warning for plugins declaring an older minor

    std::string revision() const { return contract_release{minor, entered}.name(); }
};

// clang-format off
inline constexpr std::array contract_rules{
    rule_revision{"L1", 1, "2026-11-29", {}},
    rule_revision{"L2", 1, "2026-11-29", {}},
    rule_revision{"L3", 1, "2026-11-29", {}},
    rule_revision{"L4", 1, "2026-11-29", {}},
    rule_revision{"L5", 1, "2026-11-29", {}},
    rule_revision{"L6", 1, "2026-11-29", {}},
    rule_revision{"L7", 1, "2026-11-29", {}},
    rule_revision{"L8", 1, "2026-11-29", {}},
    rule_revision{"L9", 1, "2026-11-29", {}},
    rule_revision{"L10", 2, "2026-12-01", {}},
    rule_revision{"V1", 1, "2026-11-29", {}},
    rule_revision{"V2", 1, "2026-11-29", {}},
    rule_revision{"V3", 1, "2026-11-29", {}},
    rule_revision{"V4", 1, "2026-11-29", {}},
    rule_revision{"V5", 1, "2026-11-29", {}},
    rule_revision{"V6", 1, "2026-11-29", {}},
    rule_revision{"V7", 1, "2026-11-29", {}},
    rule_revision{"V8", 1, "2026-11-29", {}},
    rule_revision{"V9", 1, "2026-11-29", {}},
    rule_revision{"V10", 1, "2026-11-29", {}},
    rule_revision{"V11", 2, "2026-11-30", {}},
    rule_revision{"V12", 3, "2026-12-02", {}},
    rule_revision{"R1", 1, "2026-11-29", {}},
    rule_revision{"R2", 1, "2026-11-29", {}},
    rule_revision{"R3", 1, "2026-11-29", {}},
    rule_revision{"R4", 1, "2026-11-29", {}},
    rule_revision{"R5", 1, "2026-11-29", {}},
    rule_revision{"R6", 1, "2026-11-29", {}},
    rule_revision{"R7", 1, "2026-11-29", {}},
    rule_revision{"R8", 1, "2026-11-29", {}},
    rule_revision{"R9", 1, "2026-11-29", {}},
    rule_revision{"R10", 1, "2026-11-29", {}},
    rule_revision{"R11", 1, "2026-11-29", {}},
    rule_revision{"R12", 2, "2026-12-01", {}},
    rule_revision{"R13", 3, "2026-12-04", "a capability table read below the minor that introduced it has every slot NULL while the allocator table points to it: the host would report the capability and jump to address 0"},
    rule_revision{"Q1", 1, "2026-11-29", {}},
    rule_revision{"Q2", 1, "2026-11-29", {}},
    rule_revision{"Q3", 1, "2026-11-29", {}},
    rule_revision{"Q4", 1, "2026-11-29", {}},
    rule_revision{"Q5", 1, "2026-11-29", {}},
    rule_revision{"Q6", 1, "2026-11-29", {}},
    rule_revision{"Q7", 1, "2026-11-29", {}},
    rule_revision{"Q8", 1, "2026-11-29", {}},
    rule_revision{"Q9", 1, "2026-11-29", {}},
    rule_revision{"Q10", 1, "2026-11-29", {}},
    rule_revision{"Q11", 1, "2026-11-29", {}},
    rule_revision{"Q12", 1, "2026-11-29", {}},
    rule_revision{"Q13", 1, "2026-11-29", {}},
    rule_revision{"Q14", 1, "2026-11-29", {}},
    rule_revision{"Q15", 2, "2026-12-01", {}},
    rule_revision{"Q16", 2, "2026-12-01", {}},
    rule_revision{"Q17", 2, "2026-12-01", {}},
    rule_revision{"Q18", 3, "2026-12-04", {}},
    rule_revision{"S1", 1, "2026-11-29", {}},
    rule_revision{"S2", 1, "2026-11-29", {}},
    rule_revision{"S3", 1, "2026-11-29", {}},
    rule_revision{"S4", 1, "2026-11-29", {}},
    rule_revision{"S5", 1, "2026-11-29", {}},
    rule_revision{"S6", 1, "2026-11-29", {}},
    rule_revision{"S7", 2, "2026-12-01", {}},
    rule_revision{"S8", 2, "2026-12-01", "a retain the plugin does not count frees an allocator the host still holds, and the host's next call uses freed memory"},
    rule_revision{"S9", 3, "2026-12-04", {}},
    rule_revision{"C1", 1, "2026-11-29", {}},
    rule_revision{"C2", 1, "2026-11-29", {}},
    rule_revision{"C3", 1, "2026-11-29", {}},
    rule_revision{"C4", 1, "2026-11-29", {}},
    rule_revision{"C5", 1, "2026-11-29", {}},
    rule_revision{"C7", 2, "2026-11-30", {}},
    rule_revision{"C6", 1, "2026-11-29", {}},
    rule_revision{"C8", 1, "2026-11-29", {}},
    rule_revision{"X1", 1, "2026-11-29", {}},
    rule_revision{"X2", 1, "2026-11-29", {}},
    rule_revision{"X3", 1, "2026-11-29", {}},
    rule_revision{"X4", 1, "2026-11-29", {}},
    rule_revision{"X5", 1, "2026-11-29", {}},
    rule_revision{"X6", 1, "2026-11-29", {}},
    rule_revision{"X7", 2, "2026-12-01", {}},
    rule_revision{"X8", 2, "2026-12-01", {}},
    rule_revision{"X9", 2, "2026-12-01", {}},
    rule_revision{"X10", 3, "2026-12-02", "an initialiser that throws leaves glibc's loader lock held, which no host can release"},
    rule_revision{"X11", 3, "2026-12-02", "factories made before a failed NxmemCreateAllocatorFactories are unreachable: the host has no pointer to release them"},
    rule_revision{"E1", 1, "2026-11-29", {}},
    rule_revision{"E2", 1, "2026-11-29", {}},
    rule_revision{"E3", 1, "2026-11-29", {}},
    rule_revision{"E4", 1, "2026-11-29", {}},
    rule_revision{"E5", 1, "2026-11-29", {}},
    rule_revision{"E6", 1, "2026-11-29", {}},
    rule_revision{"E7", 1, "2026-11-29", {}},
    rule_revision{"E8", 1, "2026-11-29", {}},
    rule_revision{"E9", 2, "2026-12-01", "a write past the status's struct_size lands in the caller's memory, which no host can take back"},
    rule_revision{"E10", 2, "2026-12-01", {}},
    rule_revision{"E11", 3, "2026-12-02", "a call refused for want of memory that changed something anyway leaves the host's records and the plugin's apart, with no status saying so"},
    rule_revision{"E12", 3, "2026-12-04", "a refusal that keeps a count blocks unload for ever, and a charge kept for a failed call starves the budget"},
    rule_revision{"E13", 3, "2026-12-04", {}},
    rule_revision{"E14", 3, "2026-12-04", {}},
    rule_revision{"M1", 1, "2026-11-29", {}},
    rule_revision{"M2", 1, "2026-11-29", {}},
    rule_revision{"M3", 1, "2026-11-29", {}},
    rule_revision{"M4", 1, "2026-11-29", {}},
    rule_revision{"M5", 1, "2026-11-29", {}},
    rule_revision{"M6", 1, "2026-11-29", {}},
    rule_revision{"M7", 1, "2026-11-29", {}},
    rule_revision{"M8", 1, "2026-11-29", {}},
    rule_revision{"M9", 2, "2026-12-01", {}},
    rule_revision{"M10", 2, "2026-12-01", {}},
    rule_revision{"O1", 1, "2026-11-29", {}},
    rule_revision{"O2", 1, "2026-11-29", {}},
    rule_revision{"O3", 1, "2026-11-29", {}},
    rule_revision{"O4", 1, "2026-11-29", {}},
    rule_revision{"O5", 1, "2026-11-29", {}},
    rule_revision{"O10", 2, "2026-12-01", {}},
    rule_revision{"O6", 1, "2026-11-29", {}},
    rule_revision{"O7", 1, "2026-11-29", {}},
    rule_revision{"O8", 1, "2026-11-29", {}},
    rule_revision{"O9", 1, "2026-11-29", {}},
    rule_revision{"O11", 2, "2026-12-01", "memory an allocation, allocator or load does not give back is lost to the host's process for good"},
    rule_revision{"O12", 2, "2026-12-01", "what a released factory keeps is lost to the host's process at every load"},
    rule_revision{"O13", 3, "2026-12-04", "a write into the host's callback table, which a host may keep in read-only memory, is a fault in the host's process"},
    rule_revision{"RO1", 1, "2026-11-29", {}},
    rule_revision{"RO2", 1, "2026-11-29", {}},
    rule_revision{"RO3", 1, "2026-11-29", {}},
    rule_revision{"RO4", 1, "2026-11-29", {}},
    rule_revision{"RO5", 1, "2026-11-29", {}},
    rule_revision{"RO6", 2, "2026-12-01", {}},
    rule_revision{"D1", 1, "2026-11-29", {}},
    rule_revision{"D2", 1, "2026-11-29", {}},
    rule_revision{"D3", 1, "2026-11-29", {}},
    rule_revision{"D4", 1, "2026-11-29", {}},
    rule_revision{"D5", 1, "2026-11-29", {}},
    rule_revision{"D6", 1, "2026-11-29", {}},
    rule_revision{"D7", 2, "2026-12-01", {}},
    rule_revision{"D8", 2, "2026-12-01", {}},
    rule_revision{"D9", 2, "2026-12-01", {}},
    rule_revision{"D10", 2, "2026-12-01", {}},
    rule_revision{"D11", 2, "2026-12-01", "a drain that waits for a running drain deadlocks a host draining from two threads or from release_completed (T1 allows both)"},
    rule_revision{"H1", 1, "2026-11-29", {}},
    rule_revision{"H2", 1, "2026-11-29", {}},
    rule_revision{"H3", 1, "2026-11-29", {}},
    rule_revision{"H4", 1, "2026-11-29", {}},
    rule_revision{"H5", 1, "2026-11-29", {}},
    rule_revision{"H6", 2, "2026-12-01", {}},
    rule_revision{"H7", 2, "2026-12-01", {}},
    rule_revision{"T1", 1, "2026-11-29", {}},
    rule_revision{"T2", 1, "2026-11-29", {}},
    rule_revision{"T3", 1, "2026-11-29", {}},
    rule_revision{"T4", 1, "2026-11-29", {}},
    rule_revision{"T5", 2, "2026-12-01", "a plugin that holds its lock across a host callback deadlocks the host's re-entrant call (H4, T2), which no host can detect or break"},
    rule_revision{"U1", 1, "2026-11-29", {}},
    rule_revision{"U2", 1, "2026-11-29", {}},
    rule_revision{"U3", 1, "2026-11-29", {}},
    rule_revision{"U4", 1, "2026-11-29", {}},
    rule_revision{"U5", 1, "2026-11-29", {}},
    rule_revision{"U6", 1, "2026-11-29", {}},
    rule_revision{"U7", 1, "2026-11-29", {}},
    rule_revision{"U8", 1, "2026-11-29", {}},
    rule_revision{"U9", 1, "2026-11-29", {}},
    rule_revision{"U10", 2, "2026-12-01", {}},
    rule_revision{"G1", 2, "2026-11-30", {}},
    rule_revision{"G2", 2, "2026-11-30", {}},
    rule_revision{"G3", 2, "2026-11-30", {}},
    rule_revision{"G4", 2, "2026-11-30", {}},
    rule_revision{"G5", 2, "2026-12-01", {}},
    rule_revision{"G6", 3, "2026-12-04", {}},
    rule_revision{"IP1", 3, "2026-12-02", {}},
    rule_revision{"IP2", 3, "2026-12-02", {}},
    rule_revision{"IP3", 3, "2026-12-02", {}},
    rule_revision{"IP4", 3, "2026-12-02", {}},
    rule_revision{"IP5", 3, "2026-12-02", {}},
    rule_revision{"IP6", 3, "2026-12-02", {}},
    rule_revision{"IP7", 3, "2026-12-02", {}},
    rule_revision{"IP8", 3, "2026-12-02", {}},
    rule_revision{"IP9", 3, "2026-12-02", {}},
    rule_revision{"IP10", 3, "2026-12-02", {}},
    rule_revision{"IP11", 3, "2026-12-02", {}},
    rule_revision{"IP12", 3, "2026-12-02", {}},
    rule_revision{"IP13", 3, "2026-12-02", {}},
    rule_revision{"IP14", 3, "2026-12-02", {}},
    rule_revision{"IP15", 3, "2026-12-04", "an importer that reads the size before the seals lets an exporter cut the file between the reads: the importing process dies of SIGBUS at its first access"},
    rule_revision{"IP16", 3, "2026-12-04", "a peer that adds a seal to an exporter's descriptor stops its decommit from freeing memory, which the exporter would count as freed"},
    rule_revision{"IP17", 3, "2026-12-04", "a forged handle answered OUT_OF_MEMORY makes the engine free memory on a peer's word"},
    rule_revision{"IP18", 3, "2026-12-04", {}},
    rule_revision{"V13", 4, "2026-12-04", {}},
    rule_revision{"F1", 4, "2026-12-04", {}},
    rule_revision{"F2", 4, "2026-12-04", {}},
    rule_revision{"F3", 4, "2026-12-04", {}},
    rule_revision{"F4", 4, "2026-12-04", {}},
    rule_revision{"F5", 4, "2026-12-04", {}},
    rule_revision{"F6", 4, "2026-12-04", {}},
    rule_revision{"F7", 4, "2026-12-04", {}},
    rule_revision{"CP1", 4, "2026-12-04", {}},
    rule_revision{"CP2", 4, "2026-12-04", {}},
    rule_revision{"CP3", 4, "2026-12-04", {}},
    rule_revision{"CP4", 4, "2026-12-04", {}},
    rule_revision{"BC1", 2, "2026-11-30", {}},
    rule_revision{"BC2", 2, "2026-11-30", {}},
    rule_revision{"BC3", 2, "2026-11-30", {}},
    rule_revision{"BC4", 2, "2026-11-30", {}},
    rule_revision{"BC5", 2, "2026-11-30", {}},
    rule_revision{"B1", 2, "2026-11-30", {}},
    rule_revision{"B2", 2, "2026-11-30", {}},};

// The rules each check judges (docs/CONFORMANCE.md, "Rule to check", read backwards; the test
// holds the two to each other). A failure that names no rule of its own is judged by these: a
// warning only when none of them is in force for the plugin.
struct check_rules {
    std::string_view check;
    std::string_view rules; // space-separated rule ids
};

inline constexpr std::array rules_by_check{
    check_rules{"tables.type_tags", "L3 R5"},
    check_rules{"tables.struct_size", "L6 V9 R3 R4 R6 R13"},
    check_rules{"model.sequences", "L10 Q1 Q2 Q3 Q4 Q5 Q6 Q7 Q8 Q9 Q10 Q11 Q12 Q13 Q14 Q15 Q16 Q17 S7 S8 C8 X9 M1 M2 M4 M5 M6 M7 M8 M10 O2 O3 O5 O10 O6 O9 O11 RO1 RO2 RO3 RO4 RO5 RO6 D1 D3 D5 D7 D8 D9 D10 H1 H5 T4 U1 U10 G3 G4 G5"},
    check_rules{"negotiation.major", "V2"},
    check_rules{"negotiation.overlap", "V4 V7"},
    check_rules{"negotiation.above", "V5"},
    check_rules{"negotiation.below", "V5"},
    check_rules{"negotiation.invalid_ranges", "V6"},
    check_rules{"negotiation.repeatable", "V7"},
    check_rules{"tables.flags_within_minor", "V8 V10 C7 IP12"},
    check_rules{"tables.required_slots", "V9 S1 S2"},
    check_rules{"allocator.open", "R1 R2 X8 O8 G1"},
    check_rules{"boundary.output_within_size", "Q1 Q6 Q7"},
    check_rules{"misuse.request_tail", "Q3"},
    check_rules{"allocation.larger_request", "Q3"},
    check_rules{"misuse.unknown_flags", "Q9"},
    check_rules{"allocation.malformed", "Q10"},
    check_rules{"allocation.sizes_alignments", "Q11"},
    check_rules{"allocation.no_overlap", "Q11"},
    check_rules{"accounting.result_mapped", "Q13 Q17 G4"},
    check_rules{"tables.capabilities", "S3 C2 C3 C6 IP12 F2"},
    check_rules{"allocation.basic", "S7 E6"},
    check_rules{"callbacks.retain_release", "S8 E7 O3"},
    check_rules{"capability.host_reclaim", "C5 H2 H3"},
    check_rules{"capability.shared_mapping", "C8 M8 O5"},
    check_rules{"accounting.release_credit", "C8 RO1 RO6"},
    check_rules{"exports.present", "X1 X2"},
    check_rules{"factories.capacity", "X4"},
    check_rules{"factories.names", "X5 X7"},
    check_rules{"boundary.status_terminated", "E4"},
    check_rules{"boundary.status_within_size", "E4 E9"},
    check_rules{"unload.idle", "E7 O2"},
    check_rules{"boundary.null_status", "E10"},
    check_rules{"misuse.wrong_mechanism", "M1"},
    check_rules{"misuse.wrong_device", "M1"},
    check_rules{"misuse.unknown_allocation", "M4"},
    check_rules{"misuse.misdescribed", "M5"},
    check_rules{"tables.identity", "M6"},
    check_rules{"capability.virtual_backing", "M7 G3"},
    check_rules{"accounting.cycles", "O8 O11"},
    check_rules{"accounting.factories", "O12"},
    check_rules{"factories.released_once", "O12 U6"},
    check_rules{"factories.fresh_after_release", "L3 X5"},
    check_rules{"capability.structured_release", "RO4 RO5"},
    check_rules{"capability.deferred_release", "D1 D3 H5 T4"},
    check_rules{"callbacks.completion_reentry", "D7 D11 T2 T5"},
    check_rules{"callbacks.completion_enqueues", "D3 H5 T5"},
    check_rules{"misuse.queued_release", "D9"},
    check_rules{"callbacks.reclaim_pressure", "H3 H4 H6 H7 T2 T5 U1 E12"},
    check_rules{"concurrency.threads", "T1"},
    check_rules{"allocation.accounting", "U1"},
    check_rules{"unload.refused_while_live", "U3"},
    check_rules{"unload.unmapped", "U5 U6"},
    check_rules{"allocation.writable", "Q11 G5"},
    check_rules{"capability.ipc", "IP1 IP2 IP3 IP4 IP5 IP6 IP7 IP8 IP9 IP10 IP11 IP13 IP14 IP17"},
    check_rules{"edges.sizes", "Q18 E12"},
    check_rules{"edges.ranges", "Q18 M7 E12"},
    check_rules{"rollback.refused_calls", "E12"},
    check_rules{"options.grammar", "X9 Q14 E13"},
    check_rules{"options.numbers", "Q18 Q14"},
    check_rules{"outputs.every_path", "Q6 Q7"},
    check_rules{"statuses.untouched_on_success", "E14"},
    check_rules{"misuse.precedence", "M10"},
    check_rules{"borrowing.after_open", "O6 O13"},
    check_rules{"borrowing.request_cap", "Q4"},
    check_rules{"concurrency.usage_consistent", "G6"},
    check_rules{"capability.copy", "CP1 CP2 CP3"},
    check_rules{"capability.fenced_release", "F1 F3 F4 F5"},
};
// clang-format on

inline const rule_revision* find_rule(std::string_view id) noexcept {
    for (const rule_revision& rule : contract_rules) {
        if (rule.id == id) {
            return &rule;
        }
    }
    return nullptr;
}

inline std::string_view rules_of_check(std::string_view check) noexcept {
    for (const check_rules& entry : rules_by_check) {
        if (entry.check == check) {
            return entry.rules;
        }
    }
    return {};
}

// The day minor `minor` was first published; nullopt for a minor newer than every release (a
// plugin of a minor this suite does not know is judged by every rule).
inline std::optional<std::string_view> minor_published(std::uint32_t minor) noexcept {
    for (const contract_release& release : contract_releases) {
        if (release.minor >= minor) {
            return release.date;
        }
    }
    return std::nullopt;
}

// `--rules VERSION`: "1.2" (the last release of minor 2), "1.2 (2026-12-01)" or "2026-12-01" (the
// release of that day). nullopt when no release matches.
inline std::optional<contract_release> parse_rule_set(std::string_view text) {
    std::optional<contract_release> found;
    for (const contract_release& release : contract_releases) {
        const std::string minor = "1." + std::to_string(release.minor);
        if (text == minor || text == release.date || text == release.name()) {
            found = release; // a minor alone: the last of its releases
        }
    }
    return found;
}

inline std::string release_names() {
    std::string names;
    for (const contract_release& release : contract_releases) {
        names += (names.empty() ? "" : ", ") + release.name();
    }
    return names;
}

// The rules a plugin is judged by: those in force for the minor it declares (the newest minor of
// its own range), as of a release (`--rules`; the newest when unset).
struct rule_set {
    std::optional<std::uint32_t> declared_minor; // unknown: every rule in force
    std::optional<contract_release> as_of;       // unset: the newest release

    // Why rule `id` is not in force for this plugin, or nullopt when it is (an unknown id is).
    std::optional<std::string> not_in_force(std::string_view id) const {
        const rule_revision* rule = find_rule(id);
        if (rule == nullptr || !rule->host_protection.empty()) {
            return std::nullopt;
        }
        if (as_of && rule->entered > as_of->date) {
            return "rule " + std::string(id) + " entered in " + rule->revision() +
                   ", after the rule set judged by (" + as_of->name() + ")";
        }
        if (!declared_minor) {
            return std::nullopt;
        }
        const std::optional<std::string_view> published = minor_published(*declared_minor);
        if (published && rule->entered > *published) {
            return "rule " + std::string(id) + " entered in " + rule->revision() + ", after minor " +
                   std::to_string(*declared_minor) + ", which the plugin declares, was published (" +
                   std::string(*published) + "): a warning until it declares a later minor";
        }
        return std::nullopt;
    }
    bool enforced(std::string_view id) const { return !not_in_force(id); }

    // For a failure blamed on `rules` (ids separated by anything else): why none of them is in
    // force, or nullopt when one is, or none is named.
    std::optional<std::string> none_in_force(std::string_view rules) const {
        const std::vector<std::string> ids = rule_ids_in(rules);
        if (ids.empty()) {
            return std::nullopt;
        }
        std::string why;
        for (const std::string& id : ids) {
            std::optional<std::string> reason = not_in_force(id);
            if (!reason) {
                return std::nullopt;
            }
            why += (why.empty() ? "" : "; ") + *reason;
        }
        return why;
    }

    // The known rule ids in `text`, in order, each once ("(G3, G5: ...)" gives G3 and G5).
    static std::vector<std::string> rule_ids_in(std::string_view text) {
        std::vector<std::string> ids;
        std::size_t at = 0;
        while (at < text.size()) {
            const bool starts = (text[at] >= 'A' && text[at] <= 'Z') &&
                                (at == 0 || !((text[at - 1] >= 'A' && text[at - 1] <= 'Z') ||
                                              (text[at - 1] >= 'a' && text[at - 1] <= 'z') ||
                                              (text[at - 1] >= '0' && text[at - 1] <= '9') || text[at - 1] == '_'));
            std::size_t end = at;
            while (end < text.size() && ((text[end] >= 'A' && text[end] <= 'Z') || (text[end] >= '0' && text[end] <= '9'))) {
                ++end;
            }
            const bool word_ends = end == text.size() || !((text[end] >= 'a' && text[end] <= 'z') || text[end] == '_');
            if (starts && end > at && word_ends) {
                const std::string id(text.substr(at, end - at));
                if (find_rule(id) != nullptr && std::find(ids.begin(), ids.end(), id) == ids.end()) {
                    ids.push_back(id);
                }
            }
            at = std::max(end, at + 1);
        }
        return ids;
    }
};

} // namespace nxmem::conform
