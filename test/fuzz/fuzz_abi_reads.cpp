// Fuzzes the ABI layer's reads of untrusted bytes: read_prefix<T> of every growable table,
// read_request<T> of every request, and write_output<T> into every output, each on a buffer exactly
// as long as the struct_size it declares (AddressSanitizer reports one byte more), at every
// negotiated minor and at misaligned addresses. Input: [selector][minor][misalign][table bytes...].
#include "fuzz_support.hpp"

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/abi/request.hpp>

#include <algorithm>
#include <tuple>

// Inside nxmem::fuzz, `abi` is nxmem::abi (the global `abi` of <cxxabi.h> would clash).
namespace nxmem::fuzz {
namespace {

std::uint32_t declared_size(std::span<const std::uint8_t> bytes) {
    std::uint32_t size = 0;
    if (!bytes.empty()) { // an empty span's data() may be NULL, which memcpy may not receive
        std::memcpy(&size, bytes.data(), std::min<std::size_t>(bytes.size(), sizeof size));
    }
    return size;
}

// A table the sender says is struct_size long is that long; past the cap, or below the header,
// the reader must stop after the fields it needs to see that.
template <abi::growable_table T>
void read_table(std::span<const std::uint8_t> bytes, std::uint32_t negotiated, std::size_t misalign) {
    const std::uint32_t size = declared_size(bytes);
    const std::size_t length = size < abi::table_header_bytes ? sizeof(std::uint32_t)
                               : size > NXMEM_MAX_STRUCT_SIZE ? abi::table_header_bytes
                                                              : size;
    const exact_bytes table(bytes, length, misalign);
    const auto copy = abi::read_prefix<T>(table.data(), negotiated);
    if (!copy) {
        NXMEM_FUZZ_CHECK(copy.error().code == status_code::contract_violation);
        NXMEM_FUZZ_CHECK(!copy.error().message.empty());
        return;
    }
    const auto& read = copy.value();
    NXMEM_FUZZ_CHECK(misalign % alignof(T) == 0);
    NXMEM_FUZZ_CHECK(read.struct_size == size);
    NXMEM_FUZZ_CHECK(size >= abi::table_header_bytes && size <= NXMEM_MAX_STRUCT_SIZE);
    NXMEM_FUZZ_CHECK(size >= abi::bytes_required<T>(read.declared_minor));
    // R13: never a level below the table's introduction, at which its slots would read as absent.
    NXMEM_FUZZ_CHECK(read.declared_minor >= abi::introduced_minor<T>() && negotiated >= abi::introduced_minor<T>());
    NXMEM_FUZZ_CHECK(read.effective_minor ==
                     std::min({read.declared_minor, negotiated, abi::known_minor<T>()}));
    NXMEM_FUZZ_CHECK(read.table.abi_minor == read.effective_minor);
    NXMEM_FUZZ_CHECK(read.table.type_tag == abi::struct_traits<T>::type_tag);
    // What the effective level covers is the sender's bytes; everything above it reads as zero.
    const auto* local = reinterpret_cast<const unsigned char*>(&read.table);
    const std::size_t keep = abi::bytes_required<T>(read.effective_minor);
    for (std::size_t at = 0; at < sizeof(T); ++at) {
        if (at >= 4 && at < 8) {
            continue; // abi_minor, rewritten to the effective level
        }
        const unsigned char expected = at < keep && at < size ? table.data()[at] : 0;
        NXMEM_FUZZ_CHECK(local[at] == expected);
    }
}

template <class T> void read_one_request(std::span<const std::uint8_t> bytes) {
    const std::uint32_t size = declared_size(bytes);
    const bool plausible = size >= abi::baseline_bytes<T>() && size <= NXMEM_MAX_STRUCT_SIZE;
    const exact_bytes request(bytes, plausible ? size : sizeof(std::uint32_t));
    const auto copy = abi::read_request(reinterpret_cast<const T*>(request.data()));
    if (!copy) {
        NXMEM_FUZZ_CHECK(copy.error().code == status_code::invalid_argument);
        return;
    }
    NXMEM_FUZZ_CHECK(plausible);
    for (std::size_t at = sizeof(T); at < size; ++at) {
        NXMEM_FUZZ_CHECK(request.data()[at] == 0); // unknown bytes accepted only when zero
    }
    const auto* local = reinterpret_cast<const unsigned char*>(&copy.value());
    for (std::size_t at = 0; at < sizeof(T); ++at) {
        NXMEM_FUZZ_CHECK(local[at] == (at < size ? request.data()[at] : 0));
    }
}

template <class T> void write_one_output(std::span<const std::uint8_t> bytes, input_reader& rest) {
    // The receiver's output is as long as it says (capped here only to bound the buffer).
    const std::uint32_t size = declared_size(bytes);
    const bool plausible = size >= abi::baseline_bytes<T>();
    const exact_bytes out(bytes, plausible ? std::min<std::size_t>(size, 2 * NXMEM_MAX_STRUCT_SIZE)
                                           : sizeof(std::uint32_t));
    T value{};
    if (const auto source = rest.bytes(sizeof(T)); !source.empty()) {
        std::memcpy(&value, source.data(), source.size());
    }
    const std::vector<unsigned char> before(out.data(), out.data() + out.size());
    const auto written = abi::write_output(reinterpret_cast<T*>(out.data()), value);
    if (!written) {
        NXMEM_FUZZ_CHECK(written.error().code == status_code::invalid_argument);
        NXMEM_FUZZ_CHECK(std::equal(before.begin(), before.end(), out.data())); // untouched
        return;
    }
    NXMEM_FUZZ_CHECK(plausible);
    NXMEM_FUZZ_CHECK(declared_size({out.data(), out.size()}) == size); // the receiver's size stays
    const auto* sent = reinterpret_cast<const unsigned char*>(&value);
    for (std::size_t at = sizeof(std::uint32_t); at < out.size(); ++at) {
        NXMEM_FUZZ_CHECK(out.data()[at] == (at < sizeof(T) ? sent[at] : before[at]));
    }
}

using tables = std::tuple<NxmemAllocatorFactoryVtable, NxmemAllocatorVtable, NxmemVirtualBackingVtable,
                          NxmemSharedMappingVtable, NxmemHostCallbacks>;
using requests = std::tuple<NxmemAllocRequest, NxmemAllocation, NxmemRangeRequest, NxmemReleaseCompletion,
                            NxmemReclaimRequest, NxmemSharedPrefixRequest, NxmemSharedPrefixHandle,
                            NxmemSharedPrefixCommitRequest, NxmemOpenRequest, NxmemNegotiateRequest>;
using outputs = std::tuple<NxmemAllocResult, NxmemReleaseOutcome, NxmemSharedPrefixCommitInfo,
                           NxmemUnloadReport, NxmemAllocatorUsage, NxmemNegotiateResponse,
                           NxmemSharedPrefixHandle>;

template <class Tuple, class Visit, std::size_t... I>
void visit_nth(std::size_t n, Visit&& visit, std::index_sequence<I...>) {
    ((n == I ? visit(static_cast<std::tuple_element_t<I, Tuple>*>(nullptr)) : void()), ...);
}
template <class Tuple, class Visit> void visit_nth(std::size_t n, Visit&& visit) {
    visit_nth<Tuple>(n % std::tuple_size_v<Tuple>, visit,
                     std::make_index_sequence<std::tuple_size_v<Tuple>>{});
}

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    input_reader in(data, size);
    const std::uint8_t selector = in.u8();
    const std::uint32_t negotiated = in.u8() % (NXMEM_ABI_MINOR + 3); // above what is known, too
    const std::size_t misalign = in.u8() % 8;
    const std::uint8_t which = selector >> 2;
    switch (selector % 3) {
    case 0: {
        const auto bytes = in.bytes(NXMEM_MAX_STRUCT_SIZE + 8);
        visit_nth<tables>(which, [&]<class T>(T*) { read_table<T>(bytes, negotiated, misalign); });
        break;
    }
    case 1: {
        const auto bytes = in.bytes(NXMEM_MAX_STRUCT_SIZE + 8);
        visit_nth<requests>(which, [&]<class T>(T*) { read_one_request<T>(bytes); });
        break;
    }
    default: {
        const std::size_t length = in.u8() % 160; // the output's own bytes, then the value's
        const auto bytes = in.bytes(length);
        visit_nth<outputs>(which, [&]<class T>(T*) { write_one_output<T>(bytes, in); });
        break;
    }
    }
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
