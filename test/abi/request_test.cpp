// Requests (host -> plugin) follow the kernel's extensible-struct rule; outputs (plugin -> host)
// are written only within the receiver's struct_size; make_struct is what a sender starts from.
#include "../support/byte_buffer.hpp"
#include <nxmem/abi/request.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

using nxmem::status_code;
using nxmem::abi::make_struct;
using nxmem::abi::read_request;
using nxmem::abi::write_output;
using Catch::Matchers::Contains;

using nxmem::test::byte_buffer;

NxmemAllocRequest sample_request() {
    auto request = make_struct<NxmemAllocRequest>();
    request.flags = 0x5;
    request.mechanism_id = 0xABCDEF;
    request.device = NxmemDeviceId{sizeof(NxmemDeviceId), NXMEM_DEVICE_CUDA, 2, 0};
    request.allocation_id = 77;
    request.size = 1u << 20;
    request.alignment = 4096;
    return request;
}

NxmemAllocResult sample_result() {
    auto result = make_struct<NxmemAllocResult>();
    result.address = 0x7F0000001000u;
    result.size = 8192;
    result.mapped_bytes = 4096;
    return result;
}

// `request` followed by zeros, in a buffer of exactly `struct_size` bytes.
byte_buffer request_buffer(const NxmemAllocRequest& request, std::uint32_t struct_size) {
    byte_buffer buffer(std::max<std::size_t>(struct_size, sizeof request));
    std::memcpy(buffer.data(), &request, sizeof request);
    std::memcpy(buffer.data(), &struct_size, sizeof struct_size);
    return buffer;
}

bool same_fields(const NxmemAllocRequest& a, const NxmemAllocRequest& b) {
    return a.flags == b.flags && a.mechanism_id == b.mechanism_id &&
           a.device.device_type == b.device.device_type && a.device.index == b.device.index &&
           a.allocation_id == b.allocation_id && a.size == b.size && a.alignment == b.alignment;
}

} // namespace

TEST_CASE("make_struct sets struct_size to this header's size and zeroes the rest", "[request]") {
    STATIC_REQUIRE(make_struct<NxmemAllocRequest>().struct_size == sizeof(NxmemAllocRequest));
    STATIC_REQUIRE(make_struct<NxmemAllocRequest>().size == 0);
    STATIC_REQUIRE(make_struct<NxmemStatus>().struct_size == 264);
    STATIC_REQUIRE(make_struct<NxmemAllocatorVtable>().struct_size == 152);
    STATIC_REQUIRE(make_struct<NxmemAllocatorVtable>().abi_minor == 0);
    STATIC_REQUIRE(make_struct<NxmemOpenRequest>().options == nullptr);

    const auto request = make_struct<NxmemRangeRequest>();
    std::vector<unsigned char> bytes(sizeof request);
    std::memcpy(bytes.data(), &request, sizeof request);
    CHECK(request.struct_size == sizeof(NxmemRangeRequest));
    CHECK(std::all_of(bytes.begin() + 4, bytes.end(), [](unsigned char b) { return b == 0; }));
}

TEST_CASE("a request of exactly the known size is copied field for field", "[request]") {
    const NxmemAllocRequest source = sample_request();
    const auto copy = read_request(&source);
    REQUIRE(copy.has_value());
    CHECK(copy.value().struct_size == sizeof(NxmemAllocRequest));
    CHECK(same_fields(copy.value(), source));
}

TEST_CASE("a NULL request is refused", "[request]") {
    const auto copy = read_request<NxmemAllocRequest>(nullptr);
    REQUIRE(copy.has_error());
    CHECK(copy.error().code == status_code::invalid_argument);
    CHECK_THAT(copy.error().message, Contains("NULL"));
    CHECK_THAT(copy.error().message, Contains("NxmemAllocRequest"));
}

TEST_CASE("a request smaller than the baseline is refused", "[request]") {
    for (const std::uint32_t size : {0u, 4u, 8u, 55u}) {
        CAPTURE(size);
        NxmemAllocRequest source = sample_request();
        source.struct_size = size;
        const auto copy = read_request(&source);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::invalid_argument);
        CHECK_THAT(copy.error().message, Contains("struct_size " + std::to_string(size)));
        CHECK_THAT(copy.error().message, Contains("baseline"));
    }
}

TEST_CASE("a larger request whose unknown bytes are all zero is accepted", "[request]") {
    for (const std::uint32_t size : {57u, 64u, 1000u, 4096u}) {
        CAPTURE(size);
        const byte_buffer buffer = request_buffer(sample_request(), size);
        const auto copy = read_request(buffer.as<const NxmemAllocRequest>());
        REQUIRE(copy.has_value());
        CHECK(copy.value().struct_size == size);
        CHECK(same_fields(copy.value(), sample_request()));
    }
}

TEST_CASE("a larger request with any non-zero unknown byte is refused, naming the byte",
          "[request]") {
    constexpr std::uint32_t size = 72;
    for (std::size_t at = sizeof(NxmemAllocRequest); at < size; ++at) {
        CAPTURE(at);
        const byte_buffer buffer = request_buffer(sample_request(), size);
        buffer.data()[at] = 0x01;
        const auto copy = read_request(buffer.as<const NxmemAllocRequest>());
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::invalid_argument);
        CHECK_THAT(copy.error().message, Contains("byte " + std::to_string(at)));
    }
    SECTION("the last byte of the largest request") {
        const byte_buffer buffer = request_buffer(sample_request(), NXMEM_MAX_STRUCT_SIZE);
        buffer.data()[NXMEM_MAX_STRUCT_SIZE - 1] = 0x80;
        const auto copy = read_request(buffer.as<const NxmemAllocRequest>());
        REQUIRE(copy.has_error());
        CHECK_THAT(copy.error().message, Contains("byte 4095"));
    }
}

TEST_CASE("bytes past a request's struct_size are neither read nor judged", "[request]") {
    byte_buffer buffer(80, 0xEE);
    const NxmemAllocRequest source = sample_request();
    std::memcpy(buffer.data(), &source, sizeof source);
    std::memset(buffer.data() + sizeof source, 0, 8);
    const std::uint32_t size = 64;
    std::memcpy(buffer.data(), &size, sizeof size);
    const auto copy = read_request(buffer.as<const NxmemAllocRequest>());
    REQUIRE(copy.has_value());
    CHECK(same_fields(copy.value(), source));
}

TEST_CASE("a request larger than the 4096-byte cap is refused without being scanned", "[request]") {
    for (const std::uint32_t size : {4097u, 65536u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
        CAPTURE(size);
        // Only sizeof(T) bytes exist: scanning toward struct_size would overrun (ASan) or fault.
        NxmemAllocRequest source = sample_request();
        source.struct_size = size;
        const auto copy = read_request(&source);
        REQUIRE(copy.has_error());
        CHECK(copy.error().code == status_code::invalid_argument);
        CHECK_THAT(copy.error().message, Contains("exceeds"));
        CHECK_THAT(copy.error().message, Contains(std::to_string(size)));
    }
}

TEST_CASE("other request types follow the same rule", "[request]") {
    auto open = make_struct<NxmemOpenRequest>();
    open.device = NxmemDeviceId{sizeof(NxmemDeviceId), NXMEM_DEVICE_CPU, 0, 0};
    open.options = "a=b";
    open.options_length = 3;
    const auto copy = read_request(&open);
    REQUIRE(copy.has_value());
    CHECK(copy.value().options == open.options);
    CHECK(copy.value().options_length == 3);

    open.struct_size = sizeof(NxmemOpenRequest) - 1;
    const auto short_copy = read_request(&open);
    REQUIRE(short_copy.has_error());
    CHECK_THAT(short_copy.error().message, Contains("NxmemOpenRequest"));
}

TEST_CASE("an output is written whole and keeps the receiver's struct_size", "[output]") {
    constexpr std::size_t size = sizeof(NxmemAllocResult);
    byte_buffer buffer(size + 16, 0x5A);
    const std::uint32_t receiver_size = size;
    std::memcpy(buffer.data(), &receiver_size, sizeof receiver_size);

    NxmemAllocResult value = sample_result();
    value.struct_size = 999; // the sender's idea of the size never overwrites the receiver's
    REQUIRE(write_output(buffer.as<NxmemAllocResult>(), value).has_value());

    NxmemAllocResult written{};
    std::memcpy(&written, buffer.data(), sizeof written);
    CHECK(written.struct_size == size);
    CHECK(written.address == value.address);
    CHECK(written.size == value.size);
    CHECK(written.mapped_bytes == value.mapped_bytes);
    CHECK(std::all_of(buffer.data() + size, buffer.data() + buffer.size(),
                      [](unsigned char b) { return b == 0x5A; }));
}

TEST_CASE("an output larger than this header's struct gets only the known bytes", "[output]") {
    constexpr std::uint32_t receiver_size = sizeof(NxmemAllocResult) + 16;
    byte_buffer buffer(receiver_size + 16, 0x5A);
    std::memcpy(buffer.data(), &receiver_size, sizeof receiver_size);
    REQUIRE(write_output(buffer.as<NxmemAllocResult>(), sample_result()).has_value());

    NxmemAllocResult written{};
    std::memcpy(&written, buffer.data(), sizeof written);
    CHECK(written.struct_size == receiver_size);
    CHECK(written.mapped_bytes == sample_result().mapped_bytes);
    // Nothing at all past the receiver's struct_size.
    CHECK(std::all_of(buffer.data() + receiver_size, buffer.data() + buffer.size(),
                      [](unsigned char b) { return b == 0x5A; }));
}

TEST_CASE("an output shorter than this header's struct is written only within its struct_size",
          "[output]") {
    // A minor-0 receiver of the allocator table: 112 bytes, no release_allocation.
    constexpr std::uint32_t receiver_size = 112;
    STATIC_REQUIRE(nxmem::abi::bytes_required<NxmemAllocatorVtable>(0) == receiver_size);
    byte_buffer buffer(sizeof(NxmemAllocatorVtable) + 8, 0x5A);
    std::memcpy(buffer.data(), &receiver_size, sizeof receiver_size);

    auto value = make_struct<NxmemAllocatorVtable>();
    value.abi_minor = 1;
    value.type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
    value.mechanism_id = 31;
    std::memset(reinterpret_cast<unsigned char*>(&value) + receiver_size, 0x11,
                sizeof value - receiver_size); // a non-NULL bit pattern in release_allocation
    REQUIRE(write_output(buffer.as<NxmemAllocatorVtable>(), value).has_value());

    std::uint32_t written_size = 0;
    std::uint64_t written_mechanism = 0;
    std::memcpy(&written_size, buffer.data(), sizeof written_size);
    std::memcpy(&written_mechanism, buffer.data() + offsetof(NxmemAllocatorVtable, mechanism_id),
                sizeof written_mechanism);
    CHECK(written_size == receiver_size);
    CHECK(written_mechanism == 31);
    CHECK(std::all_of(buffer.data() + receiver_size, buffer.data() + buffer.size(),
                      [](unsigned char b) { return b == 0x5A; }));
}

TEST_CASE("an output too small for the baseline struct is refused and left untouched", "[output]") {
    for (const std::uint32_t receiver_size : {0u, 4u, 8u, 31u}) {
        CAPTURE(receiver_size);
        byte_buffer buffer(sizeof(NxmemAllocResult) + 8, 0x5A);
        std::memcpy(buffer.data(), &receiver_size, sizeof receiver_size);
        const std::vector<unsigned char> before = buffer.bytes();
        const auto written = write_output(buffer.as<NxmemAllocResult>(), sample_result());
        REQUIRE(written.has_error());
        CHECK(written.error().code == status_code::invalid_argument);
        CHECK_THAT(written.error().message, Contains("struct_size " + std::to_string(receiver_size)));
        CHECK(buffer.bytes() == before);
    }
}

TEST_CASE("a NULL output is refused", "[output]") {
    const auto written = write_output<NxmemAllocResult>(nullptr, sample_result());
    REQUIRE(written.has_error());
    CHECK(written.error().code == status_code::invalid_argument);
    CHECK_THAT(written.error().message, Contains("NULL"));
}
