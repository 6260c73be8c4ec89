// Fuzzes the host's checks of the tables a plugin hands over, after read_prefix: required slots,
// capability flags against slots (versioned flags included), the capability tables and their
// commit granularity, and the defensive location of a refused table's release slot. The slots are
// arbitrary bit patterns; nothing is ever called. Input: [selector][negotiated minor][table bytes].
#include "fuzz_support.hpp"

#include <nxmem/host/detail/table_checks.hpp>

#include <bit>

// Inside nxmem::fuzz, `abi` is nxmem::abi (the global `abi` of <cxxabi.h> would clash).
namespace nxmem::fuzz {
namespace {
using nxmem::host::detail::slot_is_set;

std::size_t table_length(std::span<const std::uint8_t> bytes) {
    std::uint32_t size = 0;
    if (!bytes.empty()) { // an empty span's data() may be NULL, which memcpy may not receive
        std::memcpy(&size, bytes.data(), std::min<std::size_t>(bytes.size(), sizeof size));
    }
    return size < abi::table_header_bytes ? sizeof(std::uint32_t)
           : size > NXMEM_MAX_STRUCT_SIZE ? abi::table_header_bytes
                                          : size;
}

void check_allocator(std::span<const std::uint8_t> bytes, std::uint32_t negotiated) {
    const exact_bytes raw(bytes, table_length(bytes));
    auto copy = abi::read_prefix<NxmemAllocatorVtable>(raw.data(), negotiated);

    // Whatever read_prefix says, locating the release slot never reads past struct_size and
    // finds one only in an aligned, tagged table whose struct_size (capped) covers it.
    if (host::detail::locate_release_slot(raw.data()) != nullptr) {
        std::uint32_t size = 0;
        std::memcpy(&size, raw.data(), sizeof size);
        NXMEM_FUZZ_CHECK(size >= offsetof(NxmemAllocatorVtable, release) + sizeof(NxmemReleaseFn));
        NXMEM_FUZZ_CHECK(size <= NXMEM_MAX_STRUCT_SIZE);
    }
    if (!copy) {
        return;
    }
    const auto slots = host::detail::check_required_slots(copy.value());
    const auto flags = host::detail::check_capabilities(copy.value());
    if (!slots || !flags) {
        NXMEM_FUZZ_CHECK((slots ? flags.error() : slots.error()).code == status_code::contract_violation);
        return;
    }
    const auto& read = copy.value();
    const NxmemAllocatorVtable& table = read.table;
    for (const auto& field : abi::struct_traits<NxmemAllocatorVtable>::fields) {
        if (field.role == abi::field_role::required_slot) {
            NXMEM_FUZZ_CHECK(slot_is_set(table, field));
        }
    }
    // Only flags the effective level defines remain, each in agreement with its slots.
    NXMEM_FUZZ_CHECK((table.capabilities & ~abi::capabilities_at_minor(read.effective_minor)) == 0);
    for (const abi::capability_pair& pair : abi::allocator_capabilities) {
        const bool flagged = (table.capabilities & pair.flag) != 0;
        for (std::string_view name : pair.fields) {
            if (name.empty()) {
                continue;
            }
            const auto& field = *abi::find_field<NxmemAllocatorVtable>(name);
            if (field.since <= read.effective_minor) {
                NXMEM_FUZZ_CHECK(flagged == slot_is_set(table, field));
            } else {
                NXMEM_FUZZ_CHECK(!slot_is_set(table, field));
            }
        }
    }
}

template <abi::growable_table T>
void check_capability_table(std::span<const std::uint8_t> bytes, std::uint32_t negotiated) {
    const exact_bytes raw(bytes, table_length(bytes));
    const auto copy =
        host::detail::read_capability_table(reinterpret_cast<const T*>(raw.data()), negotiated);
    if (!copy) {
        NXMEM_FUZZ_CHECK(copy.error().code == status_code::contract_violation);
        return;
    }
    for (const auto& field : abi::struct_traits<T>::fields) {
        if (field.role == abi::field_role::required_slot) {
            NXMEM_FUZZ_CHECK(slot_is_set(copy.value().table, field));
        }
    }
    if constexpr (std::is_same_v<T, NxmemVirtualBackingVtable>) {
        const auto granularity = host::detail::commit_granularity_of(copy.value());
        if (granularity) {
            NXMEM_FUZZ_CHECK(std::has_single_bit(granularity.value()));
        } else {
            NXMEM_FUZZ_CHECK(copy.value().effective_minor >= 2);
        }
    }
}

void check_factory(std::span<const std::uint8_t> bytes, std::uint32_t negotiated) {
    const exact_bytes raw(bytes, table_length(bytes));
    const auto copy = abi::read_prefix<NxmemAllocatorFactoryVtable>(raw.data(), negotiated);
    if (copy && host::detail::check_required_slots(copy.value())) {
        NXMEM_FUZZ_CHECK(copy.value().table.open_allocator != nullptr);
        NXMEM_FUZZ_CHECK(copy.value().table.release != nullptr);
    }
}

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    input_reader in(data, size);
    const std::uint8_t selector = in.u8();
    const std::uint32_t negotiated = in.u8() % (NXMEM_ABI_MINOR + 3);
    const auto bytes = in.bytes(NXMEM_MAX_STRUCT_SIZE + 8);
    switch (selector % 4) {
    case 0: check_allocator(bytes, negotiated); break;
    case 1: check_capability_table<NxmemVirtualBackingVtable>(bytes, negotiated); break;
    case 2: check_capability_table<NxmemSharedMappingVtable>(bytes, negotiated); break;
    default: check_factory(bytes, negotiated); break;
    }
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
