// The conformance suite: every check, in order, and run_mechanism_checks, which loads a plugin as
// a host would and runs each check that applies to one of its mechanisms on one device. A check
// that cannot run because an earlier one found the ground missing (no exports, a table the host
// refuses, no working allocate) is not applicable and says which check to look at.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_accounting.hpp>
#include <nxmem/conform/checks_allocation.hpp>
#include <nxmem/conform/checks_borrowing.hpp>
#include <nxmem/conform/checks_boundary.hpp>
#include <nxmem/conform/checks_callbacks.hpp>
#include <nxmem/conform/checks_capabilities.hpp>
#include <nxmem/conform/checks_concurrency.hpp>
#include <nxmem/conform/checks_edges.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/checks_factories.hpp>
#include <nxmem/conform/checks_ipc.hpp>
#include <nxmem/conform/checks_misuse.hpp>
#include <nxmem/conform/checks_model.hpp>
#include <nxmem/conform/checks_options.hpp>
#include <nxmem/conform/checks_outputs.hpp>
#include <nxmem/conform/checks_precedence.hpp>
#include <nxmem/conform/checks_rollback.hpp>
#include <nxmem/conform/checks_streams.hpp>
#include <nxmem/conform/checks_tables.hpp>
#include <nxmem/conform/checks_unload.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/rules.hpp>
#include <nxmem/conform/checks_usage_race.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <array>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::conform {

// What a check needs before it can say anything.
enum class requirement : std::uint8_t {
    library,     // the file loads (exports.present itself)
    exports,     // the three exports (every other check)
    device,      // the mechanism serves the device under test
    table_size,  // a consistent struct_size (the table checks after tables.struct_size)
    opened,      // the host accepted the allocator table
    allocation,  // allocate works at all
};

struct check_definition {
    std::string_view id;
    std::string_view title;
    std::string_view rule; // the section of docs/ABI.md the check enforces
    requirement needs;
    finding (*run)(const subject&, const suite_options&);
};

// clang-format off
inline constexpr std::array all_checks{
    check_definition{"exports.present", "the three exports are present", "Exports",
        requirement::library, &check_exports_present::run},
    check_definition{"negotiation.overlap", "an overlapping host range gets the highest common minor", "Versions",
        requirement::exports, &check_negotiation_overlap::run},
    check_definition{"negotiation.above", "a host range above the plugin's is refused", "Versions",
        requirement::exports, &check_negotiation_above::run},
    check_definition{"negotiation.below", "a host range below the plugin's is refused", "Versions",
        requirement::exports, &check_negotiation_below::run},
    check_definition{"negotiation.major", "a host of another major is refused", "Versions",
        requirement::exports, &check_negotiation_major::run},
    check_definition{"negotiation.repeatable", "negotiation gives the same answer every time", "Versions",
        requirement::exports, &check_negotiation_repeatable::run},
    check_definition{"factories.names", "factories are named within bounds, names and ids unique", "Exports",
        requirement::exports, &check_factories_names::run},
    check_definition{"factories.capacity", "too small a capacity creates nothing and names the count", "Exports",
        requirement::exports, &check_factories_capacity::run},
    check_definition{"factories.released_once", "every factory is released exactly once; load/unload cycles leave nothing", "Ownership",
        requirement::exports, &check_factories_released_once::run},
    check_definition{"tables.type_tags", "every table carries its type tag", "Layout",
        requirement::device, &check_tables_type_tags::run},
    check_definition{"tables.struct_size", "struct_size covers the declared level, within the cap", "Layout",
        requirement::device, &check_tables_struct_size::run},
    check_definition{"tables.capabilities", "capability flags agree with slots and tables", "Slots",
        requirement::table_size, &check_tables_capabilities::run},
    check_definition{"tables.flags_within_minor", "no capability flag above the negotiated minor", "Capabilities",
        requirement::table_size, &check_tables_flags_within_minor::run},
    check_definition{"tables.required_slots", "required slots are present", "Slots",
        requirement::table_size, &check_tables_required_slots::run},
    check_definition{"tables.identity", "the allocator table names its mechanism and device", "Misuse",
        requirement::table_size, &check_tables_identity::run},
    check_definition{"allocator.open", "the host accepts the allocator table", "read_prefix",
        requirement::device, &run_for_device<check_allocator_open>},
    check_definition{"allocation.basic", "a small allocation is made and released", "Ownership",
        requirement::opened, &run_for_device<check_allocation_basic>},
    check_definition{"allocation.sizes_alignments", "1 B to 1 MiB at alignments 1 to 64 KiB, aligned, host-assigned ids", "Slots",
        requirement::allocation, &run_for_device<check_allocation_sizes_alignments>},
    check_definition{"allocation.writable", "host memory is writable over the whole size", "Slots",
        requirement::allocation, &run_for_device<check_allocation_writable>},
    check_definition{"allocation.no_overlap", "distinct live allocations never overlap", "Slots",
        requirement::allocation, &run_for_device<check_allocation_no_overlap>},
    check_definition{"allocation.accounting", "the unload report counts live allocations", "Unload",
        requirement::allocation, &run_for_device<check_allocation_accounting>},
    check_definition{"allocation.malformed", "size 0 and bad alignments are refused, nothing allocated", "Misuse",
        requirement::opened, &run_for_device<check_allocation_malformed>},
    check_definition{"allocation.larger_request", "a longer request with a zero tail is served", "read_prefix",
        requirement::allocation, &run_for_device<check_allocation_larger_request>},
    check_definition{"misuse.wrong_mechanism", "another mechanism's object is refused", "Misuse",
        requirement::allocation, &run_for_device<check_misuse_wrong_mechanism>},
    check_definition{"misuse.wrong_device", "another device's object is refused", "Misuse",
        requirement::allocation, &run_for_device<check_misuse_wrong_device>},
    check_definition{"misuse.unknown_allocation", "an unknown or already released address is refused", "Misuse",
        requirement::allocation, &run_for_device<check_misuse_unknown_allocation>},
    check_definition{"misuse.misdescribed", "a release that misdescribes the allocation is refused", "Misuse",
        requirement::allocation, &run_for_device<check_misuse_misdescribed>},
    check_definition{"misuse.request_tail", "a longer request with non-zero unknown bytes is refused", "read_prefix",
        requirement::opened, &run_for_device<check_misuse_request_tail>},
    check_definition{"misuse.unknown_flags", "a request with unknown flag bits is refused", "Misuse",
        requirement::opened, &run_for_device<check_misuse_unknown_flags>},
    check_definition{"capability.virtual_backing", "commit, decommit and mapped bytes agree", "Slots",
        requirement::allocation, &run_for_device<check_capability_virtual_backing>},
    check_definition{"capability.shared_mapping", "shared prefixes are reference counted and costed once", "Ownership",
        requirement::allocation, &run_for_device<check_capability_shared_mapping>},
    check_definition{"capability.deferred_release", "queued releases retire in enqueue order", "Threads and re-entrancy",
        requirement::allocation, &run_for_device<check_capability_deferred_release>},
    check_definition{"capability.structured_release", "release outcomes are COMPLETE or QUARANTINED, consistently", "Release outcomes",
        requirement::allocation, &run_for_device<check_capability_structured_release>},
    check_definition{"capability.host_reclaim", "a refused reclaim fails the allocation cleanly", "Threads and re-entrancy",
        requirement::allocation, &run_for_device<check_capability_host_reclaim>},
    check_definition{"capability.ipc", "a prefix (and an allocation, where shared) exported and imported in a child process reads the same bytes (device memory: imported by a second allocator); forged handles refused", "Sharing across processes (minor 3)",
        requirement::allocation, &run_for_device<check_capability_ipc>},
    check_definition{"capability.copy", "bytes round trip through copy both ways; refused copies touch nothing; an unlisted stream kind is refused", "Stream-ordered release and copies (minor 4)",
        requirement::allocation, &run_for_device<check_capability_copy>},
    check_definition{"capability.fenced_release", "a release fenced on a host timeline retires once the counter reaches its value, in enqueue order; malformed requests queue nothing", "Stream-ordered release and copies (minor 4)",
        requirement::allocation, &check_capability_fenced_release::run},
    check_definition{"concurrency.threads", "concurrent use leaves an all-zero unload report", "Threads and re-entrancy",
        requirement::allocation, &run_for_device<check_concurrency_threads>},
    check_definition{"unload.refused_while_live", "unload is refused while objects are live", "Unload",
        requirement::allocation, &run_for_device<check_unload_refused_while_live>},
    check_definition{"unload.idle", "the report is zero once everything is given back, and the plugin unloads", "Unload",
        requirement::exports, &run_for_device<check_unload_idle>},
    check_definition{"unload.unmapped", "after unload the library is unmapped", "Unload",
        requirement::exports, &run_for_device<check_unload_unmapped>},
    check_definition{"accounting.cycles", "allocate/release and load/unload cycles grow neither heap, address space nor resident memory", "Ownership",
        requirement::allocation, &run_for_device<check_accounting_cycles>},
    check_definition{"accounting.release_credit", "a structured release credits what the allocation cost", "Release outcomes",
        requirement::allocation, &run_for_device<check_accounting_release_credit>},
    check_definition{"accounting.result_mapped", "an allocation result's mapped_bytes agrees with the virtual-backing or usage accounting", "Requests and outputs",
        requirement::allocation, &run_for_device<check_accounting_result_mapped>},
    check_definition{"accounting.factories", "factory create/release cycles grow neither heap nor address space", "Ownership",
        requirement::exports, &check_accounting_factories::run},
    // The boundary between the two sides' memory (checks_boundary.hpp).
    check_definition{"boundary.status_terminated", "a status message is NUL-terminated within its 256 bytes", "Nothing C++ crosses",
        requirement::opened, &run_for_device<check_boundary_status_terminated>},
    check_definition{"boundary.status_within_size", "a status is written only within its struct_size, down to 8 bytes", "Nothing C++ crosses",
        requirement::opened, &run_for_device<check_boundary_status_within_size>},
    check_definition{"boundary.null_status", "a NULL status is tolerated and the code still returned", "Nothing C++ crosses",
        requirement::opened, &run_for_device<check_boundary_null_status>},
    check_definition{"boundary.output_within_size", "outputs of the smallest struct_size are written only within it", "Requests and outputs",
        requirement::opened, &run_for_device<check_boundary_output_within_size>},
    check_definition{"negotiation.invalid_ranges", "inverted and empty host ranges are refused as invalid", "Versions",
        requirement::exports, &check_negotiation_invalid_ranges::run},
    check_definition{"callbacks.retain_release", "each retain keeps the allocator through one more release", "Slots",
        requirement::allocation, &check_callbacks_retain_release::run},
    check_definition{"misuse.queued_release", "a queued allocation is no longer released directly", "Deferred release",
        requirement::allocation, &check_misuse_queued_release::run},
    check_definition{"callbacks.completion_reentry", "release_completed may re-enter the plugin, from any thread", "Threads and re-entrancy",
        requirement::allocation, &check_callbacks_completion_reentry::run},
    check_definition{"callbacks.completion_enqueues", "a release enqueued from release_completed retires once, after those queued before it", "Deferred release",
        requirement::allocation, &check_callbacks_completion_enqueues::run},
    check_definition{"callbacks.reclaim_pressure", "request_reclaim under a real budget: re-entered, honoured, refused", "Host callbacks",
        requirement::allocation, &check_callbacks_reclaim_pressure::run},
    // Slips of issue 35, one class each; each check's `revision` says when its rule entered.
    check_definition{"edges.sizes", "sizes near 2^64 and above 2^32 are refused or served whole", "Requests and outputs",
        requirement::allocation, &run_for_device<check_edges_sizes>},
    check_definition{"edges.ranges", "ranges whose offset + length wraps, or cut to 32 bits, are refused", "Misuse",
        requirement::allocation, &run_for_device<check_edges_ranges>},
    check_definition{"rollback.refused_calls", "a refused call changes neither the unload report, the usage nor an allocation's cost", "Nothing C++ crosses",
        requirement::allocation, &run_for_device<check_rollback_refused_calls>},
    check_definition{"options.grammar", "open options read within options_length by the documented grammar, refusals naming the key in printable UTF-8", "Exports",
        requirement::opened, &run_for_device<check_options_grammar>},
    check_definition{"options.numbers", "a byte count in the options is read in 64 bits: 2^32 more is refused or serves at least as much", "Requests and outputs",
        requirement::allocation, &check_options_numbers::run},
    check_definition{"outputs.every_path", "allocate writes a short output only within its struct_size on every size, alignment and refusal path", "Requests and outputs",
        requirement::opened, &run_for_device<check_outputs_every_path>},
    check_definition{"statuses.untouched_on_success", "a call that succeeds writes nothing into its status", "Nothing C++ crosses",
        requirement::allocation, &run_for_device<check_statuses_untouched_on_success>},
    check_definition{"misuse.precedence", "with several faults the first in M10's order decides the code", "Misuse",
        requirement::allocation, &run_for_device<check_misuse_precedence>},
    check_definition{"borrowing.after_open", "the open request is not read after the call, the callback table never written", "Ownership",
        requirement::opened, &run_for_device<check_borrowing_after_open>},
    check_definition{"borrowing.request_cap", "a request above the 4096-byte cap is refused without being scanned", "Requests and outputs",
        requirement::opened, &run_for_device<check_borrowing_request_cap>},
    check_definition{"concurrency.usage_consistent", "usage totals racing allocate and release stay within what could be live", "Commit granularity and usage (minor 2)",
        requirement::allocation, &run_for_device<check_concurrency_usage_consistent>},
    // Allocates through a factory: after allocation.basic, so a mechanism whose allocate crashes
    // or hangs is reported there.
    check_definition{"factories.fresh_after_release", "factories created again after their release are whole, the same, and open", "Exports",
        requirement::allocation, &check_factories_fresh_after_release::run},
    // The reference model against random sequences (checks_model.hpp, model/).
    check_definition{"model.sequences", "random sequences of every operation agree with the reference model and the OS", "Ownership",
        requirement::allocation, &check_model_sequences::run},
};
// clang-format on

// The definition of the check called `id`, or nullptr.
inline const check_definition* find_check(std::string_view id) noexcept {
    for (const check_definition& check : all_checks) {
        if (check.id == id) {
            return &check;
        }
    }
    return nullptr;
}

// Hooks for a caller that reports progress (the nxmem tool sends each event down a pipe, so a
// crash is attributed to the check that was running).
struct suite_hooks {
    std::function<void(const check_definition&)> on_start;
    std::function<void(const check_result&)> on_result;
    std::function<void(std::string_view)> on_step; // each step a check announces (step.hpp)
};

// The newest minor the plugin declares (its own range, as NxmemNegotiate states it to a host of
// every minor this header knows); nullopt when it does not negotiate.
inline std::optional<std::uint32_t> declared_minor(const std::filesystem::path& path) {
    result<detail::raw_library> library = detail::raw_library::open(path);
    if (!library || library.value().negotiate() == nullptr) {
        return std::nullopt;
    }
    const detail::negotiation_reply reply = detail::negotiate(
        library.value().negotiate(), abi::version_range{NXMEM_ABI_MAJOR, NXMEM_ABI_MINOR_BASELINE, NXMEM_ABI_MINOR});
    if (reply.code != NXMEM_STATUS_OK || reply.response.plugin_range.major != NXMEM_ABI_MAJOR) {
        return std::nullopt;
    }
    return reply.response.plugin_range.max_minor;
}

// A failure of rules not in force for the plugin becomes a warning (docs/ABI.md, "Contract
// revisions"): the rules the finding names, else the check's own (rules.hpp, rules_by_check).
inline check_result judge_by_rules(check_result judged, const rule_set& rules) {
    if (!judged.failed()) {
        return judged;
    }
    if (judged.rule.empty()) {
        judged.rule = std::string(rules_of_check(judged.id));
    }
    if (std::optional<std::string> why = rules.none_in_force(judged.rule)) {
        judged.verdict = outcome::warn;
        judged.actual += " [not failing: " + *why + "]";
    }
    return judged;
}

// Runs one check's body, turning an escaped exception into a failure.
inline check_result run_check(const check_definition& check, const subject& target,
                              const suite_options& options) {
    finding found;
    try {
        found = check.run(target, options);
    } catch (const std::exception& failure) {
        found = failed("the check runs to completion", std::string("exception: ") + failure.what());
    }
    return name_finding(check.id, check.title, std::move(found));
}

// The device a mechanism is checked on when none is named: device 0 of the first type it serves
// (cpu, cuda, hip); cpu:0 when the plugin cannot be read.
inline device_id default_device(const std::filesystem::path& path, std::string_view mechanism) {
    result<std::shared_ptr<host::plugin_module>> module = host::plugin_module::load(path);
    device_id chosen{NXMEM_DEVICE_CPU, 0};
    if (module) {
        if (const host::factory_info* factory = module.value()->find_factory(mechanism)) {
            for (NxmemDeviceType type : {NXMEM_DEVICE_CPU, NXMEM_DEVICE_CUDA, NXMEM_DEVICE_HIP}) {
                if (factory->serves(type)) {
                    chosen = device_id{type, 0};
                    break;
                }
            }
        }
        (void)module.value()->try_unload();
    }
    return chosen;
}

// Whether `mechanism` of the plugin serves `device`'s type; the reason when it does not.
inline std::optional<std::string> device_not_served(const std::filesystem::path& path,
                                                    std::string_view mechanism, device_id device) {
    result<std::shared_ptr<host::plugin_module>> module = host::plugin_module::load(path);
    if (!module) {
        return std::nullopt; // the checks themselves report why it does not load
    }
    std::optional<std::string> reason;
    const host::factory_info* factory = module.value()->find_factory(mechanism);
    if (factory == nullptr) {
        reason = "the plugin has no mechanism called '" + std::string(mechanism) + "'";
    } else if (!factory->serves(device.type)) {
        reason = "'" + std::string(mechanism) + "' does not serve device type " +
                 std::string(device_type_name(device.type));
    } else {
        // device_types names types only; which indices a mechanism serves it says at open, by
        // refusing the others with WRONG_DEVICE (ABI rule Q16). Any other refusal is
        // allocator.open's to report.
        (void)with_device_tag(device.type, [&]<Device D>() -> finding {
            result<host::plugin_allocator<D>> opened =
                host::open_allocator<D>(module.value(), mechanism, device.index);
            if (!opened && opened.error().code == status_code::wrong_device) {
                reason = "'" + std::string(mechanism) + "' does not serve " +
                         std::string(device_type_name(device.type)) + ":" +
                         std::to_string(device.index) + " (" + opened.error().describe() + ")";
            }
            return passed();
        });
    }
    (void)module.value()->try_unload();
    return reason;
}

// Every check for one mechanism on one device (by default device 0 of the first type it serves).
inline std::vector<check_result> run_mechanism_checks(const std::filesystem::path& path,
                                                      std::string_view mechanism,
                                                      std::optional<device_id> device = std::nullopt,
                                                      const suite_options& given_options = {},
                                                      const suite_hooks& hooks = {}) {
    suite_options options = given_options;
    if (!options.rules.declared_minor) {
        options.rules.declared_minor = declared_minor(path);
    }
    const subject target{path, std::string(mechanism),
                         device ? *device : default_device(path, mechanism), options.mechanism_options};
    std::vector<check_result> results;
    std::optional<std::string> no_exports;
    std::optional<std::string> not_served;
    std::optional<std::string> bad_size;
    std::optional<std::string> refused_open; // the factory refused: no table to judge
    std::optional<std::string> not_opened;
    std::optional<std::string> no_allocation;
    bool device_known = false;
    const listen_to_steps steps(hooks.on_step);
    for (const check_definition& check : all_checks) {
        if (hooks.on_start) {
            hooks.on_start(check);
        }
        if (!device_known && check.needs >= requirement::device && !no_exports) {
            not_served = device_not_served(path, mechanism, target.device);
            device_known = true;
        }
        std::optional<std::string> blocked;
        const auto needs = check.needs;
        if (needs >= requirement::exports && no_exports) {
            blocked = no_exports;
        } else if (needs >= requirement::device && not_served) {
            blocked = not_served;
        } else if (refused_open && (check.id.starts_with("tables.") || needs == requirement::table_size)) {
            blocked = refused_open;
        } else if (needs == requirement::table_size && bad_size) {
            blocked = bad_size;
        } else if (needs >= requirement::opened && not_opened) {
            blocked = not_opened;
        } else if (needs >= requirement::allocation && no_allocation) {
            blocked = no_allocation;
        }
        check_result outcome_of_check =
            blocked ? name_finding(check.id, check.title, not_applicable(*blocked))
                    : judge_by_rules(run_check(check, target, options), options.rules);
        if (outcome_of_check.failed()) {
            const std::string see = " (see " + std::string(check.id) + ")";
            if (outcome_of_check.expected == detail::factory_opens && !refused_open) {
                refused_open = "the factory refuses to open an allocator" + see;
            } else if (check.id == "exports.present") {
                no_exports = "the plugin does not load with its three exports" + see;
            } else if (check.id == "tables.struct_size") {
                bad_size = "the table's struct_size contradicts its level" + see;
            } else if (check.id == "allocator.open") {
                not_opened = "the host refuses to open the mechanism" + see;
            } else if (check.id == "allocation.basic") {
                no_allocation = "the mechanism cannot allocate" + see;
            }
        }
        if (hooks.on_result) {
            hooks.on_result(outcome_of_check);
        }
        results.push_back(std::move(outcome_of_check));
    }
    return results;
}

// Selected checks only, without the gating: what the contract tests call to reuse a check.
inline std::vector<check_result> run_checks(const subject& target,
                                            std::initializer_list<std::string_view> ids,
                                            const suite_options& options = {}) {
    std::vector<check_result> results;
    for (std::string_view id : ids) {
        const check_definition* check = find_check(id);
        if (check == nullptr) {
            results.push_back(name_finding(id, "unknown check", failed("a known check id", std::string(id))));
            continue;
        }
        results.push_back(run_check(*check, target, options));
    }
    return results;
}

} // namespace nxmem::conform
