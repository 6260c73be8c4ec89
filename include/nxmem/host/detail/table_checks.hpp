// Checks the host makes of every table a plugin hands over, after read_prefix: required slots
// present, capability flags and slots in agreement, identities as expected.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/detail/hex.hpp>

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

// Capability flags agree with their slots and tables. A flag whose slots all lie above the
// effective level is cleared in the local copy: the capability exists, just not at this level.
inline result<void> check_capabilities(abi::table_copy<NxmemAllocatorVtable>& copy) {
    NxmemAllocatorVtable& table = copy.table;
    if ((table.capabilities & ~NXMEM_CAP_ALL_V1) != 0) {
        return fail(status_code::contract_violation,
                    "NxmemAllocatorVtable: unknown capability bits 0x" +
                        nxmem::detail::to_hex(table.capabilities & ~NXMEM_CAP_ALL_V1));
    }
    for (const abi::capability_pair& pair : abi::allocator_capabilities) {
        const bool flagged = (table.capabilities & pair.flag) != 0;
        bool any_field = false;
        bool above_declared = true;
        bool above_effective = true;
        for (std::string_view name : pair.fields) {
            if (name.empty()) {
                continue;
            }
            const abi::field_info* field = abi::find_field<NxmemAllocatorVtable>(name);
            any_field = true;
            above_declared = above_declared && field->since > copy.declared_minor;
            above_effective = above_effective && field->since > copy.effective_minor;
        }
        if (!any_field) {
            continue; // a flag without slots (NXMEM_CAP_HOST_RECLAIM)
        }
        if (flagged && above_declared) {
            return fail(status_code::contract_violation,
                        "NxmemAllocatorVtable: " + std::string(pair.flag_name) +
                            " is set but the table declares minor " +
                            std::to_string(copy.declared_minor) + ", which has no slot for it");
        }
        if (above_effective) {
            table.capabilities &= ~pair.flag; // offered, but above the level both sides speak
            continue;
        }
        for (std::string_view name : pair.fields) {
            if (name.empty()) {
                continue;
            }
            const bool set = slot_is_set(table, *abi::find_field<NxmemAllocatorVtable>(name));
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

// Reads a capability table the allocator points to and checks its required slots.
template <abi::growable_table T>
result<abi::table_copy<T>> read_capability_table(const T* untrusted, std::uint32_t negotiated_minor) {
    NXMEM_TRY(copy, abi::read_prefix<T>(untrusted, negotiated_minor));
    NXMEM_TRY_VOID(check_required_slots(copy));
    return copy;
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
