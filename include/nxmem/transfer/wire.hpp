// The transfer layer's wire format: what crosses between agents as bytes (agent metadata, region
// lists, descriptor lists), little-endian, versioned, every read bounds-checked. Bytes from a peer
// are untrusted input: a reader never reads past the end, and every refusal names what was wrong.
//
// Every blob: magic "NXTR" (u32), format version (u16), kind (u16), body length (u32), body. A
// blob of another kind, another version, a body length that disagrees with the bytes, or bytes
// left over after the body are refused.
#pragma once

#include <nxmem/abi/result.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::transfer {

static_assert(std::endian::native == std::endian::little,
              "the transfer wire format is written as the host's bytes: little-endian hosts only");

inline constexpr std::uint32_t wire_magic = 0x5254584Eu; // "NXTR"
inline constexpr std::uint16_t wire_version = 1;
inline constexpr std::size_t wire_header_bytes = 12;
// Caps on what a peer may make us allocate or walk.
inline constexpr std::size_t max_blob_bytes = std::size_t{64} << 20;
inline constexpr std::size_t max_name_bytes = 256;
inline constexpr std::size_t max_worker_address_bytes = std::size_t{64} << 10;
inline constexpr std::size_t max_rkey_bytes = 4096;
inline constexpr std::size_t max_regions = 1u << 20;
inline constexpr std::uint64_t max_blocks = std::uint64_t{1} << 24; // blocks in one list
inline constexpr std::size_t max_notification_bytes = 4096;

enum class blob_kind : std::uint16_t { agent_metadata = 1, regions = 2, descriptors = 3 };

constexpr std::string_view blob_kind_name(blob_kind kind) noexcept {
    switch (kind) {
    case blob_kind::agent_metadata: return "agent metadata";
    case blob_kind::regions: return "region list";
    case blob_kind::descriptors: return "descriptor list";
    }
    return "unknown blob";
}

namespace detail {

class wire_writer {
public:
    explicit wire_writer(blob_kind kind) {
        put_u32(wire_magic);
        put_u16(wire_version);
        put_u16(static_cast<std::uint16_t>(kind));
        put_u32(0); // body length, written by finish()
    }
    void put_u8(std::uint8_t value) { bytes_.push_back(static_cast<std::byte>(value)); }
    void put_u16(std::uint16_t value) { put_raw(&value, sizeof value); }
    void put_u32(std::uint32_t value) { put_raw(&value, sizeof value); }
    void put_u64(std::uint64_t value) { put_raw(&value, sizeof value); }
    // A length (u32) and the bytes.
    void put_bytes(std::span<const std::byte> data) {
        put_u32(static_cast<std::uint32_t>(data.size()));
        put_raw(data.data(), data.size());
    }
    void put_raw(const void* data, std::size_t size) {
        const auto* first = static_cast<const std::byte*>(data);
        bytes_.insert(bytes_.end(), first, first + size);
    }
    std::vector<std::byte> finish() && {
        const auto body = static_cast<std::uint32_t>(bytes_.size() - wire_header_bytes);
        std::memcpy(bytes_.data() + 8, &body, sizeof body);
        return std::move(bytes_);
    }

private:
    std::vector<std::byte> bytes_;
};

// Reads a blob's body; every read is checked against what is left, and a failed read leaves the
// reader failed (later reads fail too) so a parser checks once per record.
class wire_reader {
public:
    // Checks the header; `what` names the blob in messages.
    static result<wire_reader> open(std::span<const std::byte> blob, blob_kind expected) {
        const std::string what(blob_kind_name(expected));
        if (blob.size() < wire_header_bytes) {
            return fail(status_code::invalid_argument,
                        what + ": " + std::to_string(blob.size()) + " bytes, shorter than the " +
                            std::to_string(wire_header_bytes) + "-byte header (truncated)");
        }
        if (blob.size() > max_blob_bytes) {
            return fail(status_code::invalid_argument,
                        what + ": " + std::to_string(blob.size()) + " bytes exceed the cap of " +
                            std::to_string(max_blob_bytes));
        }
        std::uint32_t magic = 0;
        std::uint16_t version = 0;
        std::uint16_t kind = 0;
        std::uint32_t body = 0;
        std::memcpy(&magic, blob.data(), 4);
        std::memcpy(&version, blob.data() + 4, 2);
        std::memcpy(&kind, blob.data() + 6, 2);
        std::memcpy(&body, blob.data() + 8, 4);
        if (magic != wire_magic) {
            return fail(status_code::invalid_argument, what + ": not an nxmem transfer blob (bad magic)");
        }
        if (version != wire_version) {
            return fail(status_code::version_mismatch,
                        what + ": format version " + std::to_string(version) + ", this reader speaks " +
                            std::to_string(wire_version));
        }
        if (kind != static_cast<std::uint16_t>(expected)) {
            return fail(status_code::invalid_argument,
                        what + " expected, got a blob of kind " + std::to_string(kind));
        }
        if (body != blob.size() - wire_header_bytes) {
            return fail(status_code::invalid_argument,
                        what + ": the header says " + std::to_string(body) + " body bytes, " +
                            std::to_string(blob.size() - wire_header_bytes) + " arrived" +
                            (body > blob.size() - wire_header_bytes ? " (truncated)" : " (trailing bytes)"));
        }
        return wire_reader(blob.subspan(wire_header_bytes), what);
    }

    bool get_u8(std::uint8_t& value) noexcept { return get_raw(&value, sizeof value); }
    bool get_u16(std::uint16_t& value) noexcept { return get_raw(&value, sizeof value); }
    bool get_u32(std::uint32_t& value) noexcept { return get_raw(&value, sizeof value); }
    bool get_u64(std::uint64_t& value) noexcept { return get_raw(&value, sizeof value); }
    // A length-prefixed run of at most `cap` bytes, as a view into the blob.
    bool get_bytes(std::span<const std::byte>& value, std::size_t cap) noexcept {
        std::uint32_t length = 0;
        if (!get_u32(length) || length > cap || length > left()) {
            failed_ = true;
            return false;
        }
        value = body_.subspan(at_, length);
        at_ += length;
        return true;
    }
    bool get_raw(void* out, std::size_t size) noexcept {
        if (failed_ || size > left()) {
            failed_ = true;
            return false;
        }
        std::memcpy(out, body_.data() + at_, size);
        at_ += size;
        return true;
    }
    std::size_t left() const noexcept { return body_.size() - at_; }
    std::size_t offset() const noexcept { return at_ + wire_header_bytes; }
    // The refusal for a failed read or a bad field, naming the blob and the byte offset.
    error malformed(std::string_view problem) const {
        return error{status_code::invalid_argument,
                     what_ + ": " + std::string(problem) + " (at byte " + std::to_string(offset()) + ")"};
    }
    // Refuses bytes left after the last record.
    result<void> finish() const {
        if (failed_) {
            return malformed("truncated");
        }
        if (left() != 0) {
            return malformed(std::to_string(left()) + " trailing bytes after the last record");
        }
        return boost::outcome_v2::success();
    }

private:
    wire_reader(std::span<const std::byte> body, std::string what) : body_(body), what_(std::move(what)) {}
    std::span<const std::byte> body_;
    std::size_t at_ = 0;
    bool failed_ = false;
    std::string what_;
};

} // namespace detail
} // namespace nxmem::transfer
