// What the host can see of a plugin at one moment: its unload report, the usage totals of one
// allocator (when it offers the query) and the cost of one live allocation (when it has virtual
// backing). The checks of failure paths and edges take one before and one after a call the plugin
// must refuse, and a difference is a refusal that changed something (ABI.md E12).
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/host/tally.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace nxmem::conform::detail {

struct state_snapshot {
    std::optional<host::plugin_counts> counts; // nullopt: the report failed
    std::optional<NxmemAllocatorUsage> usage;  // nullopt: no usage query
    std::optional<std::uint64_t> mapped;       // nullopt: no allocation watched, or no backing

    // "" when equal; else the first field that differs, before and after.
    std::string difference(const state_snapshot& after) const {
        auto figure = [](const char* name, std::uint64_t before, std::uint64_t now) -> std::string {
            return before == now ? std::string()
                                 : std::string(name) + " went from " + std::to_string(before) + " to " +
                                       std::to_string(now);
        };
        if (counts && after.counts) {
            const host::plugin_counts& a = *counts;
            const host::plugin_counts& b = *after.counts;
            for (std::string changed :
                 {figure("NxmemUnloadReport.live_allocators", a.allocators, b.allocators),
                  figure("NxmemUnloadReport.live_allocations", a.allocations, b.allocations),
                  figure("NxmemUnloadReport.live_views", a.views, b.views),
                  figure("NxmemUnloadReport.live_shared_prefixes", a.shared_prefixes, b.shared_prefixes),
                  figure("NxmemUnloadReport.queued_releases", a.queued_releases, b.queued_releases),
                  figure("NxmemUnloadReport.live_imports", a.imports, b.imports)}) {
                if (!changed.empty()) {
                    return changed;
                }
            }
        } else if (counts.has_value() != after.counts.has_value()) {
            return "the unload report stopped (or started) answering";
        }
        if (usage && after.usage) {
            const NxmemAllocatorUsage& a = *usage;
            const NxmemAllocatorUsage& b = *after.usage;
            for (std::string changed :
                 {figure("NxmemAllocatorUsage.live_allocations", a.live_allocations, b.live_allocations),
                  figure("NxmemAllocatorUsage.reserved_bytes", a.reserved_bytes, b.reserved_bytes),
                  figure("NxmemAllocatorUsage.mapped_bytes", a.mapped_bytes, b.mapped_bytes),
                  figure("NxmemAllocatorUsage.shared_prefix_bytes", a.shared_prefix_bytes, b.shared_prefix_bytes),
                  figure("NxmemAllocatorUsage.quarantined_bytes", a.quarantined_bytes, b.quarantined_bytes),
                  figure("NxmemAllocatorUsage.live_imports", a.live_imports, b.live_imports),
                  figure("NxmemAllocatorUsage.imported_bytes", a.imported_bytes, b.imported_bytes)}) {
                if (!changed.empty()) {
                    return changed;
                }
            }
        }
        if (mapped && after.mapped && *mapped != *after.mapped) {
            return figure("the watched allocation's mapped_bytes", *mapped, *after.mapped);
        }
        return {};
    }
};

// The plugin's unload report through its own export (no host in between).
inline std::optional<host::plugin_counts> raw_counts(const raw_library& library) {
    NxmemQueryUnloadReadinessFn query = library.query_unload_readiness();
    if (query == nullptr) {
        return std::nullopt;
    }
    auto report = abi::make_struct<NxmemUnloadReport>();
    NxmemStatus status = abi::make_status();
    if (query(&report, &status) != NXMEM_STATUS_OK) {
        return std::nullopt;
    }
    return host::plugin_counts::from_wire(report);
}

// One allocator's usage through its raw slot; nullopt without the query or when it fails.
inline std::optional<NxmemAllocatorUsage> raw_usage(const raw_slots& slots) {
    if (slots.table().query_usage == nullptr) {
        return std::nullopt;
    }
    auto usage = abi::make_struct<NxmemAllocatorUsage>();
    NxmemStatus status = abi::make_status();
    if (slots.table().query_usage(slots.self(), &usage, &status) != NXMEM_STATUS_OK) {
        return std::nullopt;
    }
    return usage;
}

// A snapshot of `library`'s report, `slots`' usage and, when `watched` is set and the mechanism
// has virtual backing, that allocation's mapped_bytes.
inline state_snapshot take_snapshot(const raw_library& library, const raw_slots& slots,
                                    const NxmemAllocation* watched = nullptr) {
    state_snapshot taken;
    taken.counts = raw_counts(library);
    taken.usage = raw_usage(slots);
    if (watched != nullptr && slots.table().virtual_backing != nullptr) {
        result<abi::table_copy<NxmemVirtualBackingVtable>> backing =
            abi::read_prefix<NxmemVirtualBackingVtable>(slots.table().virtual_backing, NXMEM_ABI_MINOR);
        if (backing && backing.value().table.mapped_bytes != nullptr) {
            std::uint64_t bytes = 0;
            NxmemStatus status = abi::make_status();
            if (backing.value().table.mapped_bytes(slots.self(), watched, &bytes, &status) == NXMEM_STATUS_OK) {
                taken.mapped = bytes;
            }
        }
    }
    return taken;
}

} // namespace nxmem::conform::detail
