// The pooled figures of any plugin mechanism serving the cpu device type, as `nxmem bench --pool`
// prints them: the mechanism opened pooled (host::open_pooled_allocator, default pool options)
// against the same mechanism unpooled (the host adapter) and malloc, in one process:
//   round_trip.SIZE.*   allocate + release at 64 B, 4 KiB, 64 KiB and 2 MiB
//   cycle.2MiB.*        allocate + write every page + release, and minor page faults per cycle
//   threads.*           2 threads / 1 on the one pool, against malloc's own two-thread scaling
//   crossings.*         upstream calls to hold `live` 64 B allocations at once, and what the pool
//                       holds then and after trim(0)
// The memory is written by the cycle: a cpu mechanism's memory is host memory. An unpooled
// allocation of a mechanism with virtual backing is committed whole before it is written.
#pragma once

#include "plugin_figures.hpp"
#include "pool_routes.hpp"

#include <nxmem/host.hpp>
#include <nxmem/pool.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::measure {

inline constexpr size_point pool_round_trip_sizes[] = {
    {64, "64B", 1}, {4096, "4KiB", 1}, {64 * 1024, "64KiB", 4}, {2u << 20, "2MiB", 16}};

// The keys of every figure `nxmem bench --pool` reports. The test of `nxmem bench` checks
// against this list.
inline std::vector<std::string> pool_figure_keys() {
    std::vector<std::string> keys;
    for (const size_point& size : pool_round_trip_sizes) {
        const std::string at = std::string("round_trip.") + size.label;
        for (const char* name : {".pooled_ns", ".direct_ns", ".malloc_ns", ".pooled_vs_malloc", ".pooled_vs_direct"}) {
            keys.push_back(at + name);
        }
    }
    for (const char* name : {"cycle.2MiB.pooled_ns", "cycle.2MiB.direct_ns", "cycle.2MiB.malloc_ns",
                             "cycle.2MiB.pooled_vs_malloc", "cycle.2MiB.pooled_vs_direct",
                             "cycle.2MiB.pooled_faults", "cycle.2MiB.direct_faults", "cycle.2MiB.malloc_faults",
                             "threads.pooled.scaling", "threads.malloc.scaling", "threads.pooled_vs_malloc_scaling",
                             "threads.load_average", "crossings.live", "crossings.upstream_calls",
                             "crossings.allocations_per_crossing", "crossings.held_vs_live",
                             "crossings.held_after_trim"}) {
        keys.emplace_back(name);
    }
    return keys;
}

namespace detail {

// The unpooled route of the cycle: the adapter, committing all of each allocation first where
// the mechanism reserves without committing (virtual backing).
class committed_route {
public:
    using handle = allocation<cpu_device>;
    committed_route(host::plugin_allocator<cpu_device>& allocator,
                    std::optional<host::virtual_backing_view<cpu_device>> backing)
        : adapter_(allocator), allocator_(&allocator), backing_(std::move(backing)) {}

    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        std::optional<handle> made = adapter_.allocate(size, alignment);
        if (made && backing_ && !backing_->commit(*made, byte_range{0, size})) {
            (void)allocator_->release(*made);
            return std::nullopt;
        }
        return made;
    }
    bool release(const handle& live) { return adapter_.release(live); }

private:
    adapter_route adapter_;
    host::plugin_allocator<cpu_device>* allocator_;
    std::optional<host::virtual_backing_view<cpu_device>> backing_;
};

} // namespace detail

inline result<plugin_bench_report> run_pool_bench(const plugin_bench_options& options) {
    NXMEM_TRY(module, host::plugin_module::load(std::filesystem::absolute(options.plugin)));
    NXMEM_TRY(mechanism, pick_cpu_mechanism(*module, options.mechanism));
    NXMEM_TRY(pool, host::open_pooled_allocator<cpu_device>(module, mechanism, 0));
    NXMEM_TRY(direct, detail::open_cpu(module, mechanism));
    std::optional<host::virtual_backing_view<cpu_device>> backing;
    if ((direct.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0) {
        NXMEM_TRY(view, direct.virtual_backing());
        backing.emplace(std::move(view));
    }

    plugin_bench_report report;
    report.plugin = options.plugin.string();
    report.mechanism = mechanism;
    auto add = [&report](std::string key, std::string what, double value, std::string unit) {
        report.figures.push_back({std::move(key), std::move(what), value, std::move(unit)});
    };
    const std::uint64_t iterations = options.iterations == 0 ? 1 : options.iterations;

    using pool_type = typename decltype(pool)::element_type;
    pool_route<pool_type> pooled(*pool);
    detail::committed_route unpooled(direct, backing);
    malloc_route heap;
    for (const size_point& size : pool_round_trip_sizes) {
        const std::uint64_t count = std::max<std::uint64_t>(1, iterations / size.iteration_divisor);
        const std::string at = std::string("round_trip.") + size.label;
        const std::string label = std::string(" at ") + size.label;
        NXMEM_TRY(times, detail::round_trip_nanoseconds(size.bytes, count, pooled, unpooled, heap));
        const auto [pooled_ns, direct_ns, malloc_ns] = times;
        add(at + ".pooled_ns", "allocate + release through the pool" + label, pooled_ns, "ns");
        add(at + ".direct_ns", "allocate + release through the host adapter, unpooled" + label, direct_ns, "ns");
        add(at + ".malloc_ns", "malloc + free" + label, malloc_ns, "ns");
        add(at + ".pooled_vs_malloc", "pooled / malloc" + label, pooled_ns / malloc_ns, "x");
        add(at + ".pooled_vs_direct", "pooled / unpooled" + label, pooled_ns / direct_ns, "x");
    }

    // The 2 MiB cycle: time and faults. A sixteenth of the iterations (each cycle writes 512 pages).
    constexpr std::uint64_t cycle_bytes = 2u << 20;
    const std::uint64_t cycles = std::max<std::uint64_t>(1, iterations / 256);
    auto cycle_of = [](auto& route) { return [&route] { return touched_cycle(route, cycle_bytes); }; };
    auto faults_of = [&](auto& route) -> result<double> {
        std::optional<double> faults = faults_per_call(cycle_of(route), cycles);
        if (!faults) {
            return fail(status_code::internal_error, "a 2 MiB allocate + write + release cycle failed");
        }
        return *faults;
    };
    NXMEM_TRY(pooled_faults, faults_of(pooled));
    NXMEM_TRY(direct_faults, faults_of(unpooled));
    NXMEM_TRY(malloc_faults, faults_of(heap));
    NXMEM_TRY(pooled_cycle_ns, nanoseconds_per_call(cycle_of(pooled), cycles));
    NXMEM_TRY(direct_cycle_ns, nanoseconds_per_call(cycle_of(unpooled), cycles));
    NXMEM_TRY(malloc_cycle_ns, nanoseconds_per_call(cycle_of(heap), cycles));
    add("cycle.2MiB.pooled_ns", "allocate + write every page + release of 2 MiB through the pool", pooled_cycle_ns, "ns");
    add("cycle.2MiB.direct_ns", "the same, unpooled", direct_cycle_ns, "ns");
    add("cycle.2MiB.malloc_ns", "the same with malloc + free", malloc_cycle_ns, "ns");
    add("cycle.2MiB.pooled_vs_malloc", "pooled / malloc, 2 MiB cycle", pooled_cycle_ns / malloc_cycle_ns, "x");
    add("cycle.2MiB.pooled_vs_direct", "pooled / unpooled, 2 MiB cycle", pooled_cycle_ns / direct_cycle_ns, "x");
    add("cycle.2MiB.pooled_faults", "minor page faults per 2 MiB cycle, pooled", pooled_faults, "");
    add("cycle.2MiB.direct_faults", "minor page faults per 2 MiB cycle, unpooled", direct_faults, "");
    add("cycle.2MiB.malloc_faults", "minor page faults per 2 MiB cycle, malloc", malloc_faults, "");

    // Two threads on the one pool against one, at 64 B, beside malloc's own scaling (each the
    // best of three runs).
    auto on_pool = [&](unsigned) { return [&pooled] { return round_trip(pooled, 64, round_trip_alignment); }; };
    NXMEM_TRY(pool_one, best_calls_per_second(1, iterations, on_pool));
    NXMEM_TRY(pool_two, best_calls_per_second(2, iterations, on_pool));
    std::vector<malloc_route> heaps(2);
    auto on_malloc = [&](unsigned index) { return [&heaps, index] { return round_trip(heaps[index], 64, 16); }; };
    NXMEM_TRY(malloc_one, best_calls_per_second(1, iterations, on_malloc));
    NXMEM_TRY(malloc_two, best_calls_per_second(2, iterations, on_malloc));
    report.load_average = load_average();
    add("threads.pooled.scaling", "2 threads / 1 thread, 64 B round trips on one pool", pool_two / pool_one, "x");
    add("threads.malloc.scaling", "2 threads / 1 thread, 64 B malloc + free", malloc_two / malloc_one, "x");
    add("threads.pooled_vs_malloc_scaling", "the pool's scaling / malloc's",
        (pool_two / pool_one) / (malloc_two / malloc_one), "x");
    add("threads.load_average", "1-minute load average when the thread figures were taken",
        report.load_average.value_or(-1), "");

    // Crossings, on a pool of their own so its counts are theirs alone.
    const std::uint64_t live = options.live == 0 ? 1 : options.live;
    NXMEM_TRY(fresh, host::open_pooled_allocator<cpu_device>(module, mechanism, 0));
    NXMEM_TRY(crossed, count_crossings(*fresh, live, 64));
    add("crossings.live", "64 B allocations held at once", static_cast<double>(crossed.live), "");
    add("crossings.upstream_calls", "upstream allocations + commits the pool made to hold them",
        static_cast<double>(crossed.upstream_calls), "");
    add("crossings.allocations_per_crossing", "live allocations per upstream call",
        static_cast<double>(crossed.live) / static_cast<double>(std::max<std::uint64_t>(1, crossed.upstream_calls)), "");
    add("crossings.held_vs_live", "bytes held from the upstream / bytes in use, with them live",
        static_cast<double>(crossed.held_bytes) / static_cast<double>(std::max<std::uint64_t>(1, crossed.in_use_bytes)), "x");
    add("crossings.held_after_trim", "bytes held after releasing them all and trim(0)",
        static_cast<double>(crossed.held_after_trim), "B");
    return report;
}

} // namespace nxmem::measure
