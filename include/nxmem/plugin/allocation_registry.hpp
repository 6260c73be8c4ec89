// The kit's record of live allocations, keyed by address. Every description the host sends back
// is checked against the record before the mechanism sees it.
//
// A record takes 24 bytes in its slot (address, id, and the size with the alignment's exponent in
// one word). The shared prefixes mapped into an allocation live in a side table that only
// allocations with a mapping pay for; `find` and `take` hand the mechanism the record with them
// (a copy of the list for `find`, made only for an allocation that maps a prefix). A record the
// packed word cannot hold is kept whole in a second side table: a size of 2^57 bytes or more (only
// a mechanism that reserves nothing could hand one out), or a usable size other than the size
// asked for (a mechanism that rounds up, posix-eager's mmap path: that costs a side-table node and
// its lock per allocate and release).
//
// The registry sums the usable bytes of its records (reserved_bytes, the usage query's figure):
// per shard under the shard's lock, plus the whole records' under the side table's, so allocate
// writes no counter other threads write; reading the total takes every one of those locks for a
// moment, so it is a total some serial order of the racing calls could give.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <atomic>
#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
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
    // An allocation of `size` bytes (`usable` of them usable) aligned to `alignment` (a power of
    // two); one the word cannot hold (a size above max_size, a usable size other than `size`) is
    // marked whole: its record is in the side table.
    packed_record(std::uint64_t size, std::uint64_t usable, std::uint64_t alignment,
                  std::uint64_t allocation_id) noexcept
        : allocation_id_(allocation_id),
          shape_(size > max_size || usable_size_of(size, usable) != size
                     ? 0
                     : size | static_cast<std::uint64_t>(std::countr_zero(alignment)) << alignment_shift) {}
    explicit packed_record(const allocation_record& record) noexcept
        : packed_record(record.size, record.usable_size, record.alignment, record.allocation_id) {}

    // A block is never smaller than asked: a usable size below `size` (0: not stated) is `size`.
    static std::uint64_t usable_size_of(std::uint64_t size, std::uint64_t usable) noexcept {
        return usable < size ? size : usable;
    }

    // Size 0 is never recorded: a zero size field marks a record kept whole in the side table.
    bool whole() const noexcept { return (shape_ & max_size) == 0; }
    bool maps_prefixes() const noexcept { return (shape_ & prefixes_bit) != 0; }
    void mark_maps_prefixes() noexcept { shape_ |= prefixes_bit; }
    std::uint64_t allocation_id() const noexcept { return allocation_id_; }
    std::uint64_t size() const noexcept { return shape_ & max_size; }
    std::uint64_t alignment() const noexcept {
        return std::uint64_t{1} << ((shape_ >> alignment_shift) & 63u);
    }

    // Whether the host's description names this (not whole) record exactly: compares the
    // packed words, with nothing unpacked into an allocation_record.
    bool described_by(const NxmemAllocation& described) const noexcept {
        return allocation_id_ == described.allocation_id && size() == described.size &&
               alignment() == described.alignment;
    }

    allocation_record unpack(std::uint64_t address) const {
        return allocation_record{address, size(), alignment(), allocation_id_, {}, size()};
    }

    // The usable bytes the shard sums: a whole record's are summed with the side table.
    std::uint64_t weight() const noexcept { return size(); }

private:
    static constexpr unsigned alignment_shift = 57;
    static constexpr std::uint64_t prefixes_bit = std::uint64_t{1} << 63;
    std::uint64_t allocation_id_ = 0;
    std::uint64_t shape_ = 0; // bits 0-56 size, 57-62 log2(alignment), 63 maps prefixes
};
static_assert(sizeof(packed_record) == 16);

} // namespace detail

// Why the registry refused a description: what the failure's text names, copied out under the
// shard's lock so the text is built (by allocation_registry::describe) after it is released.
struct registry_refusal {
    bool live = false; // an allocation is live at the address, described otherwise
    std::uint64_t allocation_id = 0;
    std::uint64_t size = 0;
    std::uint64_t alignment = 0;
};

class allocation_registry {
    using packed_record = detail::packed_record;

    // What a table lookup's `match` returns: a verdict without text, so accepting costs a compare
    // and refusing builds nothing under the lock (the refusal is described afterwards).
    struct verdict {
        bool accepted = false;
        bool has_value() const noexcept { return accepted; }
        explicit operator bool() const noexcept { return accepted; }
        nxmem::error error() const noexcept { return {}; }
    };

public:
    // The bytes one allocation takes in its slot, address included.
    static constexpr std::size_t slot_bytes = nxmem::detail::sharded_table<packed_record>::slot_bytes;

    // The error a refused description gets: UNKNOWN_ALLOCATION for an address with no live
    // allocation, INVALID_ARGUMENT naming both sides for a misdescribed one.
    [[gnu::cold]] static error describe(const NxmemAllocation& described, const registry_refusal& why) {
        if (!why.live) {
            return {status_code::unknown_allocation,
                    "no live allocation at 0x" + nxmem::detail::to_hex(described.address)};
        }
        return {status_code::invalid_argument,
                "misdescribed allocation at 0x" + nxmem::detail::to_hex(described.address) +
                    ": id " + std::to_string(described.allocation_id) + ", size " +
                    std::to_string(described.size) + ", alignment " +
                    std::to_string(described.alignment) + " but the live one is id " +
                    std::to_string(why.allocation_id) + ", size " + std::to_string(why.size) +
                    ", alignment " + std::to_string(why.alignment)};
    }

    // Records an allocation of `size` bytes, `usable` of them usable (what the mechanism's block
    // says), that maps no prefixes (what allocate makes). Throws std::bad_alloc, changing
    // nothing, when a table must grow and cannot.
    void insert(std::uint64_t address, std::uint64_t size, std::uint64_t alignment,
                std::uint64_t allocation_id, std::uint64_t usable) {
        const packed_record packed(size, usable, alignment, allocation_id);
        if (packed.whole()) [[unlikely]] {
            insert(allocation_record{address, size, alignment, allocation_id, {}, usable});
            return;
        }
        records_.insert(address, packed);
    }

    // Throws std::bad_alloc, changing nothing, when a table must grow and cannot.
    void insert(const allocation_record& record) {
        packed_record packed(record);
        const bool side = packed.whole() || !record.prefixes.empty();
        if (side) {
            std::lock_guard lock(side_mutex_);
            if (packed.whole()) {
                keep_whole(record);
            }
            if (!record.prefixes.empty()) {
                try {
                    prefixes_.insert_or_assign(record.address, record.prefixes);
                } catch (...) {
                    drop_whole(record.address);
                    throw;
                }
                packed.mark_maps_prefixes();
            }
        }
        try {
            records_.insert(record.address, packed);
        } catch (...) {
            if (side) {
                std::lock_guard lock(side_mutex_);
                drop_whole(record.address);
                prefixes_.erase(record.address);
            }
            throw;
        }
    }

    // Removes the record the host described and fills `taken` with it, with the prefixes mapped
    // into it; refuses an unknown address and a description that does not match, leaving the
    // record in place, and says why in `why`. One hold of the shard's lock; no text, no
    // allocation on success.
    bool take(const NxmemAllocation& described, allocation_record& taken, registry_refusal& why) {
        packed_record packed;
        const verdict accepted = records_.take_into(
            described.address, packed,
            [&](const packed_record* found) { return judge(described, found, why); });
        if (!accepted.accepted) [[unlikely]] {
            return false;
        }
        fill(described, taken);
        if (packed.whole() || packed.maps_prefixes()) [[unlikely]] {
            drop_side_entries(described.address, taken);
        }
        return true;
    }

    // Fills `found` with a copy of the record the host described, with the prefixes mapped into
    // it; refuses as take does.
    bool find(const NxmemAllocation& described, allocation_record& found, registry_refusal& why) {
        // visit: one probe, and a plain verdict rather than a result carrying a copy.
        bool in_side_table = false;
        const verdict accepted = records_.visit(described.address, [&](const packed_record* record) {
            const verdict judged = judge(described, record, why);
            in_side_table = judged.accepted && (record->whole() || record->maps_prefixes());
            return judged;
        });
        if (!accepted.accepted) [[unlikely]] {
            return false;
        }
        fill(described, found);
        if (in_side_table) [[unlikely]] {
            copy_side_entries(described.address, found);
        }
        return true;
    }

    // The same as results, the refusal described.
    result<allocation_record> take(const NxmemAllocation& described) {
        allocation_record taken;
        registry_refusal why;
        if (!take(described, taken, why)) {
            return boost::outcome_v2::failure(describe(described, why));
        }
        return taken;
    }
    result<allocation_record> find(const NxmemAllocation& described) {
        allocation_record found;
        registry_refusal why;
        if (!find(described, found, why)) {
            return boost::outcome_v2::failure(describe(described, why));
        }
        return found;
    }

    // Makes room for one more prefix of the allocation at `address`, so that add_prefix then
    // cannot run out of memory (after the mechanism mapped the prefix it must not fail). Throws
    // std::bad_alloc, changing nothing but an empty entry (unreserve_prefix drops it).
    void reserve_prefix(std::uint64_t address) {
        std::lock_guard lock(side_mutex_);
        std::vector<std::uint64_t>& listed = prefixes_[address];
        listed.reserve(listed.size() + 1);
    }
    // Drops the entry of `address` if it lists no prefix (the room reserve_prefix made).
    void unreserve_prefix(std::uint64_t address) noexcept {
        std::lock_guard lock(side_mutex_);
        if (auto listed = prefixes_.find(address); listed != prefixes_.end() && listed->second.empty()) {
            prefixes_.erase(listed);
        }
    }

    // Records that `prefix_id` is mapped into the allocation at `address`; false if that
    // allocation is no longer live. Allocates nothing after reserve_prefix(address).
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
            if (auto whole = whole_.find(record.address); whole != whole_.end()) {
                record = std::move(whole->second);
            }
            if (auto mapped = prefixes_.find(record.address); mapped != prefixes_.end()) {
                record.prefixes = std::move(mapped->second);
            }
        }
        whole_.clear();
        whole_bytes_.store(0, std::memory_order_relaxed);
        prefixes_.clear();
        return all;
    }

    // Allocations recorded now.
    std::size_t size() const noexcept { return records_.size(); }
    // The usable bytes of the allocations recorded now (their blocks' sizes), as at one instant:
    // the shards' totals and the whole records' are read with every shard's lock and the side
    // table's held (lock order: shards, then side table), so an allocation released from one
    // shard and made in another while they are read is not counted twice (docs/ABI.md G6: the
    // usage query gives totals some serial order of the racing calls could give).
    std::uint64_t reserved_bytes() {
        return records_.weight_at_once([&](std::uint64_t packed) {
            std::lock_guard lock(side_mutex_);
            return packed + whole_bytes_.load(std::memory_order_relaxed);
        });
    }
    // The memory the registry holds: the table, and the side tables' entries (about: one node
    // and the id vector per allocation with a mapping).
    std::size_t bytes() const {
        std::lock_guard lock(side_mutex_);
        std::size_t side = prefixes_.bucket_count() * sizeof(void*) + whole_.size() * 96;
        for (const auto& [address, ids] : prefixes_) {
            side += 4 * sizeof(void*) + ids.capacity() * sizeof(std::uint64_t);
        }
        return records_.bytes() + side;
    }

private:
    // Accepts a record that the description names exactly; the common case compares the packed
    // words inline, everything else (none there, kept whole, a mismatch) goes out of line.
    verdict judge(const NxmemAllocation& described, const packed_record* found, registry_refusal& why) {
        if (found != nullptr && !found->whole() && found->described_by(described)) [[likely]] {
            return {true};
        }
        return judge_otherwise(described, found, why);
    }
    [[gnu::cold]] [[gnu::noinline]] verdict judge_otherwise(const NxmemAllocation& described,
                                                          const packed_record* found,
                                                          registry_refusal& why) {
        if (found == nullptr) {
            why.live = false;
            return {false};
        }
        why.live = true;
        if (found->whole()) {
            std::lock_guard lock(side_mutex_); // lock order: shard, then side table
            const allocation_record& whole = whole_.at(described.address);
            if (whole.allocation_id == described.allocation_id && whole.size == described.size &&
                whole.alignment == described.alignment) {
                return {true};
            }
            why.allocation_id = whole.allocation_id;
            why.size = whole.size;
            why.alignment = whole.alignment;
            return {false};
        }
        why.allocation_id = found->allocation_id();
        why.size = found->size();
        why.alignment = found->alignment();
        return {false};
    }

    // An accepted description is the record: its values are the record's (its usable size the
    // size asked for, unless the side table says otherwise).
    static void fill(const NxmemAllocation& described, allocation_record& out) noexcept {
        out.address = described.address;
        out.size = described.size;
        out.alignment = described.alignment;
        out.allocation_id = described.allocation_id;
        out.usable_size = described.size;
    }

    // Keeps `record` whole (without its prefixes), its usable bytes counted; under side_mutex_.
    void keep_whole(const allocation_record& record) {
        const std::uint64_t usable = packed_record::usable_size_of(record.size, record.usable_size);
        whole_.insert_or_assign(record.address,
                                allocation_record{record.address, record.size, record.alignment,
                                                  record.allocation_id, {}, usable});
        whole_bytes_.store(whole_bytes_.load(std::memory_order_relaxed) + usable,
                           std::memory_order_relaxed);
    }
    // Drops the whole record at `address`, if any, returning its usable size; under side_mutex_.
    std::optional<std::uint64_t> drop_whole(std::uint64_t address) noexcept {
        auto whole = whole_.find(address);
        if (whole == whole_.end()) {
            return std::nullopt;
        }
        const std::uint64_t usable = whole->second.usable_size;
        whole_bytes_.store(whole_bytes_.load(std::memory_order_relaxed) - usable,
                           std::memory_order_relaxed);
        whole_.erase(whole);
        return usable;
    }

    // Copies the usable size and the prefixes of the allocation at `address` (as filled if it
    // went meanwhile).
    [[gnu::cold]] [[gnu::noinline]] void copy_side_entries(std::uint64_t address, allocation_record& found) {
        std::lock_guard lock(side_mutex_);
        if (auto whole = whole_.find(address); whole != whole_.end()) {
            found.usable_size = whole->second.usable_size;
        }
        if (auto mapped = prefixes_.find(address); mapped != prefixes_.end()) {
            found.prefixes = mapped->second;
        }
    }

    // Drops a taken record's side entries, moving its prefixes into `taken`.
    [[gnu::cold]] [[gnu::noinline]] void drop_side_entries(std::uint64_t address, allocation_record& taken) {
        std::lock_guard lock(side_mutex_);
        if (const std::optional<std::uint64_t> usable = drop_whole(address)) {
            taken.usable_size = *usable;
        }
        if (auto mapped = prefixes_.find(address); mapped != prefixes_.end()) {
            taken.prefixes = std::move(mapped->second); // moved, not copied: no allocation
            prefixes_.erase(mapped);
        }
    }

    nxmem::detail::sharded_table<packed_record> records_;
    mutable std::mutex side_mutex_;
    std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> prefixes_;
    std::map<std::uint64_t, allocation_record> whole_; // records the packed word cannot hold
    std::atomic<std::uint64_t> whole_bytes_{0};        // their usable bytes, written under side_mutex_
};

} // namespace nxmem::plugin
