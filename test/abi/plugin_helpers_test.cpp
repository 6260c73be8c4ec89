// The C plugin helpers (include/nxmem/nxmem_plugin_helpers.h), compiled here as C++: the status
// writer (ABI.md E3, E4), the request check (Q2-Q5), the output check (Q7) and the output copy
// (Q6). Buffers are exactly sized (byte_buffer), so under ASan a byte read or written past
// struct_size is reported.
#include "../support/byte_buffer.hpp"

#include <nxmem/nxmem_plugin_helpers.h>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace {

using nxmem::test::byte_buffer;

constexpr unsigned char sentinel = 0x5A;
constexpr std::size_t message_offset = offsetof(NxmemStatus, message);

byte_buffer status_buffer(std::size_t bytes, std::uint32_t struct_size) {
    byte_buffer buffer(bytes, sentinel);
    std::memcpy(buffer.data(), &struct_size, sizeof struct_size);
    return buffer;
}

// Not inlined: GCC 12 would otherwise see the exact allocation size and warn (-Warray-bounds) on
// the scan of unknown bytes past it, on a path that never runs (struct_size == sizeof).
[[gnu::noinline]] byte_buffer struct_buffer(std::size_t bytes, std::uint32_t struct_size) {
    byte_buffer buffer(bytes, 0);
    std::memcpy(buffer.data(), &struct_size, sizeof struct_size);
    return buffer;
}

std::string message_of(const byte_buffer& buffer) {
    return std::string(buffer.as<NxmemStatus>()->message);
}

} // namespace

TEST_CASE("nxmem_report writes the code and a message, and returns the code", "[abi][c-helpers]") {
    byte_buffer status = status_buffer(sizeof(NxmemStatus), sizeof(NxmemStatus));
    CHECK(nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_WRONG_DEVICE, "device %d of %s", 3,
                       "cpu") == NXMEM_STATUS_WRONG_DEVICE);
    CHECK(status.as<NxmemStatus>()->code == NXMEM_STATUS_WRONG_DEVICE);
    CHECK(message_of(status) == "device 3 of cpu");
}

TEST_CASE("nxmem_report with a NULL status only returns the code", "[abi][c-helpers]") {
    CHECK(nxmem_report(nullptr, NXMEM_STATUS_OUT_OF_MEMORY, "%s", "ignored") ==
          NXMEM_STATUS_OUT_OF_MEMORY);
}

TEST_CASE("nxmem_report truncates an overlong message to 255 bytes and terminates it",
          "[abi][c-helpers]") {
    // A status that claims more than NxmemStatus: nothing is written past the 256-byte buffer.
    byte_buffer status = status_buffer(sizeof(NxmemStatus) + 16, sizeof(NxmemStatus) + 16);
    const std::string overlong(1000, 'x');
    nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_INVALID_ARGUMENT, "%s", overlong.c_str());
    CHECK(message_of(status) == std::string(NXMEM_STATUS_MESSAGE_BYTES - 1, 'x'));
    for (std::size_t at = sizeof(NxmemStatus); at < status.size(); ++at) {
        INFO("byte " << at);
        CHECK(status.data()[at] == sentinel);
    }
}

TEST_CASE("nxmem_report never splits a UTF-8 sequence when it truncates", "[abi][c-helpers]") {
    byte_buffer status = status_buffer(sizeof(NxmemStatus), sizeof(NxmemStatus));
    // 2-byte sequences: the 255-byte cut falls after the first byte of the 128th.
    std::string text;
    while (text.size() < 300) {
        text += "\xC3\xA9";
    }
    nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_INVALID_ARGUMENT, "%s", text.c_str());
    const std::string written = message_of(status);
    CHECK(written.size() == NXMEM_STATUS_MESSAGE_BYTES - 2); // the lone lead byte was dropped
    CHECK(written == text.substr(0, written.size()));

    // A 3-byte sequence cut after two of its bytes is dropped whole.
    std::string three = "x"; // then 3-byte sequences: the cut keeps two bytes of the 85th
    while (three.size() < 300) {
        three += "\xE2\x82\xAC";
    }
    nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_INVALID_ARGUMENT, "%s", three.c_str());
    CHECK(message_of(status).size() == NXMEM_STATUS_MESSAGE_BYTES - 1 - 2);
}

TEST_CASE("nxmem_report stays within a status whose struct_size is smaller than NxmemStatus",
          "[abi][c-helpers]") {
    SECTION("room for the code and 9 message bytes: 8 characters and the NUL") {
        const std::size_t size = message_offset + 9;
        byte_buffer status = status_buffer(size, static_cast<std::uint32_t>(size));
        nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_INTERNAL_ERROR, "%s",
                     "a long message that does not fit");
        CHECK(status.as<NxmemStatus>()->code == NXMEM_STATUS_INTERNAL_ERROR);
        CHECK(message_of(status) == "a long m");
    }
    SECTION("too small for the code: nothing but struct_size is there, nothing is written") {
        byte_buffer status = status_buffer(sizeof(std::uint32_t) + 2, sizeof(std::uint32_t) + 2);
        CHECK(nxmem_report(status.as<NxmemStatus>(), NXMEM_STATUS_INTERNAL_ERROR, "%s", "x") ==
              NXMEM_STATUS_INTERNAL_ERROR);
        CHECK(status.data()[4] == sentinel);
        CHECK(status.data()[5] == sentinel);
    }
}

TEST_CASE("nxmem_check_request refuses a NULL request, a wrong struct_size and unknown bytes",
          "[abi][c-helpers]") {
    constexpr std::size_t baseline = NXMEM_FIELD_END(NxmemAllocRequest, alignment);
    byte_buffer status = status_buffer(sizeof(NxmemStatus), sizeof(NxmemStatus));
    NxmemStatus* out = status.as<NxmemStatus>();

    SECTION("NULL") {
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, nullptr, out) ==
              NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK(message_of(status) == "NxmemAllocRequest: NULL request");
    }
    SECTION("struct_size below the baseline") {
        byte_buffer request = struct_buffer(baseline - 1, baseline - 1);
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, request.data(), out) ==
              NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(message_of(status),
                   Catch::Contains("struct_size " + std::to_string(baseline - 1) + " is outside"));
    }
    SECTION("struct_size above the 4096-byte cap") {
        byte_buffer request = struct_buffer(sizeof(NxmemAllocRequest),
                                                               NXMEM_MAX_STRUCT_SIZE + 1);
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, request.data(), out) ==
              NXMEM_STATUS_INVALID_ARGUMENT);
    }
    SECTION("a larger request with a non-zero unknown byte, named") {
        const std::size_t size = sizeof(NxmemAllocRequest) + 8;
        byte_buffer request = struct_buffer(size, size);
        request.data()[sizeof(NxmemAllocRequest) + 5] = 1;
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, request.data(), out) ==
              NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK_THAT(message_of(status),
                   Catch::Contains("byte " + std::to_string(sizeof(NxmemAllocRequest) + 5)));
    }
    SECTION("accepted: the baseline, and a larger request whose unknown bytes are zero") {
        byte_buffer smallest = struct_buffer(baseline, baseline);
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, smallest.data(), out) ==
              NXMEM_STATUS_OK);
        const std::size_t size = sizeof(NxmemAllocRequest) + 8;
        byte_buffer larger = struct_buffer(size, size);
        CHECK(NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, larger.data(), out) ==
              NXMEM_STATUS_OK);
    }
}

TEST_CASE("nxmem_check_output refuses a NULL or too small output and leaves it untouched",
          "[abi][c-helpers]") {
    constexpr std::size_t baseline = NXMEM_FIELD_END(NxmemAllocResult, mapped_bytes);
    byte_buffer status = status_buffer(sizeof(NxmemStatus), sizeof(NxmemStatus));
    CHECK(NXMEM_CHECK_OUTPUT(NxmemAllocResult, mapped_bytes, nullptr, status.as<NxmemStatus>()) ==
          NXMEM_STATUS_INVALID_ARGUMENT);

    byte_buffer small = struct_buffer(baseline - 1, baseline - 1);
    const auto before = small.bytes();
    CHECK(NXMEM_CHECK_OUTPUT(NxmemAllocResult, mapped_bytes, small.data(),
                             status.as<NxmemStatus>()) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(small.bytes() == before);
    CHECK_THAT(message_of(status), Catch::Contains("NxmemAllocResult: output missing"));

    byte_buffer enough = struct_buffer(baseline, baseline);
    CHECK(NXMEM_CHECK_OUTPUT(NxmemAllocResult, mapped_bytes, enough.data(),
                             status.as<NxmemStatus>()) == NXMEM_STATUS_OK);
}

TEST_CASE("nxmem_copy_output writes only within the receiver's struct_size and keeps it",
          "[abi][c-helpers]") {
    NxmemUnloadReport value{};
    value.struct_size = sizeof value;
    value.live_allocators = 7;
    value.live_allocations = 9;
    constexpr std::size_t shorter = NXMEM_FIELD_END(NxmemUnloadReport, live_allocators);

    byte_buffer small = struct_buffer(shorter, shorter);
    nxmem_copy_output(small.data(), &value, sizeof value);
    CHECK(small.as<NxmemUnloadReport>()->struct_size == shorter);
    CHECK(small.as<NxmemUnloadReport>()->live_allocators == 7);

    const std::size_t larger = sizeof value + 8;
    byte_buffer big = struct_buffer(larger, static_cast<std::uint32_t>(larger));
    std::memset(big.data() + sizeof value, sentinel, 8);
    nxmem_copy_output(big.data(), &value, sizeof value);
    CHECK(big.as<NxmemUnloadReport>()->struct_size == larger);
    CHECK(big.as<NxmemUnloadReport>()->live_allocations == 9);
    for (std::size_t at = sizeof value; at < larger; ++at) {
        CHECK(big.data()[at] == sentinel); // bytes this plugin does not know are left alone
    }
}
