// What a C++ mechanism class provides to the plugin kit. The kit builds the C tables from it:
// optional capabilities are detected by these concepts, so a capability flag and its slots can
// never disagree, and the table's abi_minor follows from the slots actually filled.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>
#include <nxmem/concepts/shared_mapping.hpp>
#include <nxmem/device.hpp>
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
};

// Memory a mechanism handed out: `size` usable bytes (at least those asked for) and the bytes
// that cost memory now (`size` when eager, 0 when only reserved).
struct block {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t mapped_bytes = 0;
};

// A live allocation as the kit recorded it; handed back to the mechanism on every later call,
// after the kit has checked the host's description against it.
struct allocation_record {
    std::uint64_t address = 0;
    std::uint64_t size = 0; // as requested
    std::uint64_t alignment = 0;
    std::uint64_t allocation_id = 0;
    std::vector<std::uint64_t> prefixes; // shared prefixes mapped into it, by id
};

// How a release ended, as a mechanism reports it. `state` is any NxmemReleaseState; a mechanism
// may report a state from a later contract level (the host reads it as quarantine).
struct release_outcome {
    NxmemReleaseState state = NXMEM_RELEASE_COMPLETE;
    std::uint64_t unmapped_bytes = 0;
    std::uint64_t residual_owned_bytes = 0;
};

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

// "the mechanism releases an allocation without reporting how"
template <class M>
concept defines_deallocate = requires(M& instance, const allocation_record& record) {
    { instance.deallocate(record) } -> std::same_as<result<void>>;
};

// "the mechanism releases an allocation and reports how it ended"
template <class M>
concept defines_release_allocation = requires(M& instance, const allocation_record& record) {
    { instance.release_allocation(record) } -> std::same_as<result<release_outcome>>;
};

// "the mechanism opens per allocator, allocates, and releases": by deallocate, by
// release_allocation, or both. A mechanism with release_allocation alone gets the deallocate slot
// from the kit, which forwards to it (a FAILED outcome is a failed deallocate).
template <class M>
concept mechanism = mechanism_identity<M> &&
    (defines_deallocate<M> || defines_release_allocation<M>) &&
    requires(open_context& context, M& instance, std::uint64_t size, std::uint64_t alignment) {
        { M::open(context) } -> std::same_as<result<std::unique_ptr<M>>>;
        { instance.allocate(size, alignment) } -> std::same_as<result<block>>;
    };

// NXMEM_CAP_VIRTUAL_BACKING: commit, decommit, mapped_bytes.
template <class M>
concept offers_virtual_backing = mechanism<M> &&
    requires(M& instance, const allocation_record& record, byte_range range) {
        { instance.commit(record, range) } -> std::same_as<result<void>>;
        { instance.decommit(record, range) } -> std::same_as<result<void>>;
        { instance.mapped_bytes(record) } -> std::same_as<result<std::uint64_t>>;
    };

// NXMEM_CAP_SHARED_MAPPING: prefixes named by a mechanism-chosen id. The kit counts references
// (the creator's, each retain, and one per mapping) and calls destroy_shared_prefix when the last
// one goes. commit_shared_prefix maps the prefix at the start of the allocation; the mechanism's
// deallocate (and release_allocation, retire) undo an allocation's mappings before returning.
template <class M>
concept offers_shared_mapping = mechanism<M> &&
    requires(M& instance, std::uint64_t size, std::uint64_t prefix_id,
             const allocation_record& record) {
        { instance.create_shared_prefix(size) } -> std::same_as<result<std::uint64_t>>;
        { instance.commit_shared_prefix(record, prefix_id) } -> std::same_as<result<prefix_commit>>;
        { instance.destroy_shared_prefix(prefix_id) } -> std::same_as<void>;
    };

// NXMEM_CAP_DEFERRED_RELEASE: a queued allocation retires when `retire` returns an outcome;
// nullopt means "not yet" and keeps it (and everything queued after it) in the queue.
template <class M>
concept offers_deferred_release = mechanism<M> &&
    requires(M& instance, const allocation_record& record) {
        { instance.retire(record) } -> std::same_as<result<std::optional<release_outcome>>>;
    };

// NXMEM_CAP_STRUCTURED_RELEASE (minor 1): a release that reports its outcome.
template <class M>
concept offers_structured_release = mechanism<M> && defines_release_allocation<M>;

// NXMEM_CAP_USAGE_QUERY (minor 2): the mechanism reports what one allocator holds now.
template <class M>
concept offers_usage_query = mechanism<M> && requires(M& instance) {
    { instance.usage() } -> std::same_as<result<allocator_usage>>;
};

// NXMEM_CAP_IPC (minor 3): shared prefixes exported to and imported from other processes. The kit
// reads and checks the untrusted handle's form, identity and access (abi/ipc_handle.hpp) and fills
// its header; export_shared_prefix writes the descriptors (new, owned by the caller) and opaque
// bytes; import_shared_prefix checks what only the mechanism can (descriptors, opaque bytes, a
// replay) and makes a local prefix the kit then counts like a created one, its one reference the
// import's. Its bytes are the importer's imported bytes, never its shared_prefix_bytes.
struct imported_prefix {
    std::uint64_t prefix_id = 0;
    std::uint64_t mapped_bytes = 0; // what the import maps in this process
};
template <class M>
concept offers_ipc = offers_shared_mapping<M> &&
    requires(M& instance, std::uint64_t prefix_id, std::uint32_t access, NxmemIpcHandle& out,
             const NxmemIpcHandle& handle) {
        { instance.export_shared_prefix(prefix_id, access, out) } -> std::same_as<result<void>>;
        { instance.import_shared_prefix(handle, access) } -> std::same_as<result<imported_prefix>>;
    };

// Minor 2's commit granularity of a virtual-backing mechanism, per allocator (a device's
// granularity, huge pages). Without it the kit states the system page size.
template <class M>
concept states_commit_granularity = offers_virtual_backing<M> && requires(const M& instance) {
    { instance.commit_granularity() } -> std::convertible_to<std::uint64_t>;
};

// NXMEM_CAP_HOST_RECLAIM: the mechanism may call the host's request_reclaim.
template <class M>
concept uses_host_reclaim = mechanism<M> && requires {
    requires M::uses_host_reclaim;
};

template <mechanism M> constexpr NxmemCapabilities capabilities_of() noexcept {
    NxmemCapabilities flags = 0;
    flags |= offers_virtual_backing<M> ? NXMEM_CAP_VIRTUAL_BACKING : 0;
    flags |= offers_shared_mapping<M> ? NXMEM_CAP_SHARED_MAPPING : 0;
    flags |= offers_deferred_release<M> ? NXMEM_CAP_DEFERRED_RELEASE : 0;
    flags |= offers_structured_release<M> ? NXMEM_CAP_STRUCTURED_RELEASE : 0;
    flags |= uses_host_reclaim<M> ? NXMEM_CAP_HOST_RECLAIM : 0;
    flags |= offers_usage_query<M> ? NXMEM_CAP_USAGE_QUERY : 0;
    flags |= offers_ipc<M> ? NXMEM_CAP_IPC : 0;
    return flags;
}

// The level a mechanism's allocator table declares at most: the newest slot it fills. The kit
// declares less when the host negotiated less (a sender uses nothing above the negotiated minor).
template <class M> constexpr std::uint32_t declared_minor_of() noexcept {
    if constexpr (raw_mechanism<M>) {
        return M::abi_minor;
    } else {
        return offers_ipc<M>                   ? 3u
               : offers_usage_query<M>         ? 2u
               : offers_structured_release<M> ? 1u
                                               : 0u;
    }
}

} // namespace nxmem::plugin
