// The host's record of one allocator's live allocations, keyed by the host-assigned allocation id
// and sharded, so threads allocating and releasing through one allocator rarely share a lock and
// no lock is process-wide. A record is taken out under its shard's lock, and the lock is dropped
// before the plugin is called.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace nxmem::host::detail {

struct live_record {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t alignment = 0;
};

class live_table {
public:
    void insert(std::uint64_t allocation_id, const live_record& record) {
        shard& owner = shard_of(allocation_id);
        std::lock_guard lock(owner.mutex);
        owner.records.emplace(allocation_id, record);
    }

    // Removes the record if the description matches it; refuses an unknown id or a description
    // that does not match, leaving the table unchanged.
    result<live_record> take(const NxmemAllocation& described) {
        shard& owner = shard_of(described.allocation_id);
        std::lock_guard lock(owner.mutex);
        NXMEM_TRY(record, match(owner, described));
        owner.records.erase(described.allocation_id);
        return record;
    }

    result<live_record> find(const NxmemAllocation& described) {
        shard& owner = shard_of(described.allocation_id);
        std::lock_guard lock(owner.mutex);
        return match(owner, described);
    }

    std::vector<std::pair<std::uint64_t, live_record>> take_all() {
        std::vector<std::pair<std::uint64_t, live_record>> all;
        for (shard& owner : shards_) {
            std::lock_guard lock(owner.mutex);
            all.insert(all.end(), owner.records.begin(), owner.records.end());
            owner.records.clear();
        }
        return all;
    }

private:
    struct shard {
        std::mutex mutex;
        std::unordered_map<std::uint64_t, live_record> records;
    };

    shard& shard_of(std::uint64_t allocation_id) { return shards_[allocation_id % shards_.size()]; }

    static result<live_record> match(shard& owner, const NxmemAllocation& described) {
        auto found = owner.records.find(described.allocation_id);
        if (found == owner.records.end()) {
            return fail(status_code::unknown_allocation,
                        "no live allocation with id " + std::to_string(described.allocation_id) +
                            " (address 0x" + nxmem::detail::to_hex(described.address) +
                            ") in this allocator");
        }
        const live_record& record = found->second;
        if (record.address != described.address || record.size != described.size ||
            record.alignment != described.alignment) {
            return fail(status_code::invalid_argument,
                        "misdescribed allocation " + std::to_string(described.allocation_id) +
                            ": address 0x" + nxmem::detail::to_hex(described.address) + ", size " +
                            std::to_string(described.size) + ", alignment " +
                            std::to_string(described.alignment) + " but the live one is at 0x" +
                            nxmem::detail::to_hex(record.address) + ", size " +
                            std::to_string(record.size) + ", alignment " +
                            std::to_string(record.alignment));
        }
        return record;
    }

    std::array<shard, 16> shards_;
};

} // namespace nxmem::host::detail
