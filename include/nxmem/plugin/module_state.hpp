// What one plugin module holds, process-wide within that module: its live-object counters and the
// version it negotiated. The kit's objects update these; NxmemQueryUnloadReadiness reports them.
// The state is an inline function-local static: one per loaded module, which is why plugins are
// built with -fno-gnu-unique (a GNU unique symbol would be shared across modules and pin them).
#pragma once

#include <nxmem/nxmem_memory_abi.h>

#include <atomic>
#include <cstdint>

namespace nxmem::plugin {

struct module_state {
    std::atomic<std::uint32_t> negotiated_minor{NXMEM_ABI_MINOR_BASELINE};
    std::atomic<std::uint64_t> factories_created{0};
    std::atomic<std::uint64_t> factories_released{0};
    std::atomic<std::uint64_t> live_allocators{0};
    std::atomic<std::uint64_t> live_allocations{0};
    std::atomic<std::uint64_t> live_views{0};
    std::atomic<std::uint64_t> live_shared_prefixes{0};
    std::atomic<std::uint64_t> queued_releases{0};

    NxmemUnloadReport report() const noexcept {
        NxmemUnloadReport report{};
        report.struct_size = sizeof report;
        report.live_allocators = live_allocators.load();
        report.live_allocations = live_allocations.load();
        report.live_views = live_views.load();
        report.live_shared_prefixes = live_shared_prefixes.load();
        report.queued_releases = queued_releases.load();
        return report;
    }
};

inline module_state& this_module() noexcept {
    static module_state state;
    return state;
}

} // namespace nxmem::plugin
