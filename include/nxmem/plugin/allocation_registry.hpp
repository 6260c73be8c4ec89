// The kit's record of live allocations, keyed by address. Every description the host sends back
// is checked against the record before the mechanism sees it.
//
// A record takes 24 bytes in its slot (address, id, and the size with the alignment's exponent in
// one word). The shared prefixes mapped into an allocation live in a side table that only
// allocations with a mapping pay for; `find` hands the mechanism the record without them, `take`
// with them (what the kit drops when the allocation goes). A size of 2^57 bytes or more does not
// fit the packed word; such an allocation (only a mechanism that reserves nothing could hand one
// out) is kept whole in a second side table.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nxmem::plugin {
namespace detail {

// One allocation in the registry, its address being the key (outside the class: the table
// checks its traits, which a nested class does not have before its enclosing class is complete).
class packed_record {
public:
    static constexpr std::uint64_t max_size = (std::uint64_t{1} << 57) - 1;

    packed_record() = default;
    // The allocation at `record.address`; a size above max_size is marked oversized (its
    // record is in the side table).
    explicit packed_record(const allocation_record& record) noexcept
        : allocation_id_(record.allocation_id),
          shape_(record.size > max_size
                     ? 0
                     : record.size | static_cast<std::uint64_t>(std::countr_zero(record.alignment))
                                         << alignment_shift) {}

    bool oversized() const noexcept { return shape_ == 0; } // size 0 is never recorded
    bool maps_prefixes() const noexcept { return (shape_ & prefixes_bit) != 0; }
    void mark_maps_prefixes() noexcept { shape_ |= prefixes_bit; }
    std::uint64_t allocation_id() const noexcept { return allocation_id_; }

    allocation_record unpack(std::uint64_t address) const {
        return allocation_record{address, shape_ & max_size,
                                 std::uint64_t{1} << ((shape_ >> alignment_shift) & 63u),
                                 allocation_id_, {}};
    }

private:
    static constexpr unsigned alignment_shift = 57;
    static constexpr std::uint64_t prefixes_bit = std::uint64_t{1} << 63;
    std::uint64_t allocation_id_ = 0;
    std::uint64_t shape_ = 0; // bits 0-56 size, 57-62 log2(alignment), 63 maps prefixes
};
static_assert(sizeof(packed_record) == 16);

} // namespace detail

class allocation_registry {
    using packed_record = detail::packed_record;


    // Accepts the record only if it exists and matches the host's description.
    static result<void> check(const NxmemAllocation& described, const allocation_record* record) {
        if (record == nullptr) [[unlikely]] {
            return fail(status_code::unknown_allocation,
                        "no live allocation at 0x" + nxmem::detail::to_hex(described.address));
        }
        if (record->allocation_id != described.allocation_id || record->size != described.size ||
            record->alignment != described.alignment) [[unlikely]] {
            return fail(status_code::invalid_argument,
                        "misdescribed allocation at 0x" + nxmem::detail::to_hex(described.address) +
                            ": id " + std::to_string(described.allocation_id) + ", size " +
                            std::to_string(described.size) + ", alignment " +
                            std::to_string(described.alignment) + " but the live one is id " +
                            std::to_string(record->allocation_id) + ", size " +
                            std::to_string(record->size) + ", alignment " +
                            std::to_string(record->alignment));
        }
        return boost::outcome_v2::success();
    }

public:
    // The bytes one allocation takes in its slot, address included.
    static constexpr std::size_t slot_bytes = nxmem::detail::sharded_table<packed_record>::slot_bytes;

    // Throws std::bad_alloc, changing nothing, when a table must grow and cannot.
    void insert(const allocation_record& record) {
        packed_record packed(record);
        const bool side = packed.oversized() || !record.prefixes.empty();
        if (side) {
            std::lock_guard lock(side_mutex_);
            if (packed.oversized()) {
                oversized_.insert_or_assign(record.address,
                                            allocation_record{record.address, record.size,
                                                              record.alignment,
                                                              record.allocation_id, {}});
            }
            if (!record.prefixes.empty()) {
                prefixes_.insert_or_assign(record.address, record.prefixes);
                packed.mark_maps_prefixes();
            }
        }
        try {
            records_.insert(record.address, packed);
        } catch (...) {
            if (side) {
                std::lock_guard lock(side_mutex_);
                oversized_.erase(record.address);
                prefixes_.erase(record.address);
            }
            throw;
        }
    }

    // Removes and returns the record the host described, with the prefixes mapped into it;
    // refuses an unknown address and a description that does not match, leaving the record in
    // place.
    result<allocation_record> take(const NxmemAllocation& described) {
        allocation_record taken;
        NXMEM_TRY(packed, records_.take(described.address, [&](const packed_record* found) {
            return check_packed(described, found, taken);
        }));
        if (packed.oversized() || packed.maps_prefixes()) {
            std::lock_guard lock(side_mutex_);
            if (packed.oversized()) {
                oversized_.erase(described.address);
            }
            if (auto mapped = prefixes_.find(described.address); mapped != prefixes_.end()) {
                taken.prefixes = std::move(mapped->second); // moved, not copied: no allocation
                prefixes_.erase(mapped);
            }
        }
        return taken;
    }

    // A copy of the record the host described, without its prefixes.
    result<allocation_record> find(const NxmemAllocation& described) {
        allocation_record found;
        NXMEM_TRY_VOID(records_.find(described.address, [&](const packed_record* record) {
            return check_packed(described, record, found);
        }));
        return found;
    }

    // Records that `prefix_id` is mapped into the allocation at `address`; false if that
    // allocation is no longer live.
    bool add_prefix(std::uint64_t address, std::uint64_t prefix_id) {
        // The mark and the side entry change under the shard's lock, so a concurrent take sees
        // both or neither (lock order: shard, then side table).
        return records_.update(address, [&](packed_record& record) {
            std::lock_guard lock(side_mutex_);
            prefixes_[address].push_back(prefix_id);
            record.mark_maps_prefixes();
        });
    }

    // Every record, removed: what is left when the allocator goes away.
    std::vector<allocation_record> take_all() {
        std::vector<allocation_record> all;
        all.reserve(records_.size());
        records_.take_each([&](std::uint64_t address, packed_record&& packed) {
            all.push_back(packed.unpack(address)); // within the reserved room
        });
        std::lock_guard lock(side_mutex_);
        for (allocation_record& record : all) {
            if (auto whole = oversized_.find(record.address); whole != oversized_.end()) {
                record = std::move(whole->second);
            }
            if (auto mapped = prefixes_.find(record.address); mapped != prefixes_.end()) {
                record.prefixes = std::move(mapped->second);
            }
        }
        oversized_.clear();
        prefixes_.clear();
        return all;
    }

    // Allocations recorded now.
    std::size_t size() const noexcept { return records_.size(); }
    // The memory the registry holds: the table, and the side tables' entries (about: one node
    // and the id vector per allocation with a mapping).
    std::size_t bytes() const {
        std::lock_guard lock(side_mutex_);
        std::size_t side = prefixes_.bucket_count() * sizeof(void*) + oversized_.size() * 96;
        for (const auto& [address, ids] : prefixes_) {
            side += 4 * sizeof(void*) + ids.capacity() * sizeof(std::uint64_t);
        }
        return records_.bytes() + side;
    }

private:
    // Unpacks a found record into `out` (the oversized one from the side table) and checks it.
    result<void> check_packed(const NxmemAllocation& described, const packed_record* found,
                              allocation_record& out) {
        if (found == nullptr) [[unlikely]] {
            return check(described, nullptr);
        }
        if (found->oversized()) [[unlikely]] {
            std::lock_guard lock(side_mutex_);
            const allocation_record& whole = oversized_.at(described.address);
            out = allocation_record{whole.address, whole.size, whole.alignment,
                                    whole.allocation_id, {}};
        } else {
            out = found->unpack(described.address);
        }
        return check(described, &out);
    }

    nxmem::detail::sharded_table<packed_record> records_;
    mutable std::mutex side_mutex_;
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> prefixes_;
    std::map<std::uint64_t, allocation_record> oversized_;
};

} // namespace nxmem::plugin
