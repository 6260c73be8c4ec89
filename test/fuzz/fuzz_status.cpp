// Fuzzes status handling: write_status into a status of any struct_size (never past it, always
// terminated, never splitting a UTF-8 sequence), read_status_message of a buffer the other side
// may have left unterminated, codes from the wire, and the exception guard turning a thrown
// message into INTERNAL_ERROR. Input: [selector][struct_size u32][code u32][message bytes...].
#include "fuzz_support.hpp"

#include <nxmem/abi/status.hpp>
#include <nxmem/detail/exception_guard.hpp>

#include <stdexcept>
#include <string>

// Inside nxmem::fuzz, `abi` is nxmem::abi (the global `abi` of <cxxabi.h> would clash).
namespace nxmem::fuzz {
namespace {

bool is_continuation(char byte) { return (static_cast<unsigned char>(byte) & 0xC0u) == 0x80u; }

void write_and_read(std::uint32_t struct_size, NxmemStatusCode code, std::string_view message) {
    // The status is exactly as long as it says (at least its struct_size field, at most the struct).
    const std::size_t length =
        std::clamp<std::size_t>(struct_size, sizeof(std::uint32_t), sizeof(NxmemStatus));
    std::uint8_t size_bytes[sizeof struct_size];
    std::memcpy(size_bytes, &struct_size, sizeof struct_size);
    const exact_bytes raw({size_bytes, sizeof size_bytes}, length);
    auto* status = reinterpret_cast<NxmemStatus*>(raw.data());
    NXMEM_FUZZ_CHECK(abi::write_status(status, code, message) == code);
    if (length < offsetof(NxmemStatus, message) + 1) {
        return; // no room for a message; ASan has checked that none was written
    }
    const char* text = reinterpret_cast<const char*>(raw.data()) + offsetof(NxmemStatus, message);
    const std::size_t room = length - offsetof(NxmemStatus, message);
    const std::size_t written = ::strnlen(text, room);
    NXMEM_FUZZ_CHECK(written < room); // terminated within the receiver's bytes
    // A prefix of the message (it may hold NULs of its own), cut on a sequence boundary.
    NXMEM_FUZZ_CHECK(written <= message.size());
    NXMEM_FUZZ_CHECK(written == 0 || std::memcmp(text, message.data(), written) == 0);
    const std::size_t cut = abi::utf8_prefix_length(message, room - 1);
    NXMEM_FUZZ_CHECK(cut <= room - 1 && cut <= message.size());
    NXMEM_FUZZ_CHECK(cut == message.size() || !is_continuation(message[cut]) || cut == 0);
    std::uint32_t written_code = 0;
    std::memcpy(&written_code, raw.data() + offsetof(NxmemStatus, code), sizeof written_code);
    NXMEM_FUZZ_CHECK(written_code == code);
}

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    input_reader in(data, size);
    const std::uint8_t selector = in.u8();
    const std::uint32_t struct_size = in.u32();
    const NxmemStatusCode code = in.u32();
    const std::string_view message = in.text(2 * NXMEM_STATUS_MESSAGE_BYTES);

    const status_code read = status_code_from_wire(code);
    NXMEM_FUZZ_CHECK(static_cast<std::uint32_t>(read) <= NXMEM_STATUS_INTERNAL_ERROR);
    NXMEM_FUZZ_CHECK(code > NXMEM_STATUS_INTERNAL_ERROR ? read == status_code::internal_error
                                                        : static_cast<std::uint32_t>(read) == code);
    NXMEM_FUZZ_CHECK(!status_code_name(read).empty());

    switch (selector % 3) {
    case 0: write_and_read(struct_size, code, message); break;
    case 1: {
        // Whatever the other side left in the buffer, the reader stops at its end.
        NxmemStatus status = abi::make_status();
        if (!message.empty()) {
            std::memcpy(status.message, message.data(), std::min(message.size(), sizeof status.message));
        }
        const std::string text = abi::read_status_message(status);
        NXMEM_FUZZ_CHECK(text.size() <= sizeof status.message);
        NXMEM_FUZZ_CHECK(text.size() == ::strnlen(status.message, sizeof status.message));
        break;
    }
    default: {
        NxmemStatus status = abi::make_status();
        const std::string what(message);
        const NxmemStatusCode guarded = nxmem::detail::guard_status(&status, [&]() -> NxmemStatusCode {
            if ((selector & 4u) != 0) {
                throw std::runtime_error(what);
            }
            throw code; // not a std::exception
        });
        NXMEM_FUZZ_CHECK(guarded == NXMEM_STATUS_INTERNAL_ERROR && status.code == guarded);
        NXMEM_FUZZ_CHECK(::strnlen(status.message, sizeof status.message) < sizeof status.message);
        break;
    }
    }
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
