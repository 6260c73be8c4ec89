// Descriptors: where memory is, as a remote agent names it (NIXL's model: memory kind, address,
// length, device), in lists and in a strided form for KV blocks (base, block size, stride,
// count). A list is a sequence of runs; a plain descriptor is a run of one block. Lists are
// serialised as bytes the engine sends however it likes, and parsed back with every field
// checked (docs/TRANSFER.md, "What crosses the wire").
#pragma once

#include <nxmem/detail/hex.hpp>
#include <nxmem/transfer/wire.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nxmem::transfer {

enum class memory_kind : std::uint8_t { host = 0, device = 1 };

constexpr std::string_view memory_kind_name(memory_kind kind) noexcept {
    return kind == memory_kind::host ? "host" : "device";
}

// One block: `length` bytes at `address` of `device` (0 for host memory).
struct descriptor {
    std::uint64_t address = 0;
    std::uint64_t length = 0;
    std::uint32_t device = 0;
    memory_kind kind = memory_kind::host;
};

// `count` blocks of `block_bytes`, the first at `base`, each `stride` bytes after the previous.
struct strided_descriptor {
    std::uint64_t base = 0;
    std::uint64_t block_bytes = 0;
    std::uint64_t stride = 0;
    std::uint64_t count = 0;
    std::uint32_t device = 0;
    memory_kind kind = memory_kind::host;
};

// A run of blocks as a list holds it (a plain descriptor: count 1, stride = length).
struct descriptor_run {
    std::uint64_t base = 0;
    std::uint64_t block_bytes = 0;
    std::uint64_t stride = 0;
    std::uint64_t count = 0;
    std::uint32_t device = 0;
    memory_kind kind = memory_kind::host;

    descriptor block(std::uint64_t index) const noexcept {
        return descriptor{base + index * stride, block_bytes, device, kind};
    }
    // One past the last byte of the last block (checked against wrapping when the run was made).
    std::uint64_t end() const noexcept { return base + stride * (count - 1) + block_bytes; }
};

namespace detail {
// Why a run is not well formed (empty when it is): no empty block, no wrap of the address space,
// no overlap between blocks (a stride shorter than a block would let one read land on another),
// a known memory kind.
inline std::string run_problem(const descriptor_run& run) {
    if (run.kind != memory_kind::host && run.kind != memory_kind::device) {
        return "unknown memory kind " + std::to_string(static_cast<unsigned>(run.kind));
    }
    if (run.block_bytes == 0) {
        return "a block of 0 bytes";
    }
    if (run.count == 0) {
        return "a run of 0 blocks";
    }
    if (run.count > max_blocks) {
        return "a run of " + std::to_string(run.count) + " blocks (at most " + std::to_string(max_blocks) + ")";
    }
    if (run.count > 1 && run.stride < run.block_bytes) {
        return "stride " + std::to_string(run.stride) + " shorter than the block (" +
               std::to_string(run.block_bytes) + " bytes): blocks would overlap";
    }
    const std::uint64_t span_before_last = run.count > 1 ? run.stride : 0;
    const std::uint64_t steps = run.count - 1;
    if ((steps != 0 && span_before_last > (UINT64_MAX - run.block_bytes) / steps) ||
        run.base > UINT64_MAX - (span_before_last * steps + run.block_bytes)) {
        return "the run wraps past the end of the address space (base 0x" + nxmem::detail::to_hex(run.base) + ")";
    }
    return {};
}
} // namespace detail

class descriptor_list {
public:
    descriptor_list() = default;

    result<void> add(const descriptor& block) {
        return add_run(descriptor_run{block.address, block.length, block.length, 1, block.device, block.kind});
    }
    result<void> add(const strided_descriptor& blocks) {
        return add_run(descriptor_run{blocks.base, blocks.block_bytes, blocks.count > 1 ? blocks.stride : blocks.block_bytes,
                                      blocks.count, blocks.device, blocks.kind});
    }

    const std::vector<descriptor_run>& runs() const noexcept { return runs_; }
    std::uint64_t block_count() const noexcept { return blocks_; }
    std::uint64_t total_bytes() const noexcept { return bytes_; }
    bool empty() const noexcept { return blocks_ == 0; }
    void clear() noexcept {
        runs_.clear();
        blocks_ = 0;
        bytes_ = 0;
    }

    // Bytes for a peer: the header, a run count (u32), each run (base, block bytes, stride, count:
    // u64; device: u32; kind: u8).
    std::vector<std::byte> serialise() const {
        detail::wire_writer out(blob_kind::descriptors);
        out.put_u32(static_cast<std::uint32_t>(runs_.size()));
        for (const descriptor_run& run : runs_) {
            out.put_u64(run.base);
            out.put_u64(run.block_bytes);
            out.put_u64(run.stride);
            out.put_u64(run.count);
            out.put_u32(run.device);
            out.put_u8(static_cast<std::uint8_t>(run.kind));
        }
        return std::move(out).finish();
    }

    // Parses a peer's bytes; every run is checked as add() checks it. Nothing is kept on refusal.
    static result<descriptor_list> parse(std::span<const std::byte> blob) {
        NXMEM_TRY(in, detail::wire_reader::open(blob, blob_kind::descriptors));
        std::uint32_t count = 0;
        if (!in.get_u32(count)) {
            return in.malformed("truncated before the run count");
        }
        constexpr std::size_t run_bytes = 8 * 4 + 4 + 1;
        if (count > in.left() / run_bytes) {
            return in.malformed(std::to_string(count) + " runs announced, room for " +
                                std::to_string(in.left() / run_bytes));
        }
        descriptor_list list;
        list.runs_.reserve(count);
        for (std::uint32_t i = 0; i < count; ++i) {
            descriptor_run run;
            std::uint8_t kind = 0;
            if (!(in.get_u64(run.base) && in.get_u64(run.block_bytes) && in.get_u64(run.stride) &&
                  in.get_u64(run.count) && in.get_u32(run.device) && in.get_u8(kind))) {
                return in.malformed("run " + std::to_string(i) + " truncated");
            }
            run.kind = static_cast<memory_kind>(kind);
            result<void> added = list.add_run(run);
            if (!added) {
                return in.malformed("run " + std::to_string(i) + ": " + added.error().message);
            }
        }
        NXMEM_TRY_VOID(in.finish());
        return list;
    }

private:
    result<void> add_run(const descriptor_run& run) {
        std::string problem = detail::run_problem(run);
        if (!problem.empty()) {
            return fail(status_code::invalid_argument, "descriptor refused: " + problem);
        }
        if (run.count > max_blocks - blocks_) {
            return fail(status_code::invalid_argument,
                        "descriptor refused: the list would hold more than " + std::to_string(max_blocks) + " blocks");
        }
        runs_.push_back(run);
        blocks_ += run.count;
        const std::uint64_t run_bytes = run.count * run.block_bytes; // no wrap: run_problem checked
        bytes_ = run_bytes > UINT64_MAX - bytes_ ? UINT64_MAX : bytes_ + run_bytes;
        return boost::outcome_v2::success();
    }

    std::vector<descriptor_run> runs_;
    std::uint64_t blocks_ = 0;
    std::uint64_t bytes_ = 0;
};

} // namespace nxmem::transfer
