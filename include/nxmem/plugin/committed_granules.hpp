// What a virtual-backing mechanism otherwise writes itself: the granularity check of commit and
// decommit ranges (ABI.md G3), the granules each allocation has committed, its cost from them
// (each committed granule, the last one up to the allocation's end, as the bundled lazy
// mechanisms count it), and the granules a mapped shared prefix owns (C8). One per allocator;
// opt-in: a mechanism that keeps this state elsewhere (in the kernel, in runs) need not use it.
//
//   committed_granules granules_{page_bytes};                        // a member
//   commit:       return granules_.commit(record, range, [&](byte_range part) { ...map part... });
//   decommit:     return granules_.decommit(record, range, [&](byte_range part) { ...unmap... });
//   mapped_bytes: return granules_.mapped_bytes(record.address);
//   a prefix mapped into the allocation: granules_.make_entry(record.address, record.size) before
//                 the mmap(MAP_FIXED) that cannot be undone, granules_.map_prefix(...) after it;
//   a release:    release_outcome{NXMEM_RELEASE_COMPLETE, granules_.forget(record.address), 0}
//
// An allocation's entry is made by its first commit or prefix (a node and one bit per granule:
// the only allocation this block makes) and dropped by forget. Calls may come from any thread.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/allocation.hpp>
#include <nxmem/detail/page_size.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace nxmem::plugin {

class committed_granules {
public:
    // `granularity`: the unit of commit, a power of two (what commit_granularity() states).
    explicit committed_granules(std::uint64_t granularity = nxmem::detail::system_page_bytes()) noexcept
        : granularity_(granularity) {}
    committed_granules(const committed_granules&) = delete;
    committed_granules& operator=(const committed_granules&) = delete;

    std::uint64_t granularity() const noexcept { return granularity_; }
    // `bytes` in whole granules.
    std::uint64_t round_up(std::uint64_t bytes) const noexcept {
        return (bytes + granularity_ - 1) & ~(granularity_ - 1);
    }

    // G3: the whole granules a legal range of `record` covers (a range ending exactly at the
    // allocation's end may end unaligned; its last granule is whole), or INVALID_ARGUMENT naming
    // the range and the granularity. The kit has checked that the range lies inside.
    result<byte_range> granules_of(const allocation_record& record, byte_range range) const {
        const bool ends_at_end = range.offset + range.length == record.size;
        if (range.offset % granularity_ != 0 || (range.length % granularity_ != 0 && !ends_at_end))
            [[unlikely]] {
            return illegal_range(range);
        }
        return byte_range{range.offset, round_up(range.length)};
    }

    // Commits `range` of `record`: checks it (G3), calls `map(part)` for the granules in it that
    // are not the prefix's (C8: those stay the prefix's) unless there are none, and records them
    // committed if map succeeds. `map` returns result<void> and runs under this object's lock (it
    // must not call the host). Committing granules already committed is allowed and costs nothing.
    template <class Map> result<void> commit(const allocation_record& record, byte_range range, Map&& map) {
        return change(record, range, true, map);
    }
    result<void> commit(const allocation_record& record, byte_range range) {
        return change(record, range, true, map_nothing);
    }
    // The same for decommit: `unmap(part)`, then the granules are no longer committed.
    template <class Unmap>
    result<void> decommit(const allocation_record& record, byte_range range, Unmap&& unmap) {
        return change(record, range, false, unmap);
    }
    result<void> decommit(const allocation_record& record, byte_range range) {
        return change(record, range, false, map_nothing);
    }

    // Makes the entry of the allocation at `address` (`size` bytes) unless it has one: the only
    // allocation this block makes for it. Throws std::bad_alloc, changing nothing, when it cannot.
    // Once the entry is made, map_prefix for the allocation allocates nothing and cannot throw:
    // call this before the step that cannot be undone (the prefix's mmap(MAP_FIXED)), so a call
    // refused for memory (E11) has mapped nothing.
    void make_entry(std::uint64_t address, std::uint64_t size) {
        std::lock_guard lock(mutex_);
        (void)entry_for(address, size);
    }

    // C8: a shared prefix of `prefix_bytes` is now mapped at the start of the allocation of
    // `size` bytes at `address`: the granules it covers are the prefix's, and those the
    // allocation had committed leave its cost (the prefix's mapping replaced them). Returns the
    // bytes that left. Throws std::bad_alloc, changing nothing, if the entry cannot be made (never
    // after make_entry).
    std::uint64_t map_prefix(std::uint64_t address, std::uint64_t size, std::uint64_t prefix_bytes) {
        std::lock_guard lock(mutex_);
        entry& found = entry_for(address, size);
        const std::uint64_t covered = std::min<std::uint64_t>(found.committed.size(),
                                                              round_up(prefix_bytes) / granularity_);
        const std::uint64_t before = found.cost;
        for (std::uint64_t granule = 0; granule < covered; ++granule) {
            flip(found, granule, false);
        }
        found.prefix_granules = std::max(found.prefix_granules, covered);
        return before - found.cost;
    }

    // What the allocation at `address` costs now: its committed granules, prefix excluded (C8).
    std::uint64_t mapped_bytes(std::uint64_t address) const {
        std::lock_guard lock(mutex_);
        const auto found = entries_.find(address);
        return found == entries_.end() ? 0 : found->second.cost;
    }

    // What every allocation tracked here costs now: usage()'s mapped_bytes.
    std::uint64_t total_mapped_bytes() const {
        std::lock_guard lock(mutex_);
        return total_cost_;
    }

    // The allocation at `address` goes: returns what it cost (what its release credits, Q17/C8).
    std::uint64_t forget(std::uint64_t address) {
        std::lock_guard lock(mutex_);
        const auto found = entries_.find(address);
        if (found == entries_.end()) {
            return 0;
        }
        const std::uint64_t cost = found->second.cost;
        total_cost_ -= cost;
        entries_.erase(found);
        return cost;
    }

private:
    // For memory that needs no mapping step (taken eagerly, only its cost tracked).
    static result<void> map_nothing(byte_range) noexcept { return success(); }

    struct entry {
        std::uint64_t size = 0;      // as requested
        std::vector<bool> committed; // one per granule of it
        std::uint64_t cost = 0;      // of the committed granules
        std::uint64_t prefix_granules = 0; // the first ones, owned by a mapped prefix
    };

    // Commits or decommits one granule, keeping the costs.
    void flip(entry& found, std::uint64_t granule, bool commit) {
        if (found.committed[granule] == commit) {
            return;
        }
        found.committed[granule] = commit;
        const std::uint64_t bytes = std::min(granularity_, found.size - granule * granularity_);
        found.cost = commit ? found.cost + bytes : found.cost - bytes;
        total_cost_ = commit ? total_cost_ + bytes : total_cost_ - bytes;
    }

    entry& entry_for(std::uint64_t address, std::uint64_t size) {
        auto [found, made] = entries_.try_emplace(address);
        if (made) {
            found->second.size = size;
            try {
                found->second.committed.resize(round_up(size) / granularity_);
            } catch (...) {
                entries_.erase(found);
                throw;
            }
        }
        return found->second;
    }

    template <class Change>
    result<void> change(const allocation_record& record, byte_range range, bool commit, Change&& apply) {
        NXMEM_TRY(whole, granules_of(record, range));
        std::lock_guard lock(mutex_);
        entry& found = entry_for(record.address, record.size);
        std::uint64_t first = whole.offset / granularity_;
        const std::uint64_t end = first + whole.length / granularity_;
        first = std::max(first, found.prefix_granules);
        if (first >= end) {
            return success(); // all of it under the prefix: the prefix's pages are left alone
        }
        NXMEM_TRY_VOID(apply(byte_range{first * granularity_, (end - first) * granularity_}));
        for (std::uint64_t granule = first; granule < end; ++granule) {
            flip(found, granule, commit);
        }
        return success();
    }

    [[gnu::cold]] failure illegal_range(byte_range range) const {
        return fail(status_code::invalid_argument,
                    "range [" + std::to_string(range.offset) + ", +" + std::to_string(range.length) +
                        ") is not in whole granules of " + std::to_string(granularity_) +
                        " bytes (ABI.md G3)");
    }

    const std::uint64_t granularity_;
    mutable std::mutex mutex_;
    std::unordered_map<std::uint64_t, entry> entries_;
    std::uint64_t total_cost_ = 0;
};

} // namespace nxmem::plugin
