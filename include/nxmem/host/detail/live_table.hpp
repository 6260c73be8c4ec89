// The host's record of one allocator's live allocations, keyed by the host-assigned allocation id.
// A release claims its record under the shard's lock (marks it releasing), the lock is dropped
// before the plugin is called, and the record is erased once the plugin has taken the allocation
// back, or unmarked if it refused: a refused release never needs to allocate a record again.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/allocation_id_source.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/nxmem_memory_abi.h>

#include <bit>
#include <cstdint>
#include <string>
#include <utility>

namespace nxmem::host::detail {

// One live allocation in 16 bytes (24 with its id in the table's slot): the size, the alignment's
// exponent and the releasing mark share one word, so sizes are below 2^57 bytes (128 PiB, more
// than any address space maps); the host refuses larger requests before calling the plugin.
class live_record {
public:
    static constexpr std::uint64_t max_size = (std::uint64_t{1} << 57) - 1;

    live_record() = default;
    // `size` <= max_size and `alignment` a power of two (allocate checks both).
    live_record(std::uint64_t address, std::uint64_t size, std::uint64_t alignment) noexcept
        : address_(address),
          shape_(size | static_cast<std::uint64_t>(std::countr_zero(alignment)) << alignment_shift) {}

    std::uint64_t address() const noexcept { return address_; }
    std::uint64_t size() const noexcept { return shape_ & max_size; }
    std::uint64_t alignment() const noexcept {
        return std::uint64_t{1} << ((shape_ >> alignment_shift) & 63u);
    }
    // Claimed by a release or enqueue that has not finished.
    bool releasing() const noexcept { return (shape_ & releasing_bit) != 0; }
    void mark_releasing(bool releasing) noexcept {
        shape_ = releasing ? shape_ | releasing_bit : shape_ & ~releasing_bit;
    }

private:
    static constexpr unsigned alignment_shift = 57;
    static constexpr std::uint64_t releasing_bit = std::uint64_t{1} << 63;
    std::uint64_t address_ = 0;
    std::uint64_t shape_ = 0; // bits 0-56 size, 57-62 log2(alignment), 63 releasing
};
static_assert(sizeof(live_record) == 16);

class live_table {
    using table = nxmem::detail::sharded_table<live_record, nxmem::detail::shard_by_lane>;

public:
    // The bytes one record takes in its slot, id included.
    static constexpr std::size_t slot_bytes = table::slot_bytes;
    // Where claim found a record (a hint for erase_claimed).
    using position = table::position;

    // How a description compares with the record at its id.
    enum class verdict { accepted, unknown, being_released, misdescribed };

    static verdict compare(const live_record* record, const NxmemAllocation& described) noexcept {
        if (record == nullptr) [[unlikely]] {
            return verdict::unknown;
        }
        if (record->releasing()) [[unlikely]] {
            return verdict::being_released;
        }
        if (record->address() != described.address || record->size() != described.size ||
            record->alignment() != described.alignment) [[unlikely]] {
            return verdict::misdescribed;
        }
        return verdict::accepted;
    }

    // Why a description was refused; `record` is the live one (unused for an unknown id). Built
    // out of line, only on refusal.
    [[gnu::noinline, gnu::cold]] static error refusal(verdict refused, const NxmemAllocation& described,
                                                     const live_record& record) {
        if (refused != verdict::misdescribed) {
            return error{status_code::unknown_allocation,
                         "no live allocation with id " + std::to_string(described.allocation_id) +
                             " (address 0x" + nxmem::detail::to_hex(described.address) +
                             ") in this allocator" +
                             (refused == verdict::being_released ? " (it is being released)" : "")};
        }
        return error{status_code::invalid_argument,
                     "misdescribed allocation " + std::to_string(described.allocation_id) +
                         ": address 0x" + nxmem::detail::to_hex(described.address) + ", size " +
                         std::to_string(described.size) + ", alignment " +
                         std::to_string(described.alignment) + " but the live one is at 0x" +
                         nxmem::detail::to_hex(record.address()) + ", size " +
                         std::to_string(record.size()) + ", alignment " +
                         std::to_string(record.alignment())};
    }

    // Throws std::bad_alloc, changing nothing, when the table must grow and cannot.
    void insert(std::uint64_t allocation_id, const live_record& record) {
        records_.insert(allocation_id, record);
    }

    // Marks the record releasing if the description matches it, and copies it to `claimed` (the
    // live record is copied on a mismatch too, for the refusal's message). An unknown id, a record
    // already being released or a description that does not match leave the table unchanged.
    verdict claim(const NxmemAllocation& described, live_record& claimed, position& at) noexcept {
        return records_.visit(described.allocation_id, [&](live_record* record) noexcept {
            const verdict found = compare(record, described);
            if (found == verdict::accepted) [[likely]] {
                record->mark_releasing(true);
            }
            if (record != nullptr) {
                claimed = *record;
            }
            return found;
        }, at);
    }
    // claim, with the refusal as an error.
    result<live_record> claim(const NxmemAllocation& described) {
        live_record claimed;
        position ignored;
        const verdict found = claim(described, claimed, ignored);
        if (found != verdict::accepted) [[unlikely]] {
            return refusal(found, described, claimed);
        }
        return claimed;
    }
    // The claimed allocation is gone: erases its record (allocates nothing; the table gives memory
    // back when it has become sparse and memory can be had for the smaller array).
    // `at`, where claim found the record, spares a second lookup.
    void erase_claimed(std::uint64_t allocation_id, position at = {}) noexcept {
        (void)records_.erase(allocation_id, at);
    }
    // The claimed allocation is as live as before (allocates nothing).
    void unclaim(std::uint64_t allocation_id) noexcept {
        (void)records_.update(allocation_id, [](live_record& record) { record.mark_releasing(false); });
    }

    // The record, if the description matches it and it is not being released.
    result<live_record> find(const NxmemAllocation& described) {
        live_record found;
        const verdict compared = records_.visit(described.allocation_id, [&](live_record* record) noexcept {
            if (record != nullptr) {
                found = *record;
            }
            return compare(record, described);
        });
        if (compared != verdict::accepted) [[unlikely]] {
            return refusal(compared, described, found);
        }
        return found;
    }

    // Removes every record, handing each to `each(allocation_id, live_record&&)` with no lock held;
    // allocates nothing (the allocator's destructor uses it).
    template <class Each> void take_each(Each&& each) noexcept {
        records_.take_each(std::forward<Each>(each));
    }

    // Records held, claimed ones included (exact when no call is in flight).
    std::size_t size() const noexcept { return records_.size(); }
    // What the table holds in memory: its shards and slot arrays.
    std::size_t bytes() const noexcept { return records_.bytes(); }

private:
    // Ids come from the module's allocation_id_source: a shard per id lane, so each thread
    // allocating from this allocator keeps to a shard of its own.
    static_assert(nxmem::detail::allocation_id_source::lanes == table::shard_count);
    table records_;
};

} // namespace nxmem::host::detail
