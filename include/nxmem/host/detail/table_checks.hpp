// Checks the host makes of every table a plugin hands over, after read_prefix: required slots
// present, capability flags and slots in agreement, identities as expected.
#pragma once

#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/page_size.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

namespace nxmem::host::detail {

// Whether the pointer-sized field `field` of `table` is non-NULL.
template <class T> bool slot_is_set(const T& table, const abi::field_info& field) noexcept {
    void* value = nullptr;
    std::memcpy(&value, reinterpret_cast<const unsigned char*>(&table) + field.offset, sizeof value);
    return value != nullptr;
}

// Every required slot up to the effective level is present.
template <abi::growable_table T> result<void> check_required_slots(const abi::table_copy<T>& copy) {
    for (const abi::field_info& field : abi::struct_traits<T>::fields) {
        if (field.role == abi::field_role::required_slot && field.since <= copy.effective_minor &&
            !slot_is_set(copy.table, field)) {
            return fail(status_code::contract_violation,
                        std::string(abi::struct_traits<T>::name) + ": required slot '" +
                            std::string(field.name) + "' is NULL");
        }
    }
    return boost::outcome_v2::success();
}

// Capability flags are versioned like slots (rules C3, C4, C7 of docs/ABI.md):
//  - a table declaring a minor newer than this header knows may carry flags this header does not
//    know: they are cleared in the local copy, as read_prefix drops slots it does not know;
//  - in a table declaring a minor this header knows, a bit no minor up to the declared one defines
//    is a contract violation;
//  - a flag above the effective level (the level both sides speak) is cleared in the copy;
//  - every remaining flag agrees with its slots and tables.
inline result<void> check_capabilities(abi::table_copy<NxmemAllocatorVtable>& copy) {
    NxmemAllocatorVtable& table = copy.table;
    constexpr std::uint32_t known = abi::known_minor<NxmemAllocatorVtable>();
    if (copy.declared_minor > known) {
        table.capabilities &= abi::capabilities_at_minor(known); // a newer minor's flags: not ours
    }
    if (const std::uint64_t unknown = table.capabilities & ~abi::capabilities_at_minor(known);
        unknown != 0) {
        return fail(status_code::contract_violation,
                    "NxmemAllocatorVtable: unknown capability bits 0x" + nxmem::detail::to_hex(unknown) +
                        ": no minor up to the declared one (" + std::to_string(copy.declared_minor) +
                        ") defines them");
    }
    for (const abi::capability_pair& pair : abi::allocator_capabilities) {
        if ((table.capabilities & pair.flag) != 0 && pair.since > copy.declared_minor) {
            return fail(status_code::contract_violation,
                        "NxmemAllocatorVtable: " + std::string(pair.flag_name) +
                            " is set but the table declares minor " +
                            std::to_string(copy.declared_minor) + ", which has no such flag (minor " +
                            std::to_string(pair.since) + " added it)");
        }
    }
    table.capabilities &= abi::capabilities_at_minor(copy.effective_minor);
    if ((table.capabilities & NXMEM_CAP_FENCED_RELEASE) != 0 &&
        (table.capabilities & NXMEM_CAP_DEFERRED_RELEASE) == 0) { // F2
        return fail(status_code::contract_violation,
                    "NxmemAllocatorVtable: NXMEM_CAP_FENCED_RELEASE is set without "
                    "NXMEM_CAP_DEFERRED_RELEASE: a fenced release retires through drain_releases");
    }
    for (const abi::capability_pair& pair : abi::allocator_capabilities) {
        const bool flagged = (table.capabilities & pair.flag) != 0;
        for (std::string_view name : pair.fields) {
            if (name.empty()) {
                continue; // a flag without slots (NXMEM_CAP_HOST_RECLAIM)
            }
            const abi::field_info& field = *abi::find_field<NxmemAllocatorVtable>(name);
            if (field.since > copy.effective_minor) {
                continue; // read_prefix dropped the slot; the flag was cleared above
            }
            const bool set = slot_is_set(table, field);
            if (flagged != set) {
                return fail(status_code::contract_violation,
                            "NxmemAllocatorVtable: " + std::string(pair.flag_name) + " is " +
                                (flagged ? "set" : "clear") + " but '" + std::string(name) +
                                "' is " + (set ? "non-NULL" : "NULL"));
            }
        }
    }
    return boost::outcome_v2::success();
}

// Defence in depth (rule S9): whether each slot a call is about to use is non-NULL in the host's
// copy of a table it accepted. The checks at open already guarantee it; a call that finds a NULL
// slot anyway answers UNSUPPORTED_CAPABILITY instead of jumping to address 0.
template <class Table, class... Slots>
bool slots_present(const Table& table, Slots Table::*... used) noexcept {
    return ((table.*used != nullptr) && ...);
}

// Reads a capability table the allocator points to and checks its required slots.
template <abi::growable_table T>
result<abi::table_copy<T>> read_capability_table(const T* untrusted, std::uint32_t negotiated_minor) {
    NXMEM_TRY(copy, abi::read_prefix<T>(untrusted, negotiated_minor));
    NXMEM_TRY_VOID(check_required_slots(copy));
    return copy;
}

// The fence kinds a minor-4 table lists (fence_kinds, stream_kinds), versioned like flags (F6):
// from a table declaring a newer minor the kinds this header does not know are cleared; in one
// declaring a minor it knows, a bit no kind of it names is a violation, and so is fence_kinds 0
// (a fenced release that can wait on nothing). stream_kinds 0 says: synchronous copies only.
template <abi::growable_table T>
result<std::uint64_t> checked_kinds(const abi::table_copy<T>& copy, std::uint64_t bits,
                                    std::string_view field, bool zero_allowed) {
    if (copy.declared_minor > abi::known_minor<T>()) {
        return bits & abi::known_fence_kinds;
    }
    if ((bits & ~abi::known_fence_kinds) != 0 || (bits == 0 && !zero_allowed)) {
        return fail(status_code::contract_violation,
                    std::string(abi::struct_traits<T>::name) + ": " + std::string(field) + " 0x" +
                        nxmem::detail::to_hex(bits) +
                        (bits == 0 ? " names no fence kind"
                                   : " names kinds no minor up to the declared one defines"));
    }
    return bits;
}

// The unit of commit and decommit a virtual-backing table states: from minor 2 on, its
// commit_granularity, which must be a power of two; before it, the host's page (rule G1, G2).
inline result<std::uint64_t> commit_granularity_of(const abi::table_copy<NxmemVirtualBackingVtable>& backing) {
    if (backing.effective_minor < 2) {
        return nxmem::detail::system_page_bytes();
    }
    const std::uint64_t granularity = backing.table.commit_granularity;
    if (!std::has_single_bit(granularity)) {
        return fail(status_code::contract_violation,
                    "NxmemVirtualBackingVtable: commit_granularity " + std::to_string(granularity) +
                        " is not a power of two");
    }
    return granularity;
}

// The release slot of a table the host refuses, if it can be located without trusting more of
// the table than its own struct_size: the host still owes the plugin that release.
inline NxmemReleaseFn locate_release_slot(const void* untrusted) noexcept {
    if (untrusted == nullptr ||
        reinterpret_cast<std::uintptr_t>(untrusted) % alignof(NxmemAllocatorVtable) != 0) {
        return nullptr;
    }
    const auto* bytes = static_cast<const unsigned char*>(untrusted);
    std::uint32_t size = 0;
    std::memcpy(&size, bytes, sizeof size);
    constexpr std::size_t end = offsetof(NxmemAllocatorVtable, release) + sizeof(NxmemReleaseFn);
    if (size < end || size > NXMEM_MAX_STRUCT_SIZE) {
        return nullptr;
    }
    std::uint32_t tag = 0;
    std::memcpy(&tag, bytes + offsetof(NxmemAllocatorVtable, type_tag), sizeof tag);
    if (tag != NXMEM_TYPE_TAG_ALLOCATOR) {
        return nullptr;
    }
    NxmemReleaseFn release = nullptr;
    std::memcpy(&release, bytes + offsetof(NxmemAllocatorVtable, release), sizeof release);
    return release;
}

} // namespace nxmem::host::detail
