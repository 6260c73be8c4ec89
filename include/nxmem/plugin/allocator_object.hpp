// The C allocator table the kit builds around one instance of a mechanism class. Every slot runs
// inside the guard, reads its request with read_request, checks mechanism and device, and checks
// the host's description of an allocation against the kit's record before the mechanism sees it.
//
// The hot slots (allocate, deallocate, release_allocation, commit, decommit) do all of that
// without allocating and without writing a cache line other threads share: checks compare
// numbers and build their message only on failure, counts go to this allocator's per-thread
// cells, and an output is written once, when there is something to write. docs/PLUGINS.md
// ("What the kit costs per call") has the figures.
#pragma once

#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/ipc_handle.hpp>
#include <nxmem/abi/request.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/page_size.hpp>
#include <nxmem/plugin/allocation_registry.hpp>
#include <nxmem/plugin/guard.hpp>
#include <nxmem/plugin/mechanism.hpp>
#include <nxmem/plugin/module_state.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>


namespace nxmem::plugin {

namespace detail {

// The table and a pointer to its owner: standard layout, so the table's address (what the host
// holds and passes back as `self`) converts back to the shell.
struct allocator_shell {
    NxmemAllocatorVtable table;
    void* owner;
};
static_assert(std::is_standard_layout_v<allocator_shell>);

inline NxmemStatusCode report(NxmemStatus* status, const error& failure) noexcept {
    return abi::write_status(status, static_cast<NxmemStatusCode>(failure.code), failure.message);
}

// Runs `body` (returning result<void>) under the guard and reports its failure into `status`.
template <class Body> NxmemStatusCode run_slot(NxmemStatus* status, Body&& body) noexcept {
    return guard_status(status, [&]() -> NxmemStatusCode {
        result<void> outcome = body();
        return outcome ? NXMEM_STATUS_OK : report(status, outcome.error());
    });
}

// The failure reports of the hot slots, kept out of line: they build text, the success path
// never does.
[[gnu::cold]] inline NxmemStatusCode report_failure(NxmemStatus* status, const error& failure) {
    return report(status, failure);
}
template <class T>
[[gnu::cold]] NxmemStatusCode report_request_problem(NxmemStatus* status, const T* raw,
                                                     abi::wire_problem problem) {
    return report(status, abi::describe_request_problem(raw, problem));
}
template <class T>
[[gnu::cold]] NxmemStatusCode report_output_problem(NxmemStatus* status, const T* out,
                                                    abi::wire_problem problem) {
    return report(status, abi::describe_output_problem(out, problem));
}

constexpr bool is_power_of_two(std::uint64_t value) noexcept {
    return value != 0 && (value & (value - 1)) == 0; // no popcount call on targets without one
}

} // namespace detail


template <mechanism M> class allocator_object {
public:
    // Opens an allocator of M for `request`; on success `*out` holds one reference.
    static result<NxmemAllocatorVtable*> open(const NxmemOpenRequest& request) {
        const device_id device = device_id::from_wire(request.device);
        if (device.type >= 64 || (M::device_types & device_bit(device.type)) == 0) {
            return fail(status_code::wrong_device,
                        std::string(M::name) + " cannot open a device of type " +
                            std::string(device_type_name(device.type)));
        }
        if (device.index < 0) { // names no device of any type (ABI Q16)
            return fail(status_code::wrong_device,
                        std::string(M::name) + " on " + std::string(device_type_name(device.type)) + ":" +
                            std::to_string(device.index) + ": no device has a negative index (Q16)");
        }
        if (request.options_length > 0 && request.options == nullptr) {
            return fail(status_code::invalid_argument, "options_length is set but options is NULL");
        }
        NXMEM_TRY(parsed, options::parse(std::string_view(
                              request.options, static_cast<std::size_t>(request.options_length))));
        NXMEM_TRY(link, host_link::read(request.callbacks, this_module().negotiated_minor.load()));
        open_context context{M::mechanism_id, device, parsed, link, M::name};
        NXMEM_TRY(instance, M::open(context));
        NXMEM_TRY_VOID(parsed.refuse_unknown(M::name));
        auto* object = new allocator_object(std::move(instance), link, device);
        return &object->shell_.table;
    }

private:
    allocator_object(std::unique_ptr<M> instance, host_link link, device_id device)
        : mechanism_(std::move(instance)), host_(link), device_(device) {
        // Nothing above the negotiated minor: not its slots, not its flags, not its fields.
        const std::uint32_t level = std::min(declared_minor, this_module().negotiated_minor.load());
        NxmemAllocatorVtable& table = shell_.table;
        table = abi::make_struct<NxmemAllocatorVtable>();
        table.struct_size = static_cast<std::uint32_t>(abi::bytes_required<NxmemAllocatorVtable>(level));
        table.abi_minor = level;
        table.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
        table.capabilities = capabilities_of<M>() & abi::capabilities_at_minor(level);
        // D10: without release_completed no queued release could ever be reported retired, so a
        // host that offers none gets no deferred release (flag clear, slots NULL).
        if (!host_.offers_release_completed()) {
            table.capabilities &= ~NXMEM_CAP_DEFERRED_RELEASE;
        }
        table.mechanism_id = M::mechanism_id;
        table.device = device.to_wire();
        table.allocate = &slot_allocate;
        table.deallocate = &slot_deallocate;
        table.retain = &slot_retain;
        table.release = &slot_release;
        if constexpr (offers_virtual_backing<M>) {
            virtual_backing_ = make_virtual_backing_table(*mechanism_, this_module().negotiated_minor.load());
            table.virtual_backing = &virtual_backing_;
        }
        if constexpr (offers_shared_mapping<M>) {
            static constexpr NxmemSharedMappingVtable shared_mapping = make_shared_mapping_table();
            table.shared_mapping = &shared_mapping;
        }
        if constexpr (offers_deferred_release<M>) {
            if ((table.capabilities & NXMEM_CAP_DEFERRED_RELEASE) != 0) {
                table.enqueue_release = &slot_enqueue_release;
                table.drain_releases = &slot_drain_releases;
            }
        }
        if constexpr (offers_structured_release<M>) {
            if (level >= 1) {
                table.release_allocation = &slot_release_allocation;
            }
        }
        if constexpr (offers_usage_query<M>) {
            if (level >= 2) {
                table.query_usage = &slot_query_usage;
            }
        }
        if constexpr (offers_ipc<M>) {
            if (!ipc_available_in(*mechanism_)) {
                table.capabilities &= ~NXMEM_CAP_IPC; // this allocator's driver or device cannot share
            }
            if (level >= abi::ipc_minor && (table.capabilities & NXMEM_CAP_IPC) != 0) {
                static constexpr NxmemIpcVtable ipc = make_ipc_table();
                table.ipc = &ipc;
            }
        }
        if constexpr (offers_fenced_release<M>) {
            // F2: a fenced release is a deferred release with fences; without deferred release (no
            // release_completed, D10) or without a kind to wait on there is none.
            const std::uint64_t kinds = fence_kinds_of(*mechanism_);
            if ((table.capabilities & NXMEM_CAP_DEFERRED_RELEASE) == 0 || kinds == 0) {
                table.capabilities &= ~NXMEM_CAP_FENCED_RELEASE;
            }
            if (level >= abi::stream_minor && (table.capabilities & NXMEM_CAP_FENCED_RELEASE) != 0) {
                fenced_release_ = make_fenced_release_table(kinds);
                table.fenced_release = &fenced_release_;
            }
        }
        if constexpr (offers_copy<M>) {
            if (level >= abi::stream_minor && (table.capabilities & NXMEM_CAP_COPY) != 0) {
                copy_ = make_copy_table(copy_stream_kinds_of(*mechanism_));
                table.copy = &copy_;
            }
        }
        shell_.owner = this;
        this_module().live_allocators.fetch_add(1);
    }

    // Whatever the host left live goes back to the mechanism before the allocator goes away.
    ~allocator_object() {
        for (const allocation_record& record : registry_.take_all()) {
            (void)release_to_mechanism(record);
            forget(record);
        }
        for (const queued_release& queued : queue_) {
            (void)release_to_mechanism(queued.record);
            forget(queued.record);
            uncount_queued(queued.record);
        }
        this_module().live_imports.fetch_sub(imports_.size()); // their prefixes go just below
        if constexpr (shares_allocations<M>) {
            for (const auto& [import_id, imported] : imports_) {
                if (imported.kind == NXMEM_IPC_ALLOCATION) {
                    (void)mechanism_->close_imported_allocation({imported.address, imported.mapped_bytes});
                }
            }
        }
        if constexpr (offers_shared_mapping<M>) {
            for (const auto& [prefix_id, references] : prefix_references_) {
                mechanism_->destroy_shared_prefix(prefix_id);
                this_module().live_shared_prefixes.fetch_sub(1);
            }
        }
        this_module().live_allocators.fetch_sub(1);
    }

    static constexpr std::uint32_t declared_minor = declared_minor_of<M>();

    static allocator_object& self(NxmemAllocatorVtable* table) noexcept {
        return *static_cast<allocator_object*>(reinterpret_cast<detail::allocator_shell*>(table)->owner);
    }

    // Whether an object named by mechanism and device belongs to this allocator: the check every
    // call makes before anything is touched. Compares numbers; check_identity says why not.
    bool owns(std::uint64_t mechanism_id, const NxmemDeviceId& device) const noexcept {
        return mechanism_id == M::mechanism_id && device_id::from_wire(device) == device_;
    }
    [[gnu::cold]] NxmemStatusCode report_identity(NxmemStatus* status, std::uint64_t mechanism_id,
                                                  const NxmemDeviceId& device) const {
        return detail::report_failure(status, check_identity(mechanism_id, device).error());
    }

    // The same check as a result, naming what does not match.
    result<void> check_identity(std::uint64_t mechanism_id, const NxmemDeviceId& device) const {
        if (owns(mechanism_id, device)) [[likely]] {
            return boost::outcome_v2::success();
        }
        if (mechanism_id != M::mechanism_id) {
            return fail(status_code::wrong_mechanism,
                        "object of mechanism " + std::to_string(mechanism_id) + " handed to " +
                            std::string(M::name) + " (mechanism " +
                            std::to_string(M::mechanism_id) + ")");
        }
        if (device_id::from_wire(device) != device_) {
            return fail(status_code::wrong_device,
                        "object of device " + std::string(device_type_name(device.device_type)) +
                            ":" + std::to_string(device.index) + " handed to an allocator of " +
                            std::string(device_type_name(device_.type)) + ":" +
                            std::to_string(device_.index));
        }
        return boost::outcome_v2::success();
    }

    // Hands an allocation back through the mechanism's deallocate, or, for a mechanism that
    // defines only release_allocation, through that: the one place the kit forwards a deallocate.
    // A FAILED outcome is a failed deallocate, and the allocation stays live.
    result<void> release_to_mechanism(const allocation_record& record) {
        if constexpr (defines_deallocate<M>) {
            return mechanism_->deallocate(record);
        } else {
            NXMEM_TRY(released, mechanism_->release_allocation(record));
            if (released.state == NXMEM_RELEASE_FAILED) {
                return failed_release();
            }
            return boost::outcome_v2::success();
        }
    }
    // Calls `release` for `record`, already taken from the registry. A mechanism that throws
    // (std::bad_alloc) has changed nothing, as for FAILED: the record goes back, live.
    template <class Release>
    auto restoring_on_throw(const allocation_record& record, Release&& release) {
        try {
            return release();
        } catch (...) {
            registry_.insert(record);
            throw;
        }
    }
    [[gnu::cold]] static auto failed_release() {
        return fail(status_code::internal_error, std::string(M::name) + " reported a failed release");
    }

    // The allocation is gone (its registry record already is): uncount its views and drop the
    // references its mappings held.
    void forget(const allocation_record& record) {
        if (!record.prefixes.empty()) {
            counts_.add(allocator_counts::views, -static_cast<std::int64_t>(record.prefixes.size()));
        }
        if constexpr (offers_shared_mapping<M>) {
            for (std::uint64_t prefix_id : record.prefixes) {
                (void)drop_mapping_reference(prefix_id); // the id is live: it was mapped
            }
        }
    }

    // ---- allocator slots ----

    // The hot slots guard a member function called with the slot's own arguments: a lambda that
    // captured them by reference would be built on the stack and called on every call.
    static NxmemStatusCode slot_allocate(NxmemAllocatorVtable* table, const NxmemAllocRequest* raw,
                                         NxmemAllocResult* out, NxmemStatus* status) noexcept {
        return guard_status(status, [=] { return self(table).allocate(raw, out, status); });
    }
    NxmemStatusCode allocate(const NxmemAllocRequest* raw, NxmemAllocResult* out, NxmemStatus* status) {
        NxmemAllocRequest request;
        if (const auto problem = abi::copy_request(raw, request); problem != abi::wire_problem::none) {
            return detail::report_request_problem(status, raw, problem);
        }
        // M10: the records' form first (an unusable output is refused before anything is made,
        // so nothing can leak), then identity, then the request's values.
        if (const auto problem = abi::check_output(out); problem != abi::wire_problem::none) {
            return detail::report_output_problem(status, out, problem);
        }
        if (!owns(request.mechanism_id, request.device)) [[unlikely]] {
            return report_identity(status, request.mechanism_id, request.device);
        }
        if (request.flags != 0 || request.size == 0 || !detail::is_power_of_two(request.alignment))
            [[unlikely]] {
            return detail::report_failure(status, malformed_allocation(request));
        }
        if (request.size >= max_serveable_size) [[unlikely]] {
            // Q18: no address space maps it, and a mechanism rounding it up could wrap past 2^64
            // (libstdc++'s aligned operator new does) and serve a few bytes as OK.
            return detail::report_failure(status, unserveable_size(request));
        }
        result<block> memory = mechanism_->allocate(request.size, request.alignment);
        if (!memory) [[unlikely]] {
            return detail::report_failure(status, memory.error());
        }
        const block& made = memory.assume_value();
        try {
            registry_.insert(made.address, request.size, request.alignment, request.allocation_id,
                             made.size);
        } catch (...) {
            // Unrecorded, it could never be released: hand it back before reporting.
            (void)release_to_mechanism({made.address, request.size, request.alignment,
                                        request.allocation_id, {}, made.size});
            throw;
        }
        NxmemAllocResult written;
        written.struct_size = sizeof written;
        written.reserved = 0;
        written.address = made.address;
        written.size = made.size;
        written.mapped_bytes = made.mapped_bytes;
        abi::store_output(out, written);
        return NXMEM_STATUS_OK;
    }

    // Sizes of 2^57 bytes or more (the host's own limit, M9) reach no mechanism.
    static constexpr std::uint64_t max_serveable_size = std::uint64_t{1} << 57;
    [[gnu::cold]] static error unserveable_size(const NxmemAllocRequest& request) {
        return {status_code::out_of_memory, std::string(M::name) + ": " + std::to_string(request.size) +
                                                " bytes is more than any address space maps (2^57 or more)"};
    }

    [[gnu::cold]] static error malformed_allocation(const NxmemAllocRequest& request) {
        if (request.flags != 0) {
            return {status_code::invalid_argument,
                    "unknown allocation flags 0x" + nxmem::detail::to_hex(request.flags) +
                        " (major 1 defines none)"};
        }
        return {status_code::invalid_argument,
                "size must be non-zero and alignment a power of two (size " +
                    std::to_string(request.size) + ", alignment " +
                    std::to_string(request.alignment) + ")"};
    }

    // Reads the host's description, checks its identity and takes the matching record out of
    // the registry. On failure reports into `status`, sets `failed` and returns false.
    bool take_described(const NxmemAllocation* raw, allocation_record& record, NxmemStatus* status,
                        NxmemStatusCode& failed) {
        NxmemAllocation described;
        if (const auto problem = abi::copy_request(raw, described); problem != abi::wire_problem::none) {
            failed = detail::report_request_problem(status, raw, problem);
            return false;
        }
        if (!owns(described.mechanism_id, described.device)) [[unlikely]] {
            failed = report_identity(status, described.mechanism_id, described.device);
            return false;
        }
        if (registry_refusal why; !registry_.take(described, record, why)) [[unlikely]] {
            failed = report_refusal(status, described, why);
            return false;
        }
        return true;
    }
    [[gnu::cold]] static NxmemStatusCode report_refusal(NxmemStatus* status,
                                                        const NxmemAllocation& described,
                                                        const registry_refusal& why) {
        return detail::report(status, allocation_registry::describe(described, why));
    }

    static NxmemStatusCode slot_deallocate(NxmemAllocatorVtable* table, const NxmemAllocation* raw,
                                           NxmemStatus* status) noexcept {
        return guard_status(status, [=] { return self(table).deallocate(raw, status); });
    }
    NxmemStatusCode deallocate(const NxmemAllocation* raw, NxmemStatus* status) {
        allocation_record record;
        NxmemStatusCode failed = NXMEM_STATUS_OK;
        if (!take_described(raw, record, status, failed)) {
            return failed;
        }
        result<void> released =
            restoring_on_throw(record, [&] { return release_to_mechanism(record); });
        if (!released) [[unlikely]] {
            registry_.insert(record); // nothing changed: still live
            return detail::report_failure(status, released.error());
        }
        forget(record);
        return NXMEM_STATUS_OK;
    }

    static void slot_retain(NxmemAllocatorVtable* table) noexcept {
        guard_void([&] { self(table).references_.fetch_add(1, std::memory_order_relaxed); });
    }

    static void slot_release(NxmemAllocatorVtable* table) noexcept {
        guard_void([&] {
            allocator_object& object = self(table);
            if (object.references_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                delete &object;
            }
        });
    }

    static NxmemStatusCode slot_release_allocation(NxmemAllocatorVtable* table,
                                                   const NxmemAllocation* raw,
                                                   NxmemReleaseOutcome* out,
                                                   NxmemStatus* status) noexcept {
        return guard_status(status, [=] { return self(table).release_allocation(raw, out, status); });
    }
    NxmemStatusCode release_allocation(const NxmemAllocation* raw, NxmemReleaseOutcome* out,
                                       NxmemStatus* status) {
        NxmemAllocation described;
        if (const auto problem = abi::copy_request(raw, described); problem != abi::wire_problem::none) {
            return detail::report_request_problem(status, raw, problem);
        }
        // M10: the output's form before identity. An unusable output is refused before anything
        // is released; a usable one says FAILED until the release has happened.
        if (const auto problem = abi::check_output(out); problem != abi::wire_problem::none) {
            return detail::report_output_problem(status, out, problem);
        }
        if (!owns(described.mechanism_id, described.device)) [[unlikely]] {
            return report_identity(status, described.mechanism_id, described.device);
        }
        NxmemReleaseOutcome written;
        written.struct_size = sizeof written;
        written.state = NXMEM_RELEASE_FAILED;
        written.unmapped_bytes = 0;
        written.residual_owned_bytes = 0;
        abi::store_output(out, written);
        allocation_record record;
        if (registry_refusal why; !registry_.take(described, record, why)) [[unlikely]] {
            return report_refusal(status, described, why);
        }
        result<release_outcome> released =
            restoring_on_throw(record, [&] { return mechanism_->release_allocation(record); });
        if (!released.has_value() || released.assume_value().state == NXMEM_RELEASE_FAILED)
            [[unlikely]] {
            registry_.insert(record); // FAILED: the allocation is as live as before
            return detail::report_failure(status, released ? failed_release().error()
                                                           : released.error());
        }
        forget(record);
        const release_outcome& outcome = released.assume_value();
        written.state = outcome.state;
        written.unmapped_bytes = outcome.unmapped_bytes;
        written.residual_owned_bytes = outcome.residual_owned_bytes;
        abi::store_output(out, written);
        return NXMEM_STATUS_OK;
    }

    // ---- deferred release ----

    static NxmemStatusCode slot_enqueue_release(NxmemAllocatorVtable* table,
                                                const NxmemAllocation* raw, std::uint64_t ticket,
                                                NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(described, abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(described.mechanism_id, described.device));
            return object.enqueue(described, ticket, {});
        });
    }

    // Queues `described` under `ticket`, to retire once `fences` have completed (none: at the
    // next drain that reaches it).
    result<void> enqueue(const NxmemAllocation& described, std::uint64_t ticket,
                         std::vector<std::unique_ptr<pending_work>> fences) {
        std::lock_guard lock(queue_mutex_);
        // The queue's room first: once the record is out of the registry nothing may fail.
        queue_.push_back({ticket, {}, std::move(fences)});
        result<allocation_record> record = registry_.take(described);
        if (!record) {
            queue_.pop_back();
            return boost::outcome_v2::failure(std::move(record).error());
        }
        queue_.back().record = std::move(record).value();
        auto cell = counts_.this_thread();
        cell.add(allocator_counts::queued_releases, 1);
        cell.add(allocator_counts::unrecorded_allocations, 1); // out of the registry
        cell.add(allocator_counts::unrecorded_reserved_bytes,
                 static_cast<std::int64_t>(queue_.back().record.usable_size));
        return boost::outcome_v2::success();
    }

    // ---- fenced release (minor 4) ----

    // F3: everything is checked before anything is touched: the request's form, the allocation's
    // identity, each fence's form, kind and device, and that the allocation is live and so
    // described. Only then does each fence become pending work (the mechanism's watch_fence may
    // record an event), and the release is queued as by enqueue_release.
    static NxmemStatusCode slot_enqueue_fenced_release(NxmemAllocatorVtable* table,
                                                       const NxmemFencedReleaseRequest* raw,
                                                       NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(request.allocation.mechanism_id,
                                                 request.allocation.device));
            NXMEM_TRY(list, abi::read_fences(request));
            for (const NxmemFence& wire : list) {
                NXMEM_TRY_VOID(abi::check_fence_for(wire, object.fenced_release_.fence_kinds,
                                                    object.device_.to_wire(), M::name));
            }
            NXMEM_TRY_VOID(object.registry_.find(request.allocation));
            std::vector<std::unique_ptr<pending_work>> fences;
            fences.reserve(list.count);
            for (const NxmemFence& wire : list) {
                NXMEM_TRY(work, object.watch(wire));
                fences.push_back(std::move(work));
            }
            return object.enqueue(request.allocation, request.ticket, std::move(fences));
        });
    }

    // A checked fence as pending work: the kit's for a host timeline, the mechanism's otherwise.
    result<std::unique_ptr<pending_work>> watch(const NxmemFence& wire) {
        if (wire.kind == NXMEM_FENCE_HOST_TIMELINE) {
            return std::unique_ptr<pending_work>(std::make_unique<host_timeline_work>(wire));
        }
        if constexpr (watches_fences<M>) {
            NXMEM_TRY(work, mechanism_->watch_fence(fence::from_wire(wire)));
            if (work == nullptr) {
                return fail(status_code::internal_error,
                            std::string(M::name) + " watched a fence and returned no pending work");
            }
            return work;
        } else {
            return fail(status_code::unsupported_capability,
                        std::string(M::name) + " does not wait on fences of kind " +
                            std::to_string(wire.kind));
        }
    }

    // Whether every fence of a queued release has completed; those that have are dropped, so
    // each is polled until it completes and never after. Never blocks (D11).
    static result<bool> fences_completed(std::vector<std::unique_ptr<pending_work>>& fences) {
        bool all = true;
        for (std::unique_ptr<pending_work>& work : fences) {
            if (work == nullptr) {
                continue;
            }
            NXMEM_TRY(done, work->poll());
            if (done) {
                work.reset();
            } else {
                all = false;
            }
        }
        return all;
    }

    static NxmemFencedReleaseVtable make_fenced_release_table(std::uint64_t kinds) noexcept {
        NxmemFencedReleaseVtable fr{};
        fr.struct_size = sizeof fr;
        fr.abi_minor = abi::stream_minor;
        fr.type_tag = NXMEM_TYPE_TAG_FENCED_RELEASE;
        fr.enqueue_fenced_release = &slot_enqueue_fenced_release;
        fr.fence_kinds = kinds;
        return fr;
    }

    // ---- copies (minor 4) ----

    // CP1-CP4: the request's form, the target's identity, the range against the size the host
    // describes, the stream's kind and device, liveness, committed memory and write access, all
    // before the mechanism is called: a refused copy touches nothing.
    static NxmemStatusCode slot_copy(NxmemAllocatorVtable* table, const NxmemCopyRequest* raw,
                                     NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            const bool to_allocation = request.target == NXMEM_COPY_ALLOCATION;
            if (to_allocation) {
                NXMEM_TRY_VOID(object.check_identity(request.allocation.mechanism_id,
                                                     request.allocation.device));
            } else if (request.target == NXMEM_COPY_PREFIX) {
                NXMEM_TRY_VOID(object.check_prefix(request.prefix));
            }
            NXMEM_TRY_VOID(abi::check_copy_form(request, to_allocation ? request.allocation.size
                                                                       : request.prefix.size));
            copy_job job{request.direction, request.offset, request.length, request.host_buffer, {}};
            if (request.stream != nullptr) {
                NXMEM_TRY(stream, abi::read_request(request.stream));
                NXMEM_TRY_VOID(abi::check_fence_for(stream, object.copy_.stream_kinds,
                                                    object.device_.to_wire(),
                                                    std::string(M::name) + "'s copy"));
                job.stream = fence::from_wire(stream);
            }
            return to_allocation ? object.copy_allocation(request.allocation, job)
                                 : object.copy_prefix(request.prefix, job);
        });
    }

    result<void> copy_allocation(const NxmemAllocation& described, const copy_job& job) {
        if constexpr (copies_allocations<M>) {
            NXMEM_TRY(record, registry_.find(described));
            if constexpr (offers_virtual_backing<M>) {
                if (job.length != 0 && !mechanism_->range_committed(record, {job.offset, job.length})) {
                    return fail(status_code::invalid_argument,
                                "copy range [" + std::to_string(job.offset) + ", +" +
                                    std::to_string(job.length) + ") of allocation " +
                                    std::to_string(record.allocation_id) +
                                    " is not all committed");
                }
            }
            if (job.length == 0) {
                return success();
            }
            return mechanism_->copy(record, job);
        } else {
            return fail(status_code::unsupported_capability,
                        std::string(M::name) + " copies shared prefixes only");
        }
    }

    result<void> copy_prefix(const NxmemSharedPrefixHandle& described, const copy_job& job) {
        if constexpr (copies_prefixes<M>) {
            {
                std::lock_guard lock(prefix_mutex_);
                auto found = prefix_references_.find(described.prefix_id);
                if (found == prefix_references_.end() || found->second.size != described.size) {
                    return fail(status_code::invalid_argument,
                                "no live shared prefix with id " + std::to_string(described.prefix_id) +
                                    " and size " + std::to_string(described.size));
                }
                if (job.direction == NXMEM_COPY_FROM_HOST && found->second.read_only) {
                    return fail(status_code::invalid_argument,
                                "shared prefix " + std::to_string(described.prefix_id) +
                                    " was imported read-only: nothing is copied into it");
                }
            }
            if (job.length == 0) {
                return success();
            }
            return mechanism_->copy_prefix(described.prefix_id, job);
        } else {
            return fail(status_code::unsupported_capability,
                        std::string(M::name) + " copies allocations only");
        }
    }

    static NxmemCopyVtable make_copy_table(std::uint64_t stream_kinds) noexcept {
        NxmemCopyVtable cp{};
        cp.struct_size = sizeof cp;
        cp.abi_minor = abi::stream_minor;
        cp.type_tag = NXMEM_TYPE_TAG_COPY;
        cp.copy = &slot_copy;
        cp.stream_kinds = stream_kinds;
        return cp;
    }

    // Retires queued releases in enqueue order. Only one drain runs at a time per allocator (a
    // concurrent drain returns at once with nothing retired), so completions are never reordered,
    // and no kit lock is held while the mechanism or the host is called.
    static NxmemStatusCode slot_drain_releases(NxmemAllocatorVtable* table, std::uint64_t* retired,
                                               NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            std::uint64_t count = 0;
            if (object.draining_.exchange(true, std::memory_order_acquire)) {
                if (retired != nullptr) {
                    *retired = 0;
                }
                return boost::outcome_v2::success();
            }
            result<void> outcome = [&] {
                try {
                    return object.drain_in_order(count);
                } catch (...) {
                    object.draining_.store(false, std::memory_order_release); // drains go on
                    throw;
                }
            }();
            object.draining_.store(false, std::memory_order_release);
            if (retired != nullptr) {
                *retired = count;
            }
            return outcome;
        });
    }

    result<void> drain_in_order(std::uint64_t& count) {
        for (;;) {
            // Only the drain removes entries, and a deque's push_back keeps references: the front
            // stays put while it is retired, read in place (a copy could run out of memory).
            queued_release* front = nullptr;
            {
                std::lock_guard lock(queue_mutex_);
                if (queue_.empty()) {
                    return boost::outcome_v2::success();
                }
                front = &queue_.front();
            }
            // F4: a release whose fences are pending stops the drain there; retire is not asked.
            NXMEM_TRY(fenced_off, fences_completed(front->fences));
            if (!fenced_off) {
                return boost::outcome_v2::success();
            }
            NXMEM_TRY(outcome, retire(front->record));
            if (!outcome) {
                return boost::outcome_v2::success(); // not yet: it and everything after it wait
            }
            queued_release next;
            {
                std::lock_guard lock(queue_mutex_);
                next = std::move(queue_.front());
                queue_.pop_front();
            }
            uncount_queued(next.record);
            forget(next.record);
            auto completion = abi::make_struct<NxmemReleaseCompletion>();
            completion.ticket = next.ticket;
            completion.mechanism_id = M::mechanism_id;
            completion.allocation_id = next.record.allocation_id;
            completion.outcome = abi::make_struct<NxmemReleaseOutcome>();
            completion.outcome.state = outcome->state;
            completion.outcome.unmapped_bytes = outcome->unmapped_bytes;
            completion.outcome.residual_owned_bytes = outcome->residual_owned_bytes;
            ++count;
            host_.release_completed(completion);
        }
    }

    // A queued release has retired (or was handed back when the allocator went): it is live no more.
    void uncount_queued(const allocation_record& record) noexcept {
        auto cell = counts_.this_thread();
        cell.add(allocator_counts::queued_releases, -1);
        cell.add(allocator_counts::unrecorded_allocations, -1);
        cell.add(allocator_counts::unrecorded_reserved_bytes, -static_cast<std::int64_t>(record.usable_size));
    }

    // A queued allocation's retirement: the mechanism's retire, or, for a mechanism that
    // retires through release_allocation, that release's outcome at once.
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        if constexpr (defines_retire<M>) {
            return mechanism_->retire(record);
        } else {
            NXMEM_TRY(released, mechanism_->release_allocation(record));
            return std::optional<release_outcome>{released};
        }
    }

    // ---- virtual backing ----

    // M10: mechanism and device, then the range's values against the size the host describes
    // (G5), and only then whether the allocation is live and so described.
    result<allocation_record> find_in_range(const NxmemRangeRequest& request) {
        NXMEM_TRY_VOID(check_identity(request.allocation.mechanism_id, request.allocation.device));
        const std::uint64_t offset = request.range.offset;
        const std::uint64_t length = request.range.length;
        const std::uint64_t size = request.allocation.size;
        if (length == 0 || offset > size || length > size - offset) {
            return fail(status_code::invalid_argument,
                        "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                            ") is empty or lies outside the allocation of " + std::to_string(size) +
                            " bytes");
        }
        return registry_.find(request.allocation);
    }

    static NxmemStatusCode slot_commit(NxmemAllocatorVtable* table, const NxmemRangeRequest* raw,
                                       NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            NXMEM_TRY(record, object.find_in_range(request));
            return object.mechanism_->commit(record, {request.range.offset, request.range.length});
        });
    }

    static NxmemStatusCode slot_decommit(NxmemAllocatorVtable* table, const NxmemRangeRequest* raw,
                                         NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            NXMEM_TRY(record, object.find_in_range(request));
            return object.mechanism_->decommit(record, {request.range.offset, request.range.length});
        });
    }

    static NxmemStatusCode slot_mapped_bytes(NxmemAllocatorVtable* table,
                                             const NxmemAllocation* raw, std::uint64_t* mapped,
                                             NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(described, abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(described.mechanism_id, described.device));
            if (mapped == nullptr) {
                return fail(status_code::invalid_argument, "mapped_bytes output is NULL");
            }
            NXMEM_TRY(record, object.registry_.find(described));
            NXMEM_TRY(bytes, object.mechanism_->mapped_bytes(record));
            *mapped = bytes;
            return boost::outcome_v2::success();
        });
    }

    // ---- shared mapping ----
    // The kit counts each prefix's references: the creator's, each retain, one per mapping.

    result<void> check_prefix(const NxmemSharedPrefixHandle& prefix) const {
        return check_identity(prefix.mechanism_id, prefix.device);
    }

    result<void> add_prefix_reference(std::uint64_t prefix_id) {
        std::lock_guard lock(prefix_mutex_);
        auto found = prefix_references_.find(prefix_id);
        if (found == prefix_references_.end()) {
            return fail(status_code::invalid_argument,
                        "no live shared prefix with id " + std::to_string(prefix_id));
        }
        ++found->second.references;
        return boost::outcome_v2::success();
    }

    result<void> drop_prefix_reference(std::uint64_t prefix_id) {
        {
            std::lock_guard lock(prefix_mutex_);
            auto found = prefix_references_.find(prefix_id);
            if (found == prefix_references_.end()) {
                return fail(status_code::invalid_argument,
                            "no live shared prefix with id " + std::to_string(prefix_id));
            }
            if (--found->second.references > 0) {
                return boost::outcome_v2::success();
            }
            prefix_references_.erase(found);
        }
        mechanism_->destroy_shared_prefix(prefix_id);
        this_module().live_shared_prefixes.fetch_sub(1);
        return boost::outcome_v2::success();
    }

    // The mechanism maps the prefix, reporting the commit or leaving it to the kit (nullopt).
    result<std::optional<prefix_commit>> commit_prefix_in_mechanism(const allocation_record& record,
                                                                    std::uint64_t prefix_id) {
        if constexpr (commit_reports_prefix_cost<M>) {
            NXMEM_TRY(reported, mechanism_->commit_shared_prefix(record, prefix_id));
            return std::optional<prefix_commit>{reported};
        } else {
            NXMEM_TRY_VOID(mechanism_->commit_shared_prefix(record, prefix_id));
            return std::optional<prefix_commit>{};
        }
    }

    // One allocation mapping the prefix went: one sharer and one reference fewer.
    result<void> drop_mapping_reference(std::uint64_t prefix_id) {
        {
            std::lock_guard lock(prefix_mutex_);
            if (auto found = prefix_references_.find(prefix_id); found != prefix_references_.end()) {
                --found->second.sharers;
            }
        }
        return drop_prefix_reference(prefix_id);
    }

    // What a prefix costs (ABI.md C8): the memory it holds, its size in whole commit granules
    // (the mechanism's commit_granularity(), else the system page), as an allocation's cost is.
    std::uint64_t prefix_cost(std::uint64_t size) const {
        std::uint64_t granule = nxmem::detail::system_page_bytes();
        if constexpr (states_commit_granularity<M>) {
            granule = mechanism_->commit_granularity();
        }
        return size % granule == 0 ? size : size + (granule - size % granule);
    }

    static NxmemStatusCode slot_create_shared_prefix(NxmemAllocatorVtable* table,
                                                     const NxmemSharedPrefixRequest* raw,
                                                     NxmemSharedPrefixHandle* out,
                                                     NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            // The form of the records first, then identity (ABI M10).
            NXMEM_TRY_VOID(abi::write_output(out, abi::make_struct<NxmemSharedPrefixHandle>()));
            NXMEM_TRY_VOID(object.check_identity(request.mechanism_id, request.device));
            if (request.size == 0) {
                return fail(status_code::invalid_argument, "a shared prefix needs a non-zero size");
            }
            NXMEM_TRY(prefix_id, object.mechanism_->create_shared_prefix(request.size));
            {
                std::lock_guard lock(object.prefix_mutex_);
                object.prefix_references_[prefix_id] =
                    prefix_state{1, request.size, object.prefix_cost(request.size), 0, false, 0, false};
            }
            this_module().live_shared_prefixes.fetch_add(1);
            auto handle = abi::make_struct<NxmemSharedPrefixHandle>();
            handle.mechanism_id = M::mechanism_id;
            handle.device = object.device_.to_wire();
            handle.prefix_id = prefix_id;
            handle.size = request.size;
            return abi::write_output(out, handle);
        });
    }

    // retain_shared_prefix and release_shared_prefix: check the handle, then add or drop one
    // reference.
    template <result<void> (allocator_object::*change)(std::uint64_t)>
    static NxmemStatusCode slot_change_prefix_reference(NxmemAllocatorVtable* table,
                                                        const NxmemSharedPrefixHandle* raw,
                                                        NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(prefix, abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_prefix(prefix));
            return (object.*change)(prefix.prefix_id);
        });
    }

    static NxmemStatusCode slot_commit_shared_prefix(NxmemAllocatorVtable* table,
                                                     const NxmemSharedPrefixCommitRequest* raw,
                                                     NxmemSharedPrefixCommitInfo* out,
                                                     NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            // The form of the records first, then identity (ABI M10).
            NXMEM_TRY_VOID(abi::write_output(out, abi::make_struct<NxmemSharedPrefixCommitInfo>()));
            NXMEM_TRY_VOID(object.check_identity(request.allocation.mechanism_id,
                                                 request.allocation.device));
            NXMEM_TRY_VOID(object.check_prefix(request.prefix));
            NXMEM_TRY(record, object.registry_.find(request.allocation));
            if (request.prefix.size > record.size) {
                return fail(status_code::invalid_argument,
                            "a prefix of " + std::to_string(request.prefix.size) +
                                " bytes does not fit an allocation of " +
                                std::to_string(record.size));
            }
            const std::uint64_t prefix_id = request.prefix.prefix_id;
            // The registry's room first: once the mechanism has mapped the prefix nothing may fail.
            object.registry_.reserve_prefix(record.address);
            if (result<void> referenced = object.add_prefix_reference(prefix_id); !referenced) {
                object.registry_.unreserve_prefix(record.address);
                return referenced; // the mapping's own reference
            }
            result<std::optional<prefix_commit>> mapped = [&] {
                try {
                    return object.commit_prefix_in_mechanism(record, prefix_id);
                } catch (...) {
                    object.registry_.unreserve_prefix(record.address);
                    (void)object.drop_prefix_reference(prefix_id);
                    throw;
                }
            }();
            if (!mapped || !object.registry_.add_prefix(record.address, prefix_id)) {
                object.registry_.unreserve_prefix(record.address);
                (void)object.drop_prefix_reference(prefix_id);
                return mapped ? fail(status_code::unknown_allocation,
                                     "the allocation was released while the prefix was mapped")
                              : fail(mapped.error().code, mapped.error().message);
            }
            object.counts_.add(allocator_counts::views, 1);
            // C8 from the kit's own bookkeeping, unless the mechanism reported it.
            prefix_commit commit;
            {
                std::lock_guard lock(object.prefix_mutex_);
                prefix_state& prefix = object.prefix_references_.at(prefix_id); // held by the mapping
                ++prefix.sharers;
                commit = {request.prefix.size, prefix.ever_mapped ? 0 : prefix.cost, prefix.sharers};
                prefix.ever_mapped = true;
            }
            if (mapped.value()) {
                commit = *mapped.value();
            }
            auto info = abi::make_struct<NxmemSharedPrefixCommitInfo>();
            info.shared_bytes = commit.shared_bytes;
            info.newly_mapped_bytes = commit.newly_mapped_bytes;
            info.sharers = commit.sharers;
            return abi::write_output(out, info);
        });
    }

    // ---- usage query ----

    static NxmemStatusCode slot_query_usage(NxmemAllocatorVtable* table, NxmemAllocatorUsage* out,
                                            NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(usage, object.usage());
            {
                std::lock_guard lock(object.prefix_mutex_);
                usage.live_imports = object.imports_.size();
            }
            return abi::write_output(out, usage.to_wire());
        });
    }

    // The mechanism's usage, completing the kit's counts if it asks for them.
    result<allocator_usage> usage() {
        if constexpr (usage_completes_kit_counts<M>) {
            return mechanism_->usage(kit_usage());
        } else {
            return mechanism_->usage();
        }
    }

    // What the kit's own records say (docs/PLUGINS.md, "What the kit counts"): live allocations
    // and their usable bytes, queued releases included; live prefixes at their cost; live imports
    // and the bytes they map (a prefix import's until its local prefix goes, IP10). The mechanism
    // adds mapped and quarantined bytes. A total the per-thread cells add to is read as at least 0:
    // a release counted on another thread than its allocation may be seen first.
    allocator_usage kit_usage() {
        allocator_usage counted;
        counted.live_allocations =
            static_cast<std::uint64_t>(std::max<std::int64_t>(0, counts_.live_allocations()));
        counted.reserved_bytes =
            registry_.reserved_bytes() +
            static_cast<std::uint64_t>(
                std::max<std::int64_t>(0, counts_.sum(allocator_counts::unrecorded_reserved_bytes)));
        std::lock_guard lock(prefix_mutex_);
        for (const auto& [prefix_id, prefix] : prefix_references_) {
            counted.shared_prefix_bytes += prefix.cost;
            counted.imported_bytes += prefix.imported_bytes;
        }
        for (const auto& [import_id, imported] : imports_) {
            if (imported.kind == NXMEM_IPC_ALLOCATION) { // a prefix import's bytes are its prefix's
                counted.imported_bytes += imported.mapped_bytes;
            }
        }
        counted.live_imports = imports_.size();
        return counted;
    }

    // ---- sharing across processes (minor 3) ----
    // A prefix import is the local prefix it made plus one reference on it, the import's, which
    // close_import drops; an allocation import is the mechanism's mapping, which close_import
    // unmaps. The records are kept under prefix_mutex_, beside the references.

    struct import_record {
        std::uint32_t kind = 0;
        std::uint64_t prefix_id = 0; // a prefix import's local prefix
        std::uint64_t address = 0;   // an allocation import's mapping
        std::uint64_t size = 0;
        std::uint64_t mapped_bytes = 0;
        std::uint32_t access = 0;
    };

    [[gnu::cold]] static error kind_not_shared(std::uint32_t kind) {
        return {status_code::unsupported_capability,
                std::string(M::name) + " does not share " +
                    (kind == NXMEM_IPC_ALLOCATION ? "allocations" : "shared prefixes") +
                    " across processes"};
    }

    static NxmemStatusCode slot_export_handle(NxmemAllocatorVtable* table,
                                              const NxmemExportRequest* raw, NxmemIpcHandle* out,
                                              NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            if (const auto problem = abi::check_output(out); problem != abi::wire_problem::none) {
                return boost::outcome_v2::failure(abi::describe_output_problem(out, problem));
            }
            if (!abi::known_ipc_kind(request.kind) || !abi::known_ipc_access(request.access)) {
                return fail(status_code::invalid_argument,
                            "unknown export kind " + std::to_string(request.kind) + " or access " +
                                std::to_string(request.access));
            }
            auto handle = abi::make_struct<NxmemIpcHandle>();
            handle.abi_minor = NXMEM_ABI_MINOR;
            handle.mechanism_id = M::mechanism_id;
            handle.device = object.device_.to_wire();
            handle.kind = request.kind;
            handle.access = request.access;
            for (std::int32_t& fd : handle.fds) {
                fd = -1;
            }
            if (request.kind == NXMEM_IPC_ALLOCATION) {
                NXMEM_TRY_VOID(object.check_identity(request.allocation.mechanism_id,
                                                     request.allocation.device));
                if constexpr (shares_allocations<M>) {
                    NXMEM_TRY(record, object.registry_.find(request.allocation));
                    handle.size = record.size;
                    NXMEM_TRY_VOID(object.mechanism_->export_allocation(record, request.access, handle));
                } else {
                    return boost::outcome_v2::failure(kind_not_shared(request.kind));
                }
            } else {
                NXMEM_TRY_VOID(object.check_prefix(request.prefix));
                if constexpr (shares_prefixes<M>) {
                    {
                        std::lock_guard lock(object.prefix_mutex_);
                        if (!object.prefix_references_.contains(request.prefix.prefix_id)) {
                            return fail(status_code::invalid_argument,
                                        "no live shared prefix with id " +
                                            std::to_string(request.prefix.prefix_id));
                        }
                    }
                    NXMEM_TRY_VOID(object.mechanism_->export_shared_prefix(request.prefix.prefix_id,
                                                                           request.access, handle));
                } else {
                    return boost::outcome_v2::failure(kind_not_shared(request.kind));
                }
            }
            abi::store_output(out, handle);
            return boost::outcome_v2::success();
        });
    }

    static NxmemStatusCode slot_import_handle(NxmemAllocatorVtable* table,
                                              const NxmemImportRequest* raw, NxmemImport* out,
                                              NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(request, abi::read_request(raw));
            if (const auto problem = abi::check_output(out); problem != abi::wire_problem::none) {
                return boost::outcome_v2::failure(abi::describe_output_problem(out, problem));
            }
            NXMEM_TRY_VOID(object.check_identity(request.mechanism_id, request.device));
            NXMEM_TRY(handle, abi::read_ipc_handle(request.handle));
            NXMEM_TRY_VOID(abi::check_ipc_identity(handle, M::mechanism_id, object.device_.to_wire()));
            NXMEM_TRY_VOID(abi::check_ipc_access(handle, request.access));
            {
                std::lock_guard lock(object.prefix_mutex_);
                if (object.imports_.contains(request.import_id)) {
                    return fail(status_code::invalid_argument,
                                "import id " + std::to_string(request.import_id) + " is live already");
                }
            }
            auto imported = abi::make_struct<NxmemImport>();
            imported.kind = handle.kind;
            imported.mechanism_id = M::mechanism_id;
            imported.device = object.device_.to_wire();
            imported.import_id = request.import_id;
            imported.size = handle.size;
            imported.access = request.access;
            if (handle.kind == NXMEM_IPC_ALLOCATION) {
                if constexpr (shares_allocations<M>) {
                    NXMEM_TRY(made, object.import_allocation(request, handle));
                    imported.address = made.address;
                    imported.mapped_bytes = made.mapped_bytes;
                } else {
                    return boost::outcome_v2::failure(kind_not_shared(handle.kind));
                }
            } else {
                if constexpr (shares_prefixes<M>) {
                    NXMEM_TRY(made, object.import_prefix(request, handle));
                    imported.prefix = abi::make_struct<NxmemSharedPrefixHandle>();
                    imported.prefix.mechanism_id = M::mechanism_id;
                    imported.prefix.device = object.device_.to_wire();
                    imported.prefix.prefix_id = made.prefix_id;
                    imported.prefix.size = handle.size;
                    imported.mapped_bytes = made.mapped_bytes;
                } else {
                    return boost::outcome_v2::failure(kind_not_shared(handle.kind));
                }
            }
            this_module().live_imports.fetch_add(1);
            abi::store_output(out, imported);
            return boost::outcome_v2::success();
        });
    }

    // The mechanism's prefix, recorded as the import's reference; nothing kept on failure.
    result<imported_prefix> import_prefix(const NxmemImportRequest& request,
                                          const NxmemIpcHandle& handle) requires shares_prefixes<M> {
        NXMEM_TRY(made, mechanism_->import_shared_prefix(handle, request.access));
        try {
            std::lock_guard lock(prefix_mutex_);
            // The import's: never costed here, its bytes imported bytes while it lives (IP10).
            prefix_references_[made.prefix_id] = prefix_state{
                1, handle.size, 0, 0, false, made.mapped_bytes, request.access == NXMEM_IPC_READ_ONLY};
            imports_[request.import_id] = {NXMEM_IPC_PREFIX, made.prefix_id, 0, handle.size,
                                           made.mapped_bytes, request.access};
        } catch (...) {
            {
                std::lock_guard lock(prefix_mutex_);
                prefix_references_.erase(made.prefix_id);
                imports_.erase(request.import_id);
            }
            mechanism_->destroy_shared_prefix(made.prefix_id);
            throw;
        }
        this_module().live_shared_prefixes.fetch_add(1);
        return made;
    }

    // The mechanism's mapping, recorded; unmapped again when the record cannot be kept.
    result<imported_allocation> import_allocation(const NxmemImportRequest& request,
                                                  const NxmemIpcHandle& handle)
        requires shares_allocations<M> {
        NXMEM_TRY(made, mechanism_->import_allocation(handle, request.access));
        try {
            std::lock_guard lock(prefix_mutex_);
            imports_[request.import_id] = {NXMEM_IPC_ALLOCATION, 0, made.address, handle.size,
                                           made.mapped_bytes, request.access};
        } catch (...) {
            (void)mechanism_->close_imported_allocation(made);
            throw;
        }
        return made;
    }

    static NxmemStatusCode slot_close_import(NxmemAllocatorVtable* table, const NxmemImport* raw,
                                             NxmemStatus* status) noexcept {
        return detail::run_slot(status, [&]() -> result<void> {
            allocator_object& object = self(table);
            NXMEM_TRY(described, abi::read_request(raw));
            NXMEM_TRY_VOID(object.check_identity(described.mechanism_id, described.device));
            typename std::unordered_map<std::uint64_t, import_record>::node_type taken;
            {
                std::lock_guard lock(object.prefix_mutex_);
                auto found = object.imports_.find(described.import_id);
                if (found == object.imports_.end()) {
                    return fail(status_code::unknown_allocation,
                                "no live import " + std::to_string(described.import_id) +
                                    " (closed already, or never imported here)");
                }
                const import_record& live = found->second;
                const bool same_memory = live.kind == NXMEM_IPC_PREFIX
                                             ? described.prefix.prefix_id == live.prefix_id
                                             : described.address == live.address;
                if (described.kind != live.kind || described.size != live.size ||
                    described.access != live.access || !same_memory) {
                    return fail(status_code::invalid_argument,
                                "import " + std::to_string(described.import_id) +
                                    " is misdescribed (kind, size, access, address or prefix)");
                }
                taken = object.imports_.extract(found);
            }
            const bool prefix_import = taken.mapped().kind == NXMEM_IPC_PREFIX;
            result<void> ended = object.end_import(std::move(taken));
            if (ended || prefix_import) { // a prefix import is over even if its reference was not
                this_module().live_imports.fetch_sub(1);
            }
            return ended;
        });
    }

    // Ends an import taken out of imports_; an allocation import that cannot be unmapped goes
    // back, still open (its node: putting it back allocates nothing).
    result<void> end_import(typename std::unordered_map<std::uint64_t, import_record>::node_type taken) {
        const import_record& record = taken.mapped();
        if constexpr (shares_prefixes<M>) {
            if (record.kind == NXMEM_IPC_PREFIX) {
                return drop_prefix_reference(record.prefix_id);
            }
        }
        if constexpr (shares_allocations<M>) {
            result<void> closed =
                mechanism_->close_imported_allocation({record.address, record.mapped_bytes});
            if (!closed) {
                std::lock_guard lock(prefix_mutex_);
                imports_.insert(std::move(taken));
            }
            return closed;
        }
        return boost::outcome_v2::success();
    }

    static constexpr NxmemIpcVtable make_ipc_table() noexcept {
        NxmemIpcVtable ipc{};
        ipc.struct_size = sizeof ipc;
        ipc.abi_minor = abi::ipc_minor;
        ipc.type_tag = NXMEM_TYPE_TAG_IPC;
        ipc.export_handle = &slot_export_handle;
        ipc.import_handle = &slot_import_handle;
        ipc.close_import = &slot_close_import;
        return ipc;
    }

    // Per allocator: the granularity may depend on the device or on the allocator's options.
    static NxmemVirtualBackingVtable make_virtual_backing_table(const M& mechanism,
                                                                std::uint32_t negotiated) noexcept {
        const std::uint32_t level = std::min<std::uint32_t>(2, negotiated);
        NxmemVirtualBackingVtable vb{};
        vb.struct_size = static_cast<std::uint32_t>(abi::bytes_required<NxmemVirtualBackingVtable>(level));
        vb.abi_minor = level;
        vb.type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
        vb.commit = &slot_commit;
        vb.decommit = &slot_decommit;
        vb.mapped_bytes = &slot_mapped_bytes;
        if (level >= 2) {
            if constexpr (states_commit_granularity<M>) {
                vb.commit_granularity = mechanism.commit_granularity();
            } else {
                vb.commit_granularity = nxmem::detail::system_page_bytes();
            }
        }
        return vb;
    }
    static constexpr NxmemSharedMappingVtable make_shared_mapping_table() noexcept {
        NxmemSharedMappingVtable sm{};
        sm.struct_size = sizeof sm;
        sm.abi_minor = NXMEM_ABI_MINOR_BASELINE;
        sm.type_tag = NXMEM_TYPE_TAG_SHARED_MAPPING;
        sm.create_shared_prefix = &slot_create_shared_prefix;
        sm.retain_shared_prefix = &slot_change_prefix_reference<&allocator_object::add_prefix_reference>;
        sm.release_shared_prefix = &slot_change_prefix_reference<&allocator_object::drop_prefix_reference>;
        sm.commit_shared_prefix = &slot_commit_shared_prefix;
        return sm;
    }

    struct queued_release {
        std::uint64_t ticket = 0;
        allocation_record record;
        std::vector<std::unique_ptr<pending_work>> fences; // not yet completed (minor 4)
    };

    detail::allocator_shell shell_{};
    NxmemVirtualBackingVtable virtual_backing_{}; // per allocator: its granularity is its own
    NxmemFencedReleaseVtable fenced_release_{};   // per allocator: the kinds it waits on
    NxmemCopyVtable copy_{};                      // per allocator: the streams it copies on
    std::atomic<std::uint32_t> references_{1};
    std::unique_ptr<M> mechanism_;
    host_link host_;
    device_id device_;
    allocation_registry registry_;
    // After the registry, whose records it counts: it leaves the module's list before they go.
    allocator_counts counts_{&registry_, [](const void* registry) noexcept {
                                 return static_cast<const allocation_registry*>(registry)->size();
                             }};
    std::mutex queue_mutex_;
    std::deque<queued_release> queue_;
    std::atomic<bool> draining_{false};
    std::mutex prefix_mutex_;
    // Per live prefix: its references, its size and cost, the allocations mapping it now,
    // whether any ever did (C8: only the first mapping in its lifetime costs it), and for an
    // imported one the bytes the import maps here (its cost is 0: the exporter pays, IP10).
    struct prefix_state {
        std::uint64_t references = 0;
        std::uint64_t size = 0;
        std::uint64_t cost = 0;
        std::uint64_t sharers = 0;
        bool ever_mapped = false;
        std::uint64_t imported_bytes = 0;
        bool read_only = false; // imported read-only: no copy into it (CP3)
    };
    std::unordered_map<std::uint64_t, prefix_state> prefix_references_;
    std::unordered_map<std::uint64_t, import_record> imports_; // by import id, under prefix_mutex_
};

} // namespace nxmem::plugin
