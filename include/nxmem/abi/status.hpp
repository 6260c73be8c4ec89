// Status codes of the C contract, their names, and bounded reads and writes of NxmemStatus.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace nxmem {

// The C status codes as a C++ enumeration; values are the C values.
enum class status_code : std::uint32_t {
    ok = NXMEM_STATUS_OK,
    invalid_argument = NXMEM_STATUS_INVALID_ARGUMENT,
    out_of_memory = NXMEM_STATUS_OUT_OF_MEMORY,
    unsupported_capability = NXMEM_STATUS_UNSUPPORTED_CAPABILITY,
    wrong_mechanism = NXMEM_STATUS_WRONG_MECHANISM,
    wrong_device = NXMEM_STATUS_WRONG_DEVICE,
    unknown_allocation = NXMEM_STATUS_UNKNOWN_ALLOCATION,
    version_mismatch = NXMEM_STATUS_VERSION_MISMATCH,
    contract_violation = NXMEM_STATUS_CONTRACT_VIOLATION,
    host_refused = NXMEM_STATUS_HOST_REFUSED,
    busy = NXMEM_STATUS_BUSY,
    internal_error = NXMEM_STATUS_INTERNAL_ERROR,
};

// The code a receiver acts on: a code this header does not know reads as INTERNAL_ERROR.
constexpr status_code status_code_from_wire(NxmemStatusCode code) noexcept {
    return code <= NXMEM_STATUS_INTERNAL_ERROR ? static_cast<status_code>(code)
                                               : status_code::internal_error;
}

constexpr std::string_view status_code_name(status_code code) noexcept {
    switch (code) {
    case status_code::ok: return "OK";
    case status_code::invalid_argument: return "INVALID_ARGUMENT";
    case status_code::out_of_memory: return "OUT_OF_MEMORY";
    case status_code::unsupported_capability: return "UNSUPPORTED_CAPABILITY";
    case status_code::wrong_mechanism: return "WRONG_MECHANISM";
    case status_code::wrong_device: return "WRONG_DEVICE";
    case status_code::unknown_allocation: return "UNKNOWN_ALLOCATION";
    case status_code::version_mismatch: return "VERSION_MISMATCH";
    case status_code::contract_violation: return "CONTRACT_VIOLATION";
    case status_code::host_refused: return "HOST_REFUSED";
    case status_code::busy: return "BUSY";
    case status_code::internal_error: return "INTERNAL_ERROR";
    }
    return "UNKNOWN_STATUS";
}

namespace abi {

// The longest prefix of `text` that fits in `capacity` bytes without splitting a UTF-8 sequence.
constexpr std::size_t utf8_prefix_length(std::string_view text, std::size_t capacity) noexcept {
    if (text.size() <= capacity) {
        return text.size();
    }
    std::size_t end = capacity;
    // Step back over continuation bytes (10xxxxxx) so the cut lands on a sequence boundary.
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0u) == 0x80u) {
        --end;
    }
    return end;
}

// A status ready to be handed to the other side: struct_size set, OK, empty message.
inline NxmemStatus make_status() noexcept {
    NxmemStatus status{};
    status.struct_size = sizeof(NxmemStatus);
    status.code = NXMEM_STATUS_OK;
    return status;
}

// Writes `code` and a truncated, NUL-terminated `message`, within the receiver's struct_size.
// Returns `code` so a slot can `return write_status(...)`. Never throws, never allocates.
inline NxmemStatusCode write_status(NxmemStatus* status, NxmemStatusCode code,
                                    std::string_view message) noexcept {
    if (status == nullptr) {
        return code;
    }
    std::uint32_t size = 0;
    std::memcpy(&size, status, sizeof size);
    if (size >= offsetof(NxmemStatus, code) + sizeof(NxmemStatusCode)) {
        std::memcpy(reinterpret_cast<char*>(status) + offsetof(NxmemStatus, code), &code,
                    sizeof code);
    }
    if (size <= offsetof(NxmemStatus, message)) {
        return code;
    }
    const std::size_t buffer =
        std::min<std::size_t>(size - offsetof(NxmemStatus, message), NXMEM_STATUS_MESSAGE_BYTES);
    const std::size_t length = utf8_prefix_length(message, buffer - 1);
    char* out = reinterpret_cast<char*>(status) + offsetof(NxmemStatus, message);
    if (length > 0) { // a default string_view's data() is NULL, which memcpy may not receive
        std::memcpy(out, message.data(), length);
    }
    out[length] = '\0';
    return code;
}

// The message in a status the other side wrote: never read past the inline buffer, whether or
// not the writer terminated it.
inline std::string read_status_message(const NxmemStatus& status) {
    const void* end = std::memchr(status.message, '\0', sizeof status.message);
    const std::size_t length = end == nullptr
                                   ? sizeof status.message
                                   : static_cast<std::size_t>(static_cast<const char*>(end) -
                                                              status.message);
    return std::string(status.message, length);
}

} // namespace abi
} // namespace nxmem
