// A test fixture plugin (never installed, never bundled): mechanisms that each break, or make
// visible, exactly one rule of docs/ABI.md that the test plugin's well-behaved mechanisms cannot
// show, for test/host/contract_rules_test.cpp. Selected by name. Its three exports are written out by
// hand around the kit's, to count how the host calls them (V4) and to fail the readiness report on
// request (U4); test-only exports read the counters. Built like every plugin (nxmem_plugin_dep).
#include <nxmem/plugin.hpp>

#include "../support/host_heap.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

namespace {

using nxmem::fail;
using nxmem::result;
using nxmem::status_code;
using nxmem::plugin::allocation_record;
using nxmem::plugin::block;
using nxmem::plugin::open_context;
using nxmem::plugin::release_outcome;
using nxmem::test::give_back_host_memory;
using nxmem::test::take_host_memory;

constexpr std::uint64_t cpu_only = nxmem::plugin::device_bit(NXMEM_DEVICE_CPU);
constexpr std::uint64_t page_bytes = 4096;

// What the host did, as this module saw it (read through the test-only exports below).
struct probe_counters {
    std::atomic<std::uint64_t> negotiate_calls{0};
    std::atomic<std::uint64_t> calls_before_negotiate{0}; // any other export called first
    std::atomic<std::uint64_t> factory_capacity{0};       // what the host passed
    std::atomic<std::uint32_t> readiness_failure{NXMEM_STATUS_OK};
    std::atomic<std::uint64_t> deallocate_calls{0};
    std::atomic<std::uint64_t> release_allocation_calls{0};
    std::atomic<void (*)(void*)> enqueue_hook{nullptr};
    std::atomic<void*> enqueue_hook_context{nullptr};
    std::atomic<std::uint64_t> release_only_calls{0}; // release-only's release_allocation
    std::atomic<bool> release_only_fails{false};       // ... reports FAILED while set
};
probe_counters counters;


// Eager heap memory: what most probes allocate, so that only the rule they probe differs.
struct heap_allocation {
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(address, take_host_memory(size, alignment));
        return block{address, size, size};
    }
};
struct heap_memory : heap_allocation {
    result<void> deallocate(const allocation_record& record) {
        give_back_host_memory(record);
        return boost::outcome_v2::success();
    }
};

// Hands out more than asked (whole pages), as a real allocator rounding up does; counts which
// release slot the host used. Q12: the host describes the allocation with the size it asked for.
struct rounding_mechanism {
    static constexpr const char* name = "rounding";
    static constexpr std::uint64_t mechanism_id = 1;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<rounding_mechanism>> open(open_context&) {
        return std::make_unique<rounding_mechanism>();
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t usable = (size + page_bytes - 1) / page_bytes * page_bytes;
        NXMEM_TRY(address, take_host_memory(usable, alignment));
        return block{address, usable, usable};
    }
    result<void> deallocate(const allocation_record& record) {
        counters.deallocate_calls.fetch_add(1);
        give_back_host_memory(record);
        return boost::outcome_v2::success();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        counters.release_allocation_calls.fetch_add(1);
        give_back_host_memory(record);
        return release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
    }
};

// One page of memory, handed out whenever it is free: every allocation has the same address.
// M3: ids are the host's, never derived from the address.
struct one_slot_mechanism {
    static constexpr const char* name = "one-slot";
    static constexpr std::uint64_t mechanism_id = 2;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<one_slot_mechanism>> open(open_context&) {
        return std::make_unique<one_slot_mechanism>();
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        if (size > sizeof slot_ || alignment > page_bytes || taken_.exchange(true)) {
            return fail(status_code::out_of_memory, "one-slot has one page and it is taken");
        }
        return block{reinterpret_cast<std::uint64_t>(&slot_), size, size};
    }
    result<void> deallocate(const allocation_record&) {
        taken_.store(false);
        return boost::outcome_v2::success();
    }

private:
    alignas(page_bytes) unsigned char slot_[page_bytes]{};
    std::atomic<bool> taken_{false};
};

// Quarantines every structured release (keeps it all) and then hands the quarantined address out
// again once, breaking "a quarantined address is never reissued" (RO3): the host must refuse it.
struct reissuing_mechanism : heap_memory {
    static constexpr const char* name = "reissuing";
    static constexpr std::uint64_t mechanism_id = 3;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<reissuing_mechanism>> open(open_context&) {
        return std::make_unique<reissuing_mechanism>();
    }
    reissuing_mechanism() = default;
    reissuing_mechanism(const reissuing_mechanism&) = delete;
    reissuing_mechanism& operator=(const reissuing_mechanism&) = delete;
    ~reissuing_mechanism() {
        for (const allocation_record& record : quarantined_) {
            give_back_host_memory(record);
        }
    }
    result<block> allocate(std::uint64_t size, std::uint64_t alignment) {
        std::lock_guard lock(mutex_);
        if (!quarantined_.empty() && quarantined_.back().size >= size &&
            quarantined_.back().alignment >= alignment) {
            const allocation_record reissued = quarantined_.back();
            quarantined_.pop_back(); // from now on deallocate frees it
            return block{reissued.address, size, size};
        }
        return heap_memory::allocate(size, alignment);
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        quarantined_.push_back(record);
        return release_outcome{NXMEM_RELEASE_QUARANTINED, 0, record.size};
    }

private:
    std::mutex mutex_;
    std::vector<allocation_record> quarantined_;
};

// Deferred releases that retire with a state other than COMPLETE (D5): `State` is reported on
// every completion, and the memory is kept until the allocator goes (as quarantine means).
template <class Self, std::uint64_t Id, NxmemReleaseState State>
struct keeping_deferred_mechanism : heap_memory {
    static constexpr std::uint64_t mechanism_id = Id;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<Self>> open(open_context&) { return std::make_unique<Self>(); }
    keeping_deferred_mechanism() = default;
    keeping_deferred_mechanism(const keeping_deferred_mechanism&) = delete;
    keeping_deferred_mechanism& operator=(const keeping_deferred_mechanism&) = delete;
    ~keeping_deferred_mechanism() {
        for (const allocation_record& record : kept_) {
            give_back_host_memory(record);
        }
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        std::lock_guard lock(mutex_);
        kept_.push_back(record);
        const std::uint64_t kept = record.size - record.size / 2;
        return std::optional<release_outcome>{release_outcome{State, record.size / 2, kept}};
    }

private:
    std::mutex mutex_;
    std::vector<allocation_record> kept_;
};
struct quarantining_deferred_mechanism
    : keeping_deferred_mechanism<quarantining_deferred_mechanism, 4, NXMEM_RELEASE_QUARANTINED> {
    static constexpr const char* name = "quarantining-deferred";
};
struct future_state_deferred_mechanism
    : keeping_deferred_mechanism<future_state_deferred_mechanism, 5, 7> {
    static constexpr const char* name = "future-state-deferred";
};

// Retires every queued release, and on the way reports a completion the host cannot match (D6):
// a ticket it never issued, or a completion too short to be one.
template <class Self, std::uint64_t Id, bool Malformed> struct bad_completion_mechanism : heap_memory {
    static constexpr std::uint64_t mechanism_id = Id;
    static constexpr std::uint64_t device_types = cpu_only;
    static constexpr std::uint64_t unknown_ticket = 1ull << 60;

    explicit bad_completion_mechanism(const open_context& context) : host_(context.host) {}
    static result<std::unique_ptr<Self>> open(open_context& context) {
        return std::make_unique<Self>(context);
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        auto completion = nxmem::abi::make_struct<NxmemReleaseCompletion>();
        completion.ticket = unknown_ticket;
        completion.mechanism_id = Id;
        completion.allocation_id = record.allocation_id;
        completion.outcome = nxmem::abi::make_struct<NxmemReleaseOutcome>();
        if (Malformed) {
            completion.struct_size = 8; // below the baseline: no receiver may read it
        }
        host_.release_completed(completion);
        give_back_host_memory(record);
        return std::optional<release_outcome>{release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0}};
    }

private:
    nxmem::plugin::host_link host_;
};
struct unknown_ticket_mechanism : bad_completion_mechanism<unknown_ticket_mechanism, 6, false> {
    static constexpr const char* name = "unknown-ticket-completion";
    using bad_completion_mechanism::bad_completion_mechanism;
};
struct malformed_completion_mechanism : bad_completion_mechanism<malformed_completion_mechanism, 7, true> {
    static constexpr const char* name = "malformed-completion";
    using bad_completion_mechanism::bad_completion_mechanism;
};

// ---- raw mechanisms: a kit allocator whose table is then altered in exactly one way ----

// The allocator the raw mechanisms start from: eager, with deferred release.
template <std::uint64_t Id> struct base_mechanism : heap_memory {
    static constexpr const char* name = "base";
    static constexpr std::uint64_t mechanism_id = Id;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<base_mechanism>> open(open_context&) {
        return std::make_unique<base_mechanism>();
    }
    result<std::optional<release_outcome>> retire(const allocation_record& record) {
        give_back_host_memory(record);
        return std::optional<release_outcome>{release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0}};
    }
};

// A raw mechanism that opens a base allocator and lets Self::alter change its table before the
// host sees it. The kit's own slots stay reachable through `original` (the same for every
// allocator of the mechanism: the tests open one at a time).
template <class Self, std::uint64_t Id> struct altered_mechanism {
    static constexpr std::uint64_t mechanism_id = Id;
    static constexpr std::uint64_t device_types = cpu_only;
    static constexpr std::uint32_t abi_minor = 0;
    static inline NxmemAllocatorVtable original{};

    static NxmemStatusCode open_raw(const NxmemOpenRequest* request, NxmemAllocatorVtable** out,
                                    NxmemStatus* status) {
        return nxmem::plugin::detail::run_slot(status, [&]() -> result<void> {
            if (request == nullptr || out == nullptr) {
                return fail(status_code::invalid_argument, "open request or output is NULL");
            }
            NXMEM_TRY(table, nxmem::plugin::allocator_object<base_mechanism<Id>>::open(*request));
            original = *table;
            Self::alter(*table);
            *out = table;
            return boost::outcome_v2::success();
        });
    }
};

// M6: the table names another mechanism than its factory.
struct foreign_id_mechanism : altered_mechanism<foreign_id_mechanism, 20> {
    static constexpr const char* name = "foreign-id-table";
    static void alter(NxmemAllocatorVtable& table) { table.mechanism_id = 99; }
};

// M6: the table names another device than the one asked for.
struct foreign_device_mechanism : altered_mechanism<foreign_device_mechanism, 21> {
    static constexpr const char* name = "foreign-device-table";
    static void alter(NxmemAllocatorVtable& table) { table.device.index += 1; }
};

// S2: capability tables with a required slot left NULL, published behind their flags.
NxmemStatusCode never_called_range(NxmemAllocatorVtable*, const NxmemRangeRequest*, NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
NxmemStatusCode never_called_prefix(NxmemAllocatorVtable*, const NxmemSharedPrefixHandle*, NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
NxmemStatusCode never_called_create(NxmemAllocatorVtable*, const NxmemSharedPrefixRequest*,
                                    NxmemSharedPrefixHandle*, NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
constexpr NxmemVirtualBackingVtable backing_without_mapped_bytes = [] {
    NxmemVirtualBackingVtable table{};
    table.struct_size = static_cast<std::uint32_t>(nxmem::abi::bytes_required<NxmemVirtualBackingVtable>(0));
    table.type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
    table.commit = &never_called_range;
    table.decommit = &never_called_range;
    table.mapped_bytes = nullptr; // the fault
    return table;
}();
constexpr NxmemSharedMappingVtable mapping_without_commit = [] {
    NxmemSharedMappingVtable table{};
    table.struct_size = static_cast<std::uint32_t>(nxmem::abi::bytes_required<NxmemSharedMappingVtable>(0));
    table.type_tag = NXMEM_TYPE_TAG_SHARED_MAPPING;
    table.create_shared_prefix = &never_called_create;
    table.retain_shared_prefix = &never_called_prefix;
    table.release_shared_prefix = &never_called_prefix;
    table.commit_shared_prefix = nullptr; // the fault
    return table;
}();

struct null_backing_slot_mechanism : altered_mechanism<null_backing_slot_mechanism, 22> {
    static constexpr const char* name = "null-virtual-backing-slot";
    static void alter(NxmemAllocatorVtable& table) {
        table.capabilities |= NXMEM_CAP_VIRTUAL_BACKING;
        table.virtual_backing = &backing_without_mapped_bytes;
    }
};
struct null_mapping_slot_mechanism : altered_mechanism<null_mapping_slot_mechanism, 23> {
    static constexpr const char* name = "null-shared-mapping-slot";
    static void alter(NxmemAllocatorVtable& table) {
        table.capabilities |= NXMEM_CAP_SHARED_MAPPING;
        table.shared_mapping = &mapping_without_commit;
    }
};

// R13: an ipc table (introduced at minor 3) that fills its three minor-3 slots but declares a
// minor below 3, behind an allocator table declaring minor 3 with NXMEM_CAP_IPC (issue 31: it was
// accepted, read as "ipc 1.0" with every slot NULL, and the first ipc call jumped to address 0).
NxmemStatusCode never_called_export(NxmemAllocatorVtable*, const NxmemExportRequest*, NxmemIpcHandle*,
                                    NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
NxmemStatusCode never_called_import(NxmemAllocatorVtable*, const NxmemImportRequest*, NxmemImport*,
                                    NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
NxmemStatusCode never_called_close(NxmemAllocatorVtable*, const NxmemImport*, NxmemStatus* status) {
    return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR, "never called");
}
template <std::uint32_t Declared> constexpr NxmemIpcVtable ipc_declaring = [] {
    NxmemIpcVtable table{};
    table.struct_size = sizeof(NxmemIpcVtable); // covers minor 3: only the level is wrong
    table.abi_minor = Declared;
    table.type_tag = NXMEM_TYPE_TAG_IPC;
    table.export_handle = &never_called_export;
    table.import_handle = &never_called_import;
    table.close_import = &never_called_close;
    return table;
}();
template <class Self, std::uint64_t Id, std::uint32_t Declared>
struct ipc_below_introduction_mechanism : altered_mechanism<Self, Id> {
    static void alter(NxmemAllocatorVtable& table) {
        table.struct_size = static_cast<std::uint32_t>(nxmem::abi::bytes_required<NxmemAllocatorVtable>(3));
        table.abi_minor = 3;
        table.capabilities |= NXMEM_CAP_IPC;
        table.ipc = &ipc_declaring<Declared>;
    }
};
struct ipc_minor_0_mechanism : ipc_below_introduction_mechanism<ipc_minor_0_mechanism, 31, 0> {
    static constexpr const char* name = "ipc-declaring-minor-0";
};
struct ipc_minor_2_mechanism : ipc_below_introduction_mechanism<ipc_minor_2_mechanism, 32, 2> {
    static constexpr const char* name = "ipc-declaring-minor-2";
};
struct ipc_minor_3_mechanism : ipc_below_introduction_mechanism<ipc_minor_3_mechanism, 33, 3> {
    static constexpr const char* name = "ipc-declaring-minor-3"; // the control: accepted
};

// E3: the returned code is authoritative over NxmemStatus::code, both ways.
struct ok_with_error_status_mechanism : altered_mechanism<ok_with_error_status_mechanism, 24> {
    static constexpr const char* name = "ok-with-error-status";
    static NxmemStatusCode allocate(NxmemAllocatorVtable* self, const NxmemAllocRequest* request,
                                    NxmemAllocResult* out, NxmemStatus* status) noexcept {
        const NxmemStatusCode code = original.allocate(self, request, out, status);
        (void)nxmem::abi::write_status(status, NXMEM_STATUS_OUT_OF_MEMORY,
                                       "a stale message; the returned code says OK");
        return code;
    }
    static void alter(NxmemAllocatorVtable& table) { table.allocate = &allocate; }
};
struct error_with_ok_status_mechanism : altered_mechanism<error_with_ok_status_mechanism, 25> {
    static constexpr const char* name = "error-with-ok-status";
    static NxmemStatusCode allocate(NxmemAllocatorVtable*, const NxmemAllocRequest*,
                                    NxmemAllocResult*, NxmemStatus* status) noexcept {
        (void)nxmem::abi::write_status(status, NXMEM_STATUS_OK, "error-with-ok-status is out of memory");
        return NXMEM_STATUS_OUT_OF_MEMORY;
    }
    static void alter(NxmemAllocatorVtable& table) { table.allocate = &allocate; }
};

// Q11: an allocation result the host must refuse. The kit allocates for real; the result is then
// altered, and a deallocate naming the altered address is mapped back, so the host's hand-back
// (deallocate) really frees the memory and the module's count shows it.
enum class result_fault { null_address, misaligned, short_size };
template <class Self, std::uint64_t Id, result_fault Fault>
struct bad_result_mechanism : altered_mechanism<Self, Id> {
    using altered_mechanism<Self, Id>::original;
    static inline std::atomic<std::uint64_t> real_address{0};
    static inline std::atomic<std::uint64_t> altered_address{0};

    static NxmemStatusCode allocate(NxmemAllocatorVtable* self, const NxmemAllocRequest* request,
                                    NxmemAllocResult* out, NxmemStatus* status) noexcept {
        const NxmemStatusCode code = original.allocate(self, request, out, status);
        if (code == NXMEM_STATUS_OK) {
            real_address.store(out->address);
            switch (Fault) {
            case result_fault::null_address: out->address = 0; break;
            case result_fault::misaligned: out->address += 8; break; // asked for 64
            case result_fault::short_size: out->size -= 1; break;
            }
            altered_address.store(out->address);
        }
        return code;
    }
    static NxmemStatusCode deallocate(NxmemAllocatorVtable* self, const NxmemAllocation* described,
                                      NxmemStatus* status) noexcept {
        NxmemAllocation mapped_back = *described;
        if (mapped_back.address == altered_address.load()) {
            mapped_back.address = real_address.load();
        }
        return original.deallocate(self, &mapped_back, status);
    }
    static void alter(NxmemAllocatorVtable& table) {
        table.allocate = &allocate;
        table.deallocate = &deallocate;
    }
};
struct null_address_mechanism
    : bad_result_mechanism<null_address_mechanism, 26, result_fault::null_address> {
    static constexpr const char* name = "null-address-result";
};
struct misaligned_mechanism : bad_result_mechanism<misaligned_mechanism, 27, result_fault::misaligned> {
    static constexpr const char* name = "misaligned-result";
};
struct short_result_mechanism : bad_result_mechanism<short_result_mechanism, 28, result_fault::short_size> {
    static constexpr const char* name = "short-result";
};

// D2: every enqueue fails, after calling the test's hook (which looks at the host's tally while
// the call is in progress).
struct failing_enqueue_mechanism : altered_mechanism<failing_enqueue_mechanism, 29> {
    static constexpr const char* name = "failing-enqueue";
    static NxmemStatusCode enqueue(NxmemAllocatorVtable*, const NxmemAllocation*, std::uint64_t,
                                   NxmemStatus* status) noexcept {
        if (void (*hook)(void*) = counters.enqueue_hook.load(); hook != nullptr) {
            hook(counters.enqueue_hook_context.load());
        }
        return nxmem::abi::write_status(status, NXMEM_STATUS_INTERNAL_ERROR,
                                        "failing-enqueue refuses every enqueue");
    }
    static void alter(NxmemAllocatorVtable& table) { table.enqueue_release = &enqueue; }
};

// S7: defines release_allocation and no deallocate; the kit's deallocate slot forwards to it.
// Reports FAILED while NxmemProbeFailReleaseOnly(true) is in force.
struct release_only_mechanism : heap_allocation {
    static constexpr const char* name = "release-only";
    static constexpr std::uint64_t mechanism_id = 30;
    static constexpr std::uint64_t device_types = cpu_only;

    static result<std::unique_ptr<release_only_mechanism>> open(open_context&) {
        return std::make_unique<release_only_mechanism>();
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        counters.release_only_calls.fetch_add(1);
        if (counters.release_only_fails.load()) {
            return release_outcome{NXMEM_RELEASE_FAILED, 0, 0};
        }
        give_back_host_memory(record);
        return release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
    }
};
static_assert(!nxmem::plugin::defines_deallocate<release_only_mechanism>);
static_assert(nxmem::plugin::mechanism<release_only_mechanism>);

using exports = nxmem::plugin::plugin_exports<
    rounding_mechanism, one_slot_mechanism, reissuing_mechanism, quarantining_deferred_mechanism,
    future_state_deferred_mechanism, unknown_ticket_mechanism, malformed_completion_mechanism,
    foreign_id_mechanism, foreign_device_mechanism, null_backing_slot_mechanism,
    null_mapping_slot_mechanism, ok_with_error_status_mechanism, error_with_ok_status_mechanism,
    null_address_mechanism, misaligned_mechanism, short_result_mechanism, failing_enqueue_mechanism,
    release_only_mechanism, ipc_minor_0_mechanism, ipc_minor_2_mechanism, ipc_minor_3_mechanism>;

void note_call_before_negotiate() {
    if (counters.negotiate_calls.load() == 0) {
        counters.calls_before_negotiate.fetch_add(1);
    }
}

} // namespace

// The three exports: the kit's, counted.
extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest* request,
                                                              NxmemNegotiateResponse* response,
                                                              NxmemStatus* status) {
    counters.negotiate_calls.fetch_add(1);
    return exports::negotiate(request, response, status);
}
extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(
    NxmemAllocatorFactoryVtable** factories, uint32_t capacity, uint32_t* count, NxmemStatus* status) {
    note_call_before_negotiate();
    counters.factory_capacity.store(capacity);
    return exports::create_factories(factories, capacity, count, status);
}
extern "C" NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport* report,
                                                                         NxmemStatus* status) {
    note_call_before_negotiate();
    if (const std::uint32_t code = counters.readiness_failure.load(); code != NXMEM_STATUS_OK) {
        return nxmem::abi::write_status(status, code,
                                        "the readiness report fails on request (NxmemProbeFailReadiness)");
    }
    return exports::query_unload_readiness(report, status);
}

// Test-only exports.
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeNegotiateCalls() {
    return counters.negotiate_calls.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeCallsBeforeNegotiate() {
    return counters.calls_before_negotiate.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeFactoryCapacity() {
    return counters.factory_capacity.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeDeallocateCalls() {
    return counters.deallocate_calls.load();
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeReleaseAllocationCalls() {
    return counters.release_allocation_calls.load();
}
// Makes NxmemQueryUnloadReadiness fail with `code` (NXMEM_STATUS_OK: succeed again).
extern "C" NXMEM_PLUGIN_EXPORT void NxmemProbeFailReadiness(std::uint32_t code) {
    counters.readiness_failure.store(code);
}
// Called from inside failing-enqueue's enqueue_release, before it fails.
extern "C" NXMEM_PLUGIN_EXPORT void NxmemProbeSetEnqueueHook(void (*hook)(void*), void* context) {
    counters.enqueue_hook_context.store(context);
    counters.enqueue_hook.store(hook);
}
extern "C" NXMEM_PLUGIN_EXPORT std::uint64_t NxmemProbeReleaseOnlyCalls() {
    return counters.release_only_calls.load();
}
// Makes release-only's release_allocation report FAILED (true) or release (false).
extern "C" NXMEM_PLUGIN_EXPORT void NxmemProbeFailReleaseOnly(bool fails) {
    counters.release_only_fails.store(fails);
}
