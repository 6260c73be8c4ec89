// The system under test of the model check: one plugin loaded past the host (its own dlopen
// handle, factories and open requests, the suite's host callbacks), up to three allocators of the
// mechanism alive at once, every slot called directly. Each step is applied to the plugin and to
// the reference model; then everything the plugin reports (its unload report, each allocator's
// usage, each allocation's mapped bytes) and what the operating system shows (the bytes written,
// residency after decommit, a prefix seen through each sharer) is compared with the model. A
// contradiction stops the sequence with a message that names the step and blames the figure that
// contradicts the model or the OS.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/model/operation.hpp>
#include <nxmem/conform/model/os_truth.hpp>
#include <nxmem/conform/model/reference.hpp>
#include <nxmem/conform/model/wire_sizes.hpp>
#include <nxmem/conform/rules.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/page_size.hpp>

#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::conform::model {

// Stops the sequence: the step and the contradiction, for RapidCheck to shrink and report.
[[noreturn]] inline void contradiction(const std::string& step, const std::string& text) {
    throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, step + ": " + text);
}

inline std::string code_text(NxmemStatusCode code, const NxmemStatus& status) {
    std::string text(status_code_name(status_code_from_wire(code)));
    const std::string message = abi::read_status_message(status);
    return message.empty() || code == NXMEM_STATUS_OK ? text : text + " (" + message + ")";
}

inline std::string range_text(std::uint64_t offset, std::uint64_t length) {
    return "[" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
}

class model_driver {
public:
    static constexpr std::size_t max_allocators = 3;
    static constexpr std::size_t max_allocations = 12; // per allocator
    static constexpr std::size_t max_prefixes = 6;     // per allocator
    static constexpr unsigned drain_attempts = 64;

    // Rules not in force for the plugin (rules.hpp) are warned of, once each, in `warnings`, and the
    // sequence goes on where the model can follow what the plugin did.
    model_driver(const subject& target, std::uint64_t& steps_run, const rule_set& rules = {},
                 std::map<std::string, std::string>* warnings = nullptr)
        : target_(target), steps_run_(steps_run), rules_(rules), warnings_(warnings),
          cpu_(target.device.type == NXMEM_DEVICE_CPU), page_(nxmem::detail::system_page_bytes()) {
        step_ = "setup (load the plugin, create its factories)";
        result<detail::raw_library> library = detail::raw_library::open(target.path);
        if (!library) {
            contradiction(step_, library.error().describe());
        }
        library_.emplace(std::move(library).value());
        result<detail::raw_factories> factories = detail::raw_factories::create(*library_);
        if (!factories) {
            contradiction(step_, factories.error().describe());
        }
        factories_.emplace(std::move(factories).value());
        factory_ = factories_->find(target.mechanism);
        if (factory_ == nullptr) {
            contradiction(step_, "the plugin has no mechanism called '" + target.mechanism + "'");
        }
        result<abi::table_copy<NxmemAllocatorFactoryVtable>> copy =
            abi::read_prefix<NxmemAllocatorFactoryVtable>(factory_, factories_->negotiated_minor());
        if (!copy) {
            contradiction(step_, "the factory table: " + copy.error().describe());
        }
        factory_table_ = copy.value().table;
        callbacks_.on_completed = [this](const NxmemReleaseCompletion& completion) {
            completions_.push_back(completion);
        };
        callbacks_.on_reclaim = [](const NxmemReclaimRequest&, NxmemStatus*) { return NXMEM_STATUS_OK; };
        baseline_report_ = read_report(step_);
        baseline_descriptors_ = open_descriptors();
        baseline_memfd_mappings_ = memfd_mappings();
        // Most steps need an allocator: every sequence starts with one open (step 0).
        step_ = "step 0 (open_allocator)";
        open_allocator(operation{});
        compare_everything();
        history_.push_back(step_);
    }

    model_driver(const model_driver&) = delete;
    model_driver& operator=(const model_driver&) = delete;

    // Whatever a failed sequence left: given back without judging (the allocator's last release
    // frees what it holds, O9), so the next sequence starts clean.
    ~model_driver() {
        // A plugin that freed an allocator early (a retain it did not count) must not be called
        // through it again: its references are left as they are.
        auto report = abi::make_struct<NxmemUnloadReport>();
        NxmemStatus report_status = abi::make_status();
        if (library_ && library_->query_unload_readiness()(&report, &report_status) == NXMEM_STATUS_OK &&
            report.live_allocators < baseline_report_.live_allocators + model_.allocators.size()) {
            return;
        }
        for (allocator_state& allocator : model_.allocators) {
            for (unsigned attempt = 0; attempt < drain_attempts && !allocator.queue.empty() &&
                                       allocator.table.drain_releases != nullptr;
                 ++attempt) {
                std::uint64_t retired = 0;
                NxmemStatus status = abi::make_status();
                completions_.clear();
                (void)allocator.table.drain_releases(allocator.self, &retired, &status);
                for (const NxmemReleaseCompletion& done : completions_) {
                    std::erase(allocator.queue, done.ticket);
                }
            }
            while (allocator.references > 0) {
                --allocator.references;
                allocator.table.release(allocator.self);
            }
        }
    }

    // One step, applied to the plugin and the model, then every figure compared.
    void apply(const operation& step) {
        ++steps_run_;
        ++step_number_;
        step_ = "step " + std::to_string(step_number_) + " (" + step_kind_name(step.kind) + ")";
        announce_step(step_);
        switch (step.kind) {
        case step_kind::open_allocator: open_allocator(step); break;
        case step_kind::retain_allocator: retain_allocator(step); break;
        case step_kind::release_allocator: release_allocator(step); break;
        case step_kind::allocate: allocate(step); break;
        case step_kind::deallocate: deallocate(step); break;
        case step_kind::release_allocation: release_allocation(step); break;
        case step_kind::commit: change_range(step, true); break;
        case step_kind::decommit: change_range(step, false); break;
        case step_kind::create_prefix: create_prefix(step); break;
        case step_kind::retain_prefix: retain_prefix(step); break;
        case step_kind::release_prefix: release_prefix(step); break;
        case step_kind::map_prefix: map_prefix(step); break;
        case step_kind::enqueue_release: enqueue_release(step); break;
        case step_kind::drain_releases: drain(step); break;
        case step_kind::query: query(step); break;
        }
        compare_everything();
        history_.push_back(step_);
    }

    // The last step: everything given back; the plugin must then hold nothing, and the process
    // no more descriptors or memfd mappings than before the sequence.
    void finish() {
        ++step_number_;
        step_ = "step " + std::to_string(step_number_) + " (give everything back)";
        announce_step(step_);
        while (!model_.allocators.empty()) {
            allocator_state& allocator = model_.allocators.back();
            drain_until_empty(allocator);
            while (!allocator.live.empty()) {
                const allocation_state live = allocator.live.back();
                NxmemStatus status = abi::make_status();
                const NxmemStatusCode code = allocator.table.deallocate(allocator.self, &live.described, &status);
                if (code != NXMEM_STATUS_OK) {
                    contradiction(step_, "deallocate of " + name(allocator, live) + " (" +
                                             describe(live) + ") answered " + code_text(code, status));
                }
                forget_allocation(allocator, live.serial);
            }
            for (prefix_state& prefix : allocator.prefixes) {
                while (prefix.references > 0) {
                    NxmemStatus status = abi::make_status();
                    const NxmemStatusCode code =
                        allocator.sharing.release_shared_prefix(allocator.self, &prefix.handle, &status);
                    if (code != NXMEM_STATUS_OK) {
                        contradiction(step_, "release_shared_prefix of prefix #" + std::to_string(prefix.serial) +
                                                 " answered " + code_text(code, status));
                    }
                    --prefix.references;
                }
            }
            compare_everything();
            while (allocator.references > 0) {
                --allocator.references;
                allocator.table.release(allocator.self);
            }
            model_.allocators.pop_back();
            compare_everything();
        }
        const std::uint64_t descriptors = open_descriptors();
        if (descriptors != baseline_descriptors_) {
            contradiction(step_, "the process holds " + std::to_string(descriptors) +
                                     " file descriptors (/proc/self/fd), " +
                                     std::to_string(baseline_descriptors_) +
                                     " before the sequence: the plugin leaks a descriptor");
        }
        const std::uint64_t mappings = memfd_mappings();
        if (mappings != baseline_memfd_mappings_) {
            contradiction(step_, std::to_string(mappings) + " memfd mappings in /proc/self/maps, " +
                                     std::to_string(baseline_memfd_mappings_) +
                                     " before the sequence: the plugin leaks a mapping");
        }
    }

private:
    // ---- names in messages ----
    static std::string name(const allocator_state& allocator) {
        return "allocator #" + std::to_string(allocator.serial);
    }
    static std::string name(const allocator_state& allocator, const allocation_state& live) {
        return "allocation #" + std::to_string(live.serial) + " of " + name(allocator);
    }
    static std::string describe(const allocation_state& live) {
        return std::to_string(live.described.size) + " B at alignment " +
               std::to_string(live.described.alignment);
    }
    // A contradiction names the steps before it with every figure they used (sizes, offsets, units,
    // prefixes), so a shrunk sequence can be read without replaying it.
    void fail(const std::string& text) const {
        std::string before;
        for (const std::string& done : history_) {
            before += (before.empty() ? "" : "; ") + done;
        }
        contradiction(step_, text + (before.empty() ? std::string() : " {the steps before it: " + before + "}"));
    }
    // A contradiction of `rule`: a failure when the rule is in force for the plugin, else a warning
    // (once per rule) and false, so the caller follows what the plugin did and the sequence goes on.
    bool fail_unless_warned(const char* rule, const std::string& text) {
        if (rules_.enforced(rule) || warnings_ == nullptr) {
            fail(text);
        }
        warnings_->emplace(rule, step_ + ": " + text);
        return false;
    }
    void expect_code(NxmemStatusCode code, const NxmemStatus& status, NxmemStatusCode wanted,
                     const std::string& call) const {
        if (code != wanted) {
            fail(call + " answered " + code_text(code, status) + "; the contract says " +
                 std::string(status_code_name(status_code_from_wire(wanted))));
        }
    }

    // ---- picks ----
    allocator_state* pick_allocator(const operation& step) {
        if (model_.allocators.empty()) {
            return nullptr;
        }
        return &model_.allocators[step.allocator % model_.allocators.size()];
    }
    allocation_state* pick_allocation(allocator_state& allocator, unsigned pick, bool queued_too,
                                      bool virtual_only = false, bool without_prefix = false) {
        std::vector<allocation_state*> candidates;
        for (allocation_state& live : allocator.live) {
            if ((queued_too || !live.ticket) && (!virtual_only || live.virtual_backed) &&
                (!without_prefix || !live.prefix)) {
                candidates.push_back(&live);
            }
        }
        return candidates.empty() ? nullptr : candidates[pick % candidates.size()];
    }
    std::uint64_t unit_of(const allocator_state& allocator) const {
        return std::max(page_, allocator.granularity);
    }
    // The committed units of a virtual-backing allocation, as ranges: "[0, 8192) [16384, 20480) of unit 4096".
    static std::string committed_text(const allocation_state& live) {
        std::string text;
        for (std::size_t index = 0; index < live.committed.size();) {
            if (!live.committed[index]) {
                ++index;
                continue;
            }
            std::size_t end = index;
            while (end < live.committed.size() && live.committed[end]) {
                ++end;
            }
            const std::uint64_t from = index * live.unit;
            text += (text.empty() ? "" : " ") + range_text(from, live.unit_end(end - 1) - from);
            index = end;
        }
        return (text.empty() ? std::string("none") : text) + " of unit " + std::to_string(live.unit);
    }
    // Where the granules of the prefix mapped over an allocation's start end (0: none mapped).
    std::uint64_t prefix_extent(const allocator_state& allocator, const allocation_state& live) const {
        return live.prefix ? round_up(live.prefix_bytes, unit_of(allocator)) : 0;
    }
    std::string prefix_text(const allocator_state& allocator, const allocation_state& live) const {
        if (!live.prefix) {
            return {};
        }
        return ", prefix #" + std::to_string(*live.prefix) + " of " + std::to_string(live.prefix_bytes) +
               " B mapped over its start, its granules " +
               range_text(0, prefix_extent(allocator, live)) + " at granule " + std::to_string(unit_of(allocator));
    }

    // The wire size a step uses for one of its structs: `pick` 0 is this header's size; others
    // index the sizes the layout table allows and forbids for T (and for the call's other struct).
    template <class Request, class Output>
    static std::pair<std::optional<wire_size>, std::optional<wire_size>> wire_pick(unsigned pick) {
        if (pick == 0) {
            return {};
        }
        const std::vector<wire_size> requests = wire_sizes<Request>(true);
        const std::vector<wire_size> outputs = wire_sizes<Output>(false);
        const std::size_t index = (pick - 1) % (requests.size() + outputs.size());
        if (index < requests.size()) {
            return {requests[index], std::nullopt};
        }
        return {std::nullopt, outputs[index - requests.size()]};
    }
    template <class Request> static std::optional<wire_size> request_pick(unsigned pick) {
        if (pick == 0) {
            return std::nullopt;
        }
        const std::vector<wire_size> sizes = wire_sizes<Request>(true);
        return sizes[(pick - 1) % sizes.size()];
    }
    template <class T> static wire_size normal() {
        return {static_cast<std::uint32_t>(sizeof(T)), size_kind::baseline};
    }
    // A refusal the struct sizes call for: INVALID_ARGUMENT, or nothing (accepted).
    static bool refused_form(const std::optional<wire_size>& size) {
        return size && (size->kind == size_kind::too_short || size->kind == size_kind::nonzero_tail ||
                        size->kind == size_kind::over_cap);
    }
    template <class T> static std::string form_text(const std::optional<wire_size>& size) {
        return size ? std::string(abi::struct_traits<T>::name) + " of struct_size " +
                          std::to_string(size->bytes) + " (" + size_kind_name(size->kind) + ")"
                    : std::string();
    }
    // A well-formed request the mechanism cannot satisfy now: nothing changed. Without host
    // callbacks, a mechanism that needs the reclaim hook answers UNSUPPORTED_CAPABILITY (H2).
    static bool cannot_now(const allocator_state& allocator, NxmemStatusCode code) {
        return code == NXMEM_STATUS_OUT_OF_MEMORY || code == NXMEM_STATUS_HOST_REFUSED ||
               (allocator.without_callbacks && code == NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
    }
    static bool too_short(const std::optional<wire_size>& size) {
        return size && size->kind == size_kind::too_short;
    }
    // An output too short for the baseline must be left untouched (Q7); any other only within the
    // fields the plugin knows (Q6).
    template <class T> void check_output(const wire_struct<T>& out, bool untouched, const std::string& call) const {
        const std::string overrun = out.overrun(untouched);
        if (!overrun.empty()) {
            fail(call + ": " + overrun);
        }
    }

    // ---- steps ----
    void open_allocator(const operation& step) {
        if (model_.allocators.size() >= max_allocators) {
            return;
        }
        device_id device = target_.device;
        std::string misuse;
        std::string options = target_.options;
        bool no_callbacks = false;
        switch (step.misuse % 5) {
        case 1: device.index = -1; misuse = "device index -1, which no mechanism can serve (Q16)"; break;
        case 2:
            for (NxmemDeviceType type : {NXMEM_DEVICE_CPU, NXMEM_DEVICE_CUDA, NXMEM_DEVICE_HIP, NXMEM_DEVICE_LEVEL_ZERO}) {
                if ((factory_table_.device_types & (1ull << type)) == 0) {
                    device = device_id{type, 0};
                    misuse = "device type " + std::string(device_type_name(type)) + ", which it does not serve (M2)";
                    break;
                }
            }
            break;
        case 3:
            options += std::string(options.empty() ? "" : ";") + "nxmem-conform-unknown-key=1";
            misuse = "an option no mechanism knows (Q14)";
            break;
        case 4: no_callbacks = true; break; // legal: no callbacks offered (H1), so no deferred release (D10)
        default: break;
        }
        const std::optional<wire_size> form = request_pick<NxmemOpenRequest>(step.wire);
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = device.to_wire();
        request.callbacks = no_callbacks ? nullptr : callbacks_.table();
        request.options = options.data();
        request.options_length = options.size();
        auto wire = wire_struct<NxmemOpenRequest>::request(request, form.value_or(normal<NxmemOpenRequest>()));
        NxmemAllocatorVtable* opened = nullptr;
        NxmemStatus status = abi::make_status();
        step_ += " on " + std::string(device_type_name(device.type)) + ":" + std::to_string(device.index) +
                 (form ? ", " + form_text<NxmemOpenRequest>(form) : std::string());
        const NxmemStatusCode code = factory_table_.open_allocator(factory_, wire.get(), &opened, &status);
        const std::string call = "open_allocator";
        if (refused_form(form) || !misuse.empty()) {
            const NxmemStatusCode wanted = refused_form(form) || step.misuse % 5 == 3
                                               ? NXMEM_STATUS_INVALID_ARGUMENT
                                               : NXMEM_STATUS_WRONG_DEVICE;
            if (code == NXMEM_STATUS_OK && opened != nullptr) { // release what it opened
                result<abi::table_copy<NxmemAllocatorVtable>> table =
                    abi::read_prefix<NxmemAllocatorVtable>(opened, factories_->negotiated_minor());
                if (table) {
                    table.value().table.release(opened);
                }
            }
            if (code != wanted && !refused_form(form) && step.misuse % 5 == 1) {
                // Q16 entered after the first contract: a plugin of an older minor is warned, and
                // the sequence goes on (what it opened was released above).
                (void)fail_unless_warned("Q16", call + " with " + misuse + " answered " + code_text(code, status) +
                                                    "; the contract says WRONG_DEVICE");
                return;
            }
            expect_code(code, status, wanted, call + (misuse.empty() ? "" : " with " + misuse));
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            fail(call + " answered " + code_text(code, status) + " for the device the mechanism opened before");
        }
        result<abi::table_copy<NxmemAllocatorVtable>> table =
            abi::read_prefix<NxmemAllocatorVtable>(opened, factories_->negotiated_minor());
        if (!table) {
            fail("the allocator table is unreadable: " + table.error().describe());
        }
        allocator_state allocator;
        allocator.serial = model_.next_serial++;
        allocator.self = opened;
        allocator.table = table.value().table;
        allocator.references = 1;
        allocator.without_callbacks = no_callbacks;
        if (allocator.table.mechanism_id != factory_table_.mechanism_id ||
            allocator.table.device.device_type != device.type || allocator.table.device.index != device.index) {
            allocator.table.release(opened);
            fail("the allocator table names mechanism " + std::to_string(allocator.table.mechanism_id) +
                 " on device type " + std::to_string(allocator.table.device.device_type) + " index " +
                 std::to_string(allocator.table.device.index) + "; its factory is " +
                 std::to_string(factory_table_.mechanism_id) + " and it was opened on " +
                 std::to_string(device.type) + ":" + std::to_string(device.index) + " (M6)");
        }
        if (no_callbacks && allocator.offers(NXMEM_CAP_DEFERRED_RELEASE)) {
            const std::string text = "opened with no host callbacks, the allocator table declares "
                                     "NXMEM_CAP_DEFERRED_RELEASE, whose retirements nobody could hear of (D10)";
            if (rules_.enforced("D10") || warnings_ == nullptr) {
                allocator.table.release(opened);
            }
            (void)fail_unless_warned("D10", text);
            // A host that offered no release_completed never enqueues: neither does the model.
            allocator.table.enqueue_release = nullptr;
            allocator.table.drain_releases = nullptr;
        }
        const std::uint32_t level = table.value().effective_minor;
        allocator.granularity = page_;
        if (allocator.offers(NXMEM_CAP_VIRTUAL_BACKING) && allocator.table.virtual_backing != nullptr) {
            result<abi::table_copy<NxmemVirtualBackingVtable>> backing =
                abi::read_prefix<NxmemVirtualBackingVtable>(allocator.table.virtual_backing, level);
            if (backing) {
                allocator.backing = backing.value().table;
                allocator.has_backing = true;
                if (backing.value().effective_minor >= 2 && allocator.backing.commit_granularity != 0) {
                    allocator.granularity = allocator.backing.commit_granularity;
                }
            }
        }
        if (allocator.offers(NXMEM_CAP_SHARED_MAPPING) && allocator.table.shared_mapping != nullptr) {
            result<abi::table_copy<NxmemSharedMappingVtable>> sharing =
                abi::read_prefix<NxmemSharedMappingVtable>(allocator.table.shared_mapping, level);
            if (sharing) {
                allocator.sharing = sharing.value().table;
                allocator.has_sharing = true;
            }
        }
        step_ += std::string(no_callbacks ? ", no host callbacks" : "") + " -> " + name(allocator);
        model_.allocators.push_back(std::move(allocator));
    }

    void retain_allocator(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr) {
            return;
        }
        step_ += " of " + name(*allocator);
        allocator->table.retain(allocator->self);
        ++allocator->references;
    }

    void release_allocator(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr) {
            return;
        }
        step_ += " of " + name(*allocator) + " (" + std::to_string(allocator->references) + " references)";
        if (allocator->references == 1) {
            drain_until_empty(*allocator); // a queued release pins its allocator (D4)
        }
        --allocator->references;
        allocator->table.release(allocator->self);
        if (allocator->references == 0) {
            // Everything it held goes with it (O9, O10).
            model_.allocators.erase(model_.allocators.begin() + (allocator - model_.allocators.data()));
        }
    }

    struct sizes_for {
        std::array<std::uint64_t, 12> sizes;
        std::array<std::uint64_t, 8> alignments;
    };
    sizes_for edges(const allocator_state& allocator) const {
        const std::uint64_t unit = unit_of(allocator);
        return {{1, 7, 64, unit - 1, unit, unit + 1, 2 * unit, 3 * unit + 5, 4 * unit, 65537, 1u << 20, page_ + 1},
                {1, 8, 64, 4096, 65536, 131072, 1u << 21, 16}};
    }

    void allocate(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || allocator->live.size() >= max_allocations) {
            return;
        }
        const sizes_for edge = edges(*allocator);
        auto request = abi::make_struct<NxmemAllocRequest>();
        request.mechanism_id = allocator->table.mechanism_id;
        request.device = allocator->table.device;
        request.allocation_id = next_allocation_id_++;
        request.size = edge.sizes[step.other % edge.sizes.size()];
        request.alignment = edge.alignments[step.shape % edge.alignments.size()];
        NxmemStatusCode wanted = NXMEM_STATUS_OK;
        std::string misuse;
        switch (step.misuse % 9) {
        case 1: request.size = 0; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "size 0"; break;
        case 2: request.alignment = 0; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "alignment 0"; break;
        case 3: request.alignment = 3; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "alignment 3"; break;
        case 4: request.alignment = 48; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "alignment 48"; break;
        case 5: request.alignment = 1ull << 40; misuse = "alignment 2^40: well formed, served or OUT_OF_MEMORY (Q15)"; break;
        case 6: request.flags = 1; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "flag bit 0, which major 1 does not define"; break;
        case 7: request.mechanism_id += 1; wanted = NXMEM_STATUS_WRONG_MECHANISM; misuse = "another mechanism's id"; break;
        case 8: request.device.index += 1; wanted = NXMEM_STATUS_WRONG_DEVICE; misuse = "another device index"; break;
        default: break;
        }
        if (wanted == NXMEM_STATUS_OK && step.shape % 4 == 3) {
            request.device.struct_size = step.other % 2 == 0 ? 0 : 4096; // not judged (L10)
        }
        const auto [request_form, output_form] = wire_pick<NxmemAllocRequest, NxmemAllocResult>(step.wire);
        if (refused_form(request_form) || (output_form && output_form->kind == size_kind::too_short)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT; // the form of the records decides first (M10)
        }
        step_ += " on " + name(*allocator) + ": " + std::to_string(request.size) + " B at alignment " +
                 std::to_string(request.alignment) + (misuse.empty() ? "" : ", " + misuse) +
                 (request_form ? ", " + form_text<NxmemAllocRequest>(request_form) : "") +
                 (output_form ? ", " + form_text<NxmemAllocResult>(output_form) : "");
        auto wire = wire_struct<NxmemAllocRequest>::request(request, request_form.value_or(normal<NxmemAllocRequest>()));
        auto out = wire_struct<NxmemAllocResult>::output(output_form.value_or(normal<NxmemAllocResult>()).bytes);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = allocator->table.allocate(allocator->self, wire.get(), out.get(), &status);
        check_output(out, too_short(output_form), "allocate");
        const NxmemAllocResult result = out.value();
        if (wanted != NXMEM_STATUS_OK) {
            if (code == NXMEM_STATUS_OK) {
                // Hand it back so the plugin holds nothing the model does not know of.
                auto described = abi::make_struct<NxmemAllocation>();
                described.mechanism_id = allocator->table.mechanism_id;
                described.device = allocator->table.device;
                described.allocation_id = request.allocation_id;
                described.address = result.address;
                described.size = request.size;
                described.alignment = request.alignment;
                NxmemStatus ignored = abi::make_status();
                (void)allocator->table.deallocate(allocator->self, &described, &ignored);
            }
            expect_code(code, status, wanted, "allocate");
            return;
        }
        if (cannot_now(*allocator, code)) {
            return; // a well-formed request the mechanism cannot satisfy now: nothing changed
        }
        if (code != NXMEM_STATUS_OK) {
            fail("allocate answered " + code_text(code, status) + " for a well-formed request");
        }
        allocation_state live;
        live.serial = model_.next_serial++;
        live.described = abi::make_struct<NxmemAllocation>();
        live.described.mechanism_id = request.mechanism_id;
        live.described.device = request.device;
        live.described.allocation_id = request.allocation_id;
        live.described.address = result.address;
        live.described.size = request.size;
        live.described.alignment = request.alignment;
        live.usable = result.size;
        live.stated_cost = result.mapped_bytes;
        live.virtual_backed = allocator->has_backing;
        live.unit = allocator->granularity;
        live.signature = static_cast<unsigned char>(0x10 + live.serial % 0xE0);
        step_ += " -> " + name(*allocator, live);
        if (result.address == 0 || result.address % request.alignment != 0) {
            fail("NxmemAllocResult.address is " + std::to_string(result.address) +
                 ", not a non-zero multiple of the alignment " + std::to_string(request.alignment) + " (Q11)");
        }
        if (result.size < request.size) {
            fail("NxmemAllocResult.size is " + std::to_string(result.size) + ", less than the " +
                 std::to_string(request.size) + " B asked for (Q11)");
        }
        if (live.virtual_backed && result.mapped_bytes != 0) {
            fail("NxmemAllocResult.mapped_bytes is " + std::to_string(result.mapped_bytes) +
                 " for a virtual-backing reservation, which costs 0 until committed (Q13)");
        }
        if (!live.virtual_backed && result.mapped_bytes < request.size) {
            fail("NxmemAllocResult.mapped_bytes is " + std::to_string(result.mapped_bytes) +
                 ", less than the " + std::to_string(request.size) + " B an eager allocation holds (Q13, Q17)");
        }
        const std::uint64_t begin = result.address;
        const std::uint64_t end = result.address + result.size;
        for (const allocator_state& other : model_.allocators) {
            for (const allocation_state& held : other.live) {
                if (begin < held.described.address + held.usable && held.described.address < end) {
                    fail("the new allocation " + range_text(begin, result.size) + " overlaps " +
                         name(other, held) + " " + range_text(held.described.address, held.usable) +
                         ", which is live");
                }
            }
            for (const auto& [start, length] : other.quarantined_ranges) {
                if (begin < start + length && start < end) {
                    fail("the new allocation " + range_text(begin, result.size) +
                         " reissues quarantined memory " + range_text(start, length) + " of " +
                         name(other) + " (RO3)");
                }
            }
        }
        if (live.virtual_backed) {
            live.committed.assign((request.size + live.unit - 1) / live.unit, false);
        } else if (cpu_) {
            write_byte(live.described.address, live.signature);
            write_byte(live.described.address + request.size - 1, live.signature);
        }
        allocator->live.push_back(std::move(live));
    }

    // The allocation's description as a step's misuse distorts it; the code the contract wants.
    static NxmemStatusCode distort(NxmemAllocation& described, unsigned misuse, std::string& text, bool release) {
        switch (misuse % (release ? 7 : 3)) {
        case 1: described.mechanism_id += 1; text = "another mechanism's id"; return NXMEM_STATUS_WRONG_MECHANISM;
        case 2: described.device.index += 1; text = "another device index"; return NXMEM_STATUS_WRONG_DEVICE;
        case 3: described.allocation_id += 1u << 20; text = "another allocation id"; return NXMEM_STATUS_INVALID_ARGUMENT;
        case 4: described.size += 1; text = "another size"; return NXMEM_STATUS_INVALID_ARGUMENT;
        case 5: described.alignment = described.alignment == 1 ? 2 : described.alignment / 2; text = "another alignment"; return NXMEM_STATUS_INVALID_ARGUMENT;
        case 6: described.address = 0x1000; text = "an address the plugin never handed out"; return NXMEM_STATUS_UNKNOWN_ALLOCATION;
        default: return NXMEM_STATUS_OK;
        }
    }

    void deallocate(const operation& step) { release(step, false); }
    void release_allocation(const operation& step) { release(step, true); }

    void release(const operation& step, bool structured) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || (structured && allocator->table.release_allocation == nullptr)) {
            return;
        }
        allocation_state* picked = pick_allocation(*allocator, step.object, true);
        if (picked == nullptr) {
            return;
        }
        const std::string call = structured ? "release_allocation" : "deallocate";
        auto described = picked->described;
        described.reserved = step.shape % 2 == 1 ? 0xFFFFFFFFu : 0; // ignored by the receiver (Q8)
        std::string misuse;
        NxmemStatusCode wanted = distort(described, step.misuse, misuse, true);
        // A misdescription may be INVALID_ARGUMENT or UNKNOWN_ALLOCATION (M4, M5): any refusal.
        bool any_refusal = wanted == NXMEM_STATUS_INVALID_ARGUMENT;
        if (wanted == NXMEM_STATUS_OK && picked->ticket) {
            wanted = NXMEM_STATUS_UNKNOWN_ALLOCATION; // the queue owns it (D9)
            misuse = "queued for release";
        }
        std::optional<wire_size> request_form;
        std::optional<wire_size> output_form;
        if (structured) {
            std::tie(request_form, output_form) = wire_pick<NxmemAllocation, NxmemReleaseOutcome>(step.wire);
        } else {
            request_form = request_pick<NxmemAllocation>(step.wire);
        }
        if (refused_form(request_form) || (output_form && output_form->kind == size_kind::too_short)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
            any_refusal = false;
        }
        step_ += " of " + name(*allocator, *picked) + " (" + describe(*picked) + ")" +
                 (misuse.empty() ? "" : ", " + misuse) +
                 (request_form ? ", " + form_text<NxmemAllocation>(request_form) : "") +
                 (output_form ? ", " + form_text<NxmemReleaseOutcome>(output_form) : "");
        const figure cost = picked->cost(page_);
        auto wire = wire_struct<NxmemAllocation>::request(described, request_form.value_or(normal<NxmemAllocation>()));
        auto out = wire_struct<NxmemReleaseOutcome>::output(output_form.value_or(normal<NxmemReleaseOutcome>()).bytes);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            structured ? allocator->table.release_allocation(allocator->self, wire.get(), out.get(), &status)
                       : allocator->table.deallocate(allocator->self, wire.get(), &status);
        if (structured) {
            check_output(out, too_short(output_form), call);
        }
        if (wanted != NXMEM_STATUS_OK) {
            if (code == NXMEM_STATUS_OK) {
                const unsigned serial = picked->serial;
                if (!picked->ticket) {
                    forget_allocation(*allocator, serial); // it acted on it: the model follows
                }
                fail(call + " with " + (misuse.empty() ? form_text<NxmemAllocation>(request_form) : misuse) +
                     " answered OK; the contract says " +
                     std::string(status_code_name(status_code_from_wire(wanted))));
            }
            if (!any_refusal) {
                expect_code(code, status, wanted, call + (misuse.empty() ? "" : " with " + misuse));
            }
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            return; // a failed release leaves the allocation live (RO4, S7)
        }
        if (structured) {
            const NxmemReleaseOutcome outcome = out.value();
            judge_outcome(*allocator, *picked, outcome, cost, call);
            if (outcome.state == NXMEM_RELEASE_FAILED) {
                fail(call + " answered OK with state FAILED; FAILED comes with a failure code (RO4)");
            }
        }
        forget_allocation(*allocator, picked->serial);
    }

    // A release outcome (structured or retired) against the allocation's cost (RO1, RO2, RO6).
    void judge_outcome(allocator_state& allocator, const allocation_state& live,
                       const NxmemReleaseOutcome& outcome, const figure& cost, const std::string& call) {
        if (outcome.state == NXMEM_RELEASE_COMPLETE) {
            if (!cost.admits(outcome.unmapped_bytes) || outcome.residual_owned_bytes != 0) {
                fail(call + " of " + name(allocator, live) + " reported COMPLETE with unmapped_bytes " +
                     std::to_string(outcome.unmapped_bytes) + " and residual_owned_bytes " +
                     std::to_string(outcome.residual_owned_bytes) + "; the model says it cost " +
                     cost.describe() + " and COMPLETE keeps nothing (RO6)");
            }
        } else if (outcome.state == NXMEM_RELEASE_QUARANTINED) {
            if (!cost.admits(outcome.unmapped_bytes + outcome.residual_owned_bytes)) {
                fail(call + " of " + name(allocator, live) + " reported QUARANTINED with unmapped_bytes " +
                     std::to_string(outcome.unmapped_bytes) + " + residual_owned_bytes " +
                     std::to_string(outcome.residual_owned_bytes) + "; the model says it cost " +
                     cost.describe() + " (RO6)");
            }
            allocator.quarantined += outcome.residual_owned_bytes;
            allocator.quarantined_ranges.emplace_back(live.described.address, live.usable);
        } else if (outcome.state != NXMEM_RELEASE_FAILED) {
            fail(call + " of " + name(allocator, live) + " reported release state " +
                 std::to_string(outcome.state) + ", which this header does not define");
        }
    }

    void forget_allocation(allocator_state& allocator, unsigned serial) {
        auto found = std::find_if(allocator.live.begin(), allocator.live.end(),
                                  [&](const allocation_state& live) { return live.serial == serial; });
        if (found == allocator.live.end()) {
            return;
        }
        if (found->prefix) {
            if (prefix_state* prefix = allocator.find_prefix(*found->prefix)) {
                --prefix->sharers;
            }
        }
        allocator.live.erase(found);
    }

    void change_range(const operation& step, bool commit) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || !allocator->has_backing) {
            return;
        }
        allocation_state* picked = pick_allocation(*allocator, step.object, false, true);
        if (picked == nullptr) {
            return;
        }
        const std::uint64_t unit = picked->unit;
        const std::uint64_t units = picked->committed.size();
        const std::uint64_t first = step.other % units;
        const std::uint64_t count = 1 + step.shape % (units - first);
        auto request = abi::make_struct<NxmemRangeRequest>();
        request.allocation = picked->described;
        request.range = abi::make_struct<NxmemByteRange>();
        request.range.offset = first * unit;
        request.range.length = std::min((first + count) * unit, picked->described.size) - first * unit;
        NxmemStatusCode wanted = NXMEM_STATUS_OK;
        std::string misuse;
        switch (step.misuse % 6) {
        case 1: request.range.length = 0; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "an empty range (M7)"; break;
        case 2: request.range.offset = units * unit; request.range.length = unit; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "a range past the end (M7)"; break;
        case 3: request.range.length = (units - first + 1) * unit; wanted = NXMEM_STATUS_INVALID_ARGUMENT; misuse = "a range running past the end (M7)"; break;
        case 4: request.allocation.mechanism_id += 1; wanted = NXMEM_STATUS_WRONG_MECHANISM; misuse = "another mechanism's id"; break;
        case 5: request.allocation.device.index += 1; wanted = NXMEM_STATUS_WRONG_DEVICE; misuse = "another device index"; break;
        default: break;
        }
        const std::optional<wire_size> form = request_pick<NxmemRangeRequest>(step.wire);
        if (refused_form(form)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
        }
        const std::string call = commit ? "commit" : "decommit";
        // The granules a mapped prefix covers are the prefix's (C8).
        const std::uint64_t prefix_end = prefix_extent(*allocator, *picked);
        const bool over_prefix = wanted == NXMEM_STATUS_OK && request.range.offset < prefix_end;
        step_ += " " + range_text(request.range.offset, request.range.length) + " of " +
                 name(*allocator, *picked) + " (" + describe(*picked) + ", unit " + std::to_string(unit) +
                 prefix_text(*allocator, *picked) + ")" + (misuse.empty() ? "" : ", " + misuse) +
                 (form ? ", " + form_text<NxmemRangeRequest>(form) : "");
        auto wire = wire_struct<NxmemRangeRequest>::request(request, form.value_or(normal<NxmemRangeRequest>()));
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = commit ? allocator->backing.commit(allocator->self, wire.get(), &status)
                                            : allocator->backing.decommit(allocator->self, wire.get(), &status);
        if (wanted != NXMEM_STATUS_OK) {
            expect_code(code, status, wanted, call + (misuse.empty() ? "" : " of " + misuse));
            return;
        }
        if (cannot_now(*allocator, code)) {
            return;
        }
        if (code == NXMEM_STATUS_INVALID_ARGUMENT && over_prefix) {
            return; // C8, reading "refuses": a range over a mapped prefix is refused, nothing changed
        }
        if (code != NXMEM_STATUS_OK) {
            const std::string text =
                call + " of a legal range inside the allocation answered " + code_text(code, status) +
                " (G5: a range of whole units, or ending at the allocation's end, inside the allocation" +
                (picked->prefix ? " and clear of its mapped prefix" : "") +
                ", is accepted; only a range over a mapped prefix may be refused, C8)";
            (void)fail_unless_warned("G5", text);
            return; // warned: a refusal changes nothing (G3)
        }
        for (std::uint64_t index = first; index < first + count; ++index) {
            picked->committed[index] = commit;
        }
        if (!cpu_) {
            return;
        }
        // The prefix's granules are the prefix's whatever the mechanism did with them (C8: left
        // alone, or on decommit emptied): the OS checks start past them.
        const std::uint64_t begin = std::max(request.range.offset, prefix_end);
        const std::uint64_t end = request.range.offset + request.range.length;
        if (commit) {
            for (std::uint64_t at = begin; at < end; at += page_) {
                write_byte(picked->described.address + at, picked->signature); // usable now, and resident
            }
            return;
        }
        // Decommitted pages must be gone: not resident (mincore).
        const std::uint64_t first_page = round_up(begin, page_);
        const std::uint64_t last_page = end / page_ * page_;
        if (last_page > first_page && (picked->described.address % page_) == 0) {
            const std::optional<std::uint64_t> resident =
                resident_pages(picked->described.address + first_page, last_page - first_page);
            if (resident && *resident != 0) {
                fail("decommit answered OK, but " + std::to_string(*resident) + " of the " +
                     std::to_string((last_page - first_page) / page_) + " pages of " +
                     range_text(first_page, last_page - first_page) + " (page " + std::to_string(page_) +
                     (prefix_end != 0 ? ", past the mapped prefix's granules ending at " + std::to_string(prefix_end)
                                      : std::string()) +
                     ") are still resident (mincore): the memory was not returned (G3)");
            }
        }
    }

    void create_prefix(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || !allocator->has_sharing) {
            return;
        }
        std::size_t alive = 0;
        for (const prefix_state& prefix : allocator->prefixes) {
            alive += prefix.alive() ? 1 : 0;
        }
        if (alive >= max_prefixes) {
            return;
        }
        const std::uint64_t unit = unit_of(*allocator);
        const std::array<std::uint64_t, 7> sizes{1, page_ - 1, page_, page_ + 1, unit, 2 * unit + 3, 65536};
        auto request = abi::make_struct<NxmemSharedPrefixRequest>();
        request.mechanism_id = allocator->table.mechanism_id;
        request.device = allocator->table.device;
        request.size = sizes[step.other % sizes.size()];
        NxmemStatusCode wanted = NXMEM_STATUS_OK;
        std::string misuse;
        switch (step.misuse % 3) {
        case 1: request.mechanism_id += 1; wanted = NXMEM_STATUS_WRONG_MECHANISM; misuse = "another mechanism's id"; break;
        case 2: request.device.index += 1; wanted = NXMEM_STATUS_WRONG_DEVICE; misuse = "another device index"; break;
        default: break;
        }
        const auto [request_form, output_form] = wire_pick<NxmemSharedPrefixRequest, NxmemSharedPrefixHandle>(step.wire);
        if (refused_form(request_form) || (output_form && output_form->kind == size_kind::too_short)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
        }
        step_ += " of " + std::to_string(request.size) + " B on " + name(*allocator) +
                 (misuse.empty() ? "" : ", " + misuse) +
                 (request_form ? ", " + form_text<NxmemSharedPrefixRequest>(request_form) : "") +
                 (output_form ? ", " + form_text<NxmemSharedPrefixHandle>(output_form) : "");
        auto wire = wire_struct<NxmemSharedPrefixRequest>::request(request, request_form.value_or(normal<NxmemSharedPrefixRequest>()));
        auto out = wire_struct<NxmemSharedPrefixHandle>::output(output_form.value_or(normal<NxmemSharedPrefixHandle>()).bytes);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = allocator->sharing.create_shared_prefix(allocator->self, wire.get(), out.get(), &status);
        check_output(out, too_short(output_form), "create_shared_prefix");
        NxmemSharedPrefixHandle handle = out.value();
        handle.struct_size = sizeof handle;
        if (wanted != NXMEM_STATUS_OK) {
            if (code == NXMEM_STATUS_OK) {
                NxmemStatus ignored = abi::make_status();
                (void)allocator->sharing.release_shared_prefix(allocator->self, &handle, &ignored);
            }
            expect_code(code, status, wanted, "create_shared_prefix");
            return;
        }
        if (cannot_now(*allocator, code)) {
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            fail("create_shared_prefix answered " + code_text(code, status) + " for a well-formed request");
        }
        prefix_state prefix;
        prefix.serial = model_.next_serial++;
        prefix.handle = handle;
        prefix.requested = request.size;
        prefix.references = 1;
        step_ += " -> prefix #" + std::to_string(prefix.serial);
        allocator->prefixes.push_back(prefix);
        if (handle.mechanism_id != request.mechanism_id || handle.device.device_type != request.device.device_type ||
            handle.device.index != request.device.index) {
            fail("the prefix handle names mechanism " + std::to_string(handle.mechanism_id) + " on " +
                 std::to_string(handle.device.device_type) + ":" + std::to_string(handle.device.index) +
                 "; its allocator is mechanism " + std::to_string(request.mechanism_id) + " on " +
                 std::to_string(request.device.device_type) + ":" + std::to_string(request.device.index) + " (O10)");
        }
        if (handle.size < request.size || handle.size > round_up(request.size, unit)) {
            fail("NxmemSharedPrefixHandle.size is " + std::to_string(handle.size) + " for a prefix of " +
                 std::to_string(request.size) + " B asked for");
        }
    }

    prefix_state* pick_prefix(allocator_state& allocator, unsigned pick, bool dead_too) {
        std::vector<prefix_state*> candidates;
        for (prefix_state& prefix : allocator.prefixes) {
            if (prefix.references > 0 || (dead_too && !prefix.alive())) {
                candidates.push_back(&prefix);
            }
        }
        return candidates.empty() ? nullptr : candidates[pick % candidates.size()];
    }

    // A prefix handle as a step's misuse distorts it; the code the contract wants.
    static NxmemStatusCode distort(NxmemSharedPrefixHandle& handle, unsigned misuse, std::string& text) {
        switch (misuse % 3) {
        case 1: handle.mechanism_id += 1; text = "a handle naming another mechanism"; return NXMEM_STATUS_WRONG_MECHANISM;
        case 2: handle.device.index += 1; text = "a handle naming another device"; return NXMEM_STATUS_WRONG_DEVICE;
        default: return NXMEM_STATUS_OK;
        }
    }

    void retain_prefix(const operation& step) { change_prefix_references(step, true); }
    void release_prefix(const operation& step) { change_prefix_references(step, false); }

    void change_prefix_references(const operation& step, bool retain) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || !allocator->has_sharing) {
            return;
        }
        prefix_state* prefix = pick_prefix(*allocator, step.object, true);
        if (prefix == nullptr) {
            return;
        }
        NxmemSharedPrefixHandle handle = prefix->handle;
        std::string misuse;
        NxmemStatusCode wanted = distort(handle, step.misuse, misuse);
        if (wanted == NXMEM_STATUS_OK && !prefix->alive()) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT; // gone (M8)
            misuse = "a prefix that is gone";
        }
        const std::optional<wire_size> form = request_pick<NxmemSharedPrefixHandle>(step.wire);
        if (refused_form(form)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
        }
        const std::string call = retain ? "retain_shared_prefix" : "release_shared_prefix";
        step_ += " of prefix #" + std::to_string(prefix->serial) + " of " + name(*allocator) + " (" +
                 std::to_string(prefix->references) + " references, " + std::to_string(prefix->sharers) +
                 " sharers)" + (misuse.empty() ? "" : ", " + misuse) +
                 (form ? ", " + form_text<NxmemSharedPrefixHandle>(form) : "");
        auto wire = wire_struct<NxmemSharedPrefixHandle>::request(handle, form.value_or(normal<NxmemSharedPrefixHandle>()));
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = retain ? allocator->sharing.retain_shared_prefix(allocator->self, wire.get(), &status)
                                            : allocator->sharing.release_shared_prefix(allocator->self, wire.get(), &status);
        if (wanted != NXMEM_STATUS_OK) {
            if (code == NXMEM_STATUS_OK && prefix->alive()) {
                prefix->references += retain ? 1 : 0; // follow what it did, then report it
                prefix->references -= retain ? 0 : 1;
            }
            expect_code(code, status, wanted, call + (misuse.empty() ? "" : " with " + misuse));
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            fail(call + " of a live prefix answered " + code_text(code, status));
        }
        if (retain) {
            ++prefix->references;
        } else {
            --prefix->references;
        }
    }

    void map_prefix(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || !allocator->has_sharing) {
            return;
        }
        prefix_state* prefix = pick_prefix(*allocator, step.other, true);
        allocation_state* picked = pick_allocation(*allocator, step.object, false, false, true);
        if (prefix == nullptr || picked == nullptr) {
            return;
        }
        auto request = abi::make_struct<NxmemSharedPrefixCommitRequest>();
        request.allocation = picked->described;
        request.prefix = prefix->handle;
        NxmemStatusCode wanted = NXMEM_STATUS_OK;
        std::string misuse;
        switch (step.misuse % 3) {
        case 1: request.allocation.mechanism_id += 1; wanted = NXMEM_STATUS_WRONG_MECHANISM; misuse = "an allocation naming another mechanism"; break;
        case 2: request.prefix.mechanism_id += 1; wanted = NXMEM_STATUS_WRONG_MECHANISM; misuse = "a prefix handle naming another mechanism"; break;
        default: break;
        }
        bool refusal_any = false;
        if (wanted == NXMEM_STATUS_OK && !prefix->alive()) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
            misuse = "a prefix that is gone (M8)";
        } else if (wanted == NXMEM_STATUS_OK && picked->described.size < prefix->handle.size) {
            refusal_any = true; // it does not fit: refused, whatever the code
            misuse = "a prefix larger than the allocation";
        }
        const auto [request_form, output_form] =
            wire_pick<NxmemSharedPrefixCommitRequest, NxmemSharedPrefixCommitInfo>(step.wire);
        if (refused_form(request_form) || (output_form && output_form->kind == size_kind::too_short)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
            refusal_any = false;
        }
        step_ += " of prefix #" + std::to_string(prefix->serial) + " (" + std::to_string(prefix->handle.size) +
                 " B, granule " + std::to_string(unit_of(*allocator)) + ") into " + name(*allocator, *picked) +
                 " (" + describe(*picked) + ")" +
                 (misuse.empty() ? "" : ", " + misuse) +
                 (request_form ? ", " + form_text<NxmemSharedPrefixCommitRequest>(request_form) : "") +
                 (output_form ? ", " + form_text<NxmemSharedPrefixCommitInfo>(output_form) : "");
        auto wire = wire_struct<NxmemSharedPrefixCommitRequest>::request(
            request, request_form.value_or(normal<NxmemSharedPrefixCommitRequest>()));
        auto out = wire_struct<NxmemSharedPrefixCommitInfo>::output(
            output_form.value_or(normal<NxmemSharedPrefixCommitInfo>()).bytes);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            allocator->sharing.commit_shared_prefix(allocator->self, wire.get(), out.get(), &status);
        check_output(out, too_short(output_form), "commit_shared_prefix");
        if (refusal_any) {
            if (code == NXMEM_STATUS_OK) {
                fail("commit_shared_prefix of a " + std::to_string(prefix->handle.size) + "-byte prefix into a " +
                     std::to_string(picked->described.size) + "-byte allocation answered OK");
            }
            return;
        }
        if (wanted != NXMEM_STATUS_OK) {
            expect_code(code, status, wanted, "commit_shared_prefix with " + (misuse.empty() ? std::string("that struct_size") : misuse));
            return;
        }
        if (cannot_now(*allocator, code)) {
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            fail("commit_shared_prefix answered " + code_text(code, status));
        }
        const NxmemSharedPrefixCommitInfo info = out.value();
        // C8: a prefix's first mapping costs its size, counted by its bytes or by the whole commit
        // granules it holds (the page without virtual backing); every later one costs 0.
        const std::uint64_t granule = unit_of(*allocator);
        const std::uint64_t by_granules = round_up(prefix->handle.size, granule);
        const bool first_mapping = !prefix->ever_mapped;
        ++prefix->sharers;
        prefix->ever_mapped = true;
        picked->prefix = prefix->serial;
        picked->prefix_bytes = prefix->handle.size;
        if (info.shared_bytes != prefix->handle.size) {
            fail("NxmemSharedPrefixCommitInfo.shared_bytes is " + std::to_string(info.shared_bytes) +
                 "; C8 says the prefix's size, its handle's size: " + std::to_string(prefix->handle.size) +
                 " B (not rounded: the granule is " + std::to_string(granule) + " B, whole granules " +
                 std::to_string(by_granules) + " B)");
        }
        if (first_mapping && info.newly_mapped_bytes != prefix->handle.size && info.newly_mapped_bytes != by_granules) {
            fail("NxmemSharedPrefixCommitInfo.newly_mapped_bytes is " + std::to_string(info.newly_mapped_bytes) +
                 " for the first mapping of prefix #" + std::to_string(prefix->serial) + " (" +
                 std::to_string(prefix->handle.size) + " B, granule " + std::to_string(granule) +
                 "); C8 permits its size counted by its bytes, " + std::to_string(prefix->handle.size) +
                 ", or by the whole granules it holds, " + std::to_string(by_granules));
        }
        if (!first_mapping && info.newly_mapped_bytes != 0) {
            fail("NxmemSharedPrefixCommitInfo.newly_mapped_bytes is " + std::to_string(info.newly_mapped_bytes) +
                 " for prefix #" + std::to_string(prefix->serial) + " (" + std::to_string(prefix->handle.size) +
                 " B), mapped before: C8 says 0, a prefix is costed once in its lifetime");
        }
        if (info.sharers != prefix->sharers) {
            fail("NxmemSharedPrefixCommitInfo.sharers is " + std::to_string(info.sharers) + "; the model counts " +
                 std::to_string(prefix->sharers) + " allocations mapping prefix #" + std::to_string(prefix->serial));
        }
        if (cpu_) {
            check_sharing(*allocator, *picked, *prefix);
        }
    }

    // A byte written through one sharer is read through every other (the prefix is shared, not
    // copied).
    void check_sharing(const allocator_state& allocator, const allocation_state& writer, const prefix_state& prefix) {
        const unsigned char mark = static_cast<unsigned char>(0x80 + (step_number_ % 0x7f));
        const std::array<std::uint64_t, 2> offsets{0, prefix.handle.size - 1};
        for (std::uint64_t offset : offsets) {
            write_byte(writer.described.address + offset, mark);
        }
        for (const allocation_state& reader : allocator.live) {
            if (reader.serial == writer.serial || reader.prefix != prefix.serial) {
                continue;
            }
            for (std::uint64_t offset : offsets) {
                const unsigned char seen = read_byte(reader.described.address + offset);
                if (seen != mark) {
                    fail("a byte written at offset " + std::to_string(offset) + " of prefix #" +
                         std::to_string(prefix.serial) + " through " + name(allocator, writer) + " reads " +
                         std::to_string(seen) + ", not " + std::to_string(mark) + ", through " +
                         name(allocator, reader) + ", which maps the same prefix: each sharer got a copy");
                }
            }
        }
    }

    void enqueue_release(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || allocator->table.enqueue_release == nullptr) {
            return;
        }
        allocation_state* picked = pick_allocation(*allocator, step.object, true);
        if (picked == nullptr) {
            return;
        }
        auto described = picked->described;
        std::string misuse;
        NxmemStatusCode wanted = distort(described, step.misuse, misuse, false);
        if (wanted == NXMEM_STATUS_OK && picked->ticket) {
            wanted = NXMEM_STATUS_UNKNOWN_ALLOCATION;
            misuse = "an allocation already queued (D9)";
        }
        const std::optional<wire_size> form = request_pick<NxmemAllocation>(step.wire);
        if (refused_form(form)) {
            wanted = NXMEM_STATUS_INVALID_ARGUMENT;
        }
        const std::uint64_t ticket = model_.next_ticket++;
        step_ += " of " + name(*allocator, *picked) + " with ticket " + std::to_string(ticket) +
                 (misuse.empty() ? "" : ", " + misuse) + (form ? ", " + form_text<NxmemAllocation>(form) : "");
        auto wire = wire_struct<NxmemAllocation>::request(described, form.value_or(normal<NxmemAllocation>()));
        NxmemStatus status = abi::make_status();
        completions_.clear();
        const NxmemStatusCode code = allocator->table.enqueue_release(allocator->self, wire.get(), ticket, &status);
        if (wanted != NXMEM_STATUS_OK) {
            expect_code(code, status, wanted, "enqueue_release" + (misuse.empty() ? "" : " of " + misuse));
            if (!completions_.empty()) {
                fail("release_completed was called for ticket " + std::to_string(completions_.front().ticket) +
                     " inside an enqueue_release that was refused");
            }
            return;
        }
        if (code != NXMEM_STATUS_OK) {
            if (!completions_.empty()) {
                fail("enqueue_release retired ticket " + std::to_string(ticket) + " and then answered " +
                     code_text(code, status) + " (D8)");
            }
            return; // the allocation is live again (D2)
        }
        picked->ticket = ticket;
        allocator->queue.push_back(ticket);
        // A completion inside enqueue_release is allowed (D7): it retires like a drain's.
        retire(*allocator, "inside enqueue_release");
    }

    // The completions delivered so far, in order, against the queue's head.
    void retire(allocator_state& allocator, const std::string& where) {
        for (const NxmemReleaseCompletion& done : completions_) {
            if (allocator.queue.empty() || allocator.queue.front() != done.ticket) {
                const bool known = std::find(allocator.queue.begin(), allocator.queue.end(), done.ticket) !=
                                   allocator.queue.end();
                fail("release_completed " + where + " for ticket " + std::to_string(done.ticket) + ": " +
                     (known ? "out of enqueue order, ticket " + std::to_string(allocator.queue.front()) +
                                  " was queued first (D3)"
                            : std::string("no such ticket is queued (never enqueued, or retired already)")));
            }
            if (done.struct_size < abi::baseline_bytes<NxmemReleaseCompletion>()) {
                fail("the completion of ticket " + std::to_string(done.ticket) + " has struct_size " +
                     std::to_string(done.struct_size) + ", below its baseline (Q1)");
            }
            allocation_state* retired = nullptr;
            for (allocation_state& live : allocator.live) {
                if (live.ticket == done.ticket) {
                    retired = &live;
                }
            }
            if (done.mechanism_id != retired->described.mechanism_id ||
                done.allocation_id != retired->described.allocation_id) {
                fail("the completion of ticket " + std::to_string(done.ticket) + " names mechanism " +
                     std::to_string(done.mechanism_id) + " and allocation id " + std::to_string(done.allocation_id) +
                     "; it was enqueued for allocation id " + std::to_string(retired->described.allocation_id));
            }
            if (done.outcome.state != NXMEM_RELEASE_COMPLETE && done.outcome.state != NXMEM_RELEASE_QUARANTINED) {
                fail("the completion of ticket " + std::to_string(done.ticket) + " reports state " +
                     std::to_string(done.outcome.state) + "; a retired release is COMPLETE or QUARANTINED");
            }
            judge_outcome(allocator, *retired, done.outcome, retired->cost(page_),
                          "the retirement of ticket " + std::to_string(done.ticket));
            allocator.queue.pop_front();
            forget_allocation(allocator, retired->serial);
        }
        completions_.clear();
    }

    // One drain: *retired against the completions it delivered.
    void drain_once(allocator_state& allocator) {
        std::uint64_t retired = 0;
        NxmemStatus status = abi::make_status();
        completions_.clear();
        const NxmemStatusCode code = allocator.table.drain_releases(allocator.self, &retired, &status);
        const std::size_t delivered = completions_.size();
        if (code != NXMEM_STATUS_OK) {
            fail("drain_releases of " + name(allocator) + " answered " + code_text(code, status));
        }
        retire(allocator, "during drain_releases");
        if (retired != delivered) {
            fail("drain_releases of " + name(allocator) + " wrote *retired = " + std::to_string(retired) +
                 " but called release_completed " + std::to_string(delivered) + " times (D3)");
        }
    }

    void drain(const operation& step) {
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || allocator->table.drain_releases == nullptr) {
            return;
        }
        step_ += " of " + name(*allocator) + " (" + std::to_string(allocator->queue.size()) + " queued)";
        drain_once(*allocator);
    }

    void drain_until_empty(allocator_state& allocator) {
        for (unsigned attempt = 0; attempt < drain_attempts && !allocator.queue.empty(); ++attempt) {
            drain_once(allocator);
        }
        if (!allocator.queue.empty()) {
            fail(std::to_string(allocator.queue.size()) + " queued releases of " + name(allocator) +
                 " did not retire within " + std::to_string(drain_attempts) + " drains");
        }
    }

    // The usage query and the unload report with each output size the rules allow and forbid.
    void query(const operation& step) {
        if (step.wire == 0) {
            return; // compare_everything queries both
        }
        const std::vector<wire_size> reports = wire_sizes<NxmemUnloadReport>(false);
        const std::vector<wire_size> usages = wire_sizes<NxmemAllocatorUsage>(false);
        const std::size_t index = (step.wire - 1) % (reports.size() + usages.size());
        if (index < reports.size()) {
            const wire_size size = reports[index];
            step_ += ": NxmemQueryUnloadReadiness with " + form_text<NxmemUnloadReport>(size);
            auto out = wire_struct<NxmemUnloadReport>::output(size.bytes);
            NxmemStatus status = abi::make_status();
            const NxmemStatusCode code = library_->query_unload_readiness()(out.get(), &status);
            check_output(out, size.kind == size_kind::too_short, "NxmemQueryUnloadReadiness");
            if (size.kind == size_kind::too_short) {
                expect_code(code, status, NXMEM_STATUS_INVALID_ARGUMENT, "NxmemQueryUnloadReadiness");
            }
            return;
        }
        allocator_state* allocator = pick_allocator(step);
        if (allocator == nullptr || allocator->table.query_usage == nullptr) {
            return;
        }
        const wire_size size = usages[index - reports.size()];
        step_ += ": query_usage of " + name(*allocator) + " with " + form_text<NxmemAllocatorUsage>(size);
        auto out = wire_struct<NxmemAllocatorUsage>::output(size.bytes);
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = allocator->table.query_usage(allocator->self, out.get(), &status);
        check_output(out, size.kind == size_kind::too_short, "query_usage");
        if (size.kind == size_kind::too_short) {
            expect_code(code, status, NXMEM_STATUS_INVALID_ARGUMENT, "query_usage");
        }
    }

    // ---- comparisons ----
    NxmemUnloadReport read_report(const std::string& where) const {
        auto report = abi::make_struct<NxmemUnloadReport>();
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = library_->query_unload_readiness()(&report, &status);
        if (code != NXMEM_STATUS_OK) {
            contradiction(where, "NxmemQueryUnloadReadiness answered " + code_text(code, status));
        }
        return report;
    }

    void compare_count(const char* field, std::uint64_t reported, std::uint64_t baseline, std::uint64_t expected,
                       const std::string& why) const {
        if (reported != baseline + expected) {
            fail("NxmemUnloadReport." + std::string(field) + " is " + std::to_string(reported) +
                 "; the model says " + std::to_string(baseline + expected) + " (" + why + ")");
        }
    }

    void compare_figure(const allocator_state& allocator, const char* field, std::uint64_t reported,
                        const figure& expected, const std::string& why) const {
        if (!expected.admits(reported)) {
            fail("NxmemAllocatorUsage." + std::string(field) + " of " + name(allocator) + " is " +
                 std::to_string(reported) + "; the model says " + expected.describe() + " (" + why + ")");
        }
    }

    void compare_everything() {
        const NxmemUnloadReport report = read_report(step_);
        const report_counts expected = model_.expected_report();
        std::uint64_t queued_live = 0;
        for (const allocator_state& allocator : model_.allocators) {
            queued_live += allocator.queue.size();
        }
        compare_count("live_allocators", report.live_allocators, baseline_report_.live_allocators,
                      expected.allocators, "allocators opened and not yet released");
        compare_count("live_allocations", report.live_allocations, baseline_report_.live_allocations,
                      expected.allocations,
                      "allocations made and not released, " + std::to_string(queued_live) +
                          " of them queued and not retired (D1)");
        compare_count("live_views", report.live_views, baseline_report_.live_views, expected.views,
                      "prefix mappings of live allocations");
        compare_count("live_shared_prefixes", report.live_shared_prefixes, baseline_report_.live_shared_prefixes,
                      expected.prefixes, "prefixes with a reference or a mapping left");
        compare_count("queued_releases", report.queued_releases, baseline_report_.queued_releases, expected.queued,
                      "releases enqueued and not retired");
        for (const allocator_state& allocator : model_.allocators) {
            if (allocator.table.query_usage != nullptr) {
                auto usage = abi::make_struct<NxmemAllocatorUsage>();
                NxmemStatus status = abi::make_status();
                const NxmemStatusCode code = allocator.table.query_usage(allocator.self, &usage, &status);
                if (code != NXMEM_STATUS_OK) {
                    fail("query_usage of " + name(allocator) + " answered " + code_text(code, status));
                }
                const usage_figures wanted = reference_model::expected_usage(allocator, page_);
                compare_figure(allocator, "live_allocations", usage.live_allocations, wanted.live_allocations,
                               "its allocations not yet released, " + std::to_string(allocator.queue.size()) +
                                   " queued among them (G4)");
                compare_figure(allocator, "reserved_bytes", usage.reserved_bytes, wanted.reserved_bytes,
                               "the usable sizes its allocation results stated");
                compare_figure(allocator, "mapped_bytes", usage.mapped_bytes, wanted.mapped_bytes,
                               allocator.has_backing ? "the committed units of its live allocations, prefixes excluded"
                                                     : "the mapped_bytes its allocation results stated");
                compare_figure(allocator, "shared_prefix_bytes", usage.shared_prefix_bytes, wanted.shared_prefix_bytes,
                               "its live prefixes, each once however many sharers");
                compare_figure(allocator, "quarantined_bytes", usage.quarantined_bytes, wanted.quarantined_bytes,
                               "the residue its quarantines reported");
            }
            for (const allocation_state& live : allocator.live) {
                if (live.virtual_backed && !live.ticket) { // a queued one is the queue's (D9)
                    std::uint64_t mapped = 0;
                    NxmemStatus status = abi::make_status();
                    const NxmemStatusCode code =
                        allocator.backing.mapped_bytes(allocator.self, &live.described, &mapped, &status);
                    if (code != NXMEM_STATUS_OK) {
                        fail("mapped_bytes of " + name(allocator, live) + " answered " + code_text(code, status));
                    }
                    const figure cost = live.cost(page_);
                    if (!cost.admits(mapped)) {
                        fail("mapped_bytes of " + name(allocator, live) + " (" + describe(live) + ") is " +
                             std::to_string(mapped) + "; the model says " + cost.describe() + " (its committed units " +
                             committed_text(live) + prefix_text(allocator, live) +
                             (live.prefix ? "; units under the prefix may count or not, C8" : "") + ", Q17)");
                    }
                }
                if (cpu_) {
                    check_signature(allocator, live);
                }
            }
        }
    }

    // The bytes the model wrote into an allocation are still there.
    void check_signature(const allocator_state& allocator, const allocation_state& live) const {
        const std::uint64_t shared_end = prefix_extent(allocator, live);
        auto expect = [&](std::uint64_t offset) {
            if (offset < shared_end) {
                return;
            }
            const unsigned char seen = read_byte(live.described.address + offset);
            if (seen != live.signature) {
                fail("byte " + std::to_string(offset) + " of " + name(allocator, live) + " reads " +
                     std::to_string(seen) + "; the model wrote " + std::to_string(live.signature) +
                     " there: the memory changed under a live allocation");
            }
        };
        if (!live.virtual_backed) {
            expect(0);
            expect(live.described.size - 1);
            return;
        }
        for (std::size_t index = 0; index < live.committed.size(); ++index) {
            if (live.committed[index]) {
                expect(index * live.unit);
            }
        }
    }

    static void write_byte(std::uint64_t address, unsigned char value) {
        *reinterpret_cast<volatile unsigned char*>(address) = value;
    }
    static unsigned char read_byte(std::uint64_t address) {
        return *reinterpret_cast<const volatile unsigned char*>(address);
    }

    const subject& target_;
    std::uint64_t& steps_run_;
    rule_set rules_;
    std::map<std::string, std::string>* warnings_;
    std::vector<std::string> history_; // each step run so far, as described
    bool cpu_;
    std::uint64_t page_;
    // Declared first: destroyed last, after the factories (and the allocators, released above).
    std::optional<detail::raw_library> library_;
    std::optional<detail::raw_factories> factories_;
    NxmemAllocatorFactoryVtable* factory_ = nullptr;
    NxmemAllocatorFactoryVtable factory_table_{};
    detail::callback_host callbacks_;
    std::vector<NxmemReleaseCompletion> completions_;
    reference_model model_;
    NxmemUnloadReport baseline_report_{};
    std::uint64_t baseline_descriptors_ = 0;
    std::uint64_t baseline_memfd_mappings_ = 0;
    std::uint64_t next_allocation_id_ = (1ull << 61) + 1;
    unsigned step_number_ = 0;
    std::string step_;
};

} // namespace nxmem::conform::model
