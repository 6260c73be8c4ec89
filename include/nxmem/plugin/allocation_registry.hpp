// The kit's record of live allocations, keyed by address. Every description the host sends back
// is checked against the record before the mechanism sees it.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>
#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace nxmem::plugin {

class allocation_registry {
    // Accepts the record only if it exists and matches the host's description.
    static auto matcher(const NxmemAllocation& described) {
        return [&described](const allocation_record* record) -> result<void> {
            if (record == nullptr) {
                return fail(status_code::unknown_allocation,
                            "no live allocation at 0x" + nxmem::detail::to_hex(described.address));
            }
            if (record->allocation_id != described.allocation_id ||
                record->size != described.size || record->alignment != described.alignment) {
                return fail(status_code::invalid_argument,
                            "misdescribed allocation at 0x" +
                                nxmem::detail::to_hex(described.address) + ": id " +
                                std::to_string(described.allocation_id) + ", size " +
                                std::to_string(described.size) + ", alignment " +
                                std::to_string(described.alignment) + " but the live one is id " +
                                std::to_string(record->allocation_id) + ", size " +
                                std::to_string(record->size) + ", alignment " +
                                std::to_string(record->alignment));
            }
            return boost::outcome_v2::success();
        };
    }

public:
public:
    void insert(const allocation_record& record) { records_.insert(record.address, record); }

    // Removes and returns the record the host described; refuses an unknown address and a
    // description that does not match, leaving the record in place.
    result<allocation_record> take(const NxmemAllocation& described) {
        return records_.take(described.address, matcher(described));
    }

    // A copy of the record the host described.
    result<allocation_record> find(const NxmemAllocation& described) {
        return records_.find(described.address, matcher(described));
    }

    // Records that `prefix_id` is mapped into the allocation at `address`; false if that
    // allocation is no longer live.
    bool add_prefix(std::uint64_t address, std::uint64_t prefix_id) {
        return records_.update(address, [prefix_id](allocation_record& record) {
            record.prefixes.push_back(prefix_id);
        });
    }

    // Every record, removed: what is left when the allocator goes away.
    std::vector<allocation_record> take_all() {
        std::vector<allocation_record> all;
        for (auto& entry : records_.take_all()) {
            all.push_back(std::move(entry.second));
        }
        return all;
    }

private:
    nxmem::detail::sharded_table<allocation_record> records_;
};

} // namespace nxmem::plugin
