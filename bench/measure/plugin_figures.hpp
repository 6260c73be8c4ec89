// The figures that apply to any plugin mechanism serving the cpu device type, as `nxmem bench`
// prints them: what the host adapter and the plugin's table cost per round trip against malloc,
// at three sizes; 1 against 2 threads on one allocator and on two; heap bytes kept per live
// allocation by the host and by the plugin; and, where the mechanism offers virtual backing,
// commit + decommit through the host's view against the plugin's table called directly.
#pragma once

#include "bookkeeping.hpp"
#include "ranges.hpp"
#include "routes.hpp"
#include "system.hpp"
#include "timing.hpp"

#include <nxmem/host.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::measure {

struct figure {
    std::string key;  // stable, dotted: what scripts read from the JSON
    std::string what; // one line for a person
    double value = 0;
    std::string unit; // "ns", "x" (a ratio), "B", "calls/s", "" (a plain number)
};

struct plugin_bench_options {
    std::filesystem::path plugin;
    std::string mechanism;              // empty: the plugin's first mechanism serving cpu
    std::uint64_t iterations = 200000;  // round trips per timed run (fewer at 2 MiB)
    std::uint64_t live = 100000;        // allocations held to measure heap bytes per allocation
};

struct plugin_bench_report {
    std::string plugin;
    std::string mechanism;
    std::optional<double> load_average; // when the thread figures were taken
    std::vector<figure> figures;

    const figure* find(const std::string& key) const {
        for (const figure& each : figures) {
            if (each.key == key) {
                return &each;
            }
        }
        return nullptr;
    }
};

struct size_point {
    std::uint64_t bytes;
    const char* label;
    std::uint64_t iteration_divisor; // large sizes make system calls: fewer of them suffice
};
inline constexpr size_point round_trip_sizes[] = {
    {64, "64B", 1}, {4096, "4KiB", 1}, {2u << 20, "2MiB", 16}};

// The keys of every figure a report on a mechanism has; those under "range." only when the
// mechanism offers virtual backing. The test of `nxmem bench` checks against this list.
inline std::vector<std::string> plugin_figure_keys(bool virtual_backing) {
    std::vector<std::string> keys;
    for (const size_point& size : round_trip_sizes) {
        const std::string at = std::string("round_trip.") + size.label;
        for (const char* name : {".adapter_ns", ".table_ns", ".malloc_ns", ".adapter_vs_malloc",
                                 ".table_vs_malloc", ".host_ns"}) {
            keys.push_back(at + name);
        }
    }
    for (const char* name : {"threads.one_allocator.scaling", "threads.two_allocators.scaling",
                             "threads.malloc.scaling", "threads.load_average",
                             "heap.host_bytes_per_live", "heap.plugin_bytes_per_live",
                             "heap.kept_after_release.host_and_plugin", "heap.kept_after_release.plugin"}) {
        keys.emplace_back(name);
    }
    if (virtual_backing) {
        for (const char* name : {"range.view_ns", "range.table_ns", "range.view_vs_table"}) {
            keys.emplace_back(name);
        }
    }
    return keys;
}

namespace detail {

inline result<host::plugin_allocator<cpu_device>> open_cpu(const std::shared_ptr<host::plugin_module>& module,
                                                          const std::string& mechanism) {
    return host::open_allocator<cpu_device>(module, mechanism, 0);
}

// Ids for table routes: far above the host's, one block per route.
inline std::uint64_t table_id_base(unsigned route) { return (1ull << 62) + (std::uint64_t{route} << 48); }

template <class Route> auto round_trips(Route& route, std::uint64_t size) {
    return [&route, size] { return round_trip(route, size, round_trip_alignment); };
}

// Nanoseconds per round trip at `size` through each route in turn, `count` a timed run.
template <class... Routes>
result<std::array<double, sizeof...(Routes)>> round_trip_nanoseconds(std::uint64_t size, std::uint64_t count,
                                                                     Routes&... routes) {
    std::array<double, sizeof...(Routes)> times{};
    std::size_t next = 0;
    std::optional<error> failed;
    auto time_one = [&](auto& route) {
        if (failed) {
            return;
        }
        result<double> ns = nanoseconds_per_call(round_trips(route, size), count);
        if (ns) {
            times[next++] = ns.value();
        } else {
            failed = ns.error();
        }
    };
    (time_one(routes), ...);
    if (failed) {
        return boost::outcome_v2::failure(std::move(*failed));
    }
    return times;
}

} // namespace detail

// The mechanism named, or the first serving cpu; a clear error when there is none.
inline result<std::string> pick_cpu_mechanism(const host::plugin_module& module, const std::string& wanted) {
    if (!wanted.empty()) {
        const host::factory_info* found = module.find_factory(wanted);
        if (found == nullptr) {
            std::string names;
            for (const host::factory_info& factory : module.factories()) {
                names += (names.empty() ? "" : ", ") + factory.name;
            }
            return fail(status_code::invalid_argument, "no mechanism named '" + wanted + "' (it has: " +
                                                           (names.empty() ? "none" : names) + ")");
        }
        if (!found->serves(NXMEM_DEVICE_CPU)) {
            return fail(status_code::wrong_device,
                        "mechanism '" + wanted + "' does not serve the cpu device type, the only one measured");
        }
        return wanted;
    }
    for (const host::factory_info& factory : module.factories()) {
        if (factory.serves(NXMEM_DEVICE_CPU)) {
            return factory.name;
        }
    }
    return fail(status_code::wrong_device, "no mechanism of this plugin serves the cpu device type, the only one measured");
}

inline result<plugin_bench_report> run_plugin_bench(const plugin_bench_options& options) {
    NXMEM_TRY(module, host::plugin_module::load(std::filesystem::absolute(options.plugin)));
    NXMEM_TRY(mechanism, pick_cpu_mechanism(*module, options.mechanism));
    NXMEM_TRY(allocator, detail::open_cpu(module, mechanism));

    plugin_bench_report report;
    report.plugin = options.plugin.string();
    report.mechanism = mechanism;
    auto add = [&report](std::string key, std::string what, double value, std::string unit) {
        report.figures.push_back({std::move(key), std::move(what), value, std::move(unit)});
    };
    const std::uint64_t iterations = options.iterations == 0 ? 1 : options.iterations;

    adapter_route adapter(allocator);
    table_route table(allocator, detail::table_id_base(0));
    malloc_route heap;
    for (const size_point& size : round_trip_sizes) {
        const std::uint64_t count = std::max<std::uint64_t>(1, iterations / size.iteration_divisor);
        const std::string at = std::string("round_trip.") + size.label;
        const std::string label = std::string(" at ") + size.label;
        NXMEM_TRY(times, detail::round_trip_nanoseconds(size.bytes, count, adapter, table, heap));
        const auto [adapter_ns, table_ns, malloc_ns] = times;
        add(at + ".adapter_ns", "allocate + release through the host adapter" + label, adapter_ns, "ns");
        add(at + ".table_ns", "allocate + release through the plugin's table called directly" + label, table_ns, "ns");
        add(at + ".malloc_ns", "malloc + free" + label, malloc_ns, "ns");
        add(at + ".adapter_vs_malloc", "host adapter / malloc" + label, adapter_ns / malloc_ns, "x");
        add(at + ".table_vs_malloc", "plugin table / malloc" + label, table_ns / malloc_ns, "x");
        add(at + ".host_ns", "the host's share (adapter - table)" + label, adapter_ns - table_ns, "ns");
    }

    // Threads: throughput of two against one, at 64 B (where the boundary weighs most).
    const std::uint64_t per_thread = iterations;
    NXMEM_TRY(second_allocator, detail::open_cpu(module, mechanism));
    adapter_route second_adapter(second_allocator);
    auto on_shared = [&](unsigned) { return [&adapter] { return round_trip(adapter, 64, round_trip_alignment); }; };
    NXMEM_TRY(shared_one, calls_per_second(1, per_thread, on_shared));
    NXMEM_TRY(shared_two, calls_per_second(2, per_thread, on_shared));
    auto on_own = [&](unsigned index) {
        adapter_route* mine = index == 0 ? &adapter : &second_adapter;
        return [mine] { return round_trip(*mine, 64, round_trip_alignment); };
    };
    NXMEM_TRY(own_one, calls_per_second(1, per_thread, on_own));
    NXMEM_TRY(own_two, calls_per_second(2, per_thread, on_own));
    std::vector<malloc_route> heaps(2);
    auto on_malloc = [&](unsigned index) { return [&heaps, index] { return round_trip(heaps[index], 64, 16); }; };
    NXMEM_TRY(malloc_one, calls_per_second(1, per_thread, on_malloc));
    NXMEM_TRY(malloc_two, calls_per_second(2, per_thread, on_malloc));
    report.load_average = load_average();
    add("threads.one_allocator.scaling", "2 threads / 1 thread, 64 B round trips on one allocator",
        shared_two / shared_one, "x");
    add("threads.two_allocators.scaling", "2 threads / 1 thread, 64 B round trips, one allocator each",
        own_two / own_one, "x");
    add("threads.malloc.scaling", "2 threads / 1 thread, 64 B malloc + free", malloc_two / malloc_one, "x");
    add("threads.load_average", "1-minute load average when the thread figures were taken",
        report.load_average.value_or(-1), "");

    // Heap bytes per live allocation (64 B each).
    const std::uint64_t live = options.live == 0 ? 1 : options.live;
    NXMEM_TRY(through_adapter, measure_heap_footprint(adapter, live, 64));
    NXMEM_TRY(through_table, measure_heap_footprint(table, live, 64));
    NXMEM_TRY(through_malloc, measure_heap_footprint(heap, live, 64));
    add("heap.host_bytes_per_live", "C heap the host keeps per live allocation (adapter - table)",
        through_adapter.bytes_per_live - through_table.bytes_per_live, "B");
    add("heap.plugin_bytes_per_live",
        "C heap the plugin keeps per live 64 B allocation beyond what malloc(64) takes (table - malloc)",
        through_table.bytes_per_live - through_malloc.bytes_per_live, "B");
    add("heap.kept_after_release.host_and_plugin", "C heap still held after releasing them all, host and plugin",
        static_cast<double>(through_adapter.kept_after_release), "B");
    add("heap.kept_after_release.plugin", "C heap still held after releasing them all, plugin alone",
        static_cast<double>(through_table.kept_after_release), "B");

    // Commit + decommit, where the mechanism offers virtual backing.
    if ((allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0) {
        NXMEM_TRY(view, allocator.virtual_backing());
        const byte_range range = commit_range(view.commit_granularity(), 64 * 1024);
        NXMEM_TRY(reserved, allocator.allocate(2u << 20, round_trip_alignment));
        view_range_route through_view(view, reserved, range);
        result<table_range_route> through_table_range = table_range_route::open(allocator, reserved, range);
        const std::uint64_t count = std::max<std::uint64_t>(1, iterations / 16);
        result<double> view_ns = nanoseconds_per_call([&] { return through_view.commit_decommit(); }, count);
        result<double> table_ns = through_table_range
            ? nanoseconds_per_call([&] { return through_table_range.value().commit_decommit(); }, count)
            : result<double>(through_table_range.error());
        (void)allocator.release(reserved);
        NXMEM_TRY_VOID(view_ns);
        NXMEM_TRY_VOID(table_ns);
        const std::string span = " of " + std::to_string(range.length / 1024) + " KiB";
        add("range.view_ns", "commit + decommit through the host's view" + span, view_ns.value(), "ns");
        add("range.table_ns", "commit + decommit through the plugin's table called directly" + span,
            table_ns.value(), "ns");
        add("range.view_vs_table", "view / table, commit + decommit", view_ns.value() / table_ns.value(), "x");
    }
    return report;
}

} // namespace nxmem::measure
