// The one table of the C contract's layout: every struct, every field, the minor that added it and
// its role. Bytes required per minor, slot checks, capability pairs and the layout tests all derive
// from this table; the header's @layout/@field annotations are checked against it.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>

namespace nxmem::abi {

// What a field is for.
enum class field_role : std::uint8_t {
    header,           // struct_size, abi_minor, type_tag
    data,             // a value
    required_slot,    // a function pointer that must be non-NULL at every level
    optional_slot,    // a function pointer that may be NULL (capability absent)
    capability_table, // a pointer to an optional capability table
};

struct field_info {
    std::string_view name;
    std::size_t offset;
    std::size_t size;
    std::uint32_t since; // the minor that added the field
    field_role role;
};

// An optional capability: its flag, the minor that added the flag, and the fields that implement
// it (one or two).
struct capability_pair {
    std::string_view flag_name;
    std::uint64_t flag;
    std::uint32_t since;
    std::array<std::string_view, 2> fields; // unused entries are empty
};

// clang-format off
#define NXMEM_ABI_FIELDS_NxmemStatus(F) \
    F(struct_size, 0, header) F(code, 0, data) F(message, 0, data)
#define NXMEM_ABI_FIELDS_NxmemDeviceId(F) \
    F(struct_size, 0, header) F(device_type, 0, data) F(index, 0, data) F(reserved, 0, data)
#define NXMEM_ABI_FIELDS_NxmemAllocation(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(allocation_id, 0, data) F(address, 0, data) F(size, 0, data) F(alignment, 0, data)
#define NXMEM_ABI_FIELDS_NxmemAllocRequest(F) \
    F(struct_size, 0, header) F(flags, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(allocation_id, 0, data) F(size, 0, data) F(alignment, 0, data)
#define NXMEM_ABI_FIELDS_NxmemAllocResult(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(address, 0, data) F(size, 0, data) \
    F(mapped_bytes, 0, data)
#define NXMEM_ABI_FIELDS_NxmemByteRange(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(offset, 0, data) F(length, 0, data)
#define NXMEM_ABI_FIELDS_NxmemRangeRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(allocation, 0, data) F(range, 0, data)
#define NXMEM_ABI_FIELDS_NxmemReleaseOutcome(F) \
    F(struct_size, 0, header) F(state, 0, data) F(unmapped_bytes, 0, data) \
    F(residual_owned_bytes, 0, data)
#define NXMEM_ABI_FIELDS_NxmemReleaseCompletion(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(ticket, 0, data) F(mechanism_id, 0, data) \
    F(allocation_id, 0, data) F(outcome, 0, data)
#define NXMEM_ABI_FIELDS_NxmemReclaimRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(bytes_needed, 0, data)
#define NXMEM_ABI_FIELDS_NxmemUnloadReport(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(live_allocators, 0, data) \
    F(live_allocations, 0, data) F(live_views, 0, data) F(live_shared_prefixes, 0, data) \
    F(queued_releases, 0, data) F(live_imports, 3, data)
#define NXMEM_ABI_FIELDS_NxmemAllocatorUsage(F) \
    F(struct_size, 2, header) F(reserved, 2, data) F(live_allocations, 2, data) \
    F(reserved_bytes, 2, data) F(mapped_bytes, 2, data) F(shared_prefix_bytes, 2, data) \
    F(quarantined_bytes, 2, data) F(live_imports, 3, data) F(imported_bytes, 3, data)
#define NXMEM_ABI_FIELDS_NxmemSharedPrefixHandle(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(prefix_id, 0, data) F(size, 0, data)
#define NXMEM_ABI_FIELDS_NxmemSharedPrefixRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(size, 0, data)
#define NXMEM_ABI_FIELDS_NxmemSharedPrefixCommitRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(allocation, 0, data) F(prefix, 0, data)
#define NXMEM_ABI_FIELDS_NxmemSharedPrefixCommitInfo(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(shared_bytes, 0, data) \
    F(newly_mapped_bytes, 0, data) F(sharers, 0, data)
#define NXMEM_ABI_FIELDS_NxmemIpcHandle(F) \
    F(struct_size, 3, header) F(abi_minor, 3, data) F(mechanism_id, 3, data) F(device, 3, data) \
    F(kind, 3, data) F(access, 3, data) F(size, 3, data) F(fd_count, 3, data) F(fds, 3, data) \
    F(opaque_length, 3, data) F(opaque, 3, data)
#define NXMEM_ABI_FIELDS_NxmemExportRequest(F) \
    F(struct_size, 3, header) F(kind, 3, data) F(access, 3, data) F(reserved, 3, data) \
    F(allocation, 3, data) F(prefix, 3, data)
#define NXMEM_ABI_FIELDS_NxmemImportRequest(F) \
    F(struct_size, 3, header) F(access, 3, data) F(mechanism_id, 3, data) F(device, 3, data) \
    F(import_id, 3, data) F(handle, 3, data)
#define NXMEM_ABI_FIELDS_NxmemImport(F) \
    F(struct_size, 3, header) F(kind, 3, data) F(mechanism_id, 3, data) F(device, 3, data) \
    F(import_id, 3, data) F(address, 3, data) F(size, 3, data) F(access, 3, data) \
    F(reserved, 3, data) F(prefix, 3, data) F(mapped_bytes, 3, data)
#define NXMEM_ABI_FIELDS_NxmemFence(F) \
    F(struct_size, 4, header) F(kind, 4, data) F(device, 4, data) F(handle, 4, data) \
    F(value, 4, data)
#define NXMEM_ABI_FIELDS_NxmemFencedReleaseRequest(F) \
    F(struct_size, 4, header) F(fence_count, 4, data) F(allocation, 4, data) F(ticket, 4, data) \
    F(fences, 4, data) F(fence_stride, 4, data) F(reserved, 4, data)
#define NXMEM_ABI_FIELDS_NxmemCopyRequest(F) \
    F(struct_size, 4, header) F(direction, 4, data) F(target, 4, data) F(reserved, 4, data) \
    F(allocation, 4, data) F(prefix, 4, data) F(offset, 4, data) F(length, 4, data) \
    F(host_buffer, 4, data) F(stream, 4, data)
#define NXMEM_ABI_FIELDS_NxmemVersionRange(F) \
    F(struct_size, 0, header) F(major, 0, data) F(min_minor, 0, data) F(max_minor, 0, data)
#define NXMEM_ABI_FIELDS_NxmemNegotiateRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(host_range, 0, data)
#define NXMEM_ABI_FIELDS_NxmemNegotiateResponse(F) \
    F(struct_size, 0, header) F(major, 0, data) F(minor, 0, data) F(reserved, 0, data) \
    F(plugin_range, 0, data)
#define NXMEM_ABI_FIELDS_NxmemHostCallbacks(F) \
    F(struct_size, 0, header) F(abi_minor, 0, header) F(type_tag, 0, header) F(reserved, 0, data) \
    F(host_context, 0, data) F(request_reclaim, 0, optional_slot) \
    F(release_completed, 0, optional_slot)
#define NXMEM_ABI_FIELDS_NxmemOpenRequest(F) \
    F(struct_size, 0, header) F(reserved, 0, data) F(device, 0, data) F(callbacks, 0, data) \
    F(options, 0, data) F(options_length, 0, data)
#define NXMEM_ABI_FIELDS_NxmemVirtualBackingVtable(F) \
    F(struct_size, 0, header) F(abi_minor, 0, header) F(type_tag, 0, header) F(reserved, 0, data) \
    F(commit, 0, required_slot) F(decommit, 0, required_slot) F(mapped_bytes, 0, required_slot) \
    F(commit_granularity, 2, data)
#define NXMEM_ABI_FIELDS_NxmemSharedMappingVtable(F) \
    F(struct_size, 0, header) F(abi_minor, 0, header) F(type_tag, 0, header) F(reserved, 0, data) \
    F(create_shared_prefix, 0, required_slot) F(retain_shared_prefix, 0, required_slot) \
    F(release_shared_prefix, 0, required_slot) F(commit_shared_prefix, 0, required_slot)
#define NXMEM_ABI_FIELDS_NxmemIpcVtable(F) \
    F(struct_size, 3, header) F(abi_minor, 3, header) F(type_tag, 3, header) F(reserved, 3, data) \
    F(export_handle, 3, required_slot) F(import_handle, 3, required_slot) \
    F(close_import, 3, required_slot)
#define NXMEM_ABI_FIELDS_NxmemFencedReleaseVtable(F) \
    F(struct_size, 4, header) F(abi_minor, 4, header) F(type_tag, 4, header) F(reserved, 4, data) \
    F(enqueue_fenced_release, 4, required_slot) F(fence_kinds, 4, data)
#define NXMEM_ABI_FIELDS_NxmemCopyVtable(F) \
    F(struct_size, 4, header) F(abi_minor, 4, header) F(type_tag, 4, header) F(reserved, 4, data) \
    F(copy, 4, required_slot) F(stream_kinds, 4, data)
#define NXMEM_ABI_FIELDS_NxmemAllocatorVtable(F) \
    F(struct_size, 0, header) F(abi_minor, 0, header) F(type_tag, 0, header) F(reserved, 0, data) \
    F(capabilities, 0, data) F(mechanism_id, 0, data) F(device, 0, data) \
    F(allocate, 0, required_slot) F(deallocate, 0, required_slot) F(retain, 0, required_slot) \
    F(release, 0, required_slot) F(virtual_backing, 0, capability_table) \
    F(shared_mapping, 0, capability_table) F(enqueue_release, 0, optional_slot) \
    F(drain_releases, 0, optional_slot) F(release_allocation, 1, optional_slot) \
    F(query_usage, 2, optional_slot) F(ipc, 3, capability_table) \
    F(fenced_release, 4, capability_table) F(copy, 4, capability_table)
#define NXMEM_ABI_FIELDS_NxmemAllocatorFactoryVtable(F) \
    F(struct_size, 0, header) F(abi_minor, 0, header) F(type_tag, 0, header) F(reserved, 0, data) \
    F(name, 0, data) F(mechanism_id, 0, data) F(device_types, 0, data) \
    F(open_allocator, 0, required_slot) F(release, 0, required_slot)

// Every struct of the contract, in header order, with its type tag (0 for plain records).
#define NXMEM_ABI_STRUCTS(S) \
    S(NxmemStatus, 0) S(NxmemDeviceId, 0) S(NxmemAllocation, 0) S(NxmemAllocRequest, 0) \
    S(NxmemAllocResult, 0) S(NxmemByteRange, 0) S(NxmemRangeRequest, 0) \
    S(NxmemReleaseOutcome, 0) S(NxmemReleaseCompletion, 0) S(NxmemReclaimRequest, 0) \
    S(NxmemUnloadReport, 0) S(NxmemAllocatorUsage, 0) S(NxmemSharedPrefixHandle, 0) S(NxmemSharedPrefixRequest, 0) \
    S(NxmemSharedPrefixCommitRequest, 0) S(NxmemSharedPrefixCommitInfo, 0) \
    S(NxmemIpcHandle, 0) S(NxmemExportRequest, 0) S(NxmemImportRequest, 0) S(NxmemImport, 0) \
    S(NxmemFence, 0) S(NxmemFencedReleaseRequest, 0) S(NxmemCopyRequest, 0) \
    S(NxmemVersionRange, 0) S(NxmemNegotiateRequest, 0) S(NxmemNegotiateResponse, 0) \
    S(NxmemHostCallbacks, NXMEM_TYPE_TAG_HOST_CALLBACKS) S(NxmemOpenRequest, 0) \
    S(NxmemVirtualBackingVtable, NXMEM_TYPE_TAG_VIRTUAL_BACKING) \
    S(NxmemSharedMappingVtable, NXMEM_TYPE_TAG_SHARED_MAPPING) \
    S(NxmemIpcVtable, NXMEM_TYPE_TAG_IPC) \
    S(NxmemFencedReleaseVtable, NXMEM_TYPE_TAG_FENCED_RELEASE) \
    S(NxmemCopyVtable, NXMEM_TYPE_TAG_COPY) \
    S(NxmemAllocatorVtable, NXMEM_TYPE_TAG_ALLOCATOR) \
    S(NxmemAllocatorFactoryVtable, NXMEM_TYPE_TAG_ALLOCATOR_FACTORY)
// clang-format on

template <class T> struct struct_traits; // defined for every contract struct below

#define NXMEM_ABI_FIELD_INFO(field, minor, role_name)                                             \
    field_info{#field, offsetof(type, field), sizeof(type::field), minor, field_role::role_name},
#define NXMEM_ABI_DEFINE_TRAITS(Struct, tag)                                                       \
    template <> struct struct_traits<Struct> {                                                     \
        using type = Struct;                                                                       \
        static constexpr std::string_view name = #Struct;                                          \
        static constexpr std::uint32_t type_tag = tag;                                             \
        static constexpr std::array fields{NXMEM_ABI_FIELDS_##Struct(NXMEM_ABI_FIELD_INFO)};       \
    };
NXMEM_ABI_STRUCTS(NXMEM_ABI_DEFINE_TRAITS)
#undef NXMEM_ABI_DEFINE_TRAITS
#undef NXMEM_ABI_FIELD_INFO

namespace detail {
template <class List> struct drop_first;
template <class First, class... Rest> struct drop_first<std::tuple<First, Rest...>> {
    using type = std::tuple<Rest...>;
};
} // namespace detail

#define NXMEM_ABI_STRUCT_TYPE(Struct, tag) , Struct
// Every contract struct as a type list, for tests and tools that visit them all.
using all_structs =
    typename detail::drop_first<std::tuple<void NXMEM_ABI_STRUCTS(NXMEM_ABI_STRUCT_TYPE)>>::type;
#undef NXMEM_ABI_STRUCT_TYPE

// A table that can grow: it carries abi_minor at offset 4 and a type tag at offset 8.
template <class T>
concept growable_table = struct_traits<T>::type_tag != 0;

// The highest minor any field of T was added in: the level this header knows for T.
template <class T> constexpr std::uint32_t known_minor() noexcept {
    std::uint32_t minor = 0;
    for (const field_info& field : struct_traits<T>::fields) {
        minor = field.since > minor ? field.since : minor;
    }
    return minor;
}

// The minor that introduced T: the oldest level any field of T belongs to.
template <class T> constexpr std::uint32_t introduced_minor() noexcept {
    std::uint32_t minor = struct_traits<T>::fields[0].since;
    for (const field_info& field : struct_traits<T>::fields) {
        minor = field.since < minor ? field.since : minor;
    }
    return minor;
}

// The bytes a sender at `minor` must provide: the end of the last field of that level (not
// sizeof, which adds padding). A minor above what this header knows requires at least as much as
// the newest level it knows, since every newer struct is a strict superset.
template <class T> constexpr std::size_t bytes_required(std::uint32_t minor) noexcept {
    std::size_t end = 0;
    for (const field_info& field : struct_traits<T>::fields) {
        if (field.since <= minor && field.offset + field.size > end) {
            end = field.offset + field.size;
        }
    }
    return end;
}

// The bytes of T as it was introduced: the smallest struct_size any receiver or sender may use.
template <class T> constexpr std::size_t baseline_bytes() noexcept {
    return bytes_required<T>(introduced_minor<T>());
}

// The field of T called `name`, or nullptr.
template <class T> constexpr const field_info* find_field(std::string_view name) noexcept {
    for (const field_info& field : struct_traits<T>::fields) {
        if (field.name == name) {
            return &field;
        }
    }
    return nullptr;
}

// Optional capabilities of the allocator table: each flag, its minor, and the slots or table behind it.
inline constexpr std::array<capability_pair, 9> allocator_capabilities{{
    {"NXMEM_CAP_VIRTUAL_BACKING", NXMEM_CAP_VIRTUAL_BACKING, 0, {"virtual_backing", ""}},
    {"NXMEM_CAP_SHARED_MAPPING", NXMEM_CAP_SHARED_MAPPING, 0, {"shared_mapping", ""}},
    {"NXMEM_CAP_DEFERRED_RELEASE", NXMEM_CAP_DEFERRED_RELEASE, 0, {"enqueue_release", "drain_releases"}},
    {"NXMEM_CAP_STRUCTURED_RELEASE", NXMEM_CAP_STRUCTURED_RELEASE, 1, {"release_allocation", ""}},
    {"NXMEM_CAP_HOST_RECLAIM", NXMEM_CAP_HOST_RECLAIM, 0, {"", ""}},
    {"NXMEM_CAP_USAGE_QUERY", NXMEM_CAP_USAGE_QUERY, 2, {"query_usage", ""}},
    {"NXMEM_CAP_IPC", NXMEM_CAP_IPC, 3, {"ipc", ""}},
    {"NXMEM_CAP_FENCED_RELEASE", NXMEM_CAP_FENCED_RELEASE, 4, {"fenced_release", ""}},
    {"NXMEM_CAP_COPY", NXMEM_CAP_COPY, 4, {"copy", ""}},
}};

// The capability flags defined at or below `minor` (by this header's knowledge): what a sender may
// set at that negotiated minor, and what a reader knows of a table declaring it.
constexpr std::uint64_t capabilities_at_minor(std::uint32_t minor) noexcept {
    std::uint64_t flags = 0;
    for (const capability_pair& pair : allocator_capabilities) {
        flags |= pair.since <= minor ? pair.flag : 0;
    }
    return flags;
}
static_assert(capabilities_at_minor(0) == NXMEM_CAP_ALL_V1_0);
static_assert(capabilities_at_minor(1) == NXMEM_CAP_ALL_V1_1);
static_assert(capabilities_at_minor(2) == NXMEM_CAP_ALL_V1_2);
static_assert(capabilities_at_minor(3) == NXMEM_CAP_ALL_V1_3);
static_assert(capabilities_at_minor(4) == NXMEM_CAP_ALL_V1_4);
static_assert(capabilities_at_minor(NXMEM_ABI_MINOR) == NXMEM_CAP_ALL_V1);
static_assert(NXMEM_CAPS_AT_MINOR(0u) == NXMEM_CAP_ALL_V1_0 && NXMEM_CAPS_AT_MINOR(1u) == NXMEM_CAP_ALL_V1_1 &&
              NXMEM_CAPS_AT_MINOR(2u) == NXMEM_CAP_ALL_V1_2 &&
              NXMEM_CAPS_AT_MINOR(3u) == NXMEM_CAP_ALL_V1_3 &&
              NXMEM_CAPS_AT_MINOR(4u) == NXMEM_CAP_ALL_V1_4 && NXMEM_CAPS_AT_MINOR(7u) == NXMEM_CAP_ALL_V1);

} // namespace nxmem::abi
