// Timing loops for the nxmem command (bench/ times with Google Benchmark): the best of a few
// repetitions of a fixed number of operations, and throughput of the same operation on several
// threads started together.
#pragma once

#include <nxmem/abi/result.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

namespace nxmem::measure {

// Nanoseconds per call of `operation` (which returns false on failure), the best of
// `repetitions` runs of `iterations` calls: the least disturbed run is the closest to the cost.
template <class Operation>
result<double> nanoseconds_per_call(Operation&& operation, std::uint64_t iterations,
                                    unsigned repetitions = 3) {
    double best = 0;
    for (unsigned run = 0; run < repetitions; ++run) {
        const auto start = std::chrono::steady_clock::now();
        for (std::uint64_t i = 0; i < iterations; ++i) {
            if (!operation()) {
                return fail(status_code::internal_error,
                            "the measured operation failed at call " + std::to_string(i + 1));
            }
        }
        const std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
        const double per_call = elapsed.count() / static_cast<double>(iterations);
        best = run == 0 ? per_call : std::min(best, per_call);
    }
    return best;
}

// Calls per second of `threads` threads each making `iterations` calls of its own operation,
// made by `make_operation(thread_index)` before the clock starts (so each thread may hold its own
// route or allocator). All threads start together; the clock stops when the last one finishes.
template <class MakeOperation>
result<double> calls_per_second(unsigned threads, std::uint64_t iterations, MakeOperation&& make_operation);

// The best of `repetitions` runs of calls_per_second: on a busy machine one run may lose its
// threads' time slices to others, and the least disturbed run is the closest to the figure.
template <class MakeOperation>
result<double> best_calls_per_second(unsigned threads, std::uint64_t iterations, MakeOperation&& make_operation,
                                     unsigned repetitions = 3) {
    double best = 0;
    for (unsigned run = 0; run < repetitions; ++run) {
        NXMEM_TRY(rate, calls_per_second(threads, iterations, make_operation));
        best = std::max(best, rate);
    }
    return best;
}

template <class MakeOperation>
result<double> calls_per_second(unsigned threads, std::uint64_t iterations, MakeOperation&& make_operation) {
    using operation = std::function<bool()>;
    std::vector<operation> operations;
    operations.reserve(threads);
    for (unsigned index = 0; index < threads; ++index) {
        operations.emplace_back(make_operation(index));
    }
    std::latch ready(static_cast<std::ptrdiff_t>(threads) + 1);
    std::latch go(1);
    std::atomic<bool> failed{false};
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    for (unsigned index = 0; index < threads; ++index) {
        workers.emplace_back([&, index] {
            ready.count_down();
            go.wait();
            for (std::uint64_t i = 0; i < iterations; ++i) {
                if (!operations[index]()) {
                    failed.store(true, std::memory_order_relaxed);
                    return;
                }
            }
        });
    }
    ready.arrive_and_wait();
    const auto start = std::chrono::steady_clock::now();
    go.count_down();
    workers.clear(); // joins
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (failed.load()) {
        return fail(status_code::internal_error, "a measured operation failed on one of " +
                                                     std::to_string(threads) + " threads");
    }
    return static_cast<double>(iterations) * threads / elapsed.count();
}

} // namespace nxmem::measure
