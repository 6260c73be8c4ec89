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

// A local copy of the request at `untrusted`, or INVALID_ARGUMENT naming what is wrong.
template <class T> result<T> read_request(const T* untrusted) {
    // The name is copied into a message only on failure: reading a valid request allocates nothing.
    const std::string_view what(struct_traits<T>::name);
    if (untrusted == nullptr) {
        return fail(status_code::invalid_argument, std::string(what) + ": request pointer is NULL");
    }
    std::uint32_t size = 0;
    std::memcpy(&size, untrusted, sizeof size);
    constexpr std::size_t required = baseline_bytes<T>();
    if (size < required) {
        return fail(status_code::invalid_argument,
                    std::string(what) + ": struct_size " + std::to_string(size) + " is below the " +
                        std::to_string(required) + " bytes of the baseline request");
    }
    if (size > NXMEM_MAX_STRUCT_SIZE) {
        return fail(status_code::invalid_argument,
                    std::string(what) + ": struct_size " + std::to_string(size) + " exceeds the cap of " +
                        std::to_string(NXMEM_MAX_STRUCT_SIZE));
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(untrusted);
    for (std::size_t at = sizeof(T); at < size; ++at) {
        if (bytes[at] != 0) {
            return fail(status_code::invalid_argument,
                        std::string(what) + ": byte " + std::to_string(at) +
                            " lies beyond what this receiver knows (" + std::to_string(sizeof(T)) +
                            " bytes) and is not zero");
        }
    }
    T copy{};
    std::memcpy(&copy, untrusted, std::min<std::size_t>(size, sizeof(T)));
    return copy;
}

// Copies `value` into the receiver's `out`, never past out->struct_size, and keeps the
// receiver's struct_size. Refuses an output too small to hold the baseline struct.
template <class T> result<void> write_output(T* out, const T& value) {
    // The name is copied into a message only on failure: reading a valid request allocates nothing.
    const std::string_view what(struct_traits<T>::name);
    if (out == nullptr) {
        return fail(status_code::invalid_argument, std::string(what) + ": output pointer is NULL");
    }
    std::uint32_t size = 0;
    std::memcpy(&size, out, sizeof size);
    constexpr std::size_t required = baseline_bytes<T>();
    if (size < required) {
        return fail(status_code::invalid_argument,
                    std::string(what) + ": output struct_size " + std::to_string(size) + " is below the " +
                        std::to_string(required) + " bytes of the baseline struct");
    }
    const std::size_t count = std::min<std::size_t>(size, sizeof(T)) - sizeof(std::uint32_t);
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(std::uint32_t),
                reinterpret_cast<const unsigned char*>(&value) + sizeof(std::uint32_t), count);
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
