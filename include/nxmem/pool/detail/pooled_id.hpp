// A pooled allocation's id names where its record lives, so a release finds it in constant time
// without a lookup: [generation: 31 bits][span: 1 bit][location: 32 bits]. A small block's
// location is its slab (20 bits) and its block in the slab (12 bits); a span's, its index.
// A record's generation grows each time it is handed out, and the pool never hands a record out
// past the largest generation, so ids are unique for the pool's life and never reused (ABI rule
// M3's spirit); a stale id names a record whose generation moved on.
#pragma once

#include <cstdint>

namespace nxmem::pool_detail {

inline constexpr std::uint32_t block_bits = 12;
inline constexpr std::uint32_t slab_bits = 20;
inline constexpr std::uint64_t slab_limit = std::uint64_t{1} << slab_bits;
inline constexpr std::uint64_t span_limit = std::uint64_t{1} << 32;
inline constexpr std::uint32_t generation_limit = (std::uint32_t{1} << 31) - 1;
inline constexpr std::uint64_t span_flag = std::uint64_t{1} << 32;

constexpr std::uint64_t block_id(std::uint32_t generation, std::uint32_t slab,
                                 std::uint32_t block) noexcept {
    return (std::uint64_t{generation} << 33) | (std::uint64_t{slab} << block_bits) | block;
}
constexpr std::uint64_t span_id(std::uint32_t generation, std::uint32_t span) noexcept {
    return (std::uint64_t{generation} << 33) | span_flag | span;
}
constexpr bool names_span(std::uint64_t id) noexcept { return (id & span_flag) != 0; }
constexpr std::uint32_t generation_of(std::uint64_t id) noexcept {
    return static_cast<std::uint32_t>(id >> 33);
}
constexpr std::uint32_t slab_of(std::uint64_t id) noexcept {
    return static_cast<std::uint32_t>(id >> block_bits) & ((std::uint32_t{1} << slab_bits) - 1);
}
constexpr std::uint32_t block_of(std::uint64_t id) noexcept {
    return static_cast<std::uint32_t>(id) & ((std::uint32_t{1} << block_bits) - 1);
}
constexpr std::uint32_t span_of(std::uint64_t id) noexcept { return static_cast<std::uint32_t>(id); }

} // namespace nxmem::pool_detail
