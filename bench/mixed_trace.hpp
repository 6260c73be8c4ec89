// A recorded allocation trace (bench/traces/*.trace, written by bench/torch/torch_bench --trace):
// reading it, and replaying it through a measure route (bench/measure/routes.hpp) pass after
// pass, writing every page of each allocation as the engine's kernels would.
//
// Format (bench/traces/README.md): one event a line, '#' starts a comment; "a SIZE ID" allocates
// ID, "f ID" releases it. IDs are small and unique (each indexes a table); an allocation still
// live at the end of the trace is released when a
// replayed pass ends (the pass's output, dropped before the next).
#pragma once

#include <measure/pool_routes.hpp>
#include <measure/system.hpp>

#include <nxmem/abi/result.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace nxmem::bench {

struct trace_event {
    bool allocate = false;
    std::uint32_t id = 0;
    std::uint64_t size = 0; // allocations only
};

struct allocation_trace {
    std::vector<trace_event> events;
    std::uint32_t ids = 0;               // one past the largest id
    std::uint64_t allocations = 0;
    std::uint64_t peak_live_bytes = 0;   // requested bytes live at once, at most
};

inline result<allocation_trace> read_allocation_trace(const std::string& path) {
    std::ifstream file(path);
    if (!file) {
        return fail(status_code::invalid_argument, "cannot read the trace " + path);
    }
    allocation_trace trace;
    std::vector<std::uint64_t> sizes; // by id; 0 once released
    std::uint64_t live = 0;
    std::string line;
    for (unsigned number = 1; std::getline(file, line); ++number) {
        if (line.empty() || line[0] == '#') {
            continue;
        }
        std::istringstream fields(line);
        char kind = 0;
        trace_event event;
        fields >> kind; // bench/traces/README.md: "a SIZE ID" or "f ID"
        event.allocate = kind == 'a';
        if (event.allocate) {
            fields >> event.size;
        }
        fields >> event.id;
        const bool known = event.id < sizes.size();
        if (!fields || (kind != 'a' && kind != 'f') || (event.allocate && (event.size == 0 || known)) ||
            (!event.allocate && (!known || sizes[event.id] == 0))) {
            return fail(status_code::invalid_argument, path + ":" + std::to_string(number) + ": not an event of a "
                                                       "well-formed trace: '" + line + "'");
        }
        if (event.allocate) {
            sizes.resize(event.id + 1, 0);
            sizes[event.id] = event.size;
            live += event.size;
            trace.peak_live_bytes = std::max(trace.peak_live_bytes, live);
            ++trace.allocations;
        } else {
            live -= sizes[event.id];
            sizes[event.id] = 0;
        }
        trace.events.push_back(event);
    }
    trace.ids = static_cast<std::uint32_t>(sizes.size());
    if (trace.allocations == 0) {
        return fail(status_code::invalid_argument, path + " holds no allocation");
    }
    return trace;
}

struct trace_replay_result {
    double seconds = 0;
    std::uint64_t events = 0;
    std::uint64_t first_pass_faults = 0; // minor page faults of the first pass (a cache fills)
    std::uint64_t later_faults = 0;      // of the passes after it (a cache that works adds none)
};

// Replays `passes` passes of `trace` through `route` (alignment 64, as PyTorch's CPU allocator
// asks), writing every page of each allocation; after each event `observe()` is called (a pool's
// usage sampled there gives its peak held bytes; it is not timed).
template <class Route, class Observe>
result<trace_replay_result> replay_trace(Route& route, const allocation_trace& trace, unsigned passes,
                                         Observe&& observe) {
    std::vector<std::optional<typename Route::handle>> live(trace.ids);
    trace_replay_result outcome;
    std::chrono::duration<double> busy{0};
    std::uint64_t faults_before = measure::minor_faults();
    for (unsigned pass = 0; pass < passes; ++pass) {
        for (const trace_event& event : trace.events) {
            const auto start = std::chrono::steady_clock::now();
            if (event.allocate) {
                live[event.id] = route.allocate(event.size, 64);
                if (!live[event.id]) {
                    return fail(status_code::out_of_memory, "the trace's allocation " + std::to_string(event.id) +
                                                                " of " + std::to_string(event.size) + " bytes failed");
                }
                volatile unsigned char* bytes = measure::bytes_of(*live[event.id]);
                for (std::uint64_t offset = 0; offset < event.size; offset += measure::touched_page_bytes) {
                    bytes[offset] = 1;
                }
            } else {
                const bool released = route.release(*live[event.id]);
                live[event.id].reset();
                if (!released) {
                    return fail(status_code::internal_error, "releasing the trace's allocation " +
                                                                 std::to_string(event.id) + " failed");
                }
            }
            busy += std::chrono::steady_clock::now() - start;
            observe();
        }
        for (auto& left : live) { // the pass's output
            if (left) {
                (void)route.release(*left);
                left.reset();
            }
        }
        outcome.events += trace.events.size();
        if (pass == 0) {
            outcome.first_pass_faults = measure::minor_faults() - faults_before;
            faults_before = measure::minor_faults();
        }
    }
    outcome.later_faults = measure::minor_faults() - faults_before;
    outcome.seconds = busy.count();
    return outcome;
}

} // namespace nxmem::bench
