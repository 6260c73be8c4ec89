// Batch messages (docs/TRANSFER.md, "Two paths"): reads and writes as one active message each
// way per about 1 MiB of blocks instead of one get or put per block, for transports whose RMA
// UCX emulates in software (tcp). Their layout, and the checks a target makes before touching
// any memory.
#pragma once

#include <nxmem/transfer/detail/records.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace nxmem::transfer::detail {

// Both ends are little-endian (every host UCX supports here): the fields travel as they lie.
static_assert(std::endian::native == std::endian::little, "batch messages are little-endian");

inline constexpr unsigned batch_request_am_id = 0x6e79;
inline constexpr unsigned batch_reply_am_id = 0x6e7a;
inline constexpr std::uint32_t batch_magic = 0x3162786eu; // "nxb1"
// The initiator cuts a request into messages of about this much data (a larger block into pieces),
// so the target copies one while the previous one is on the wire.
inline constexpr std::uint64_t batch_message_bytes = std::uint64_t{1} << 20;
// Batch data an initiator keeps unanswered per peer; more waits in its queue.
inline constexpr std::uint64_t max_batch_bytes_in_flight = std::uint64_t{4} << 20;
// What a target accepts in one message: it stages a read's reply, so this bounds what a peer can
// make it allocate.
inline constexpr std::uint32_t max_batch_entries = 1u << 14;
inline constexpr std::uint64_t max_batch_bytes = std::uint64_t{16} << 20;

enum class batch_op : std::uint8_t { read = 1, write = 2 };

// The header of a request and of its reply (the UCX active-message header).
struct batch_header {
    std::uint32_t magic = batch_magic;
    batch_op op = batch_op::read;
    std::uint8_t flags = 0; // a request's: batch_flag_rendezvous
    std::uint8_t reserved[2] = {};
    std::uint64_t token = 0;  // the initiator's, echoed in the reply
    std::uint32_t count = 0;  // entries in the request
    std::int32_t status = 0;  // the reply's: UCS_OK, or why the target refused
    agent_id sender{};        // the request's initiator; the reply's target
};
static_assert(sizeof(batch_header) == 40);

// The initiator takes the reply's data by rendezvous (the endpoint has a zero-copy lane for it,
// as cma over shared memory): the target need not force it into eager fragments.
inline constexpr std::uint8_t batch_flag_rendezvous = 1;
// The entries follow the header in the active message's header rather than leading its data, so
// a target knows where a write's bytes go before it takes them: by rendezvous, straight into its
// blocks. The data is then the write's bytes alone.
inline constexpr std::uint8_t batch_flag_entries_in_header = 2;

// One block at the target. A request's data is `count` entries, then (a write) the blocks' bytes
// in entry order; a read's reply is the blocks' bytes in entry order.
struct batch_entry {
    std::uint64_t address = 0;
    std::uint64_t length = 0;
};
static_assert(sizeof(batch_entry) == 16);


// A request whose header and data agree with each other; the entries are still unchecked against
// the target's registrations.
struct batch_request {
    batch_header header;
    std::span<const std::byte> entries; // count * sizeof(batch_entry), possibly unaligned
    std::span<const std::byte> data;    // a write's bytes (empty while they are still at the initiator)
    std::uint64_t bytes = 0;            // the sum of the entries' lengths

    batch_entry entry(std::uint32_t i) const noexcept {
        batch_entry out;
        std::memcpy(&out, entries.data() + std::size_t{i} * sizeof(batch_entry), sizeof out);
        return out;
    }
};

// Parses a request's header and data; nullopt when they disagree with each other (the target
// answers only with a status, so the reason is not spelled out). `data_length` is the data's
// length: `data` itself is empty for a write whose bytes come by rendezvous (then its entries must
// be in the header).
inline std::optional<batch_request> parse_batch_request(std::span<const std::byte> header,
                                                        std::span<const std::byte> data, std::uint64_t data_length) {
    batch_request request;
    if (header.size() < sizeof(batch_header)) {
        return std::nullopt;
    }
    std::memcpy(&request.header, header.data(), sizeof(batch_header));
    const batch_header& h = request.header;
    if (h.magic != batch_magic || (h.op != batch_op::read && h.op != batch_op::write)) {
        return std::nullopt;
    }
    if (h.count == 0 || h.count > max_batch_entries) {
        return std::nullopt;
    }
    const std::size_t entry_bytes = std::size_t{h.count} * sizeof(batch_entry);
    const bool in_header = (h.flags & batch_flag_entries_in_header) != 0;
    const bool rendezvous = data.size() != data_length;
    if (in_header) {
        if (header.size() != sizeof(batch_header) + entry_bytes) {
            return std::nullopt;
        }
        request.entries = header.subspan(sizeof(batch_header));
        request.data = data;
    } else {
        if (header.size() != sizeof(batch_header) || rendezvous || data.size() < entry_bytes) {
            return std::nullopt;
        }
        request.entries = data.first(entry_bytes);
        request.data = data.subspan(entry_bytes);
        data_length -= entry_bytes;
    }
    if (rendezvous && (h.op != batch_op::write || !data.empty())) {
        return std::nullopt; // only a write's bytes come by rendezvous, whole
    }
    for (std::uint32_t i = 0; i < h.count; ++i) {
        const batch_entry e = request.entry(i);
        // Non-empty, not wrapping, and the whole message within what a target stages.
        if (e.length == 0 || e.length > max_batch_bytes - request.bytes || e.address == 0 ||
            e.address > UINT64_MAX - e.length) {
            return std::nullopt;
        }
        request.bytes += e.length;
    }
    const std::uint64_t expected_data = h.op == batch_op::write ? request.bytes : 0;
    if (data_length != expected_data) {
        return std::nullopt;
    }
    return request;
}

} // namespace nxmem::transfer::detail
