// Reading requests and writing outputs across the boundary. Requests follow the Linux kernel's
// extensible-struct rule: a larger request than the receiver knows is accepted only if every byte
// the receiver does not know is zero. Outputs are written only within the receiver's struct_size.
#pragma once

#include <nxmem/abi/layout.hpp>
#include <nxmem/abi/result.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace nxmem::abi {

// What is wrong with a request or an output, found without building any text: the hot paths
// test it and describe it (allocating) only when it is not `none`.
enum class wire_problem : std::uint8_t {
    none,
    null_pointer,
    below_baseline,  // struct_size below the baseline struct
    above_cap,       // struct_size above NXMEM_MAX_STRUCT_SIZE (requests only)
    unknown_nonzero, // a byte beyond what this receiver knows is not zero (requests only)
};

namespace detail {
// copy_request for a sender whose struct_size differs from this header's: checked against the
// baseline and the cap, unknown bytes must be zero. Out of line: the common case never runs it.
template <class T>
[[gnu::noinline]] wire_problem copy_resized_request(const T* untrusted, std::uint32_t size, T& copy) noexcept {
    if (size < baseline_bytes<T>()) {
        return wire_problem::below_baseline;
    }
    if (size > NXMEM_MAX_STRUCT_SIZE) {
        return wire_problem::above_cap;
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(untrusted);
    for (std::size_t at = sizeof(T); at < size; ++at) {
        if (bytes[at] != 0) {
            return wire_problem::unknown_nonzero;
        }
    }
    copy = T{};
    std::memcpy(&copy, untrusted, std::min<std::size_t>(size, sizeof(T)));
    return wire_problem::none;
}
} // namespace detail

// Copies the request at `untrusted` into `copy` (zero-filled beyond a shorter sender's size);
// on any problem `copy` is left as it was. Never allocates.
template <class T> wire_problem copy_request(const T* untrusted, T& copy) noexcept {
    static_assert(sizeof(T) >= baseline_bytes<T>() && sizeof(T) <= NXMEM_MAX_STRUCT_SIZE);
    if (untrusted == nullptr) {
        return wire_problem::null_pointer;
    }
    std::uint32_t size = 0;
    std::memcpy(&size, untrusted, sizeof size);
    // The common case, sender and receiver sharing this header: inline, one fixed-size copy.
    if (size == sizeof(T)) [[likely]] {
        std::memcpy(&copy, untrusted, sizeof(T));
        return wire_problem::none;
    }
    return detail::copy_resized_request(untrusted, size, copy);
}

// The INVALID_ARGUMENT that names `problem` of the request at `untrusted`; built only on failure.
template <class T> [[gnu::cold]] error describe_request_problem(const T* untrusted, wire_problem problem) {
    const std::string what(struct_traits<T>::name);
    std::uint32_t size = 0;
    if (untrusted != nullptr) {
        std::memcpy(&size, untrusted, sizeof size);
    }
    switch (problem) {
    case wire_problem::none: break;
    case wire_problem::null_pointer: return {status_code::invalid_argument, what + ": request pointer is NULL"};
    case wire_problem::below_baseline:
        return {status_code::invalid_argument,
                what + ": struct_size " + std::to_string(size) + " is below the " +
                    std::to_string(baseline_bytes<T>()) + " bytes of the baseline request"};
    case wire_problem::above_cap:
        return {status_code::invalid_argument,
                what + ": struct_size " + std::to_string(size) + " exceeds the cap of " +
                    std::to_string(NXMEM_MAX_STRUCT_SIZE)};
    case wire_problem::unknown_nonzero: {
        const auto* bytes = reinterpret_cast<const unsigned char*>(untrusted);
        std::size_t at = sizeof(T);
        while (at < size && bytes[at] == 0) {
            ++at;
        }
        return {status_code::invalid_argument,
                what + ": byte " + std::to_string(at) + " lies beyond what this receiver knows (" +
                    std::to_string(sizeof(T)) + " bytes) and is not zero"};
    }
    }
    return {status_code::internal_error, what + ": no problem to describe"};
}

// A local copy of the request at `untrusted`, or INVALID_ARGUMENT naming what is wrong.
template <class T> result<T> read_request(const T* untrusted) {
    T copy{};
    if (const wire_problem problem = copy_request(untrusted, copy); problem != wire_problem::none) {
        return boost::outcome_v2::failure(describe_request_problem(untrusted, problem));
    }
    return copy;
}

// Whether the receiver's `out` can take an output: not NULL and at least the baseline struct.
// Checked before any work whose result would then be lost. Never allocates, writes nothing.
template <class T> wire_problem check_output(const T* out) noexcept {
    if (out == nullptr) {
        return wire_problem::null_pointer;
    }
    std::uint32_t size = 0;
    std::memcpy(&size, out, sizeof size);
    return size < baseline_bytes<T>() ? wire_problem::below_baseline : wire_problem::none;
}

// Copies `value` into an `out` that check_output accepted, never past out->struct_size, keeping
// the receiver's struct_size. Never allocates.
template <class T> void store_output(T* out, const T& value) noexcept {
    std::uint32_t size = 0;
    std::memcpy(&size, out, sizeof size);
    if (size >= sizeof(T)) { // the common case: a fixed-size copy the compiler inlines
        std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(std::uint32_t),
                    reinterpret_cast<const unsigned char*>(&value) + sizeof(std::uint32_t),
                    sizeof(T) - sizeof(std::uint32_t));
        return;
    }
    const std::size_t count = std::min<std::size_t>(size, sizeof(T)) - sizeof(std::uint32_t);
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(std::uint32_t),
                reinterpret_cast<const unsigned char*>(&value) + sizeof(std::uint32_t), count);
}

// The INVALID_ARGUMENT that names `problem` of the output at `out`; built only on failure.
template <class T> [[gnu::cold]] error describe_output_problem(const T* out, wire_problem problem) {
    const std::string what(struct_traits<T>::name);
    if (problem == wire_problem::null_pointer || out == nullptr) {
        return {status_code::invalid_argument, what + ": output pointer is NULL"};
    }
    std::uint32_t size = 0;
    std::memcpy(&size, out, sizeof size);
    return {status_code::invalid_argument,
            what + ": output struct_size " + std::to_string(size) + " is below the " +
                std::to_string(baseline_bytes<T>()) + " bytes of the baseline struct"};
}

// Copies `value` into the receiver's `out`, never past out->struct_size, and keeps the
// receiver's struct_size. Refuses an output too small to hold the baseline struct.
template <class T> result<void> write_output(T* out, const T& value) {
    if (const wire_problem problem = check_output(out); problem != wire_problem::none) {
        return boost::outcome_v2::failure(describe_output_problem(out, problem));
    }
    store_output(out, value);
    return boost::outcome_v2::success();
}

// A value of T with struct_size set to this header's size and everything else zero: what a sender
// fills in before handing T over.
template <class T> constexpr T make_struct() noexcept {
    T value{};
    value.struct_size = static_cast<std::uint32_t>(sizeof(T));
    return value;
}

} // namespace nxmem::abi
