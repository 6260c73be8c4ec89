// Status codes, their names, bounded writes and reads of NxmemStatus, and nxmem::error.
#include "../support/byte_buffer.hpp"
#include <nxmem/abi/result.hpp>
#include <nxmem/abi/status.hpp>

#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using nxmem::status_code;
using nxmem::status_code_from_wire;
using nxmem::status_code_name;
using nxmem::abi::make_status;
using nxmem::abi::read_status_message;
using nxmem::abi::utf8_prefix_length;
using nxmem::abi::write_status;

constexpr std::size_t message_offset = offsetof(NxmemStatus, message);
constexpr unsigned char sentinel = 0x5A;

using nxmem::test::byte_buffer;

std::string repeat(std::string_view piece, std::size_t times) {
    std::string text;
    for (std::size_t i = 0; i < times; ++i) {
        text += piece;
    }
    return text;
}

// The message as written: the bytes before the first NUL, which must exist within 256 bytes.
std::string terminated_message(const NxmemStatus& status) {
    const void* nul = std::memchr(status.message, '\0', sizeof status.message);
    REQUIRE(nul != nullptr);
    return std::string(status.message, static_cast<const char*>(nul));
}

// True when `text` is a sequence of whole UTF-8 sequences.
bool is_whole_utf8(std::string_view text) {
    std::size_t at = 0;
    while (at < text.size()) {
        const auto lead = static_cast<unsigned char>(text[at]);
        const std::size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3
                                                  : (lead >> 3) == 0x1E ? 4
                                                                        : 0;
        if (length == 0 || at + length > text.size()) {
            return false;
        }
        for (std::size_t i = 1; i < length; ++i) {
            if ((static_cast<unsigned char>(text[at + i]) & 0xC0u) != 0x80u) {
                return false;
            }
        }
        at += length;
    }
    return true;
}

const std::vector<std::pair<status_code, std::string_view>> every_code{
    {status_code::ok, "OK"},
    {status_code::invalid_argument, "INVALID_ARGUMENT"},
    {status_code::out_of_memory, "OUT_OF_MEMORY"},
    {status_code::unsupported_capability, "UNSUPPORTED_CAPABILITY"},
    {status_code::wrong_mechanism, "WRONG_MECHANISM"},
    {status_code::wrong_device, "WRONG_DEVICE"},
    {status_code::unknown_allocation, "UNKNOWN_ALLOCATION"},
    {status_code::version_mismatch, "VERSION_MISMATCH"},
    {status_code::contract_violation, "CONTRACT_VIOLATION"},
    {status_code::host_refused, "HOST_REFUSED"},
    {status_code::busy, "BUSY"},
    {status_code::internal_error, "INTERNAL_ERROR"},
};

} // namespace

TEST_CASE("the C++ status codes carry the C values", "[status]") {
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::ok) == NXMEM_STATUS_OK);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::invalid_argument) ==
                   NXMEM_STATUS_INVALID_ARGUMENT);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::out_of_memory) ==
                   NXMEM_STATUS_OUT_OF_MEMORY);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::unsupported_capability) ==
                   NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::wrong_mechanism) ==
                   NXMEM_STATUS_WRONG_MECHANISM);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::wrong_device) ==
                   NXMEM_STATUS_WRONG_DEVICE);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::unknown_allocation) ==
                   NXMEM_STATUS_UNKNOWN_ALLOCATION);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::version_mismatch) ==
                   NXMEM_STATUS_VERSION_MISMATCH);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::contract_violation) ==
                   NXMEM_STATUS_CONTRACT_VIOLATION);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::host_refused) ==
                   NXMEM_STATUS_HOST_REFUSED);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::busy) == NXMEM_STATUS_BUSY);
    STATIC_REQUIRE(static_cast<std::uint32_t>(status_code::internal_error) ==
                   NXMEM_STATUS_INTERNAL_ERROR);
}

TEST_CASE("every known wire code maps to itself and every unknown one to INTERNAL_ERROR",
          "[status]") {
    STATIC_REQUIRE(status_code_from_wire(NXMEM_STATUS_BUSY) == status_code::busy);
    STATIC_REQUIRE(status_code_from_wire(12) == status_code::internal_error);
    for (const auto& [code, name] : every_code) {
        CAPTURE(name);
        CHECK(status_code_from_wire(static_cast<NxmemStatusCode>(code)) == code);
    }
    for (const NxmemStatusCode unknown : {12u, 13u, 100u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu}) {
        CAPTURE(unknown);
        CHECK(status_code_from_wire(unknown) == status_code::internal_error);
    }
}

TEST_CASE("every status code has its own name", "[status]") {
    STATIC_REQUIRE(status_code_name(status_code::contract_violation) == "CONTRACT_VIOLATION");
    REQUIRE(every_code.size() == NXMEM_STATUS_INTERNAL_ERROR + 1);
    std::set<std::string_view> names;
    for (const auto& [code, name] : every_code) {
        CAPTURE(name);
        CHECK(status_code_name(code) == name);
        names.insert(status_code_name(code));
    }
    CHECK(names.size() == every_code.size());
    CHECK(status_code_name(static_cast<status_code>(99)) == "UNKNOWN_STATUS");
}

TEST_CASE("make_status is sized, OK and empty", "[status]") {
    const NxmemStatus status = make_status();
    CHECK(status.struct_size == sizeof(NxmemStatus));
    CHECK(status.code == NXMEM_STATUS_OK);
    CHECK(std::all_of(std::begin(status.message), std::end(status.message),
                      [](char c) { return c == '\0'; }));
}

TEST_CASE("write_status writes the code and a short message and returns the code", "[status]") {
    NxmemStatus status = make_status();
    CHECK(write_status(&status, NXMEM_STATUS_WRONG_DEVICE, "device 3 is not mine") ==
          NXMEM_STATUS_WRONG_DEVICE);
    CHECK(status.code == NXMEM_STATUS_WRONG_DEVICE);
    CHECK(terminated_message(status) == "device 3 is not mine");
    CHECK(read_status_message(status) == "device 3 is not mine");

    // A shorter second message is terminated, not mixed with the first.
    write_status(&status, NXMEM_STATUS_OK, "ok");
    CHECK(read_status_message(status) == "ok");
    CHECK(status.code == NXMEM_STATUS_OK);
}

TEST_CASE("write_status with a NULL status only returns the code", "[status]") {
    CHECK(write_status(nullptr, NXMEM_STATUS_BUSY, "ignored") == NXMEM_STATUS_BUSY);
}

TEST_CASE("write_status truncates at 255 bytes and always terminates", "[status]") {
    for (const std::size_t length : {254u, 255u, 256u, 257u, 300u, 10000u}) {
        CAPTURE(length);
        NxmemStatus status = make_status();
        std::memset(status.message, 'z', sizeof status.message); // no stale NUL to lean on
        const std::string message(length, 'x');
        write_status(&status, NXMEM_STATUS_INTERNAL_ERROR, message);
        const std::string written = terminated_message(status);
        CHECK(written == std::string(std::min<std::size_t>(length, 255), 'x'));
        CHECK(status.message[std::min<std::size_t>(length, 255)] == '\0');
    }
}

TEST_CASE("write_status never splits a UTF-8 sequence", "[status][utf8]") {
    struct utf8_case {
        const char* piece;
        std::size_t copies;
        std::size_t expected_bytes;
    };
    // 2-byte é: 127 whole copies (254 bytes); 3-byte €: 85 copies fill 255 exactly;
    // 4-byte 😀: 63 copies (252 bytes); after one ASCII byte, 2-byte é: 1 + 127 * 2 = 255.
    for (const utf8_case& row : {utf8_case{"\xC3\xA9", 300, 254}, utf8_case{"\xE2\x82\xAC", 100, 255},
                                 utf8_case{"\xF0\x9F\x98\x80", 100, 252}}) {
        CAPTURE(row.piece, row.copies);
        NxmemStatus status = make_status();
        write_status(&status, NXMEM_STATUS_INVALID_ARGUMENT, repeat(row.piece, row.copies));
        const std::string written = terminated_message(status);
        CHECK(written.size() == row.expected_bytes);
        CHECK(is_whole_utf8(written));
        CHECK(written == repeat(row.piece, row.expected_bytes / std::strlen(row.piece)));
    }
    SECTION("an odd ASCII prefix shifts the cut") {
        NxmemStatus status = make_status();
        write_status(&status, NXMEM_STATUS_INVALID_ARGUMENT, "a" + repeat("\xC3\xA9", 300));
        const std::string written = terminated_message(status);
        CHECK(written.size() == 255);
        CHECK(is_whole_utf8(written));
    }
}

TEST_CASE("utf8_prefix_length cuts on a sequence boundary", "[status][utf8]") {
    STATIC_REQUIRE(utf8_prefix_length("abc", 3) == 3);
    STATIC_REQUIRE(utf8_prefix_length("abc", 2) == 2);
    STATIC_REQUIRE(utf8_prefix_length("a\xC3\xA9", 2) == 1);
    STATIC_REQUIRE(utf8_prefix_length("a\xC3\xA9", 3) == 3);
    STATIC_REQUIRE(utf8_prefix_length("\xF0\x9F\x98\x80", 3) == 0);
    STATIC_REQUIRE(utf8_prefix_length("\xF0\x9F\x98\x80z", 4) == 4);
    STATIC_REQUIRE(utf8_prefix_length("abc", 0) == 0);
    STATIC_REQUIRE(utf8_prefix_length("", 0) == 0);
}

TEST_CASE("write_status respects a status whose struct_size is smaller than NxmemStatus",
          "[status][bounds]") {
    const std::string long_message(300, 'm');
    for (const std::uint32_t size : {0u, 4u, 6u, 7u, 8u, 9u, 10u, 16u, 100u, 263u}) {
        CAPTURE(size);
        byte_buffer buffer(sizeof(NxmemStatus), sentinel);
        std::memcpy(buffer.data(), &size, sizeof size);

        CHECK(write_status(buffer.as<NxmemStatus>(), NXMEM_STATUS_OUT_OF_MEMORY, long_message) ==
              NXMEM_STATUS_OUT_OF_MEMORY);

        // Nothing at or past struct_size changed.
        const std::size_t untouched_from = std::max<std::size_t>(size, sizeof(std::uint32_t));
        CHECK(std::all_of(buffer.data() + untouched_from, buffer.data() + buffer.size(),
                          [](unsigned char b) { return b == sentinel; }));
        // The code is written only when struct_size covers it.
        NxmemStatusCode code = 0;
        std::memcpy(&code, buffer.data() + offsetof(NxmemStatus, code), sizeof code);
        if (size >= 8) {
            CHECK(code == NXMEM_STATUS_OUT_OF_MEMORY);
        }
        // The message fills what there is, terminated inside struct_size.
        if (size > message_offset) {
            const std::size_t room = size - message_offset;
            const char* message = reinterpret_cast<const char*>(buffer.data() + message_offset);
            CHECK(std::string(message, room - 1) == std::string(room - 1, 'm'));
            CHECK(message[room - 1] == '\0');
        }
    }
    SECTION("a multibyte message in a tiny status") {
        byte_buffer buffer(sizeof(NxmemStatus), sentinel);
        const std::uint32_t size = message_offset + 2; // room for one byte and the NUL
        std::memcpy(buffer.data(), &size, sizeof size);
        write_status(buffer.as<NxmemStatus>(), NXMEM_STATUS_INTERNAL_ERROR, "\xC3\xA9\xC3\xA9");
        CHECK(buffer.data()[message_offset] == '\0');
        CHECK(buffer.data()[size] == sentinel);
    }
}

TEST_CASE("write_status never writes past 264 bytes, whatever struct_size claims",
          "[status][bounds]") {
    for (const std::uint32_t size : {265u, 300u, 4096u, 0xFFFFFFFFu}) {
        CAPTURE(size);
        byte_buffer buffer(sizeof(NxmemStatus) + 64, sentinel);
        std::memcpy(buffer.data(), &size, sizeof size);
        write_status(buffer.as<NxmemStatus>(), NXMEM_STATUS_INTERNAL_ERROR, std::string(1000, 'q'));
        CHECK(std::all_of(buffer.data() + sizeof(NxmemStatus), buffer.data() + buffer.size(),
                          [](unsigned char b) { return b == sentinel; }));
        CHECK(terminated_message(*buffer.as<NxmemStatus>()) == std::string(255, 'q'));
    }
}

TEST_CASE("read_status_message reads an unterminated buffer without overrun", "[status][bounds]") {
    // Exactly sizeof(NxmemStatus) bytes: a read past the message array is an ASan report.
    byte_buffer buffer(sizeof(NxmemStatus), 'A');
    NxmemStatus* status = buffer.as<NxmemStatus>();
    status->struct_size = sizeof(NxmemStatus);
    status->code = NXMEM_STATUS_INTERNAL_ERROR;
    std::memset(status->message, 'A', sizeof status->message);
    const std::string message = read_status_message(*status);
    CHECK(message.size() == NXMEM_STATUS_MESSAGE_BYTES);
    CHECK(message == std::string(256, 'A'));
}

TEST_CASE("read_status_message of an unterminated status ending at a PROT_NONE page does not fault",
          "[status][bounds]") {
    // The status's last byte is the last readable byte: one byte read past the message faults in
    // every build, not only under AddressSanitizer.
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* mapping =
        ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(mapping != MAP_FAILED);
    auto* base = static_cast<unsigned char*>(mapping);
    REQUIRE(::mprotect(base + page, page, PROT_NONE) == 0);
    auto* status = reinterpret_cast<NxmemStatus*>(base + page - sizeof(NxmemStatus));
    status->struct_size = sizeof(NxmemStatus);
    status->code = NXMEM_STATUS_INTERNAL_ERROR;
    std::memset(status->message, 'C', sizeof status->message);
    const std::string message = read_status_message(*status);
    ::munmap(mapping, 2 * page);
    CHECK(message == std::string(NXMEM_STATUS_MESSAGE_BYTES, 'C'));
}

TEST_CASE("read_status_message stops at the first NUL", "[status]") {
    NxmemStatus status = make_status();
    CHECK(read_status_message(status).empty());
    std::memcpy(status.message, "first\0second", 13);
    CHECK(read_status_message(status) == "first");
    std::memset(status.message, 'B', sizeof status.message);
    status.message[255] = '\0';
    CHECK(read_status_message(status) == std::string(255, 'B'));
}

TEST_CASE("an error describes itself as CODE: message", "[status][error]") {
    const nxmem::error failure{status_code::wrong_mechanism, "mechanism 7 is not mine"};
    CHECK(failure.describe() == "WRONG_MECHANISM: mechanism 7 is not mine");
    CHECK(nxmem::error{status_code::busy, ""}.describe() == "BUSY");
    CHECK(nxmem::error{}.code == status_code::internal_error);
    CHECK(nxmem::error{}.describe() == "INTERNAL_ERROR");
    CHECK(failure == nxmem::error{status_code::wrong_mechanism, "mechanism 7 is not mine"});
    CHECK_FALSE(failure == nxmem::error{status_code::wrong_device, "mechanism 7 is not mine"});
}

TEST_CASE("reading the value of a failed result throws bad_result_access", "[status][error]") {
    const nxmem::result<int> failed = nxmem::fail(status_code::host_refused, "no room");
    REQUIRE(failed.has_error());
    CHECK(failed.error().code == status_code::host_refused);
    CHECK_THROWS_WITH(failed.value(), "HOST_REFUSED: no room");
    try {
        (void)failed.value();
        FAIL("value() of a failed result returned");
    } catch (const nxmem::bad_result_access& thrown) {
        CHECK(thrown.failure() == nxmem::error{status_code::host_refused, "no room"});
    }
    const nxmem::result<int> succeeded = 5;
    CHECK(succeeded.value() == 5);
    CHECK_THROWS_AS(succeeded.error(), std::logic_error);
}

// A default std::string_view has data() == nullptr; memcpy may not receive it even for zero bytes
// (UBSan: "null pointer passed as argument 2"), so write_status must not pass it on.
TEST_CASE("an empty message given as a default string_view is written as an empty message",
          "[status]") {
    NxmemStatus status = make_status();
    std::memset(status.message, '#', sizeof status.message);
    CHECK(write_status(&status, NXMEM_STATUS_BUSY, std::string_view{}) == NXMEM_STATUS_BUSY);
    CHECK(status.code == NXMEM_STATUS_BUSY);
    CHECK(read_status_message(status).empty());
}
