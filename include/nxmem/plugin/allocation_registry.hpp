// The kit's record of live allocations, keyed by address and sharded so concurrent allocations
// on different addresses rarely share a lock. Every description the host sends back is checked
// against the record before the mechanism sees it.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace nxmem::plugin {

class allocation_registry {
public:
    void insert(const allocation_record& record) {
        shard& owner = shard_of(record.address);
        std::lock_guard lock(owner.mutex);
        owner.records[record.address] = record;
    }

    // Removes and returns the record the host described; refuses an unknown address and a
    // description that does not match, leaving the record in place.
    result<allocation_record> take(const NxmemAllocation& described) {
        shard& owner = shard_of(described.address);
        std::lock_guard lock(owner.mutex);
        NXMEM_TRY(record, match(owner, described));
        owner.records.erase(described.address);
        return record;
    }

    // A copy of the record the host described.
    result<allocation_record> find(const NxmemAllocation& described) {
        shard& owner = shard_of(described.address);
        std::lock_guard lock(owner.mutex);
        return match(owner, described);
    }

    // Records that `prefix_id` is mapped into the allocation at `address`; false if that
    // allocation is no longer live.
    bool add_prefix(std::uint64_t address, std::uint64_t prefix_id) {
        shard& owner = shard_of(address);
        std::lock_guard lock(owner.mutex);
        auto found = owner.records.find(address);
        if (found == owner.records.end()) {
            return false;
        }
        found->second.prefixes.push_back(prefix_id);
        return true;
    }

    // Every record, removed: what is left when the allocator goes away.
    std::vector<allocation_record> take_all() {
        std::vector<allocation_record> all;
        for (shard& owner : shards_) {
            std::lock_guard lock(owner.mutex);
            for (const auto& [address, record] : owner.records) {
                all.push_back(record);
            }
            owner.records.clear();
        }
        return all;
    }

private:
    struct shard {
        std::mutex mutex;
        std::unordered_map<std::uint64_t, allocation_record> records;
    };

    shard& shard_of(std::uint64_t address) {
        // Allocations are at least 16-byte aligned in practice; mix the bits above that.
        const std::uint64_t mixed = (address >> 4) * 0x9E3779B97F4A7C15ull;
        return shards_[mixed >> 60];
    }

    static result<allocation_record> match(shard& owner, const NxmemAllocation& described) {
        auto found = owner.records.find(described.address);
        if (found == owner.records.end()) {
            return fail(status_code::unknown_allocation,
                        "no live allocation at 0x" + detail::to_hex(described.address));
        }
        const allocation_record& record = found->second;
        if (record.allocation_id != described.allocation_id || record.size != described.size ||
            record.alignment != described.alignment) {
            return fail(status_code::invalid_argument,
                        "misdescribed allocation at 0x" + detail::to_hex(described.address) +
                            ": id " + std::to_string(described.allocation_id) + ", size " +
                            std::to_string(described.size) + ", alignment " +
                            std::to_string(described.alignment) + " but the live one is id " +
                            std::to_string(record.allocation_id) + ", size " +
                            std::to_string(record.size) + ", alignment " +
                            std::to_string(record.alignment));
        }
        return record;
    }

    std::array<shard, 16> shards_;
};

} // namespace nxmem::plugin
