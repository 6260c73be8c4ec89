// read_prefix<T>: the only way to read a table the other side handed over. It reads at most
// struct_size bytes, refuses a sender that contradicts itself (or declares a level its kind did not
// exist at), and clamps the level to what both sides agreed, writing the clamped level only into
// the local copy.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace nxmem::abi {

// A bounded local copy of a table and what was learned reading it.
template <growable_table T> struct table_copy {
    T table{};                        // zeroed beyond what was read; slots above `effective_minor` NULL
    std::uint32_t struct_size = 0;    // as the sender declared it
    std::uint32_t declared_minor = 0; // as the sender declared it
    std::uint32_t effective_minor = 0; // min(declared, negotiated, known); also in table.abi_minor
};

inline constexpr std::size_t table_header_bytes = 3 * sizeof(std::uint32_t);

template <growable_table T>
result<table_copy<T>> read_prefix(const void* untrusted, std::uint32_t negotiated_minor) {
    using traits = struct_traits<T>;
    // The name is copied into a message only on failure: a valid table is read without allocating.
    const std::string_view what(traits::name);
    // 1. Null and misaligned pointers.
    if (untrusted == nullptr) {
        return fail(status_code::contract_violation, std::string(what) + ": table pointer is NULL");
    }
    if (reinterpret_cast<std::uintptr_t>(untrusted) % alignof(T) != 0) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": table pointer is not aligned to " + std::to_string(alignof(T)));
    }
    // 2. struct_size first; abi_minor and the type tag only if struct_size covers them.
    const auto* bytes = static_cast<const unsigned char*>(untrusted);
    table_copy<T> copy;
    std::memcpy(&copy.struct_size, bytes, sizeof(std::uint32_t));
    if (copy.struct_size < table_header_bytes) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": struct_size " + std::to_string(copy.struct_size) +
                        " does not cover the table header (12 bytes)");
    }
    std::uint32_t type_tag = 0;
    std::memcpy(&copy.declared_minor, bytes + 4, sizeof(std::uint32_t));
    std::memcpy(&type_tag, bytes + 8, sizeof(std::uint32_t));
    // 3. A sender contradicting itself is broken, not old.
    if (copy.struct_size > NXMEM_MAX_STRUCT_SIZE) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": struct_size " + std::to_string(copy.struct_size) +
                        " exceeds the cap of " + std::to_string(NXMEM_MAX_STRUCT_SIZE));
    }
    if (type_tag != traits::type_tag) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": wrong type tag 0x" + nxmem::detail::to_hex(type_tag) + " (expected 0x" +
                        nxmem::detail::to_hex(traits::type_tag) + ")");
    }
    // A table declaring a level below the one that introduced its kind (an ipc table declaring
    // minor 0), or read at a level below it, would have every slot read as absent although the
    // allocator points to it: the host would call NULL (rule R13). Refused, like a short table.
    constexpr std::uint32_t introduced = introduced_minor<T>();
    if (copy.declared_minor < introduced) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": declares minor " + std::to_string(copy.declared_minor) +
                        ", below minor " + std::to_string(introduced) +
                        ", which introduced it (its slots would read as absent)");
    }
    if (negotiated_minor < introduced) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": read at negotiated minor " + std::to_string(negotiated_minor) +
                        ", below minor " + std::to_string(introduced) + ", which introduced it");
    }
    const std::size_t claimed = bytes_required<T>(copy.declared_minor);
    if (copy.struct_size < claimed) {
        return fail(status_code::contract_violation,
                    std::string(what) + ": claims minor " + std::to_string(copy.declared_minor) + ", which needs " +
                        std::to_string(claimed) + " bytes, but struct_size is " +
                        std::to_string(copy.struct_size));
    }
    // 4. The level both sides speak.
    copy.effective_minor =
        std::min({copy.declared_minor, negotiated_minor, known_minor<T>()});
    // 5. Never read past struct_size.
    std::memcpy(&copy.table, bytes, std::min<std::size_t>(copy.struct_size, sizeof(T)));
    // 6. Everything above the effective level reads as absent.
    const std::size_t keep = bytes_required<T>(copy.effective_minor);
    std::memset(reinterpret_cast<unsigned char*>(&copy.table) + keep, 0, sizeof(T) - keep);
    copy.table.abi_minor = copy.effective_minor;
    return copy;
}

} // namespace nxmem::abi
