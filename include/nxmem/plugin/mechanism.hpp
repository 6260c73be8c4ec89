// What a C++ mechanism class provides to the plugin kit. The kit builds the C tables from it:
// optional capabilities are detected by these concepts, so a capability flag and its slots can
// never disagree, and the table's abi_minor follows from the slots actually filled.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>
#include <nxmem/concepts/shared_mapping.hpp>
#include <nxmem/device.hpp>
#include <nxmem/plugin/fences.hpp>
#include <nxmem/plugin/host_link.hpp>
#include <nxmem/plugin/options.hpp>
#include <nxmem/usage.hpp>

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace nxmem::plugin {

constexpr std::uint64_t device_bit(NxmemDeviceType type) noexcept { return 1ull << type; }

// What a mechanism learns when an allocator opens. It must take every option it understands;
// the kit refuses the open if any option is left untaken.
struct open_context {
    std::uint64_t mechanism_id;
    device_id device;
    plugin::options& options;
    const host_link& host;
    const char* mechanism_name = ""; // M::name, for messages
};

// Memory a mechanism handed out: `size` usable bytes (at least those asked for) and what the
// allocation costs now (ABI.md Q17): the memory it holds, whole pages or granules if it takes them
// (so possibly more than `size`) when eager, 0 when only reserved.
struct block {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t mapped_bytes = 0;
};

// A live allocation as the kit recorded it; handed back to the mechanism on every later call,
// after the kit has checked the host's description against it. `prefixes` lists the shared
// prefixes mapped into it, on every call (commit, decommit, mapped_bytes, commit_shared_prefix
// and the releases); copying a non-empty list is the only allocation that mapping costs a call.
struct allocation_record {
    std::uint64_t address = 0;
    std::uint64_t size = 0; // as requested
    std::uint64_t alignment = 0;
    std::uint64_t allocation_id = 0;
    std::vector<std::uint64_t> prefixes; // shared prefixes mapped into it, by id
    // The block's size, what the kit counts as reserved bytes; 0 (or anything below `size`)
    // stands for `size`.
    std::uint64_t usable_size = 0;
};

// How a release ended, as a mechanism reports it. `state` is any NxmemReleaseState; a mechanism
// may report a state from a later contract level (the host reads it as quarantine).
struct release_outcome {
    NxmemReleaseState state = NXMEM_RELEASE_COMPLETE;
    std::uint64_t unmapped_bytes = 0;
    std::uint64_t residual_owned_bytes = 0;
};

// The concepts below take members with exactly the documented signatures: a member whose
// parameter or return types differ (allocate(std::uint64_t, std::uint32_t), which would truncate
// alignments of 2^32 and more) does not satisfy its concept, even where a call would compile.
// A member is matched by converting its address to the member-function type the kit calls
// (a `noexcept` member converts too; an overload set is matched by its exact overload).
template <class M, class Signature> using member_function = Signature M::*;

// "the mechanism has a name, a non-zero id and the device types it serves"
template <class M>
concept mechanism_identity = requires {
    { M::name } -> std::convertible_to<const char*>;
    { M::mechanism_id } -> std::convertible_to<std::uint64_t>;
    { M::device_types } -> std::convertible_to<std::uint64_t>;
};

// A mechanism that builds its allocator table by hand (the test plugin's malformed tables).
template <class M>
concept raw_mechanism = mechanism_identity<M> &&
    requires(const NxmemOpenRequest* request, NxmemAllocatorVtable** out, NxmemStatus* status) {
        { M::abi_minor } -> std::convertible_to<std::uint32_t>;
        { M::open_raw(request, out, status) } -> std::same_as<NxmemStatusCode>;
    };

// "the mechanism opens one instance per allocator:
//  static result<std::unique_ptr<M>> open(open_context&)"
template <class M>
concept mechanism_opens = requires {
    static_cast<result<std::unique_ptr<M>> (*)(open_context&)>(&M::open);
};

// "the mechanism allocates: result<block> allocate(std::uint64_t size, std::uint64_t alignment)"
template <class M>
concept mechanism_allocates = requires {
    static_cast<member_function<M, result<block>(std::uint64_t, std::uint64_t)>>(&M::allocate);
};

// "the mechanism releases an allocation without reporting how:
//  result<void> deallocate(const allocation_record&)"
template <class M>
concept defines_deallocate = requires {
    static_cast<member_function<M, result<void>(const allocation_record&)>>(&M::deallocate);
};

// "the mechanism releases an allocation and reports how it ended:
//  result<release_outcome> release_allocation(const allocation_record&)"
template <class M>
concept defines_release_allocation = requires {
    static_cast<member_function<M, result<release_outcome>(const allocation_record&)>>(
        &M::release_allocation);
};

// "the mechanism opens per allocator, allocates, and releases": by deallocate, by
// release_allocation, or both. A mechanism with release_allocation alone gets the deallocate slot
// from the kit, which forwards to it (a FAILED outcome is a failed deallocate).
template <class M>
concept mechanism = mechanism_identity<M> && mechanism_opens<M> && mechanism_allocates<M> &&
    (defines_deallocate<M> || defines_release_allocation<M>);

// What NXMEM_EXPORT_PLUGIN publishes: a mechanism, or a raw_mechanism with a hand-built table.
template <class M>
concept exportable_mechanism = mechanism<M> || raw_mechanism<M>;

// NXMEM_CAP_VIRTUAL_BACKING: commit, decommit, mapped_bytes.
template <class M>
concept offers_virtual_backing = mechanism<M> && requires {
    static_cast<member_function<M, result<void>(const allocation_record&, byte_range)>>(&M::commit);
    static_cast<member_function<M, result<void>(const allocation_record&, byte_range)>>(&M::decommit);
    static_cast<member_function<M, result<std::uint64_t>(const allocation_record&)>>(&M::mapped_bytes);
};

// commit_shared_prefix either reports the commit itself (result<prefix_commit>) or leaves it to the
// kit (result<void>): the kit knows each prefix's size, whether it was ever mapped and how many
// allocations map it now, and answers C8's shared_bytes, newly_mapped_bytes and sharers.
template <class M>
concept commit_reports_prefix_cost = requires {
    static_cast<member_function<M, result<prefix_commit>(const allocation_record&, std::uint64_t)>>(
        &M::commit_shared_prefix);
};
template <class M>
concept commit_leaves_prefix_cost_to_kit = requires {
    static_cast<member_function<M, result<void>(const allocation_record&, std::uint64_t)>>(
        &M::commit_shared_prefix);
};

// NXMEM_CAP_SHARED_MAPPING: prefixes named by a mechanism-chosen id. The kit counts references
// (the creator's, each retain, and one per mapping) and calls destroy_shared_prefix when the last
// one goes. commit_shared_prefix maps the prefix at the start of the allocation; the mechanism's
// deallocate (and release_allocation, retire) undo an allocation's mappings before returning.
template <class M>
concept offers_shared_mapping = mechanism<M> &&
    (commit_reports_prefix_cost<M> || commit_leaves_prefix_cost_to_kit<M>) && requires {
        static_cast<member_function<M, result<std::uint64_t>(std::uint64_t)>>(&M::create_shared_prefix);
        static_cast<member_function<M, void(std::uint64_t)>>(&M::destroy_shared_prefix);
    };

// A mechanism whose queued releases retire at the next drain, through its release_allocation:
// `static constexpr bool retires_through_release_allocation = true;` instead of a retire member.
template <class M>
concept retires_through_release_allocation = defines_release_allocation<M> && requires {
    requires M::retires_through_release_allocation;
};

// NXMEM_CAP_DEFERRED_RELEASE: a queued allocation retires when `retire` returns an outcome;
// nullopt means "not yet" and keeps it (and everything queued after it) in the queue.
template <class M>
concept defines_retire = requires {
    static_cast<member_function<M, result<std::optional<release_outcome>>(const allocation_record&)>>(
        &M::retire);
};
template <class M>
concept offers_deferred_release = mechanism<M> &&
    (defines_retire<M> || retires_through_release_allocation<M>);

// NXMEM_CAP_STRUCTURED_RELEASE (minor 1): a release that reports its outcome.
template <class M>
concept offers_structured_release = mechanism<M> && defines_release_allocation<M>;

// NXMEM_CAP_USAGE_QUERY (minor 2): the mechanism reports what one allocator holds now, either
// whole (`usage()`) or completing what the kit counts (`usage(allocator_usage counted)`: the kit
// fills live_allocations and reserved_bytes (their blocks' sizes), queued releases included,
// shared_prefix_bytes, each live prefix at its cost, live_imports and imported_bytes; the
// mechanism adds mapped and quarantined bytes, and may replace any field). Either may be const.
template <class M>
concept usage_counts_everything = requires {
    static_cast<member_function<M, result<allocator_usage>()>>(&M::usage);
} || requires {
    static_cast<member_function<M, result<allocator_usage>() const>>(&M::usage);
};
template <class M>
concept usage_completes_kit_counts = requires {
    static_cast<member_function<M, result<allocator_usage>(allocator_usage)>>(&M::usage);
} || requires {
    static_cast<member_function<M, result<allocator_usage>(allocator_usage) const>>(&M::usage);
};
template <class M>
concept offers_usage_query =
    mechanism<M> && (usage_counts_everything<M> || usage_completes_kit_counts<M>);

// NXMEM_CAP_IPC (minor 3): shared prefixes, allocations, or both, exported to and imported from
// other processes. The kit reads and checks the untrusted handle's form, identity and access
// (abi/ipc_handle.hpp) and fills its header; the mechanism writes the descriptors (new, owned by
// the caller) and its opaque bytes, and on import checks what only it can (descriptors, opaque
// bytes, a replay). A kind the mechanism has no members for is UNSUPPORTED_CAPABILITY.
//
// Prefixes: import_shared_prefix makes a local prefix the kit then counts like a created one, its
// one reference the import's. Its bytes are the importer's imported bytes, never its
// shared_prefix_bytes.
struct imported_prefix {
    std::uint64_t prefix_id = 0;
    std::uint64_t mapped_bytes = 0; // what the import maps in this process
};
template <class M>
concept shares_prefixes = offers_shared_mapping<M> &&
    requires(M& instance, std::uint64_t prefix_id, std::uint32_t access, NxmemIpcHandle& out,
             const NxmemIpcHandle& handle) {
        { instance.export_shared_prefix(prefix_id, access, out) } -> std::same_as<result<void>>;
        { instance.import_shared_prefix(handle, access) } -> std::same_as<result<imported_prefix>>;
    };

// Allocations: export_allocation gets the live allocation's record (checked against the host's
// description); import_allocation maps the memory and returns where, and the bytes it maps (the
// importer's imported bytes: the mechanism's usage() reports them); close_imported_allocation
// unmaps it (the kit calls it for each import still open when the allocator goes). An imported
// allocation is not an allocation of the importer: it is in no registry and costs no budget.
struct imported_allocation {
    std::uint64_t address = 0;
    std::uint64_t mapped_bytes = 0; // what the import maps in this process
};
template <class M>
concept shares_allocations = mechanism<M> &&
    requires(M& instance, const allocation_record& record, std::uint32_t access, NxmemIpcHandle& out,
             const NxmemIpcHandle& handle, const imported_allocation& imported) {
        { instance.export_allocation(record, access, out) } -> std::same_as<result<void>>;
        { instance.import_allocation(handle, access) } -> std::same_as<result<imported_allocation>>;
        { instance.close_imported_allocation(imported) } -> std::same_as<result<void>>;
    };

template <class M>
concept offers_ipc = shares_prefixes<M> || shares_allocations<M>;

// A mechanism whose sharing depends on what an allocator finds when it opens (a driver entry
// point, a device's handle type) says so per allocator: `ipc_available()` false clears
// NXMEM_CAP_IPC in that allocator's table and leaves its ipc table NULL.
template <class M>
concept decides_ipc_at_open = offers_ipc<M> && requires {
    static_cast<member_function<M, bool() const>>(&M::ipc_available);
};
template <class M> bool ipc_available_in(const M& mechanism) {
    if constexpr (decides_ipc_at_open<M>) {
        return mechanism.ipc_available();
    } else {
        return true;
    }
}

// Minor 2's commit granularity of a virtual-backing mechanism, per allocator (a device's
// granularity, huge pages). Without it the kit states the system page size.
template <class M>
concept states_commit_granularity = offers_virtual_backing<M> && requires {
    static_cast<member_function<M, std::uint64_t() const>>(&M::commit_granularity);
};

// NXMEM_CAP_FENCED_RELEASE (minor 4): a queued release that retires only after its fences have
// completed, through the same queue, in enqueue order (retire is asked only then). A mechanism
// opts in with `static constexpr bool accepts_host_timeline_fences = true;` (the kit waits on
// HOST_TIMELINE fences itself), with the pair below for other kinds, or both.
template <class M>
concept accepts_host_timeline_fences = requires {
    requires M::accepts_host_timeline_fences;
};
// The hook for device fences: `watched_fence_kinds()` says which kinds (bits 1 << kind; the
// HOST_TIMELINE bit is the kit's and ignored here), and `watch_fence` turns one checked fence of
// those kinds into pending work the kit polls at each drain (a CUDA stream fence: an event recorded
// on the stream now, queried by poll). Called while the release is enqueued, before the allocation
// leaves the registry; a failure refuses the release and nothing is queued.
template <class M>
concept watches_fences = requires {
    static_cast<member_function<M, result<std::unique_ptr<pending_work>>(const fence&)>>(&M::watch_fence);
    static_cast<member_function<M, std::uint64_t() const>>(&M::watched_fence_kinds);
};
template <class M>
concept offers_fenced_release =
    offers_deferred_release<M> && (accepts_host_timeline_fences<M> || watches_fences<M>);

// The fence kinds one allocator of M waits on (fence_kinds of its table).
template <class M> std::uint64_t fence_kinds_of(const M& mechanism) {
    std::uint64_t kinds = 0;
    if constexpr (accepts_host_timeline_fences<M>) {
        kinds |= abi::fence_kind_bit(NXMEM_FENCE_HOST_TIMELINE);
    }
    if constexpr (watches_fences<M>) {
        kinds |= mechanism.watched_fence_kinds() & abi::known_fence_kinds &
                 ~abi::fence_kind_bit(NXMEM_FENCE_HOST_TIMELINE);
    }
    return kinds;
}

// NXMEM_CAP_COPY (minor 4): copies between memory and the host, after the kit has checked the
// request (form, identity, range, liveness, committed memory, write access). Allocations:
// `result<void> copy(const allocation_record&, const copy_job&)`; shared prefixes (the mechanism's
// own or imported): `result<void> copy_prefix(std::uint64_t prefix_id, const copy_job&)`.
template <class M>
concept copies_allocations = mechanism<M> && requires {
    static_cast<member_function<M, result<void>(const allocation_record&, const copy_job&)>>(&M::copy);
};
template <class M>
concept copies_prefixes = offers_shared_mapping<M> && requires {
    static_cast<member_function<M, result<void>(std::uint64_t, const copy_job&)>>(&M::copy_prefix);
};
// A virtual-backing mechanism that copies allocations says which ranges are committed
// (`bool range_committed(const allocation_record&, byte_range) const`, a mapped prefix's pages
// included): the kit refuses a copy over memory that is not before the mechanism is called.
template <class M>
concept tells_committed_ranges = requires {
    static_cast<member_function<M, bool(const allocation_record&, byte_range) const>>(&M::range_committed);
};
template <class M>
concept offers_copy = (copies_allocations<M> && (!offers_virtual_backing<M> || tells_committed_ranges<M>)) ||
    copies_prefixes<M>;
// Asynchronous copies: `std::uint64_t copy_stream_kinds() const`, the fence kinds accepted as a
// copy's stream (stream_kinds of the table). Without it every copy is synchronous and a request
// with a stream is refused (UNSUPPORTED_CAPABILITY).
template <class M>
concept copies_on_streams = requires {
    static_cast<member_function<M, std::uint64_t() const>>(&M::copy_stream_kinds);
};
template <class M> std::uint64_t copy_stream_kinds_of(const M& mechanism) {
    if constexpr (copies_on_streams<M>) {
        return mechanism.copy_stream_kinds() & abi::known_fence_kinds;
    } else {
        return 0;
    }
}

// NXMEM_CAP_HOST_RECLAIM: the mechanism may call the host's request_reclaim.
template <class M>
concept uses_host_reclaim = mechanism<M> && requires {
    requires M::uses_host_reclaim;
};

// Asserts that M is a mechanism, one requirement at a time, so that the compiler's message names
// the class (in the instantiation it reports) and the member missing or mistyped. Optional
// members that are declared but do not match their signature fail too: a capability is never
// silently absent because of a typo in a parameter type. NXMEM_EXPORT_PLUGIN calls it for each
// class it publishes (a raw_mechanism is checked only for its identity and open_raw).
template <class M> constexpr bool assert_mechanism() {
    static_assert(requires { M::name; },
                  "a mechanism has a name: `static constexpr const char* name = \"...\";`");
    static_assert(requires { M::mechanism_id; },
                  "a mechanism has an id: `static constexpr std::uint64_t mechanism_id = <non-zero>;`");
    static_assert(requires { M::device_types; },
                  "a mechanism names its device types: `static constexpr std::uint64_t device_types = "
                  "device_bit(NXMEM_DEVICE_CPU) | ...;`");
    static_assert(!requires {
        M::name;
        M::mechanism_id;
        M::device_types;
    } || mechanism_identity<M>,
                  "a mechanism's name converts to const char*, its mechanism_id and device_types to "
                  "std::uint64_t");
    static_assert(mechanism_opens<M>,
                  "a mechanism opens one instance per allocator: `static result<std::unique_ptr<M>> "
                  "open(open_context&)`, exactly (missing, or a parameter or return type differs)");
    static_assert(mechanism_allocates<M>,
                  "a mechanism allocates: `result<block> allocate(std::uint64_t size, std::uint64_t "
                  "alignment)`, exactly (missing, or a parameter or return type differs)");
    static_assert(defines_deallocate<M> || defines_release_allocation<M>,
                  "a mechanism releases: `result<void> deallocate(const allocation_record&)` and/or "
                  "`result<release_outcome> release_allocation(const allocation_record&)`, exactly");
    static_assert(!requires { &M::deallocate; } || defines_deallocate<M>,
                  "deallocate is declared but is not `result<void> deallocate(const "
                  "allocation_record&)`");
    static_assert(!requires { &M::release_allocation; } || defines_release_allocation<M>,
                  "release_allocation is declared but is not `result<release_outcome> "
                  "release_allocation(const allocation_record&)`");
    static_assert((!requires { &M::commit; } && !requires { &M::decommit; } &&
                   !requires { &M::mapped_bytes; }) ||
                      offers_virtual_backing<M>,
                  "virtual backing is declared in part or with other signatures: it takes all of "
                  "`result<void> commit(const allocation_record&, byte_range)`, `result<void> "
                  "decommit(const allocation_record&, byte_range)` and `result<std::uint64_t> "
                  "mapped_bytes(const allocation_record&)`");
    static_assert((!requires { &M::create_shared_prefix; } &&
                   !requires { &M::commit_shared_prefix; } &&
                   !requires { &M::destroy_shared_prefix; }) ||
                      offers_shared_mapping<M>,
                  "shared mapping is declared in part or with other signatures: it takes all of "
                  "`result<std::uint64_t> create_shared_prefix(std::uint64_t size)`, "
                  "`result<prefix_commit> (or result<void>) commit_shared_prefix(const "
                  "allocation_record&, std::uint64_t prefix_id)` and `void "
                  "destroy_shared_prefix(std::uint64_t prefix_id)`");
    static_assert(!requires { &M::retire; } || defines_retire<M>,
                  "retire is declared but is not `result<std::optional<release_outcome>> retire(const "
                  "allocation_record&)`");
    static_assert(!requires { M::retires_through_release_allocation; } ||
                      retires_through_release_allocation<M>,
                  "retires_through_release_allocation needs `result<release_outcome> "
                  "release_allocation(const allocation_record&)`");
    static_assert(!requires { &M::usage; } || usage_counts_everything<M> ||
                      usage_completes_kit_counts<M>,
                  "usage is declared but is neither `result<allocator_usage> usage()` nor "
                  "`result<allocator_usage> usage(allocator_usage counted)` (either may be const)");
    static_assert(!requires { &M::ipc_available; } || decides_ipc_at_open<M>,
                  "ipc_available is declared but is not `bool ipc_available() const` on a mechanism "
                  "that shares across processes");
    static_assert(!requires { &M::commit_granularity; } || states_commit_granularity<M>,
                  "commit_granularity is declared but is not `std::uint64_t commit_granularity() "
                  "const` on a mechanism with virtual backing");
    static_assert((!requires { &M::export_allocation; } && !requires { &M::import_allocation; } &&
                   !requires { &M::close_imported_allocation; }) ||
                      shares_allocations<M>,
                  "sharing allocations across processes is declared in part or with other "
                  "signatures: it takes all of `result<void> export_allocation(const "
                  "allocation_record&, std::uint32_t access, NxmemIpcHandle&)`, "
                  "`result<imported_allocation> import_allocation(const NxmemIpcHandle&, "
                  "std::uint32_t access)` and `result<void> close_imported_allocation(const "
                  "imported_allocation&)`");
    static_assert(!requires { &M::copy; } ||
                      (copies_allocations<M> && (!offers_virtual_backing<M> || tells_committed_ranges<M>)),
                  "copy is declared but is not `result<void> copy(const allocation_record&, const "
                  "copy_job&)`, or the mechanism has virtual backing and no `bool range_committed(const "
                  "allocation_record&, byte_range) const`");
    static_assert(!requires { &M::copy_prefix; } || copies_prefixes<M>,
                  "copy_prefix is declared but is not `result<void> copy_prefix(std::uint64_t "
                  "prefix_id, const copy_job&)` on a mechanism with shared mapping");
    static_assert(!requires { &M::copy_stream_kinds; } || (copies_on_streams<M> && offers_copy<M>),
                  "copy_stream_kinds is declared but is not `std::uint64_t copy_stream_kinds() const` "
                  "on a mechanism that copies");
    static_assert((!requires { &M::watch_fence; } && !requires { &M::watched_fence_kinds; }) ||
                      (watches_fences<M> && offers_deferred_release<M>),
                  "fences are watched in part or with other signatures: it takes both of "
                  "`result<std::unique_ptr<pending_work>> watch_fence(const fence&)` and "
                  "`std::uint64_t watched_fence_kinds() const`, on a mechanism with deferred release");
    static_assert(!requires { M::accepts_host_timeline_fences; } ||
                      (accepts_host_timeline_fences<M> && offers_deferred_release<M>),
                  "accepts_host_timeline_fences needs deferred release (retire, or "
                  "retires_through_release_allocation)");
    return mechanism<M>;
}

// The same for every class NXMEM_EXPORT_PLUGIN publishes.
template <class M> constexpr bool assert_exportable() {
    if constexpr (raw_mechanism<M>) {
        return true;
    } else {
        return assert_mechanism<M>();
    }
}

template <mechanism M> constexpr NxmemCapabilities capabilities_of() noexcept {
    NxmemCapabilities flags = 0;
    flags |= offers_virtual_backing<M> ? NXMEM_CAP_VIRTUAL_BACKING : 0;
    flags |= offers_shared_mapping<M> ? NXMEM_CAP_SHARED_MAPPING : 0;
    flags |= offers_deferred_release<M> ? NXMEM_CAP_DEFERRED_RELEASE : 0;
    flags |= offers_structured_release<M> ? NXMEM_CAP_STRUCTURED_RELEASE : 0;
    flags |= uses_host_reclaim<M> ? NXMEM_CAP_HOST_RECLAIM : 0;
    flags |= offers_usage_query<M> ? NXMEM_CAP_USAGE_QUERY : 0;
    flags |= offers_ipc<M> ? NXMEM_CAP_IPC : 0;
    flags |= offers_fenced_release<M> ? NXMEM_CAP_FENCED_RELEASE : 0;
    flags |= offers_copy<M> ? NXMEM_CAP_COPY : 0;
    return flags;
}

// The level a mechanism's allocator table declares at most: the newest slot it fills. The kit
// declares less when the host negotiated less (a sender uses nothing above the negotiated minor).
template <class M> constexpr std::uint32_t declared_minor_of() noexcept {
    if constexpr (raw_mechanism<M>) {
        return M::abi_minor;
    } else {
        return offers_fenced_release<M> || offers_copy<M> ? 4u
               : offers_ipc<M>                 ? 3u
               : offers_usage_query<M>         ? 2u
               : offers_structured_release<M> ? 1u
                                               : 0u;
    }
}

} // namespace nxmem::plugin
