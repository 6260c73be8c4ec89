// One open plugin allocator, device-agnostic: everything the typed adapter and the capability
// views share. It owns the plugin's allocator reference, the host callback table the plugin
// borrows, and the record of live allocations. The module is declared first so it is destroyed
// last: the plugin's code stays mapped until the allocator has been released.
#pragma once

#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/allocation.hpp>
#include <nxmem/detail/page_size.hpp>
#include <nxmem/host/callback_guard.hpp>
#include <nxmem/host/capability_table_level.hpp>
#include <nxmem/host/completion.hpp>
#include <nxmem/detail/allocation_id_source.hpp>
#include <nxmem/host/detail/contain.hpp>
#include <nxmem/host/detail/live_table.hpp>
#include <nxmem/host/detail/table_checks.hpp>
#include <nxmem/host/fence.hpp>
#include <nxmem/host/module.hpp>
#include <nxmem/host/reclaim.hpp>
#include <nxmem/host/shared_prefix.hpp>
#include <nxmem/concepts/shared_mapping.hpp>
#include <nxmem/usage.hpp>

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdint>
#include <deque>
#include <span>
#include <type_traits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>


namespace nxmem::host::detail {

class allocator_core : public std::enable_shared_from_this<allocator_core> {
    struct private_tag {};

public:
    // Opens an allocator of `factory` on `device`. The returned core holds the plugin's reference.
    static result<std::shared_ptr<allocator_core>> open(std::shared_ptr<plugin_module> module,
                                                        const factory_info& factory,
                                                        device_id device, std::string_view options,
                                                        reclaim_function reclaim) {
        return contain("open", [&] {
            return open_unguarded(std::move(module), factory, device, options, std::move(reclaim));
        });
    }

private:
    static result<std::shared_ptr<allocator_core>> open_unguarded(
        std::shared_ptr<plugin_module> module, const factory_info& factory, device_id device,
        std::string_view options, reclaim_function reclaim) {
        if (!factory.serves(device.type)) {
            return fail(status_code::wrong_device,
                        "mechanism '" + factory.name + "' does not serve device type " +
                            std::string(device_type_name(device.type)));
        }
        if (options.size() > NXMEM_MAX_OPTIONS_BYTES) {
            return fail(status_code::invalid_argument,
                        "options of " + std::to_string(options.size()) + " bytes exceed " +
                            std::to_string(NXMEM_MAX_OPTIONS_BYTES));
        }
        // Count the allocator before checking the module's state, so a concurrent try_unload
        // either sees this allocator or this open sees the unload (and the factories stay put).
        auto core = std::make_shared<allocator_core>(private_tag{}, module, factory, device,
                                                     std::move(reclaim));
        if (!module->loaded()) {
            return fail(status_code::busy, module->not_loaded_reason());
        }
        const plugin_module::factory_entry* entry = module->entry_for(factory);
        if (entry == nullptr) {
            return fail(status_code::invalid_argument,
                        "factory '" + factory.name + "' does not belong to " + module->path().string());
        }
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = device.to_wire();
        request.callbacks = &core->callbacks_;
        request.options = options.data();
        request.options_length = options.size();
        NxmemAllocatorVtable* raw = nullptr;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code =
            entry->table.open_allocator(entry->raw, &request, &raw, &status);
        if (code != NXMEM_STATUS_OK) {
            return fail(status_code_from_wire(code),
                        "'" + factory.name + "' refused to open: " + abi::read_status_message(status));
        }
        // From here the host owes the plugin this table's release, whatever fails.
        result<void> accepted = [&]() -> result<void> {
            try {
                return core->accept(raw);
            } catch (...) {
                abandon(raw);
                throw;
            }
        }();
        if (!accepted) {
            abandon(raw);
            return fail(accepted.error().code, "'" + factory.name + "' handed back an allocator "
                                                                    "table the host refuses: " +
                                                   accepted.error().message);
        }
        return core;
    }

public:
    allocator_core(private_tag, std::shared_ptr<plugin_module> module, const factory_info& factory,
                   device_id device, reclaim_function reclaim)
        : module_(std::move(module)), reclaim_(std::move(reclaim)), device_(device),
          wire_device_(device.to_wire()), mechanism_id_(factory.mechanism_id),
          mechanism_name_(factory.name) {
        tables_.reserve(5); // accept() records the capability tables (at most five) without allocating
        module_->tally_.allocators.fetch_add(1);
        callbacks_ = abi::make_struct<NxmemHostCallbacks>();
        callbacks_.abi_minor = abi::known_minor<NxmemHostCallbacks>(); // the slots it fills
        callbacks_.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        callbacks_.host_context = this;
        callbacks_.request_reclaim = reclaim_ ? &on_request_reclaim : nullptr;
        callbacks_.release_completed = &on_release_completed;
        count_link_.owner = this;
        count_link_.count = &count_allocations;
        module_->link_allocator(count_link_);
    }

    allocator_core(const allocator_core&) = delete;
    allocator_core& operator=(const allocator_core&) = delete;

    // Leftover allocations go back first, then the plugin's reference; the callback table is
    // still alive throughout, and the module (declared first) outlives both. Allocates nothing.
    // The prefix references the engine still held from this allocator go with it: the plugin
    // drops them when the allocator is released.
    ~allocator_core() {
        if (raw_ != nullptr) {
            live_.take_each([this](std::uint64_t allocation_id, live_record&& record) {
                NxmemAllocation described = describe(allocation_id, record);
                NxmemStatus status;
                prepare_status(status);
                (void)table_.deallocate(raw_, &described, &status);
            });
            table_.release(raw_);
        }
        module_->unlink_allocator(count_link_);
        module_->tally_.shared_prefixes.fetch_sub(prefixes_held_.load());
        module_->tally_.allocators.fetch_sub(1);
    }

    // ---- identity ----
    const std::shared_ptr<plugin_module>& module() const noexcept { return module_; }
    device_id device() const noexcept { return device_; }
    std::uint64_t mechanism_id() const noexcept { return mechanism_id_; }
    const std::string& mechanism_name() const noexcept { return mechanism_name_; }
    NxmemCapabilities capabilities() const noexcept { return table_.capabilities; }
    std::uint32_t declared_minor() const noexcept { return declared_minor_; }
    std::uint32_t effective_minor() const noexcept { return table_.abi_minor; }
    bool offers_reclaim() const noexcept { return static_cast<bool>(reclaim_); }
    std::uint64_t quarantined_bytes() const noexcept { return quarantined_bytes_.load(); }
    // Allocations this allocator holds now: live records, plus queued releases not yet retired.
    std::uint64_t live_allocations() const noexcept {
        return live_.size() + retiring_.load(std::memory_order_relaxed);
    }
    // The memory the host keeps to track this allocator's allocations: the live table (shards and
    // slot arrays), the queued-release bookkeeping and the quarantined addresses.
    std::size_t bookkeeping_bytes() const noexcept {
        std::size_t bytes = live_.bytes();
        {
            std::lock_guard lock(deferred_mutex_);
            bytes += pending_.size() * tree_node_bytes<pending_release>() +
                     completed_.capacity() * sizeof(release_completion) +
                     host_fenced_.size() * sizeof(host_fenced_release);
        }
        std::lock_guard lock(quarantine_mutex_);
        return bytes + quarantined_addresses_.size() * tree_node_bytes<std::uint64_t>();
    }
    // The plugin's own table pointer and the host's checked copy: for conformance checks only.
    NxmemAllocatorVtable* raw_table() const noexcept { return raw_; }
    const NxmemAllocatorVtable& checked_table() const noexcept { return table_; }

    // ---- allocation ----

    // Size 0 and an alignment that is not a power of two are refused before the plugin is called.
    result<NxmemAllocation> allocate(std::uint64_t size, std::uint64_t alignment) {
        return allocate(size, alignment, [](const NxmemAllocation& described) { return described; });
    }
    // The same, handing the new allocation's description to `made`, whose value is returned: a
    // typed caller builds its own result once instead of converting this one.
    template <class Made>
    auto allocate(std::uint64_t size, std::uint64_t alignment, Made&& made)
        -> result<std::invoke_result_t<Made&, const NxmemAllocation&>> {
        return contain("allocate", [&] { return allocate_unguarded(size, alignment, made); });
    }

    // Releases through release_allocation when the mechanism offers it, else deallocate.
    result<release_report> release(const NxmemAllocation& described) {
        return contain("release", [&] { return release_unguarded(described); });
    }

    // ---- deferred release ----

    // Hands the allocation over; it retires at a later drain. The pending ticket pins this
    // allocator (and so the module and this callback table) until it retires. A plugin that
    // retires the ticket inside this call and then returns an error has broken the contract: the
    // completion wins (the allocation is gone and its completion is reported by the next drain)
    // and the call returns CONTRACT_VIOLATION.
    result<std::uint64_t> enqueue_release(const NxmemAllocation& described) {
        return contain("enqueue_release", [&] { return enqueue_release_unguarded(described); });
    }

    // Asks the plugin to retire what it can; returns the completions reported since the last
    // drain, in the order the plugin reported them. The contract says that is the order in which
    // the plugin received the enqueue calls; the host cannot check that while threads enqueue
    // concurrently (a ticket is numbered before its call reaches the plugin), so the conformance
    // suite checks it single-threaded. A failed drain (the plugin's error, a malformed completion,
    // or the host out of memory) keeps the valid completions for the next drain.
    result<std::vector<release_completion>> drain_releases() {
        return contain("drain_releases", [&] { return drain_releases_unguarded(); });
    }

private:
    template <class Made>
    auto allocate_unguarded(std::uint64_t size, std::uint64_t alignment, Made& made)
        -> result<std::invoke_result_t<Made&, const NxmemAllocation&>> {
        // Not std::has_single_bit: without -mpopcnt it is a call into libgcc.
        const bool power_of_two = alignment != 0 && (alignment & (alignment - 1)) == 0;
        if (size == 0 || !power_of_two || size > live_record::max_size) [[unlikely]] {
            return refused_request(size, alignment);
        }
        const NxmemAllocRequest request{.struct_size = sizeof(NxmemAllocRequest),
                                        .flags = 0,
                                        .mechanism_id = mechanism_id_,
                                        .device = wire_device_,
                                        .allocation_id = module_->allocation_ids_.next(),
                                        .size = size,
                                        .alignment = alignment};
        NxmemAllocResult produced{.struct_size = sizeof(NxmemAllocResult),
                                  .reserved = 0,
                                  .address = 0,
                                  .size = 0,
                                  .mapped_bytes = 0};
        NxmemStatus status;
        prepare_status(status);
        const NxmemStatusCode code = table_.allocate(raw_, &request, &produced, &status);
        if (code != NXMEM_STATUS_OK) [[unlikely]] {
            return plugin_refusal(code, status);
        }
        const NxmemAllocation described{.struct_size = sizeof(NxmemAllocation),
                                        .reserved = 0,
                                        .mechanism_id = mechanism_id_,
                                        .device = wire_device_,
                                        .allocation_id = request.allocation_id,
                                        .address = produced.address,
                                        .size = size,
                                        .alignment = alignment};
        const bool sane = produced.address != 0 && (produced.address & (alignment - 1)) == 0 &&
                          produced.size >= size && !reissues_quarantined(produced.address);
        if (!sane) [[unlikely]] {
            return refuse_bad_allocation(described, produced);
        }
        try {
            live_.insert(described.allocation_id, live_record(described.address, size, alignment));
        } catch (...) {
            (void)table_.deallocate(raw_, &described, &status); // no record, no allocation
            throw;
        }
        return made(described);
    }

    result<release_report> release_unguarded(const NxmemAllocation& described) {
        if (!identifies_this(described.mechanism_id, described.device)) [[unlikely]] {
            return identity_error(described.mechanism_id, described.device);
        }
        live_record record;
        live_table::position at;
        const live_table::verdict claimed = live_.claim(described, record, at);
        if (claimed != live_table::verdict::accepted) [[unlikely]] {
            return live_table::refusal(claimed, described, record);
        }
        if (leases_held_.load(std::memory_order_acquire) != 0) [[unlikely]] {
            if (leased(lease_kind::allocation, described.allocation_id)) {
                live_.unclaim(described.allocation_id);
                return lease_refusal(lease_kind::allocation, described.allocation_id);
            }
        }
        return release_claimed(described, record, at);
    }

    // Releases an allocation the caller has claimed in live_; on failure it is unclaimed, live.
    result<release_report> release_claimed(const NxmemAllocation& described, const live_record& record,
                                           live_table::position at) {
        NxmemStatus status;
        prepare_status(status);
        if (table_.release_allocation == nullptr) {
            const NxmemStatusCode code = table_.deallocate(raw_, &described, &status);
            if (code != NXMEM_STATUS_OK) [[unlikely]] {
                live_.unclaim(described.allocation_id); // nothing changed
                return plugin_failure(code, status);
            }
            live_.erase_claimed(described.allocation_id, at);
            return release_report{release_state::complete, record.size(), 0};
        }
        NxmemReleaseOutcome outcome{.struct_size = sizeof(NxmemReleaseOutcome),
                                    .state = 0,
                                    .unmapped_bytes = 0,
                                    .residual_owned_bytes = 0};
        const NxmemStatusCode code = table_.release_allocation(raw_, &described, &outcome, &status);
        if (code != NXMEM_STATUS_OK || outcome.state == NXMEM_RELEASE_FAILED) [[unlikely]] {
            live_.unclaim(described.allocation_id); // FAILED: as live as before
            return release_failure(code, status);
        }
        live_.erase_claimed(described.allocation_id, at);
        if (outcome.state == NXMEM_RELEASE_COMPLETE) [[likely]] {
            return release_report{release_state::complete, outcome.unmapped_bytes, 0};
        }
        return interpret(outcome, record);
    }

    // Why allocate refused a request before calling the plugin.
    [[gnu::noinline, gnu::cold]] error refused_request(std::uint64_t size, std::uint64_t alignment) const {
        if (size == 0) {
            return error{status_code::invalid_argument,
                         "allocate: size 0 (an allocation is at least one byte)"};
        }
        if (!std::has_single_bit(alignment)) {
            return error{status_code::invalid_argument,
                         "allocate: alignment " + std::to_string(alignment) + " is not a power of two"};
        }
        return error{status_code::out_of_memory,
                     "allocate: '" + mechanism_name_ + "' cannot be asked for " +
                         std::to_string(size) + " bytes: the host records sizes up to 2^57 - 1 "
                         "bytes, more than any address space maps"};
    }

    // The plugin broke the contract with a new allocation; it still gets the allocation back.
    [[gnu::noinline, gnu::cold]] error refuse_bad_allocation(const NxmemAllocation& described,
                                                             const NxmemAllocResult& produced) {
        NxmemStatus status;
        prepare_status(status);
        (void)table_.deallocate(raw_, &described, &status);
        return error{status_code::contract_violation,
                     describe_bad_allocation(produced, described.size, described.alignment)};
    }

    // The plugin's refusal with its message (out of memory copying it: the caller's guard says so).
    [[gnu::noinline, gnu::cold]] static error plugin_refusal(NxmemStatusCode code,
                                                             const NxmemStatus& status) {
        return error{status_code_from_wire(code), abi::read_status_message(status)};
    }

    [[gnu::noinline, gnu::cold]] static error release_failure(NxmemStatusCode code,
                                                              const NxmemStatus& status) {
        return error{code != NXMEM_STATUS_OK ? status_code_from_wire(code) : status_code::internal_error,
                     "release failed, the allocation is still live: " + abi::read_status_message(status)};
    }

    // Everything that can fail for lack of memory happens before the plugin is called: the
    // pending entry, the room for its completion and its parking slot. The live record is claimed,
    // not taken, so a refusal restores it without allocating.
    result<std::uint64_t> enqueue_release_unguarded(const NxmemAllocation& described) {
        if (table_.enqueue_release == nullptr) {
            return unsupported("deferred release");
        }
        return enqueue_with(described, [&](std::uint64_t ticket, NxmemStatus& status) {
            return table_.enqueue_release(raw_, &described, ticket, &status);
        });
    }

    // The host's side of handing an allocation over under a new ticket; `call` makes the ABI
    // call (enqueue_release, or enqueue_fenced_release with the same ticket).
    template <class Call>
    result<std::uint64_t> enqueue_with(const NxmemAllocation& described, Call&& call) {
        NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
        const std::uint64_t ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
        {
            std::lock_guard lock(deferred_mutex_);
            auto [entry, inserted] = pending_.try_emplace(ticket);
            (void)inserted;
            try {
                const std::size_t needed = completed_.size() + pending_.size();
                if (completed_.capacity() < needed) {
                    completed_.reserve(std::max(needed, 2 * completed_.capacity()));
                }
                module_->reserve_parking_slot();
            } catch (...) {
                pending_.erase(entry);
                throw;
            }
        }
        result<live_record> claimed = live_.claim(described);
        if (!claimed) {
            forget_ticket(ticket);
            return claimed.error();
        }
        if (leases_held_.load(std::memory_order_acquire) != 0 &&
            leased(lease_kind::allocation, described.allocation_id)) [[unlikely]] {
            live_.unclaim(described.allocation_id);
            forget_ticket(ticket);
            return lease_refusal(lease_kind::allocation, described.allocation_id);
        }
        {
            std::lock_guard lock(deferred_mutex_);
            pending_release& entry = pending_.find(ticket)->second;
            entry.allocation_id = described.allocation_id;
            entry.record = claimed.value();
            entry.pin = shared_from_this();
        }
        module_->tally_.queued_releases.fetch_add(1); // before the ABI call, as the contract says
        // Counted as retiring before the call (its completion may come inside it), while the
        // claimed record still counts too: an overcount for the length of the call, never an
        // undercount.
        retiring_.fetch_add(1, std::memory_order_relaxed);
        NxmemStatus status;
        prepare_status(status);
        const NxmemStatusCode code = call(ticket, status);
        if (code == NXMEM_STATUS_OK) {
            live_.erase_claimed(described.allocation_id);
            return ticket;
        }
        std::shared_ptr<allocator_core> pin = forget_ticket(ticket);
        if (pin == nullptr) {
            // The plugin retired the ticket inside the call (its completion is recorded) and then
            // failed the call: the completion wins, the allocation is gone.
            live_.erase_claimed(described.allocation_id);
            try {
                return fail(status_code::contract_violation,
                            "'" + mechanism_name_ + "' retired ticket " + std::to_string(ticket) +
                                " inside enqueue_release and then failed the call with " +
                                std::string(status_code_name(status_code_from_wire(code))) + ": " +
                                abi::read_status_message(status) +
                                "; the release stands and its completion is reported by the next "
                                "drain");
            } catch (...) {
                // Not OUT_OF_MEMORY: that would say the allocation is still live.
                return error{status_code::contract_violation, {}};
            }
        }
        module_->tally_.queued_releases.fetch_sub(1);
        retiring_.fetch_sub(1, std::memory_order_relaxed);
        live_.unclaim(described.allocation_id);
        return plugin_failure(code, status);
    }

    // Withdraws a ticket that is still pending (with its parking slot); returns its pin, or
    // nullptr when it had already retired. Allocates nothing.
    std::shared_ptr<allocator_core> forget_ticket(std::uint64_t ticket) noexcept {
        std::shared_ptr<allocator_core> pin;
        {
            std::lock_guard lock(deferred_mutex_);
            auto found = pending_.find(ticket);
            if (found == pending_.end()) {
                return nullptr;
            }
            pin = std::move(found->second.pin);
            pending_.erase(found);
            module_->cancel_parking_slot();
        }
        return pin; // dropped by the caller, outside the lock; never the last reference
    }

    result<std::vector<release_completion>> drain_releases_unguarded() {
        NXMEM_TRY(host_retired, retire_host_fenced());
        if (table_.drain_releases == nullptr) {
            if (!host_fenced_used_.load(std::memory_order_acquire)) {
                return unsupported("deferred release");
            }
            return host_retired;
        }
        NXMEM_TRY(completions, drain_plugin_releases());
        completions.insert(completions.end(), host_retired.begin(), host_retired.end());
        return completions;
    }

    result<std::vector<release_completion>> drain_plugin_releases() {
        std::uint64_t retired = 0;
        NxmemStatus status = abi::make_status();
        const NxmemStatusCode code = table_.drain_releases(raw_, &retired, &status);
        // Pins of releases that retired are dropped outside every lock and plugin call; the
        // caller's own reference keeps this allocator alive.
        module_->release_parked();
        std::size_t ready = 0;
        std::string violation;
        {
            std::lock_guard lock(deferred_mutex_);
            ready = completed_.size();
            violation.swap(completion_violation_);
            if (violation.empty() && completion_violation_unrecorded_) {
                violation = "a release_completed call was refused (the host ran out of memory "
                            "describing why)";
                completion_violation_unrecorded_ = false;
            }
        }
        if (!violation.empty()) {
            return fail(status_code::contract_violation, std::move(violation));
        }
        if (code != NXMEM_STATUS_OK) {
            return plugin_failure(code, status);
        }
        std::vector<release_completion> completions;
        completions.reserve(ready); // the completions stay recorded if this fails
        {
            std::lock_guard lock(deferred_mutex_);
            // A concurrent drain may have taken some meanwhile; more may have arrived (the next
            // drain reports those), so take at most what was counted and is still there.
            const auto taken = static_cast<std::ptrdiff_t>(std::min(ready, completed_.size()));
            completions.assign(completed_.begin(), completed_.begin() + taken);
            completed_.erase(completed_.begin(), completed_.begin() + taken);
        }
        return completions;
    }

public:
    // ---- release after fences (minor 4) ----

    // Hands the allocation over under a new ticket, to retire once every fence has completed
    // (F7): through the mechanism's enqueue_fenced_release when its table waits on every kind
    // among `fences`; otherwise the host keeps the allocation claimed in its own queue, checks the
    // fences at each drain (a host timeline itself, any other kind through `query`), and releases
    // it once they have completed. Either way the ticket is a queued release until it retires:
    // counted in live_allocations, in the module's queued releases (the unload gate) and pinning
    // this allocator. UNSUPPORTED_CAPABILITY when a fence is of a kind neither side can wait on.
    result<std::uint64_t> release_after(const NxmemAllocation& described, std::span<const fence> fences,
                                        fence_query query) {
        return contain("release_after", [&]() -> result<std::uint64_t> {
            return release_after_unguarded(described, fences, std::move(query));
        });
    }

    // ---- copies (minor 4) ----

    // Copies between the request's host memory and a range of a live allocation or a prefix,
    // synchronously or, with request.stream, queued on a stream of a kind the table lists; the
    // host checks the table, identity, liveness, the range and the stream first (CP3, CP4).
    result<void> copy(NxmemCopyRequest request) {
        return contain("copy", [&]() -> result<void> {
            NXMEM_TRY_VOID(require(copy_, "copies", &NxmemCopyVtable::copy));
            std::uint64_t size = 0;
            if (request.target == NXMEM_COPY_ALLOCATION) {
                NXMEM_TRY_VOID(check_identity(request.allocation.mechanism_id, request.allocation.device));
                NXMEM_TRY(record, live_.find(request.allocation));
                (void)record;
                size = request.allocation.size;
            } else {
                NXMEM_TRY_VOID(check_identity(request.prefix.mechanism_id, request.prefix.device));
                size = request.prefix.size;
            }
            NXMEM_TRY_VOID(abi::check_copy_form(request, size));
            if (request.stream != nullptr) {
                NXMEM_TRY_VOID(abi::check_fence_for(*request.stream, copy_->stream_kinds, wire_device_,
                                                    "the mechanism's copies"));
            }
            NxmemStatus status = abi::make_status();
            return check(copy_->copy(raw_, &request, &status), status);
        });
    }

    bool has_copy() const noexcept { return copy_.has_value(); }
    bool has_fenced_release() const noexcept { return fenced_release_.has_value(); }
    // The fence kinds the mechanism waits on (bits 1 << kind; 0 without fenced release).
    std::uint64_t fence_kinds() const noexcept {
        return fenced_release_ ? fenced_release_->fence_kinds : 0;
    }
    // The stream kinds copies may be queued on (bits 1 << kind; 0 without copies or synchronous only).
    std::uint64_t copy_stream_kinds() const noexcept { return copy_ ? copy_->stream_kinds : 0; }

    std::uint64_t pending_releases() const {
        std::lock_guard lock(deferred_mutex_);
        return pending_.size();
    }

    // ---- virtual backing ----

    result<void> change_range(const NxmemAllocation& described, byte_range range, bool commit) {
        return contain(commit ? "commit" : "decommit", [&]() -> result<void> {
            NXMEM_TRY_VOID(require(virtual_backing_, "virtual backing",
                                   commit ? &NxmemVirtualBackingVtable::commit : &NxmemVirtualBackingVtable::decommit));
            NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
            NXMEM_TRY(record, live_.find(described));
            (void)record;
            auto request = abi::make_struct<NxmemRangeRequest>();
            request.allocation = described;
            request.range = abi::make_struct<NxmemByteRange>();
            request.range.offset = range.offset;
            request.range.length = range.length;
            NxmemStatus status = abi::make_status();
            const NxmemStatusCode code = commit
                                             ? virtual_backing_->commit(raw_, &request, &status)
                                             : virtual_backing_->decommit(raw_, &request, &status);
            return check(code, status);
        });
    }

    result<std::uint64_t> mapped_bytes(const NxmemAllocation& described) {
        return contain("mapped_bytes", [&]() -> result<std::uint64_t> {
            NXMEM_TRY_VOID(require(virtual_backing_, "virtual backing", &NxmemVirtualBackingVtable::mapped_bytes));
            NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
            NXMEM_TRY(record, live_.find(described));
            (void)record;
            std::uint64_t bytes = 0;
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(virtual_backing_->mapped_bytes(raw_, &described, &bytes, &status), status));
            return bytes;
        });
    }

    // ---- shared mapping ----

    // A handle that names another mechanism or device than this allocator's is refused (and
    // given back to the plugin as it was handed over): the host could never release it.
    result<shared_prefix> create_prefix(std::uint64_t size) {
        return contain("create_prefix", [&]() -> result<shared_prefix> {
            NXMEM_TRY_VOID(require(shared_mapping_, "shared mapping", &NxmemSharedMappingVtable::create_shared_prefix,
                                   &NxmemSharedMappingVtable::release_shared_prefix));
            auto request = abi::make_struct<NxmemSharedPrefixRequest>();
            request.mechanism_id = mechanism_id_;
            request.device = device_.to_wire();
            request.size = size;
            auto handle = abi::make_struct<NxmemSharedPrefixHandle>();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(shared_mapping_->create_shared_prefix(raw_, &request, &handle, &status), status));
            if (handle.mechanism_id != mechanism_id_ || device_id::from_wire(handle.device) != device_) {
                (void)shared_mapping_->release_shared_prefix(raw_, &handle, &status);
                return fail(status_code::contract_violation,
                            "'" + mechanism_name_ + "' created shared prefix " +
                                std::to_string(handle.prefix_id) + " naming mechanism " +
                                std::to_string(handle.mechanism_id) + " on " +
                                std::string(device_type_name(handle.device.device_type)) + ":" +
                                std::to_string(handle.device.index) + "; it is refused");
            }
            prefix_referenced();
            return shared_prefix{handle.prefix_id, handle.size, handle.mechanism_id,
                                 device_id::from_wire(handle.device)};
        });
    }

    result<void> retain_prefix(const shared_prefix& prefix) {
        return contain("retain_prefix", [&]() -> result<void> {
            NXMEM_TRY_VOID(require(shared_mapping_, "shared mapping", &NxmemSharedMappingVtable::retain_shared_prefix));
            NXMEM_TRY_VOID(check_identity(prefix.mechanism_id, prefix.device.to_wire()));
            const NxmemSharedPrefixHandle handle = prefix.to_wire();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(shared_mapping_->retain_shared_prefix(raw_, &handle, &status), status));
            prefix_referenced();
            return boost::outcome_v2::success();
        });
    }

    result<void> release_prefix(const shared_prefix& prefix) {
        return contain("release_prefix", [&]() -> result<void> {
            NXMEM_TRY_VOID(require(shared_mapping_, "shared mapping", &NxmemSharedMappingVtable::release_shared_prefix));
            NXMEM_TRY_VOID(check_identity(prefix.mechanism_id, prefix.device.to_wire()));
            const NxmemSharedPrefixHandle handle = prefix.to_wire();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(shared_mapping_->release_shared_prefix(raw_, &handle, &status), status));
            prefixes_held_.fetch_sub(1);
            module_->tally_.shared_prefixes.fetch_sub(1);
            return boost::outcome_v2::success();
        });
    }

    result<prefix_commit> commit_prefix(const NxmemAllocation& described, const shared_prefix& prefix) {
        return contain("commit_prefix", [&]() -> result<prefix_commit> {
            NXMEM_TRY_VOID(require(shared_mapping_, "shared mapping", &NxmemSharedMappingVtable::commit_shared_prefix));
            NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
            NXMEM_TRY_VOID(check_identity(prefix.mechanism_id, prefix.device.to_wire()));
            NXMEM_TRY(record, live_.find(described));
            (void)record;
            auto request = abi::make_struct<NxmemSharedPrefixCommitRequest>();
            request.allocation = described;
            request.prefix = prefix.to_wire();
            auto info = abi::make_struct<NxmemSharedPrefixCommitInfo>();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(shared_mapping_->commit_shared_prefix(raw_, &request, &info, &status), status));
            return prefix_commit{info.shared_bytes, info.newly_mapped_bytes, info.sharers};
        });
    }

    // The unit of commit and decommit (0 without virtual backing).
    std::uint64_t commit_granularity() const noexcept { return commit_granularity_; }

    // ---- usage query (minor 2) ----

    result<allocator_usage> query_usage() {
        return contain("query_usage", [&]() -> result<allocator_usage> {
            if (table_.query_usage == nullptr) {
                return unsupported("the usage query");
            }
            auto usage = abi::make_struct<NxmemAllocatorUsage>();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(table_.query_usage(raw_, &usage, &status), status));
            return allocator_usage::from_wire(usage);
        });
    }

    // ---- sharing across processes (minor 3) ----

    // The handle the plugin wrote; its descriptors are the caller's from here on. A handle naming
    // another mechanism or device, or more descriptors than a handle holds, is refused
    // (CONTRACT_VIOLATION) and the descriptors it names are closed.
    result<NxmemIpcHandle> export_handle(const NxmemExportRequest& request) {
        return contain("export_handle", [&]() -> result<NxmemIpcHandle> {
            NXMEM_TRY_VOID(require(ipc_, "sharing across processes", &NxmemIpcVtable::export_handle));
            if (request.kind == NXMEM_IPC_ALLOCATION) {
                NXMEM_TRY_VOID(check_identity(request.allocation.mechanism_id, request.allocation.device));
                NXMEM_TRY(record, live_.find(request.allocation));
                (void)record;
            } else {
                NXMEM_TRY_VOID(check_identity(request.prefix.mechanism_id, request.prefix.device));
            }
            auto handle = abi::make_struct<NxmemIpcHandle>();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(ipc_->export_handle(raw_, &request, &handle, &status), status));
            if (handle.fd_count > NXMEM_IPC_MAX_FDS || handle.mechanism_id != mechanism_id_ ||
                !identifies_this(handle.mechanism_id, handle.device) || handle.kind != request.kind) {
                for (std::uint32_t index = 0; index < NXMEM_IPC_MAX_FDS && index < handle.fd_count; ++index) {
                    if (handle.fds[index] >= 0) {
                        (void)::close(handle.fds[index]);
                    }
                }
                return fail(status_code::contract_violation,
                            "'" + mechanism_name_ + "' exported a handle naming another mechanism, "
                            "device or kind, or " + std::to_string(handle.fd_count) + " descriptors");
            }
            return handle;
        });
    }

    // Imports `handle` (its descriptors borrowed for the call) under a new import id.
    result<NxmemImport> import_handle(const NxmemIpcHandle& handle, std::uint32_t access) {
        return contain("import_handle", [&]() -> result<NxmemImport> {
            NXMEM_TRY_VOID(require(ipc_, "sharing across processes", &NxmemIpcVtable::import_handle,
                                   &NxmemIpcVtable::close_import));
            auto request = abi::make_struct<NxmemImportRequest>();
            request.access = access;
            request.mechanism_id = mechanism_id_;
            request.device = wire_device_;
            request.import_id = module_->allocation_ids_.next();
            request.handle = &handle;
            auto imported = abi::make_struct<NxmemImport>();
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(ipc_->import_handle(raw_, &request, &imported, &status), status));
            if (imported.import_id != request.import_id ||
                !identifies_this(imported.mechanism_id, imported.device)) {
                (void)ipc_->close_import(raw_, &imported, &status);
                return fail(status_code::contract_violation,
                            "'" + mechanism_name_ + "' reported an import of another id, "
                            "mechanism or device; it is closed and refused");
            }
            module_->tally_.imports.fetch_add(1);
            return imported;
        });
    }

    result<void> close_import(const NxmemImport& imported) {
        return contain("close_import", [&]() -> result<void> {
            NXMEM_TRY_VOID(require(ipc_, "sharing across processes", &NxmemIpcVtable::close_import));
            if (leased(lease_kind::import, imported.import_id)) {
                return lease_refusal(lease_kind::import, imported.import_id);
            }
            NxmemStatus status = abi::make_status();
            NXMEM_TRY_VOID(check(ipc_->close_import(raw_, &imported, &status), status));
            module_->tally_.imports.fetch_sub(1);
            return boost::outcome_v2::success();
        });
    }

    bool has_ipc() const noexcept { return ipc_.has_value(); }

    // ---- leases (transfer registrations, docs/TRANSFER.md) ----
    // A lease keeps a live allocation from being released (release and enqueue_release are
    // BUSY) or an import from being closed, until it ends; each counts in the module's tally as a
    // registration, so unload is refused while one lives. Leases nest (two registrations of one
    // allocation hold two). The allocation is claimed while the lease is recorded, so a release
    // racing with it either wins (the lease is refused: the allocation is being released) or
    // sees the lease after its own claim.
    enum class lease_kind : std::uint32_t { allocation, import };

    result<void> lease_allocation(const NxmemAllocation& described) {
        return contain("lease", [&]() -> result<void> {
            NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
            NXMEM_TRY(claimed, live_.claim(described));
            (void)claimed;
            try {
                add_lease(lease_kind::allocation, described.allocation_id);
            } catch (...) {
                live_.unclaim(described.allocation_id);
                throw;
            }
            live_.unclaim(described.allocation_id);
            return boost::outcome_v2::success();
        });
    }
    // The caller holds the import open (imported_memory::lease).
    result<void> lease_import(std::uint64_t import_id) {
        return contain("lease", [&]() -> result<void> {
            add_lease(lease_kind::import, import_id);
            return boost::outcome_v2::success();
        });
    }
    // Allocates nothing (a registration's destructor ends its lease).
    void end_lease(lease_kind kind, std::uint64_t id) noexcept {
        std::lock_guard lock(lease_mutex_);
        for (auto entry = leases_.begin(); entry != leases_.end(); ++entry) {
            if (entry->kind == kind && entry->id == id) {
                if (--entry->count == 0) {
                    *entry = leases_.back();
                    leases_.pop_back();
                }
                leases_held_.fetch_sub(1, std::memory_order_release);
                module_->tally_.registrations.fetch_sub(1);
                return;
            }
        }
    }
    bool leased(lease_kind kind, std::uint64_t id) const noexcept {
        std::lock_guard lock(lease_mutex_);
        for (const lease_entry& entry : leases_) {
            if (entry.kind == kind && entry.id == id) {
                return true;
            }
        }
        return false;
    }

    bool has_virtual_backing() const noexcept { return virtual_backing_.has_value(); }
    const std::vector<capability_table_level>& capability_tables() const noexcept { return tables_; }
    bool has_shared_mapping() const noexcept { return shared_mapping_.has_value(); }

    // Views count themselves in the module's tally for as long as they live.
    void view_opened() noexcept { module_->tally_.views.fetch_add(1); }
    void view_closed() noexcept { module_->tally_.views.fetch_sub(1); }

private:
    struct lease_entry {
        lease_kind kind;
        std::uint64_t id;
        std::uint64_t count;
    };
    // Throws std::bad_alloc, changing nothing.
    void add_lease(lease_kind kind, std::uint64_t id) {
        std::lock_guard lock(lease_mutex_);
        for (lease_entry& entry : leases_) {
            if (entry.kind == kind && entry.id == id) {
                ++entry.count;
                leases_held_.fetch_add(1, std::memory_order_release);
                module_->tally_.registrations.fetch_add(1);
                return;
            }
        }
        leases_.push_back(lease_entry{kind, id, 1});
        leases_held_.fetch_add(1, std::memory_order_release);
        module_->tally_.registrations.fetch_add(1);
    }
    [[gnu::noinline, gnu::cold]] static error lease_refusal(lease_kind kind, std::uint64_t id) {
        return error{status_code::busy,
                     (kind == lease_kind::allocation ? "allocation " : "import ") +
                         std::to_string(id) +
                         " is registered for transfer (a registration holds a lease on it); "
                         "deregister it first, it stays " +
                         (kind == lease_kind::allocation ? "live" : "open")};
    }

    // A release the host keeps until its fences complete (the mechanism cannot wait on them).
    struct host_fenced_release {
        std::uint64_t ticket = 0;
        NxmemAllocation described{};
        live_record record;
        std::vector<fence> fences; // those not yet seen completed
        fence_query query;
        std::shared_ptr<allocator_core> pin;
    };

    result<std::uint64_t> release_after_unguarded(const NxmemAllocation& described,
                                                  std::span<const fence> fences, fence_query query) {
        NXMEM_TRY_VOID(check_identity(described.mechanism_id, described.device));
        if (fences.empty() || fences.size() > NXMEM_MAX_FENCES) {
            return fail(status_code::invalid_argument,
                        "release_after: " + std::to_string(fences.size()) + " fences, not 1 to " +
                            std::to_string(NXMEM_MAX_FENCES));
        }
        std::uint64_t kinds = 0;
        for (const fence& each : fences) {
            if (each.device != device_) {
                return fail(status_code::wrong_device,
                            "release_after: a fence names another device than the allocator's");
            }
            if (each.kind == NXMEM_FENCE_HOST_TIMELINE && (each.handle == 0 || each.handle % 8 != 0)) {
                return fail(status_code::invalid_argument,
                            "release_after: a host timeline's counter is NULL or not 8-aligned");
            }
            kinds |= abi::fence_kind_bit(each.kind);
        }
        if (fenced_release_ && (kinds & ~fenced_release_->fence_kinds) == 0 &&
            table_.enqueue_release != nullptr) {
            std::array<NxmemFence, NXMEM_MAX_FENCES> wire{};
            for (std::size_t index = 0; index < fences.size(); ++index) {
                wire[index] = fences[index].to_wire();
            }
            auto request = abi::make_struct<NxmemFencedReleaseRequest>();
            request.fence_count = static_cast<std::uint32_t>(fences.size());
            request.allocation = described;
            request.fences = wire.data();
            request.fence_stride = sizeof(NxmemFence);
            return enqueue_with(described, [&](std::uint64_t ticket, NxmemStatus& status) {
                request.ticket = ticket;
                return fenced_release_->enqueue_fenced_release(raw_, &request, &status);
            });
        }
        if ((kinds & ~abi::fence_kind_bit(NXMEM_FENCE_HOST_TIMELINE)) != 0 && !query) {
            return fail(status_code::unsupported_capability,
                        "release_after: '" + mechanism_name_ +
                            "' does not wait on every kind of these fences and no fence_query "
                            "was given for them");
        }
        return keep_host_fenced(described, fences, std::move(query));
    }

    // The host's own queue: the allocation is claimed (live to every count, refused to the
    // engine's releases as being released) until a drain finds its fences completed.
    result<std::uint64_t> keep_host_fenced(const NxmemAllocation& described,
                                           std::span<const fence> fences, fence_query query) {
        host_fenced_release entry{0, described, {}, {fences.begin(), fences.end()}, std::move(query),
                                  shared_from_this()};
        NXMEM_TRY(claimed, live_.claim(described));
        if (leases_held_.load(std::memory_order_acquire) != 0 &&
            leased(lease_kind::allocation, described.allocation_id)) [[unlikely]] {
            live_.unclaim(described.allocation_id);
            return lease_refusal(lease_kind::allocation, described.allocation_id);
        }
        entry.record = claimed;
        entry.ticket = next_ticket_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t ticket = entry.ticket;
        try {
            std::lock_guard lock(deferred_mutex_);
            host_fenced_.push_back(std::move(entry));
        } catch (...) {
            live_.unclaim(described.allocation_id);
            throw;
        }
        host_fenced_used_.store(true, std::memory_order_release);
        module_->tally_.queued_releases.fetch_add(1);
        return ticket;
    }

    // Whether every fence of `entry` has completed; those seen completed are dropped.
    static bool host_fences_completed(host_fenced_release& entry) {
        std::erase_if(entry.fences, [&](const fence& each) {
            if (each.kind == NXMEM_FENCE_HOST_TIMELINE) {
                return abi::host_timeline_reached(each.to_wire());
            }
            return entry.query(each);
        });
        return entry.fences.empty();
    }

    // Releases the host-kept allocations whose fences have completed, in ticket order, up to the
    // first still waiting (F7: the drain never waits). One drain at a time walks this queue; no
    // lock is held while the engine's query or the plugin is called.
    result<std::vector<release_completion>> retire_host_fenced() {
        std::vector<release_completion> retired;
        if (!host_fenced_used_.load(std::memory_order_acquire) ||
            host_draining_.exchange(true, std::memory_order_acquire)) {
            return retired;
        }
        struct done_draining {
            std::atomic<bool>& flag;
            ~done_draining() { flag.store(false, std::memory_order_release); }
        } done{host_draining_};
        for (;;) {
            host_fenced_release* front = nullptr;
            {
                std::lock_guard lock(deferred_mutex_);
                if (host_fenced_.empty()) {
                    return retired;
                }
                front = &host_fenced_.front(); // only this drain pops; push_back keeps it in place
            }
            if (!host_fences_completed(*front)) {
                return retired;
            }
            retired.reserve(retired.size() + 1);
            result<release_report> report =
                release_claimed(front->described, front->record, live_table::position{});
            if (!report) {
                (void)live_.claim(front->described); // still queued: claimed again for the next drain
                return report.error();
            }
            host_fenced_release finished;
            {
                std::lock_guard lock(deferred_mutex_);
                finished = std::move(host_fenced_.front());
                host_fenced_.pop_front();
            }
            module_->tally_.queued_releases.fetch_sub(1);
            retired.push_back(release_completion{finished.ticket, finished.described.allocation_id,
                                                 report.value()});
        }
    }

    struct pending_release {
        std::uint64_t allocation_id = 0;
        live_record record;
        std::shared_ptr<allocator_core> pin;
    };

    // Reads and checks the table open_allocator returned; keeps it only if all is well.
    result<void> accept(NxmemAllocatorVtable* raw) {
        const std::uint32_t ceiling = module_->version().minor;
        NXMEM_TRY(copy, abi::read_prefix<NxmemAllocatorVtable>(raw, ceiling));
        NXMEM_TRY_VOID(check_required_slots(copy));
        NXMEM_TRY_VOID(check_capabilities(copy));
        if (copy.table.mechanism_id != mechanism_id_) {
            return fail(status_code::contract_violation,
                        "the table names mechanism " + std::to_string(copy.table.mechanism_id) +
                            ", its factory is mechanism " + std::to_string(mechanism_id_));
        }
        if (device_id::from_wire(copy.table.device) != device_) {
            return fail(status_code::contract_violation,
                        "the table names another device than the one asked for");
        }
        if (copy.table.virtual_backing != nullptr) {
            NXMEM_TRY(backing, read_capability_table(copy.table.virtual_backing, ceiling));
            NXMEM_TRY(granularity, commit_granularity_of(backing));
            commit_granularity_ = granularity;
            virtual_backing_ = backing.table;
            tables_.push_back({"virtual-backing", backing.declared_minor, backing.effective_minor});
        }
        if (copy.table.shared_mapping != nullptr) {
            NXMEM_TRY_VOID(keep_table(copy.table.shared_mapping, ceiling, shared_mapping_, "shared-mapping"));
        }
        if (copy.table.ipc != nullptr) {
            NXMEM_TRY_VOID(keep_table(copy.table.ipc, ceiling, ipc_, "ipc"));
        }
        if (copy.table.fenced_release != nullptr) {
            NXMEM_TRY(fenced, keep_table(copy.table.fenced_release, ceiling, fenced_release_, "fenced-release"));
            NXMEM_TRY(kinds, checked_kinds(fenced, fenced.table.fence_kinds, "fence_kinds", false));
            fenced_release_->fence_kinds = kinds;
        }
        if (copy.table.copy != nullptr) {
            NXMEM_TRY(copier, keep_table(copy.table.copy, ceiling, copy_, "copy"));
            NXMEM_TRY(kinds, checked_kinds(copier, copier.table.stream_kinds, "stream_kinds", true));
            copy_->stream_kinds = kinds;
        }
        table_ = copy.table;
        declared_minor_ = copy.declared_minor;
        raw_ = raw;
        return boost::outcome_v2::success();
    }

    // Reads the capability table at `untrusted` into `kept` and records its levels as `name`.
    template <abi::growable_table T>
    result<abi::table_copy<T>> keep_table(const T* untrusted, std::uint32_t ceiling,
                                          std::optional<T>& kept, std::string_view name) {
        NXMEM_TRY(read, read_capability_table(untrusted, ceiling));
        kept = read.table;
        tables_.push_back({name, read.declared_minor, read.effective_minor});
        return read;
    }

    // The host owes a refused table its release, if the slot can be located at all.
    static void abandon(NxmemAllocatorVtable* raw) noexcept {
        if (NxmemReleaseFn release = locate_release_slot(raw); release != nullptr) {
            release(raw);
        }
    }

    bool identifies_this(std::uint64_t mechanism_id, const NxmemDeviceId& device) const noexcept {
        return mechanism_id == mechanism_id_ && device.device_type == device_.type &&
               device.index == device_.index;
    }
    result<void> check_identity(std::uint64_t mechanism_id, const NxmemDeviceId& device) const {
        if (identifies_this(mechanism_id, device)) [[likely]] {
            return boost::outcome_v2::success();
        }
        return identity_error(mechanism_id, device);
    }
    // Why an object was refused as another allocator's: built only when it is.
    [[gnu::noinline, gnu::cold]] error identity_error(std::uint64_t mechanism_id,
                                                      const NxmemDeviceId& device) const {
        if (mechanism_id != mechanism_id_) {
            return error{status_code::wrong_mechanism,
                         "an object of mechanism " + std::to_string(mechanism_id) +
                             " was handed to '" + mechanism_name_ + "' (mechanism " +
                             std::to_string(mechanism_id_) + ")"};
        }
        return error{status_code::wrong_device,
                     "an object of device " + std::string(device_type_name(device.device_type)) +
                         ":" + std::to_string(device.index) + " was handed to an allocator of " +
                         std::string(device_type_name(device_.type)) + ":" +
                         std::to_string(device_.index)};
    }

    bool reissues_quarantined(std::uint64_t address) {
        if (!any_quarantined_.load(std::memory_order_acquire)) {
            return false;
        }
        std::lock_guard lock(quarantine_mutex_);
        return quarantined_addresses_.count(address) != 0;
    }

    // Why a new allocation was refused (built after the plugin got it back).
    std::string describe_bad_allocation(const NxmemAllocResult& produced, std::uint64_t size,
                                        std::uint64_t alignment) {
        if (produced.address != 0 && reissues_quarantined(produced.address)) {
            return "'" + mechanism_name_ + "' reissued quarantined address 0x" +
                   nxmem::detail::to_hex(produced.address);
        }
        return "'" + mechanism_name_ + "' returned address 0x" +
               nxmem::detail::to_hex(produced.address) + " of " + std::to_string(produced.size) +
               " bytes for a request of " + std::to_string(size) + " bytes aligned to " +
               std::to_string(alignment);
    }

    void prefix_referenced() noexcept {
        prefixes_held_.fetch_add(1);
        module_->tally_.shared_prefixes.fetch_add(1);
    }

    // COMPLETE credits the unmapped bytes; anything else, a state from the future included, is
    // quarantine: the address is never reissued and the residue never refunded. Never throws: the
    // release has happened; if the host has no memory to remember the address, it cannot refuse
    // a later reissue of that one address (docs/HOST.md).
    release_report interpret(const NxmemReleaseOutcome& outcome, const live_record& record) noexcept {
        if (outcome.state == NXMEM_RELEASE_COMPLETE) {
            return release_report{release_state::complete, outcome.unmapped_bytes, 0};
        }
        try {
            std::lock_guard lock(quarantine_mutex_);
            quarantined_addresses_.insert(record.address());
        } catch (...) {
            // Out of memory: the residue is still counted below.
        }
        any_quarantined_.store(true, std::memory_order_release);
        const std::uint64_t residue = outcome.state == NXMEM_RELEASE_QUARANTINED
                                          ? outcome.residual_owned_bytes
                                          : record.size(); // unknown state: assume it kept it all
        quarantined_bytes_.fetch_add(residue);
        return release_report{release_state::quarantined,
                              outcome.state == NXMEM_RELEASE_QUARANTINED ? outcome.unmapped_bytes : 0,
                              residue};
    }

    // The capability table is there and every slot the call uses is non-NULL (S9): never a jump
    // to address 0, even if a check at open were ever to let a NULL slot through.
    template <class Table, class... Slots>
    result<void> require(const std::optional<Table>& table, std::string_view capability,
                         Slots Table::*... used) const {
        if (!table) {
            return unsupported(capability);
        }
        if (!slots_present(*table, used...)) [[unlikely]] {
            return error{status_code::unsupported_capability,
                         "'" + mechanism_name_ + "' offers " + std::string(capability) +
                             " with a NULL slot in its table; the host does not call it"};
        }
        return boost::outcome_v2::success();
    }

    error unsupported(std::string_view capability) const {
        return error{status_code::unsupported_capability,
                     "'" + mechanism_name_ + "' does not offer " + std::string(capability)};
    }

    static result<void> check(NxmemStatusCode code, const NxmemStatus& status) {
        if (code != NXMEM_STATUS_OK) {
            return plugin_failure(code, status);
        }
        return boost::outcome_v2::success();
    }

    // The plugin's failure with its message; with its code alone if the message cannot be copied.
    static error plugin_failure(NxmemStatusCode code, const NxmemStatus& status) noexcept {
        try {
            return error{status_code_from_wire(code), abi::read_status_message(status)};
        } catch (...) {
            return error{status_code_from_wire(code), {}};
        }
    }

    NxmemAllocation describe(std::uint64_t allocation_id, const live_record& record) const {
        auto described = abi::make_struct<NxmemAllocation>();
        described.mechanism_id = mechanism_id_;
        described.device = device_.to_wire();
        described.allocation_id = allocation_id;
        described.address = record.address();
        described.size = record.size();
        described.alignment = record.alignment();
        return described;
    }

    // What a status must hold before the plugin gets it: its size, OK and an empty message. The
    // rest of the message buffer is left as it is: a reader stops at the first NUL, the plugin
    // writes its message NUL-terminated (abi::write_status), and zeroing 264 bytes on every call
    // costs more than the call's own checks.
    static void prepare_status(NxmemStatus& status) noexcept {
        status.struct_size = sizeof(NxmemStatus);
        status.code = NXMEM_STATUS_OK;
        status.message[0] = '\0';
    }

    // About what one node of a std::map or std::set holding `T` takes (libstdc++: colour and
    // three links, then the value).
    template <class T> static constexpr std::size_t tree_node_bytes() noexcept {
        return 4 * sizeof(void*) + sizeof(T);
    }

    static std::uint64_t count_allocations(const void* core) noexcept {
        return static_cast<const allocator_core*>(core)->live_allocations();
    }

    // ---- host callbacks (called by the plugin; each runs inside the host's guard) ----

    static NxmemStatusCode on_request_reclaim(void* context, const NxmemReclaimRequest* raw,
                                              NxmemStatus* status) noexcept {
        return guard_status(status, [&]() -> NxmemStatusCode {
            auto& core = *static_cast<allocator_core*>(context);
            result<NxmemReclaimRequest> request = abi::read_request(raw);
            if (!request) {
                return abi::write_status(status, NXMEM_STATUS_INVALID_ARGUMENT,
                                         request.error().message);
            }
            // No host lock is held here: the hook may re-enter this allocator.
            result<void> reclaimed = core.reclaim_(reclaim_request{
                request.value().mechanism_id, device_id::from_wire(request.value().device),
                request.value().bytes_needed});
            if (!reclaimed) {
                return abi::write_status(status, NXMEM_STATUS_HOST_REFUSED,
                                         reclaimed.error().describe());
            }
            return NXMEM_STATUS_OK;
        });
    }

    // A valid completion allocates nothing: its room was reserved when the ticket was enqueued.
    // Only describing a malformed one can run out of memory; then the violation is still noted.
    // The pin is parked in the module, never dropped here: this may be the allocator's last
    // reference, and the plugin is inside its own call.
    static void on_release_completed(void* context, const NxmemReleaseCompletion* raw) noexcept {
        auto& core = *static_cast<allocator_core*>(context);
        const bool recorded = guard_void([&] {
            result<NxmemReleaseCompletion> completion = abi::read_request(raw);
            std::lock_guard lock(core.deferred_mutex_);
            if (!completion) {
                core.completion_violation_ = "release_completed: " + completion.error().message;
                return;
            }
            const std::uint64_t ticket = completion.value().ticket;
            auto found = core.pending_.find(ticket);
            if (found == core.pending_.end() || found->second.pin == nullptr) {
                core.completion_violation_ =
                    "release_completed for unknown ticket " + std::to_string(ticket);
                return;
            }
            core.completed_.push_back(release_completion{
                ticket, found->second.allocation_id,
                core.interpret(completion.value().outcome, found->second.record)});
            core.module_->park(std::move(found->second.pin));
            core.pending_.erase(found);
            core.module_->tally_.queued_releases.fetch_sub(1);
            core.retiring_.fetch_sub(1, std::memory_order_relaxed);
        });
        if (!recorded) {
            std::lock_guard lock(core.deferred_mutex_);
            core.completion_violation_unrecorded_ = true;
        }
    }

    // Declared first: destroyed last.
    std::shared_ptr<plugin_module> module_;
    reclaim_function reclaim_;
    NxmemHostCallbacks callbacks_{}; // borrowed by the plugin for this allocator's lifetime
    NxmemAllocatorVtable* raw_ = nullptr;
    NxmemAllocatorVtable table_{};
    std::uint32_t declared_minor_ = 0;
    std::optional<NxmemVirtualBackingVtable> virtual_backing_;
    std::uint64_t commit_granularity_ = 0;
    std::optional<NxmemSharedMappingVtable> shared_mapping_;
    std::optional<NxmemIpcVtable> ipc_; // minor 3
    std::optional<NxmemFencedReleaseVtable> fenced_release_; // minor 4
    std::optional<NxmemCopyVtable> copy_;                    // minor 4
    std::vector<capability_table_level> tables_;
    device_id device_;
    NxmemDeviceId wire_device_; // device_, as every request names it
    std::uint64_t mechanism_id_;
    std::string mechanism_name_;
    live_table live_;
    // Allocations erased from live_ whose queued release has not retired yet.
    std::atomic<std::uint64_t> retiring_{0};
    allocation_count_link count_link_; // this allocator in its module's list

    mutable std::mutex deferred_mutex_;
    std::atomic<std::uint64_t> next_ticket_{1};
    std::map<std::uint64_t, pending_release> pending_;
    std::vector<release_completion> completed_; // capacity >= size + pending tickets
    std::string completion_violation_;
    bool completion_violation_unrecorded_ = false;
    std::deque<host_fenced_release> host_fenced_; // under deferred_mutex_ (minor 4)
    std::atomic<bool> host_fenced_used_{false};   // release_after ever kept one here
    std::atomic<bool> host_draining_{false};      // a drain is walking host_fenced_
    std::atomic<std::uint64_t> prefixes_held_{0}; // references the engine holds from this allocator

    mutable std::mutex lease_mutex_;
    std::vector<lease_entry> leases_;
    std::atomic<std::uint64_t> leases_held_{0}; // read on every release: non-zero only while leased

    mutable std::mutex quarantine_mutex_;
    std::atomic<bool> any_quarantined_{false};
    std::set<std::uint64_t> quarantined_addresses_;
    std::atomic<std::uint64_t> quarantined_bytes_{0};
};

} // namespace nxmem::host::detail
