// nxmem's pool against what an engine would use without it, in one process (issue 21):
//   pooled     nxmem::pool_allocator over the posix plugin's posix-eager (through the host)
//   direct     the host adapter over posix-eager, unpooled
//   malloc     glibc's malloc + free (posix_memalign beyond 16-byte alignment), the process's heap
//   jemalloc   Debian's libjemalloc, dlopen'd and called by mallocx/dallocx
//   mimalloc   Debian's libmimalloc, dlopen'd and called by mi_malloc/mi_free
// (the last two never replace malloc: bench/baseline_heaps.hpp). Families:
//   round_trip/ROUTE/SIZE          allocate + release at 64 B, 4 KiB, 64 KiB, 2 MiB; 1 and 2
//                                  threads (one pool, one allocator, one heap shared by both)
//   cycle/ROUTE/2MiB               allocate + write every page + release, with minor page faults
//                                  per cycle (getrusage deltas)
//   crossings/pooled/64B           upstream calls a pool makes for NXMEM_BENCH_LIVE (1M) live
//                                  64 B allocations, and what it holds then and after trim(0)
//   kv_replay/pooled_posix_lazy    bench/kv_cache_replay.hpp's trace, every block a pool
//                                  allocation from a pool over posix-lazy: peak held / peak live
//   mixed_trace/ROUTE              the host allocations of a PyTorch transformer forward pass
//                                  (bench/traces/transformer_forward.trace; NXMEM_BENCH_TRACE
//                                  overrides), replayed NXMEM_BENCH_PASSES times (20); also
//                                  mixed_trace/pooled_posix_lazy, a pool growing by commit
//                                  (its spans one arena) beside the pool over posix-eager
// NXMEM_BENCH_ROUND_TRIPS fixes the round trips' iteration count (for callgrind, below).
// The figures that matter are the in-run ratios printed after the table (or the "ratios" member
// of the JSON document with --benchmark_format=json); the load average of the two-thread runs is
// among the notes. NXMEM_POSIX_PLUGIN overrides the plugin built alongside.
#include "baseline_heaps.hpp"
#include "kv_cache_replay.hpp"
#include "mixed_trace.hpp"
#include "ratio_summary.hpp"

#include <measure/pool_routes.hpp>
#include <measure/routes.hpp>
#include <measure/system.hpp>

#include <nxmem/host.hpp>
#include <nxmem/pool.hpp>

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace nxmem::measure;
using nxmem::cpu_device;
using nxmem::host::plugin_allocator;
using eager_pool = nxmem::pool_allocator<plugin_allocator<cpu_device>>;

// ---- what every family measures, opened once ----

struct subjects {
    std::string problem; // empty when the plugin opened
    std::shared_ptr<nxmem::host::plugin_module> module;
    std::optional<plugin_allocator<cpu_device>> eager;
    std::unique_ptr<eager_pool> pool; // over a copy of `eager` (the copies share one allocator)
    std::string jemalloc_problem;
    std::optional<nxmem::bench::baseline_heap> jemalloc;
    std::string mimalloc_problem;
    std::optional<nxmem::bench::baseline_heap> mimalloc;
};

subjects& opened() {
    static subjects made = [] {
        subjects loaded;
        loaded.jemalloc = nxmem::bench::baseline_heap::jemalloc(loaded.jemalloc_problem);
        loaded.mimalloc = nxmem::bench::baseline_heap::mimalloc(loaded.mimalloc_problem);
        const char* path = std::getenv("NXMEM_POSIX_PLUGIN");
        auto module = nxmem::host::plugin_module::load(path != nullptr ? path : NXMEM_BENCH_POSIX_PLUGIN);
        if (!module) {
            loaded.problem = module.error().describe();
            return loaded;
        }
        loaded.module = std::move(module).value();
        auto eager = nxmem::host::open_allocator<cpu_device>(loaded.module, "posix-eager", 0);
        if (!eager) {
            loaded.problem = "cannot open posix-eager: " + eager.error().describe();
            return loaded;
        }
        loaded.eager.emplace(std::move(eager).value());
        loaded.pool = std::make_unique<eager_pool>(*loaded.eager);
        return loaded;
    }();
    return made;
}


// Figures noted during the runs and printed with the ratios.
nxmem::bench::context_notes& run_notes() {
    static nxmem::bench::context_notes notes;
    return notes;
}

// glibc's malloc as PyTorch's CPU allocator calls it: posix_memalign beyond malloc's 16 bytes.
class glibc_route {
public:
    using handle = void*;
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        void* memory = nullptr;
        if (alignment <= 16) {
            memory = std::malloc(static_cast<std::size_t>(size));
        } else if (::posix_memalign(&memory, static_cast<std::size_t>(alignment), static_cast<std::size_t>(size)) != 0) {
            memory = nullptr;
        }
        keep(memory);
        return memory == nullptr ? std::nullopt : std::optional<handle>(memory);
    }
    bool release(handle memory) {
        std::free(memory);
        return true;
    }
};

// Runs `body(route)` with the route named; skips the benchmark with the reason when it is missing.
template <class Body> void with_route(benchmark::State& state, const std::string& name, Body&& body) {
    subjects& open = opened();
    if (name == "malloc") {
        glibc_route route;
        body(route);
    } else if (name == "jemalloc" || name == "mimalloc") {
        const auto& heap = name == "jemalloc" ? open.jemalloc : open.mimalloc;
        if (!heap) {
            state.SkipWithError((name == "jemalloc" ? open.jemalloc_problem : open.mimalloc_problem).c_str());
            return;
        }
        nxmem::bench::baseline_route route(*heap);
        body(route);
    } else if (!open.problem.empty()) {
        state.SkipWithError(open.problem.c_str());
    } else if (name == "pooled") {
        pool_route<eager_pool> route(*open.pool);
        body(route);
    } else {
        adapter_route route(*open.eager);
        body(route);
    }
}

constexpr const char* route_names[] = {"pooled", "direct", "malloc", "jemalloc", "mimalloc"};
constexpr const char* baseline_names[] = {"direct", "malloc", "jemalloc", "mimalloc"};

struct size_label {
    std::uint64_t bytes;
    const char* label;
};
constexpr size_label round_trip_sizes[] = {{64, "64B"}, {4096, "4KiB"}, {64 * 1024, "64KiB"}, {2u << 20, "2MiB"}};

// ---- round trips, 1 and 2 threads ----

// Not inlined, so callgrind can count its instructions alone:
//   NXMEM_BENCH_ROUND_TRIPS=20000 GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*timed_round_trips*'
//       nxmem_pool_bench --benchmark_filter='round_trip/pooled/64B/.*threads:1$'
// (one route a run; its instructions / 20000 = per round trip, plus the loop's few; the first
// round trips, which fill the caches, weigh little among 20000).
template <class Route> [[gnu::noinline]] void timed_round_trips(benchmark::State& state, Route& route, std::uint64_t size) {
    for (auto _ : state) {
        if (!round_trip(route, size, round_trip_alignment)) {
            state.SkipWithError("a round trip failed");
            break;
        }
    }
}

void round_trip_benchmark(benchmark::State& state, std::string route_name, std::uint64_t size) {
    with_route(state, route_name, [&](auto& route) {
        timed_round_trips(state, route, size);
        state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
    });
    if (state.thread_index() == 0 && state.threads() == 2) {
        // A ratio of thread counts means little on a busy machine: say how busy it was.
        run_notes()["load_average_at_threads/" + route_name] = load_average().value_or(-1);
    }
}

// ---- 2 MiB touched cycle ----

void cycle_benchmark(benchmark::State& state, std::string route_name, std::uint64_t size) {
    with_route(state, route_name, [&](auto& route) {
        if (!touched_cycle(route, size)) { // the first: a cache that keeps memory has it now
            state.SkipWithError("the first cycle failed");
            return;
        }
        const std::uint64_t faults_before = minor_faults();
        for (auto _ : state) {
            if (!touched_cycle(route, size)) {
                state.SkipWithError("a cycle failed");
                break;
            }
        }
        state.counters["faults_per_cycle"] = benchmark::Counter(static_cast<double>(minor_faults() - faults_before),
                                                                benchmark::Counter::kAvgIterations);
    });
}

// ---- upstream crossings with many live ----

void crossings_benchmark(benchmark::State& state, std::uint64_t live) {
    subjects& open = opened();
    if (!open.problem.empty()) {
        state.SkipWithError(open.problem.c_str());
        return;
    }
    for (auto _ : state) {
        eager_pool fresh(*open.eager); // its counts start at zero
        auto figures = count_crossings(fresh, live, 64);
        if (!figures) {
            state.SkipWithError(figures.error().describe().c_str());
            break;
        }
        const crossing_figures& counted = figures.value();
        state.counters["live"] = static_cast<double>(counted.live);
        state.counters["upstream_calls"] = static_cast<double>(counted.upstream_calls);
        state.counters["held_bytes"] = static_cast<double>(counted.held_bytes);
        state.counters["in_use_bytes"] = static_cast<double>(counted.in_use_bytes);
        state.counters["held_vs_live"] = static_cast<double>(counted.held_bytes) / static_cast<double>(counted.in_use_bytes);
        state.counters["allocations_per_crossing"] =
            static_cast<double>(counted.live) / static_cast<double>(std::max<std::uint64_t>(1, counted.upstream_calls));
        state.counters["held_after_release"] = static_cast<double>(counted.held_after_release);
        state.counters["held_after_trim"] = static_cast<double>(counted.held_after_trim);
    }
}

// ---- the KV-cache trace, every block from a pool over posix-lazy ----

// posix-lazy opened for a pool of the benchmark's own; none (the benchmark skipped with the
// reason) when it cannot be.
std::optional<plugin_allocator<cpu_device>> open_posix_lazy(benchmark::State& state) {
    subjects& open = opened();
    if (!open.problem.empty()) {
        state.SkipWithError(open.problem.c_str());
        return std::nullopt;
    }
    auto lazy = nxmem::host::open_allocator<cpu_device>(open.module, "posix-lazy", 0);
    if (!lazy) {
        state.SkipWithError(lazy.error().describe().c_str());
        return std::nullopt;
    }
    return std::move(lazy).value();
}

void kv_replay_benchmark(benchmark::State& state) {
    std::optional<plugin_allocator<cpu_device>> lazy = open_posix_lazy(state);
    if (!lazy) {
        return;
    }
    nxmem::pool_allocator<plugin_allocator<cpu_device>> pool(std::move(*lazy));
    const nxmem::bench::kv_trace_shape shape;
    nxmem::bench::block_kv_store<decltype(pool)> store(pool, shape);
    for (auto _ : state) {
        auto outcome = nxmem::bench::replay_kv_trace(store, shape);
        if (!outcome) {
            state.SkipWithError(outcome.error().describe().c_str());
            break;
        }
        const nxmem::bench::kv_replay_result& replayed = outcome.value();
        state.SetIterationTime(replayed.seconds);
        state.counters["blocks_per_second"] = static_cast<double>(replayed.blocks) / replayed.seconds;
        state.counters["peak_held"] = static_cast<double>(replayed.peak_held);
        state.counters["peak_live"] = static_cast<double>(replayed.peak_live);
        state.counters["held_vs_peak_live"] = static_cast<double>(replayed.peak_held) / static_cast<double>(replayed.peak_live);
        state.counters["peak_rss"] = static_cast<double>(replayed.peak_rss);
    }
}

// ---- the PyTorch forward pass ----

const nxmem::result<nxmem::bench::allocation_trace>& forward_trace() {
    static const nxmem::result<nxmem::bench::allocation_trace> trace = [] {
        const char* path = std::getenv("NXMEM_BENCH_TRACE");
        return nxmem::bench::read_allocation_trace(path != nullptr ? path : NXMEM_BENCH_TRACE);
    }();
    return trace;
}

void mixed_trace_benchmark(benchmark::State& state, std::string route_name) {
    const auto& trace = forward_trace();
    if (!trace) {
        state.SkipWithError(trace.error().describe().c_str());
        return;
    }
    const auto passes = static_cast<unsigned>(count_from_environment("NXMEM_BENCH_PASSES", 20));
    subjects& open = opened();
    // The pooled replays run on a pool of their own, so what it holds is the trace's alone: over
    // posix-eager (growth by allocation: spans are pieces of segments) or over posix-lazy (growth
    // by commit: spans are pieces of one arena).
    std::unique_ptr<eager_pool> own;
    if (route_name == "pooled" && open.problem.empty()) {
        own = std::make_unique<eager_pool>(*open.eager);
    } else if (route_name == "pooled_posix_lazy") {
        std::optional<plugin_allocator<cpu_device>> lazy = open_posix_lazy(state);
        if (!lazy) {
            return;
        }
        own = std::make_unique<eager_pool>(std::move(*lazy));
        if (!own->grows_by_commit()) {
            state.SkipWithError("the pool over posix-lazy does not grow by commit");
            return;
        }
    }
    auto replay_through = [&](auto& route, auto&& observe) {
        for (auto _ : state) {
            auto outcome = nxmem::bench::replay_trace(route, trace.value(), passes, observe);
            if (!outcome) {
                state.SkipWithError(outcome.error().describe().c_str());
                break;
            }
            state.SetIterationTime(outcome.value().seconds);
            state.counters["ns_per_event"] = outcome.value().seconds * 1e9 / static_cast<double>(outcome.value().events);
            state.counters["first_pass_faults"] = static_cast<double>(outcome.value().first_pass_faults);
            if (passes > 1) {
                state.counters["faults_per_later_pass"] =
                    static_cast<double>(outcome.value().later_faults) / static_cast<double>(passes - 1);
            }
            state.counters["peak_live"] = static_cast<double>(trace.value().peak_live_bytes);
        }
    };
    if (own) {
        pool_route<eager_pool> route(*own);
        std::uint64_t peak_held = 0;
        replay_through(route, [&] { peak_held = std::max(peak_held, own->usage().held_bytes); });
        state.counters["peak_held"] = static_cast<double>(peak_held);
        state.counters["held_vs_peak_live"] =
            static_cast<double>(peak_held) / static_cast<double>(trace.value().peak_live_bytes);
        return;
    }
    with_route(state, route_name, [&](auto& route) { replay_through(route, [] {}); });
}

// ---- registration and the ratios ----

std::vector<nxmem::bench::ratio_spec> register_benchmarks() {
    using nxmem::bench::ratio_spec;
    std::vector<ratio_spec> ratios;
    for (const size_label& size : round_trip_sizes) {
        const std::string at = std::string("/") + size.label;
        auto name = [&](const char* route, int threads) {
            return std::string("round_trip/") + route + at + "/threads:" + std::to_string(threads);
        };
        for (const char* route : route_names) {
            auto* registered = benchmark::RegisterBenchmark((std::string("round_trip/") + route + at).c_str(),
                                                            round_trip_benchmark, std::string(route), size.bytes)
                                   ->Threads(1)->Threads(2)->UseRealTime();
            if (const std::uint64_t fixed = count_from_environment("NXMEM_BENCH_ROUND_TRIPS", 0); fixed != 0) {
                registered->Iterations(static_cast<benchmark::IterationCount>(fixed)); // for callgrind
            }
        }
        for (const char* baseline : baseline_names) {
            ratios.push_back({std::string("pooled_vs_") + baseline + at,
                              std::string("pooled / ") + baseline + ", allocate + release, 1 thread, ns",
                              name("pooled", 1), name(baseline, 1)});
        }
        for (const char* route : route_names) {
            ratios.push_back({std::string("two_threads_vs_one/") + route + at,
                              std::string(route) + ": throughput of 2 threads / 1", name(route, 2), name(route, 1),
                              "items_per_second"});
        }
        ratios.push_back({std::string("pooled_scaling_vs_malloc_scaling") + at,
                          "pooled 2-thread scaling / malloc's own (target >= 0.9)",
                          "ratio:two_threads_vs_one/pooled" + at, "ratio:two_threads_vs_one/malloc" + at});
    }

    for (const char* route : route_names) {
        benchmark::RegisterBenchmark((std::string("cycle/") + route + "/2MiB").c_str(), cycle_benchmark,
                                     std::string(route), std::uint64_t{2u << 20});
    }
    for (const char* baseline : baseline_names) {
        ratios.push_back({std::string("cycle_pooled_vs_") + baseline,
                          std::string("2 MiB allocate + write every page + release: pooled / ") + baseline +
                              (std::strcmp(baseline, "malloc") == 0 ? " (target <= 1.2)" : ""),
                          "cycle/pooled/2MiB", std::string("cycle/") + baseline + "/2MiB"});
    }
    for (const char* route : route_names) {
        ratios.push_back({std::string("faults_per_cycle/") + route, std::string(route) + ": minor faults per 2 MiB cycle (target 0 pooled)",
                          std::string("cycle/") + route + "/2MiB", "", "faults_per_cycle"});
    }

    const std::uint64_t live = count_from_environment("NXMEM_BENCH_LIVE", 1000000);
    const std::string crossings = "crossings/pooled/64B_x" + (live == 1000000 ? std::string("1M") : std::to_string(live));
    benchmark::RegisterBenchmark(crossings.c_str(), crossings_benchmark, live)->Iterations(1);
    ratios.push_back({"crossings_upstream_calls", "upstream calls (allocations + commits) to hold the live 64 B set",
                      crossings, "", "upstream_calls"});
    ratios.push_back({"crossings_allocations_per_crossing", "live 64 B allocations per upstream call",
                      crossings, "", "allocations_per_crossing"});
    ratios.push_back({"crossings_held_vs_live", "held / in use with the 64 B set live", crossings, "",
                      "held_vs_live"});
    ratios.push_back({"crossings_held_after_trim", "bytes held after releasing them all and trim(0) (target 0)",
                      crossings, "", "held_after_trim"});

    benchmark::RegisterBenchmark("kv_replay/pooled_posix_lazy", kv_replay_benchmark)->Iterations(1)->UseManualTime();
    ratios.push_back({"kv_replay_held_vs_peak_live", "KV trace through a pool over posix-lazy: peak held / peak live (target <= 1.3)",
                      "kv_replay/pooled_posix_lazy", "kv_replay/pooled_posix_lazy", "peak_held", false, "peak_live"});

    for (const char* route : route_names) {
        benchmark::RegisterBenchmark((std::string("mixed_trace/") + route).c_str(), mixed_trace_benchmark, std::string(route))
            ->Iterations(1)->UseManualTime();
    }
    benchmark::RegisterBenchmark("mixed_trace/pooled_posix_lazy", mixed_trace_benchmark, std::string("pooled_posix_lazy"))
        ->Iterations(1)->UseManualTime();
    ratios.push_back({"mixed_trace_held_vs_peak_live", "transformer forward pass, pooled over posix-eager (growth by "
                      "allocation): peak held / peak live",
                      "mixed_trace/pooled", "mixed_trace/pooled", "peak_held", false, "peak_live"});
    ratios.push_back({"mixed_trace_held_vs_peak_live_posix_lazy", "transformer forward pass, pooled over posix-lazy "
                      "(growth by commit, one span arena): peak held / peak live (target <= 1.3)",
                      "mixed_trace/pooled_posix_lazy", "mixed_trace/pooled_posix_lazy", "peak_held", false, "peak_live"});
    for (const char* baseline : baseline_names) {
        ratios.push_back({std::string("mixed_trace_pooled_vs_") + baseline,
                          std::string("transformer forward pass (allocate, write every page, release): pooled / ") + baseline,
                          "mixed_trace/pooled", std::string("mixed_trace/") + baseline});
    }
    for (const char* route : route_names) {
        ratios.push_back({std::string("mixed_trace_faults_per_pass/") + route,
                          std::string(route) + ": minor faults per forward pass after the first",
                          std::string("mixed_trace/") + route, "", "faults_per_later_pass"});
        ratios.push_back({std::string("mixed_trace_first_pass_faults/") + route,
                          std::string(route) + ": minor faults of the first forward pass",
                          std::string("mixed_trace/") + route, "", "first_pass_faults"});
    }
    ratios.push_back({"mixed_trace_faults_per_pass/pooled_posix_lazy",
                      "pooled over posix-lazy: minor faults per forward pass after the first",
                      "mixed_trace/pooled_posix_lazy", "", "faults_per_later_pass"});
    ratios.push_back({"mixed_trace_pooled_posix_lazy_vs_pooled",
                      "transformer forward pass: pooled over posix-lazy / pooled over posix-eager, ns",
                      "mixed_trace/pooled_posix_lazy", "mixed_trace/pooled"});
    return ratios;
}

} // namespace

int main(int argc, char** argv) {
    nxmem::bench::ensure_static_tls_for_dlopen(argv); // before anything is loaded: jemalloc's TLS
    return nxmem::bench::run_with_ratios(argc, argv, register_benchmarks(), run_notes());
}
