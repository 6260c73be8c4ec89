// The host's record of one allocator's live allocations, keyed by the host-assigned allocation id.
// A record is taken out under its shard's lock, and the lock is dropped before the plugin is
// called.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/sharded_table.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::host::detail {

struct live_record {
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t alignment = 0;
};

class live_table {
    // Accepts the record only if it exists and matches the host's description.
    static auto matcher(const NxmemAllocation& described) {
        return [&described](const live_record* record) -> result<void> {
            if (record == nullptr) {
                return fail(status_code::unknown_allocation,
                            "no live allocation with id " + std::to_string(described.allocation_id) +
                                " (address 0x" + nxmem::detail::to_hex(described.address) +
                                ") in this allocator");
            }
            if (record->address != described.address || record->size != described.size ||
                record->alignment != described.alignment) {
                return fail(status_code::invalid_argument,
                            "misdescribed allocation " + std::to_string(described.allocation_id) +
                                ": address 0x" + nxmem::detail::to_hex(described.address) +
                                ", size " + std::to_string(described.size) + ", alignment " +
                                std::to_string(described.alignment) + " but the live one is at 0x" +
                                nxmem::detail::to_hex(record->address) + ", size " +
                                std::to_string(record->size) + ", alignment " +
                                std::to_string(record->alignment));
            }
            return boost::outcome_v2::success();
        };
    }

public:
public:
    void insert(std::uint64_t allocation_id, const live_record& record) {
        records_.insert(allocation_id, record);
    }

    // Removes the record if the description matches it; refuses an unknown id or a description
    // that does not match, leaving the table unchanged.
    result<live_record> take(const NxmemAllocation& described) {
        return records_.take(described.allocation_id, matcher(described));
    }

    result<live_record> find(const NxmemAllocation& described) {
        return records_.find(described.allocation_id, matcher(described));
    }

    std::vector<std::pair<std::uint64_t, live_record>> take_all() { return records_.take_all(); }

private:
    nxmem::detail::sharded_table<live_record> records_;
};

} // namespace nxmem::host::detail
