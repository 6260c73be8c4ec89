// The reference model of the contract's observable state: per allocator its references, live
// allocations (described as the host describes them, with their usable size, cost and committed
// ranges), the shared prefixes it created (references, sharers, whether ever mapped), its queued
// tickets in order and the residue it may keep from quarantines. From it follow the figures the
// plugin must report: its unload report, each allocator's usage, each allocation's mapped bytes.
// Where the contract leaves a mechanism latitude (a partial last commit unit counted by bytes or
// whole; committed units under a mapped prefix; residue freed early) a figure is an interval.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::conform::model {

// A figure the contract pins to [low, high].
struct figure {
    std::uint64_t low = 0;
    std::uint64_t high = 0;

    static figure exactly(std::uint64_t value) { return {value, value}; }
    bool admits(std::uint64_t value) const noexcept { return value >= low && value <= high; }
    figure& operator+=(const figure& other) noexcept {
        low += other.low;
        high += other.high;
        return *this;
    }
    std::string describe() const {
        return low == high ? std::to_string(low)
                           : "between " + std::to_string(low) + " and " + std::to_string(high);
    }
};

inline std::uint64_t round_up(std::uint64_t value, std::uint64_t unit) {
    return unit == 0 ? value : (value + unit - 1) / unit * unit;
}

struct prefix_state {
    unsigned serial = 0;                // "prefix #N" in messages
    NxmemSharedPrefixHandle handle{};   // as the plugin named it
    std::uint64_t requested = 0;        // the size asked for
    unsigned references = 0;            // the creator's and each retain's, not yet released
    unsigned sharers = 0;               // allocations mapping it now
    bool ever_mapped = false;           // costed once in its lifetime (C8)
    bool alive() const noexcept { return references > 0 || sharers > 0; }
};

struct allocation_state {
    unsigned serial = 0;               // "allocation #N"
    NxmemAllocation described{};       // the host's description: the size it asked for (Q12)
    std::uint64_t usable = 0;          // NxmemAllocResult::size
    std::uint64_t stated_cost = 0;     // NxmemAllocResult::mapped_bytes
    bool virtual_backed = false;
    std::uint64_t unit = 0;            // commit granularity (virtual backing)
    std::vector<bool> committed;       // per unit
    std::optional<unsigned> prefix;    // serial of the prefix mapped over its start
    std::uint64_t prefix_bytes = 0;    // that prefix's size
    std::optional<std::uint64_t> ticket; // queued for release
    unsigned char signature = 0;       // the byte the model wrote into it (cpu)

    std::uint64_t unit_end(std::size_t index) const noexcept {
        return std::min<std::uint64_t>((index + 1) * unit, described.size);
    }

    // What it costs now (Q17, C8).
    figure cost(std::uint64_t page) const {
        if (!virtual_backed) {
            if (!prefix) {
                return figure::exactly(stated_cost);
            }
            const std::uint64_t under = std::min(stated_cost, round_up(prefix_bytes, page));
            return figure{stated_cost - under, stated_cost};
        }
        figure total;
        for (std::size_t index = 0; index < committed.size(); ++index) {
            if (!committed[index]) {
                continue;
            }
            const std::uint64_t start = index * unit;
            const std::uint64_t end = unit_end(index);
            if (prefix && start < round_up(prefix_bytes, page)) {
                total += figure{0, unit}; // under the prefix: the contract leaves it open
            } else {
                total += figure{end - start, unit}; // a partial last unit: by bytes or whole
            }
        }
        return total;
    }
};

struct allocator_state {
    unsigned serial = 0;
    NxmemAllocatorVtable* self = nullptr;
    NxmemAllocatorVtable table{};
    NxmemVirtualBackingVtable backing{};
    NxmemSharedMappingVtable sharing{};
    bool has_backing = false;
    bool has_sharing = false;
    bool without_callbacks = false; // opened with no host callbacks (H1)
    std::uint64_t granularity = 0;
    unsigned references = 0;
    std::vector<allocation_state> live;
    std::vector<prefix_state> prefixes; // every prefix it created, dead ones kept for misuse
    std::deque<std::uint64_t> queue;    // tickets in enqueue order
    std::uint64_t quarantined = 0;      // residue reported, at most what it keeps now
    std::vector<std::pair<std::uint64_t, std::uint64_t>> quarantined_ranges; // never reissued (RO3)

    bool offers(NxmemCapabilities flag) const noexcept { return (table.capabilities & flag) != 0; }
    prefix_state* find_prefix(unsigned serial_of) {
        for (prefix_state& prefix : prefixes) {
            if (prefix.serial == serial_of) {
                return &prefix;
            }
        }
        return nullptr;
    }
};

// The five counts of the unload report (the plugin's, over the whole module).
struct report_counts {
    std::uint64_t allocators = 0, allocations = 0, views = 0, prefixes = 0, queued = 0;
};

struct usage_figures {
    figure live_allocations, reserved_bytes, mapped_bytes, shared_prefix_bytes, quarantined_bytes;
};

struct reference_model {
    std::vector<allocator_state> allocators; // open ones (references > 0)
    unsigned next_serial = 1;
    // Just below 2^32, so the second ticket of a sequence needs all 64 bits (D1: the host's
    // uint64_t); a plugin keeping tickets in 32 bits retires one the host never issued.
    std::uint64_t next_ticket = (std::uint64_t{1} << 32) - 1;

    report_counts expected_report() const {
        report_counts counts;
        for (const allocator_state& allocator : allocators) {
            ++counts.allocators;
            counts.allocations += allocator.live.size();
            counts.queued += allocator.queue.size();
            for (const prefix_state& prefix : allocator.prefixes) {
                counts.views += prefix.sharers;
                counts.prefixes += prefix.alive() ? 1 : 0;
            }
        }
        return counts;
    }

    static usage_figures expected_usage(const allocator_state& allocator, std::uint64_t page) {
        usage_figures usage;
        usage.live_allocations = figure::exactly(allocator.live.size());
        for (const allocation_state& live : allocator.live) {
            usage.reserved_bytes += figure::exactly(live.usable);
            usage.mapped_bytes += live.cost(page);
        }
        for (const prefix_state& prefix : allocator.prefixes) {
            if (prefix.alive()) {
                // By its bytes, or by the whole pages or granules it holds (Q17).
                usage.shared_prefix_bytes += figure{
                    prefix.handle.size, round_up(prefix.handle.size, std::max(page, allocator.granularity))};
            }
        }
        usage.quarantined_bytes = figure{0, allocator.quarantined};
        return usage;
    }
};

} // namespace nxmem::conform::model
