// What one plugin module holds, process-wide within that module: the version it negotiated, its
// factory and allocator counters, and the allocators whose counts NxmemQueryUnloadReadiness sums.
// The state is an inline function-local static: one per loaded module, which is why plugins are
// built with -fno-gnu-unique (a GNU unique symbol would be shared across modules and pin them).
//
// Nothing the module shares is written per allocation: an allocator's live allocations are the
// records its registry already counts shard by shard, plus those it holds outside the registry
// (queued releases); those, views and queued releases are counted per allocator and per thread
// (allocator_counts). The module sums the live allocators' counts when the host asks.
#pragma once

#include <nxmem/nxmem_memory_abi.h>
#include <nxmem/plugin/thread_tally.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace nxmem::plugin {

class allocator_counts;

struct module_state {
    std::atomic<std::uint32_t> negotiated_minor{NXMEM_ABI_MINOR_BASELINE};
    std::atomic<std::uint64_t> factories_created{0};
    std::atomic<std::uint64_t> factories_released{0};
    std::atomic<std::uint64_t> live_allocators{0};
    std::atomic<std::uint64_t> live_shared_prefixes{0};
    std::atomic<std::uint64_t> live_imports{0}; // minor 3: imports not yet closed

    // Sums every live allocator's counts (and what allocators left counted when they went).
    NxmemUnloadReport report() const noexcept;

private:
    friend class allocator_counts;
    mutable std::mutex counts_mutex_;
    allocator_counts* first_counts_ = nullptr; // an intrusive list: enlisting never allocates
    std::int64_t left_counted_[4] = {};        // guarded by counts_mutex_; allocator_counts' fields
    std::int64_t left_recorded_ = 0;           // recorded when their allocator went; the same
};

inline module_state& this_module() noexcept {
    static constinit module_state state; // constant-initialised: nothing runs at dlopen
    return state;
}

// One allocator's counts, enlisted in the module while it exists. Its live allocations are those
// its registry records (read through `recorded`, a count the registry keeps anyway, so allocate
// and release write no counter) plus those counted as `unrecorded_allocations`: live, but no
// longer in the registry (the kit's queued releases). Those, views and queued releases are
// counted per thread. What is still counted when it goes stays in the module's report (the kit
// hands everything back first, so that is normally nothing).
class allocator_counts {
public:
    // unrecorded_reserved_bytes: the usable bytes of the unrecorded allocations (the usage
    // query's reserved bytes beside the registry's); the unload report has no use for it.
    enum field : std::size_t {
        unrecorded_allocations,
        views,
        queued_releases,
        unrecorded_reserved_bytes,
        field_count
    };

    // How many allocations `registry` records now; read when the host asks for a report, from
    // any thread, so it must be safe to call concurrently with allocate and release.
    using recorded_count = std::size_t (*)(const void* registry) noexcept;

    // `registry` outlives these counts (declare it first); `recorded(registry)` counts its records.
    allocator_counts(const void* registry, recorded_count recorded) noexcept
        : registry_(registry), recorded_(recorded) {
        module_state& module = this_module();
        std::lock_guard lock(module.counts_mutex_);
        next_ = module.first_counts_;
        if (next_ != nullptr) {
            next_->previous_ = this;
        }
        module.first_counts_ = this;
    }
    // Counts with no registry behind them: live allocations are only the unrecorded ones.
    allocator_counts() noexcept
        : allocator_counts(nullptr, [](const void*) noexcept -> std::size_t { return 0; }) {}
    ~allocator_counts() {
        module_state& module = this_module();
        std::lock_guard lock(module.counts_mutex_);
        for (std::size_t each = 0; each < field_count; ++each) {
            module.left_counted_[each] += tally_.sum(each);
        }
        module.left_recorded_ += static_cast<std::int64_t>(recorded_(registry_));
        (previous_ != nullptr ? previous_->next_ : module.first_counts_) = next_;
        if (next_ != nullptr) {
            next_->previous_ = previous_;
        }
    }
    allocator_counts(const allocator_counts&) = delete;
    allocator_counts& operator=(const allocator_counts&) = delete;

    void add(field which, std::int64_t delta) noexcept { tally_.add(which, delta); }
    // This thread's cell, for a call that changes several counts.
    auto this_thread() noexcept { return tally_.this_thread(); }
    std::int64_t sum(field which) const noexcept { return tally_.sum(which); }
    // Live allocations: recorded and unrecorded ones (a sum read while other threads count may be
    // off by the calls in flight).
    std::int64_t live_allocations() const noexcept {
        return static_cast<std::int64_t>(recorded_(registry_)) + tally_.sum(unrecorded_allocations);
    }

private:
    friend struct module_state;
    static_assert(field_count == sizeof(module_state::left_counted_) / sizeof(std::int64_t));
    thread_tally<field_count> tally_;
    const void* registry_;
    recorded_count recorded_;
    allocator_counts* previous_ = nullptr; // guarded by the module's counts_mutex_
    allocator_counts* next_ = nullptr;
};

inline NxmemUnloadReport module_state::report() const noexcept {
    std::int64_t totals[allocator_counts::field_count] = {};
    std::int64_t allocations = 0;
    {
        std::lock_guard lock(counts_mutex_);
        for (std::size_t each = 0; each < allocator_counts::field_count; ++each) {
            totals[each] = left_counted_[each];
        }
        allocations = left_recorded_ + left_counted_[allocator_counts::unrecorded_allocations];
        for (const allocator_counts* counts = first_counts_; counts != nullptr; counts = counts->next_) {
            for (std::size_t each = 0; each < allocator_counts::field_count; ++each) {
                totals[each] += counts->sum(static_cast<allocator_counts::field>(each));
            }
            allocations += counts->live_allocations();
        }
    }
    NxmemUnloadReport report{};
    report.struct_size = sizeof report;
    report.live_allocators = live_allocators.load();
    // A sum read while other threads count may pass below zero for a moment; it is reported as
    // the unsigned count it wraps to, which is non-zero, so unload is refused, never allowed.
    report.live_allocations = static_cast<std::uint64_t>(allocations);
    report.live_views = static_cast<std::uint64_t>(totals[allocator_counts::views]);
    report.live_shared_prefixes = live_shared_prefixes.load();
    report.queued_releases = static_cast<std::uint64_t>(totals[allocator_counts::queued_releases]);
    report.live_imports = live_imports.load();
    return report;
}

} // namespace nxmem::plugin
