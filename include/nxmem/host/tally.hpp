// The host's own count of what it holds from one module: the second tally of every unload check.
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace nxmem::host {

// A snapshot of the host's counters.
struct host_counts {
    std::uint64_t allocators = 0;
    std::uint64_t allocations = 0;
    std::uint64_t views = 0;           // capability views (virtual backing, shared mapping) held
    std::uint64_t shared_prefixes = 0; // prefix references held
    std::uint64_t queued_releases = 0;
    std::uint64_t pins = 0;            // execution contexts pinning the module
    std::uint64_t imports = 0;         // imports from other processes not yet closed (minor 3)
    std::uint64_t registrations = 0;   // leases held by transfer registrations (docs/TRANSFER.md)

    bool idle() const noexcept {
        return allocators == 0 && allocations == 0 && views == 0 && shared_prefixes == 0 &&
               queued_releases == 0 && pins == 0 && imports == 0 && registrations == 0;
    }
    std::string describe() const {
        return "allocators " + std::to_string(allocators) + ", allocations " +
               std::to_string(allocations) + ", capability views " + std::to_string(views) +
               ", shared prefixes " + std::to_string(shared_prefixes) + ", queued releases " +
               std::to_string(queued_releases) + ", pins " + std::to_string(pins) +
               (imports != 0 ? ", imports " + std::to_string(imports) : std::string()) +
               (registrations != 0 ? ", transfer registrations " + std::to_string(registrations)
                                   : std::string());
    }
};

// The plugin's own report, as read through NxmemQueryUnloadReadiness.
struct plugin_counts {
    std::uint64_t allocators = 0;
    std::uint64_t allocations = 0;
    std::uint64_t views = 0; // shared prefixes mapped into allocations (NxmemUnloadReport::live_views)
    std::uint64_t shared_prefixes = 0;
    std::uint64_t queued_releases = 0;
    std::uint64_t imports = 0; // minor 3; a plugin that writes a shorter report has none

    static plugin_counts from_wire(const NxmemUnloadReport& report) noexcept {
        return {report.live_allocators, report.live_allocations, report.live_views,
                report.live_shared_prefixes, report.queued_releases, report.live_imports};
    }
    bool idle() const noexcept {
        return allocators == 0 && allocations == 0 && views == 0 && shared_prefixes == 0 &&
               queued_releases == 0 && imports == 0;
    }
    std::string describe() const {
        return "allocators " + std::to_string(allocators) + ", allocations " +
               std::to_string(allocations) + ", prefix mappings " + std::to_string(views) +
               ", shared prefixes " + std::to_string(shared_prefixes) + ", queued releases " +
               std::to_string(queued_releases) +
               (imports != 0 ? ", imports " + std::to_string(imports) : std::string());
    }
};

// Both tallies, side by side: a refusal always carries both, so a plugin that misreports shows.
struct unload_readiness {
    plugin_counts plugin;
    host_counts host;
    bool ready() const noexcept { return plugin.idle() && host.idle(); }
    std::string describe() const {
        return "plugin reports {" + plugin.describe() + "}; host holds {" + host.describe() + "}";
    }
};

namespace detail {

// The live counters behind host_counts, except allocations: those change on every allocate and
// release, so each allocator counts its own (its live table's per-shard counts) and the module sums
// them when asked, through each allocator's link. A module-wide counter here would be one cache
// line written by every allocation of every thread.
struct host_tally {
    std::atomic<std::uint64_t> allocators{0};
    std::atomic<std::uint64_t> views{0};
    std::atomic<std::uint64_t> shared_prefixes{0};
    std::atomic<std::uint64_t> queued_releases{0};
    std::atomic<std::uint64_t> pins{0};
    std::atomic<std::uint64_t> imports{0};
    std::atomic<std::uint64_t> registrations{0};

    // Everything but allocations, which the caller fills in.
    host_counts snapshot() const noexcept {
        return {allocators.load(), 0, views.load(), shared_prefixes.load(), queued_releases.load(),
                pins.load(), imports.load(), registrations.load()};
    }
};

// One allocator's entry in its module's list of allocators; `count(owner)` reports the
// allocations it holds now. Intrusive, so joining the list allocates nothing.
struct allocation_count_link {
    const void* owner = nullptr;
    std::uint64_t (*count)(const void* owner) noexcept = nullptr;
    allocation_count_link* previous = nullptr;
    allocation_count_link* next = nullptr;
};

} // namespace detail
} // namespace nxmem::host
