// Lower-case hexadecimal text of an unsigned value, for diagnostics.
#pragma once

#include <cstdint>
#include <string>

namespace nxmem::detail {

inline std::string to_hex(std::uint64_t value) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string text;
    do {
        text.insert(text.begin(), digits[value & 0xFu]);
        value >>= 4;
    } while (value != 0);
    return text;
}

} // namespace nxmem::detail
