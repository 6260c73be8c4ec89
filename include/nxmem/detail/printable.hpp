// Bytes a message may carry (ABI.md E13): valid UTF-8 without control bytes. A message that
// names something the other side handed over (an option's key, say) escapes what is not
// printable as \xNN, so a raw byte never reaches an engine's log or terminal.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace nxmem::detail {

// The length of the valid UTF-8 sequence at the start of `text` (1 to 4), or 0 when there is
// none: a stray continuation byte, an overlong or surrogate form, a sequence cut short.
constexpr std::size_t utf8_sequence_length(std::string_view text) noexcept {
    if (text.empty()) {
        return 0;
    }
    const auto byte = [&](std::size_t at) { return static_cast<unsigned char>(text[at]); };
    const unsigned char lead = byte(0);
    if (lead < 0x80) {
        return 1;
    }
    std::size_t length = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        low = lead == 0xE0 ? 0xA0 : 0x80;  // no overlong form
        high = lead == 0xED ? 0x9F : 0xBF; // no surrogate
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        low = lead == 0xF0 ? 0x90 : 0x80;
        high = lead == 0xF4 ? 0x8F : 0xBF; // nothing above U+10FFFF
    } else {
        return 0;
    }
    if (text.size() < length || byte(1) < low || byte(1) > high) {
        return 0;
    }
    for (std::size_t at = 2; at < length; ++at) {
        if (byte(at) < 0x80 || byte(at) > 0xBF) {
            return 0;
        }
    }
    return length;
}

constexpr bool is_control_byte(unsigned char byte) noexcept { return byte < 0x20 || byte == 0x7F; }

// The offset of the first byte of `text` a message may not carry (a control byte, or a byte of
// no valid UTF-8 sequence), or npos when there is none.
constexpr std::size_t first_unprintable(std::string_view text) noexcept {
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t length = utf8_sequence_length(text.substr(at));
        if (length == 0 || (length == 1 && is_control_byte(static_cast<unsigned char>(text[at])))) {
            return at;
        }
        at += length;
    }
    return std::string_view::npos;
}

// `text` with every byte a message may not carry written as \xNN (and a backslash as \\, so
// the escape cannot be forged).
inline std::string printable(std::string_view text) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string shown;
    shown.reserve(text.size());
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t length = utf8_sequence_length(text.substr(at));
        const auto byte = static_cast<unsigned char>(text[at]);
        if (length == 0 || (length == 1 && is_control_byte(byte))) {
            shown += "\\x";
            shown += digits[byte >> 4];
            shown += digits[byte & 0xF];
            ++at;
        } else if (byte == '\\') {
            shown += "\\\\";
            ++at;
        } else {
            shown.append(text.substr(at, length));
            at += length;
        }
    }
    return shown;
}

} // namespace nxmem::detail
