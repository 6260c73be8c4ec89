// The pool's error texts, built only when there is an error (so a success costs no string), and
// shared by every layer: each names the pool, what was refused and why.
#pragma once

#include <nxmem/allocation.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/abi/result.hpp>

#include <cstdint>
#include <string>

namespace nxmem::pool_detail {

[[gnu::cold, gnu::noinline]] inline error out_of_memory(const std::string& why) noexcept {
    try {
        return {status_code::out_of_memory, std::string("pool: ") + why};
    } catch (...) {
        return {status_code::out_of_memory, {}};
    }
}

[[gnu::cold, gnu::noinline]] inline error upstream_refused(const std::string& what, const error& failure) noexcept {
    try {
        return {status_code::out_of_memory, "pool: the upstream refused " + what + ": " + failure.describe()};
    } catch (...) {
        return {status_code::out_of_memory, {}};
    }
}

[[gnu::cold, gnu::noinline]] inline error commitment_refused(bool commit, std::uint64_t bytes,
                                                             const error& failure) noexcept {
    try {
        return upstream_refused(std::string(commit ? "a commit of " : "a decommit of ") + std::to_string(bytes) +
                                    " bytes",
                                failure);
    } catch (...) {
        return {status_code::out_of_memory, {}};
    }
}

[[gnu::cold, gnu::noinline]] inline error refused_request(std::uint64_t size, std::uint64_t alignment) noexcept {
    try {
        return {status_code::invalid_argument, "size must be non-zero and alignment a power of two (size " +
                                                   std::to_string(size) + ", alignment " +
                                                   std::to_string(alignment) + ")"};
    } catch (...) {
        return {status_code::invalid_argument, {}};
    }
}

inline const char* why_refused(status_code code) noexcept {
    switch (code) {
    case status_code::wrong_mechanism: return "it belongs to another mechanism";
    case status_code::wrong_device: return "it belongs to another device";
    case status_code::unknown_allocation: return "it is not live in this pool";
    default: return "it misdescribes the allocation (address, size, alignment or id)";
    }
}

// A release of `live` refused with `code`.
template <class D>
[[gnu::cold, gnu::noinline]] error refused_release(status_code code, const allocation<D>& live) noexcept {
    try {
        return {code, "pool: release of allocation " + std::to_string(live.allocation_id) + " at 0x" +
                          nxmem::detail::to_hex(D::to_wire(live.address)) + " refused: " + why_refused(code)};
    } catch (...) {
        return {code, {}};
    }
}

// A release by address where no live allocation starts: the address is all the caller named.
[[gnu::cold, gnu::noinline]] inline error refused_address(std::uint64_t wire) noexcept {
    try {
        return {status_code::unknown_allocation,
                "pool: release at 0x" + nxmem::detail::to_hex(wire) + " refused: no live allocation of this pool starts there"};
    } catch (...) {
        return {status_code::unknown_allocation, {}};
    }
}

// A release refused as not live: a size or alignment that no allocation has comes first
// (docs/ABI.md M10), checked only here so a release that succeeds does not pay for it.
template <class D> [[gnu::cold, gnu::noinline]] error refused_as_unknown(const allocation<D>& live) noexcept {
    if (live.size == 0 || live.alignment == 0 || (live.alignment & (live.alignment - 1)) != 0) {
        return refused_release(status_code::invalid_argument, live);
    }
    return refused_release(status_code::unknown_allocation, live);
}

} // namespace nxmem::pool_detail
