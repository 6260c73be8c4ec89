// The pool's size classes: the block sizes small requests are rounded up to, and the bins that
// cache large spans. Both are pure functions of the request, so a release finds its class again.
//
// Small classes: 16 to 128 bytes in steps of 16, then four classes per doubling (160, 192, 224,
// 256, 320, ...) up to 16 KiB: a request wastes at most a fifth of its block. Blocks are carved
// from 64 KiB slabs aligned to 64 KiB, so a block of class size s is aligned to s's lowest set
// bit; a request whose alignment exceeds that is rounded up to a class it divides.
// Large bins: four per doubling, each a multiple of the page size.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace nxmem::pool_classes {

inline constexpr std::uint64_t slab_bytes = std::uint64_t{64} << 10;
inline constexpr std::uint64_t small_limit_bytes = std::uint64_t{16} << 10;
inline constexpr std::uint32_t small_class_count = 8 + 4 * 7; // 16..128, then 7 doublings to 16 KiB
inline constexpr std::uint32_t not_small = small_class_count;

constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) noexcept {
    return (value + multiple - 1) / multiple * multiple;
}

// The block size of class `index`.
constexpr std::uint64_t class_bytes(std::uint32_t index) noexcept {
    if (index < 8) {
        return 16 * (std::uint64_t{index} + 1);
    }
    const std::uint32_t doubling = (index - 8) / 4; // 0: (128, 256]
    const std::uint32_t step = (index - 8) % 4;     // 0..3
    const std::uint64_t base = std::uint64_t{128} << doubling;
    return base + (base / 4) * (step + 1);
}

// The smallest class whose blocks hold `bytes` (1 <= bytes <= small_limit_bytes).
constexpr std::uint32_t class_of_bytes(std::uint64_t bytes) noexcept {
    if (bytes <= 128) {
        return static_cast<std::uint32_t>((bytes + 15) / 16) - 1;
    }
    // bytes in (base, 2 base], base = 2^k >= 128: steps of base / 4.
    const std::uint32_t k = 63 - static_cast<std::uint32_t>(std::countl_zero(bytes - 1));
    const std::uint64_t base = std::uint64_t{1} << k;
    const auto step = static_cast<std::uint32_t>((bytes - base + base / 4 - 1) / (base / 4)); // 1..4
    return 8 + (k - 7) * 4 + step - 1;
}

// The class serving a request, or not_small: a request of more than small_limit_bytes, or
// aligned beyond what a 64 KiB slab gives its blocks. `alignment` is a power of two.
constexpr std::uint32_t class_of(std::uint64_t size, std::uint64_t alignment) noexcept {
    if (alignment <= 16) [[likely]] {
        return size <= small_limit_bytes ? class_of_bytes(size) : not_small;
    }
    // Rounded to a multiple of the alignment, the class is that multiple exactly (classes between
    // 2^k and 2^(k+1) are the multiples of 2^(k-2) there), so its blocks are aligned to it.
    const std::uint64_t rounded = round_up(size, alignment);
    return rounded <= small_limit_bytes && alignment <= slab_bytes ? class_of_bytes(rounded)
                                                                    : not_small;
}

// Large bins: a span of `bytes` (> small_limit_bytes) is rounded up to four sizes per doubling,
// at least whole `granule`s (a power of two: the page, or the upstream's commit granularity).
constexpr std::uint64_t bin_bytes(std::uint64_t bytes, std::uint64_t granule) noexcept {
    const std::uint32_t k = 63 - static_cast<std::uint32_t>(std::countl_zero(bytes - 1));
    const std::uint64_t quarter = std::uint64_t{1} << (k >= 2 ? k - 2 : 0);
    return round_up(round_up(bytes, quarter), granule);
}
inline constexpr std::uint32_t bin_count = 64 * 4;
// The bin index of a size bin_bytes produced: four per doubling, by the top three bits.
constexpr std::uint32_t bin_of(std::uint64_t binned) noexcept {
    const std::uint32_t k = 63 - static_cast<std::uint32_t>(std::countl_zero(binned));
    const std::uint32_t quarter = k >= 2 ? static_cast<std::uint32_t>((binned >> (k - 2)) & 3) : 0;
    return k * 4 + quarter;
}

} // namespace nxmem::pool_classes
