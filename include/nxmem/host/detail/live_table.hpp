// The host's record of one allocator's live allocations, keyed by the host-assigned allocation id.
// A release claims its record under the shard's lock (marks it releasing), the lock is dropped
// before the plugin is called, and the record is erased once the plugin has taken the allocation
// back, or unmarked if it refused: a refused release never needs to allocate a record again.
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
    bool releasing = false; // claimed by a release or enqueue that has not finished
};

class live_table {
    // Accepts the record only if it exists and matches the host's description.
    static auto matcher(const NxmemAllocation& described) {
        return [&described](const live_record* record) -> result<void> {
            if (record == nullptr || record->releasing) {
                return fail(status_code::unknown_allocation,
                            "no live allocation with id " + std::to_string(described.allocation_id) +
                                " (address 0x" + nxmem::detail::to_hex(described.address) +
                                ") in this allocator" +
                                (record != nullptr ? " (it is being released)" : ""));
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
    void insert(std::uint64_t allocation_id, const live_record& record) {
        records_.insert(allocation_id, record);
    }

    // Marks the record releasing if the description matches it; refuses an unknown id, a record
    // already being released or a description that does not match, leaving the table unchanged.
    result<live_record> claim(const NxmemAllocation& described) {
        return records_.modify(described.allocation_id, matcher(described),
                               [](live_record& record) { record.releasing = true; });
    }
    // The claimed allocation is gone: erases its record (allocates nothing).
    void erase_claimed(std::uint64_t allocation_id) noexcept {
        (void)records_.take(allocation_id, [](const live_record* record) -> result<void> {
            if (record == nullptr) {
                return error{status_code::unknown_allocation, {}}; // no message: nothing allocated
            }
            return boost::outcome_v2::success();
        });
    }
    // The claimed allocation is as live as before (allocates nothing).
    void unclaim(std::uint64_t allocation_id) noexcept {
        (void)records_.update(allocation_id, [](live_record& record) { record.releasing = false; });
    }

    result<live_record> find(const NxmemAllocation& described) {
        return records_.find(described.allocation_id, matcher(described));
    }

    // Removes every record, handing each to `each(allocation_id, live_record&&)` with no lock held;
    // allocates nothing (the allocator's destructor uses it).
    template <class Each> void take_each(Each&& each) noexcept {
        records_.take_each(std::forward<Each>(each));
    }

private:
    nxmem::detail::sharded_table<live_record> records_;
};

} // namespace nxmem::host::detail
