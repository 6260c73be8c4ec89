// A peer's packed remote key is opaque bytes that UCX parses without being told their length
// (ucp_ep_rkey_unpack takes a pointer only). So before UCX sees one, its outer layout is walked
// here within the bytes that arrived, and UCX is handed a copy with zeroed slack behind it, so a
// forged key can make UCX refuse it but never read past what we own.
#pragma once

#include <nxmem/transfer/wire.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace nxmem::transfer::detail {

// Zeroed bytes behind every copy of peer bytes UCX parses without a length.
inline constexpr std::size_t packed_key_slack = 256;

// UCX 1.x packs a key as: the map of memory domains (u64), the memory type (u8), then for each
// domain in the map a size (u8) and that many bytes; what follows (system device distances) is
// UCX's own business and stays within the copy. Returns why `key` is refused, or empty.
inline std::string packed_key_problem(std::span<const std::byte> key) {
    if (key.empty()) {
        return "empty";
    }
    if (key.size() > max_rkey_bytes) {
        return std::to_string(key.size()) + " bytes (at most " + std::to_string(max_rkey_bytes) + ")";
    }
    if (key.size() < sizeof(std::uint64_t) + 1) {
        return std::to_string(key.size()) + " bytes, shorter than a domain map and a memory type";
    }
    std::uint64_t domains = 0;
    std::memcpy(&domains, key.data(), sizeof domains);
    const auto memory_type = static_cast<std::uint8_t>(key[sizeof domains]);
    if (memory_type > 16) {
        return "memory type " + std::to_string(memory_type) + " is none UCX knows";
    }
    std::size_t at = sizeof domains + 1;
    for (int i = 0; i < std::popcount(domains); ++i) {
        if (at >= key.size()) {
            return "domain " + std::to_string(i) + " of " + std::to_string(std::popcount(domains)) +
                   " lies past the end of the key";
        }
        const auto size = static_cast<std::uint8_t>(key[at]);
        if (size > key.size() - at - 1) {
            return "domain " + std::to_string(i) + " claims " + std::to_string(size) + " bytes, " +
                   std::to_string(key.size() - at - 1) + " are left";
        }
        at += 1 + size;
    }
    return {};
}

} // namespace nxmem::transfer::detail
