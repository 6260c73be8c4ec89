// Every struct_size the rules allow, and those they forbid, for each struct that crosses the
// boundary, derived from the layout table (nxmem/abi/layout.hpp) rather than listed by hand; and
// the buffers that carry one such struct to the plugin with bytes past it that must survive.
//   a request (host -> plugin): each field end below the baseline (too short: INVALID_ARGUMENT,
//     Q2), the baseline, this header's size with a zero tail (accepted, Q3) and with a non-zero
//     tail byte (INVALID_ARGUMENT, Q3);
//   an output (plugin -> host): each field end below the baseline (too short: INVALID_ARGUMENT and
//     nothing written, Q7), the baseline, and larger than this header's struct (written only in the
//     fields the plugin knows; the tail survives, Q6).
#pragma once

#include <nxmem/abi/layout.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace nxmem::conform::model {

enum class size_kind : std::uint8_t {
    too_short,      // below the baseline: refused, nothing written
    baseline,       // the smallest struct_size a receiver accepts
    zero_tail,      // larger than this header's struct, the extra bytes zero
    nonzero_tail,   // requests only: larger, with a non-zero byte the receiver does not know
    over_cap,       // requests only: above NXMEM_MAX_STRUCT_SIZE, refused unscanned (Q4)
};

struct wire_size {
    std::uint32_t bytes;
    size_kind kind;
};

inline constexpr std::uint32_t tail_bytes = 16;       // a larger struct: this many bytes past sizeof
inline constexpr unsigned char sentinel = 0xA5;       // what an output's untouched bytes hold
inline constexpr std::size_t guard_bytes = 64;        // bytes past struct_size that must survive
inline constexpr unsigned char past_request = 0xEE;   // bytes past a request's struct_size (Q5)
inline constexpr unsigned char scribble = 0xDD;       // a buffer after its call (O6)

// The sizes to draw for a struct of type T, from its fields' ends.
template <class T> std::vector<wire_size> wire_sizes(bool request) {
    std::vector<wire_size> sizes;
    const std::uint32_t baseline = static_cast<std::uint32_t>(abi::baseline_bytes<T>());
    for (const abi::field_info& field : abi::struct_traits<T>::fields) {
        const auto end = static_cast<std::uint32_t>(field.offset + field.size);
        if (end < baseline && field.offset > 0 &&
            std::none_of(sizes.begin(), sizes.end(), [&](const wire_size& s) { return s.bytes == end; })) {
            sizes.push_back({end, size_kind::too_short}); // a field end below the baseline
        }
    }
    sizes.push_back({baseline - 1, size_kind::too_short});
    sizes.push_back({baseline, size_kind::baseline});
    sizes.push_back({static_cast<std::uint32_t>(sizeof(T)) + tail_bytes, size_kind::zero_tail});
    if (request) {
        sizes.push_back({static_cast<std::uint32_t>(sizeof(T)) + tail_bytes, size_kind::nonzero_tail});
        sizes.push_back({NXMEM_MAX_STRUCT_SIZE + 8, size_kind::over_cap});
    }
    return sizes;
}

inline const char* size_kind_name(size_kind kind) {
    switch (kind) {
    case size_kind::too_short: return "too short";
    case size_kind::baseline: return "the baseline size";
    case size_kind::zero_tail: return "larger, zero tail";
    case size_kind::nonzero_tail: return "larger, non-zero tail";
    case size_kind::over_cap: return "above the 4096-byte cap";
    }
    return "?";
}

// One struct on the wire at a chosen struct_size, followed by guard bytes. An output starts as
// sentinel bytes (struct_size set), a request as `value` (struct_size set, the tail zero or not).
template <class T> class wire_struct {
public:
    // An output buffer of `size` bytes.
    static wire_struct output(std::uint32_t size) {
        wire_struct made(size);
        std::memset(made.bytes_.data(), sentinel, made.bytes_.size());
        std::memcpy(made.bytes_.data(), &size, sizeof size);
        made.before_ = made.bytes_;
        return made;
    }
    // A request carrying `value` at `size` bytes (copied up to min(size, sizeof(T))).
    static wire_struct request(const T& value, wire_size size) {
        wire_struct made(size.bytes);
        std::memset(made.bytes_.data() + size.bytes, past_request, made.bytes_.size() - size.bytes);
        std::memcpy(made.bytes_.data(), &value, std::min<std::size_t>(size.bytes, sizeof(T)));
        std::memcpy(made.bytes_.data(), &size.bytes, sizeof size.bytes);
        if (size.kind == size_kind::nonzero_tail) {
            made.bytes_[size.bytes - 1] = 0x5A; // a byte the receiver does not know
        }
        made.before_ = made.bytes_;
        return made;
    }

    wire_struct(wire_struct&&) noexcept = default;
    wire_struct& operator=(wire_struct&&) noexcept = default;
    wire_struct(const wire_struct&) = delete;
    wire_struct& operator=(const wire_struct&) = delete;
    // Borrowed for the call only (O6): a plugin that kept the pointer reads garbage.
    ~wire_struct() {
        if (!bytes_.empty()) {
            std::memset(bytes_.data(), scribble, bytes_.size());
        }
    }

    T* get() noexcept { return reinterpret_cast<T*>(bytes_.data()); }
    std::uint32_t size() const noexcept { return size_; }

    // What the plugin wrote, as this header reads it (bytes past struct_size left out).
    T value() const noexcept {
        T copy{};
        std::memcpy(&copy, bytes_.data(), std::min<std::size_t>(size_, sizeof(T)));
        return copy;
    }

    // The first byte the plugin changed at or past `from`, or -1.
    long first_change_from(std::size_t from) const noexcept {
        for (std::size_t at = from; at < bytes_.size(); ++at) {
            if (bytes_[at] != before_[at]) {
                return static_cast<long>(at);
            }
        }
        return -1;
    }
    // Where a write broke Q6/Q7: "" when none; `refused`: the whole buffer must be untouched.
    std::string overrun(bool refused) const {
        const std::size_t known = std::min<std::size_t>(size_, sizeof(T));
        const long changed = first_change_from(refused ? 0 : known);
        if (changed < 0) {
            return {};
        }
        return "byte " + std::to_string(changed) + " of a " + std::to_string(size_) + "-byte " +
               std::string(abi::struct_traits<T>::name) +
               (refused ? " too short for its baseline was written (Q7: refused untouched)"
                        : " was written, past the " + std::to_string(known) + " bytes it may write");
    }

private:
    explicit wire_struct(std::uint32_t size)
        : bytes_(std::max<std::size_t>(size, sizeof(T)) + guard_bytes, 0), size_(size) {}

    std::vector<unsigned char> bytes_;
    std::vector<unsigned char> before_;
    std::uint32_t size_;
};

} // namespace nxmem::conform::model
