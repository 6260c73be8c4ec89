// The transfer layer against ucx_perftest on the same transport, in the same run
// (docs/TRANSFER.md, "What it costs"), as bench/transfer_bench.cpp and `nxmem transfer` print it.
// Needs UCX (nxmem_transfer_dep) and nlohmann_json.
//
// For each transport: a target process (forked) takes memory from the caller's source, registers
// it and serves; this process reads from it and writes to it with an agent, at each block size:
//   - bandwidth: single-block requests, 16 in flight (ucx_perftest's bandwidth tests keep many
//     operations outstanding too), bytes per second;
//   - latency: one single-block request at a time, issue to completion;
//   - batch: N blocks of 4 KiB in one request against N single requests one at a time.
// Beside each, when asked, ucx_perftest (a server and a client process on 127.0.0.1, the same
// UCX_TLS): ucp_put_bw for writes, ucp_get for reads, same sizes. Then the registration cost: one
// region (a pool's reservation) against its memory registered as many tensors.
#pragma once

#include <nxmem/transfer.hpp>

#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::measure {

// Memory the measurements read, write and register, from whoever runs them (the bench: anonymous
// mappings; `nxmem transfer`: a plugin mechanism's allocations).
struct held_memory {
    std::byte* base = nullptr;
    std::uint64_t bytes = 0;
    std::shared_ptr<void> owner; // gives the memory back when the last holder goes
    // Registers it whole with the agent, as its source would (a plugin allocation with its lease).
    std::function<result<transfer::registration>(transfer::agent&)> register_whole;
};
using memory_source = std::function<result<held_memory>(std::uint64_t bytes)>;

struct transfer_bench_options {
    std::vector<std::string> transports = {"tcp", "sm"}; // UCX_TLS values
    std::vector<std::uint64_t> sizes = {4096, 64 * 1024, 1 << 20, 16 << 20};
    std::uint64_t batch_blocks = 1000; // blocks of 4 KiB in the batched request
    bool quick = false;                // fewer iterations: a smoke run
    bool baseline = true;              // run ucx_perftest beside each figure
    std::uint64_t pool_bytes = 1ull << 30;              // the registration cost's one region
    std::vector<std::uint64_t> tensor_counts = {100, 10000}; // ... against this many tensors of it
    std::string tool = "nxmem_transfer_bench";          // in messages and the JSON's context
};

inline constexpr std::uint64_t batch_block_bytes = 4096;
inline constexpr std::size_t bandwidth_window = 16;

namespace transfer_detail {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point start) {
    return std::chrono::duration<double>(clock_type::now() - start).count();
}

inline result<void> send_blob(int socket, const std::vector<std::byte>& bytes) {
    if (::send(socket, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
        return fail(status_code::internal_error, std::string("cannot send to the other process: ") + std::strerror(errno));
    }
    return boost::outcome_v2::success();
}
inline result<std::vector<std::byte>> receive_blob(int socket) {
    std::vector<std::byte> bytes(1 << 16);
    const ssize_t got = ::recv(socket, bytes.data(), bytes.size(), 0);
    if (got <= 0) {
        return fail(status_code::internal_error, "the target process ended before it sent its metadata and regions "
                                                 "(its error is above)");
    }
    bytes.resize(static_cast<std::size_t>(got));
    return bytes;
}

// The bytes the target serves: the largest block a few times over, and the batch's strided blocks.
inline std::uint64_t target_bytes(const transfer_bench_options& options) {
    std::uint64_t largest = 0;
    for (const std::uint64_t size : options.sizes) {
        largest = std::max(largest, size);
    }
    return std::max({std::uint64_t{64} << 20, largest, 2 * options.batch_blocks * batch_block_bytes});
}

inline result<held_memory> take_filled(const memory_source& source, std::uint64_t bytes, std::uint8_t fill) {
    NXMEM_TRY(memory, source(bytes));
    std::memset(memory.base, fill, memory.bytes);
    return memory;
}

// The target: registers its memory, sends its metadata and region, progresses until told to stop.
inline result<void> serve(const std::string& transports, const memory_source& source, std::uint64_t bytes, int socket) {
    NXMEM_TRY(memory, take_filled(source, bytes, 0x5a));
    NXMEM_TRY(agent, transfer::agent::start({"target", transports, false}));
    NXMEM_TRY(registered, memory.register_whole(agent));
    NXMEM_TRY(metadata, agent.metadata());
    NXMEM_TRY_VOID(send_blob(socket, metadata));
    NXMEM_TRY(regions, agent.export_regions({&registered}));
    NXMEM_TRY_VOID(send_blob(socket, regions));
    pollfd stop{socket, POLLIN, 0};
    for (unsigned spin = 0;; ++spin) {
        (void)agent.progress();
        if (spin % 256 == 0 && ::poll(&stop, 1, 0) > 0) {
            return boost::outcome_v2::success();
        }
    }
}

struct measurement {
    double bytes_per_second = 0;
    double seconds_per_transfer = 0;
};

struct window_run {
    transfer::agent& agent;
    const transfer::peer& target;
    std::uint64_t remote_base;
    std::uint64_t local_base;
    std::uint64_t region_bytes;
    bool write;
    bool quick;
};

// Single-block requests of `size` bytes, `window` in flight at once, for about `budget`.
inline result<measurement> run_window(const window_run& run, std::uint64_t size, std::size_t window,
                                      std::chrono::duration<double> budget) {
    using namespace std::chrono_literals;
    std::vector<transfer::descriptor_list> locals;
    std::vector<transfer::descriptor_list> remotes;
    const std::uint64_t slots = std::max<std::uint64_t>(1, std::min<std::uint64_t>(window, run.region_bytes / size));
    for (std::uint64_t slot = 0; slot < slots; ++slot) {
        locals.emplace_back();
        remotes.emplace_back();
        NXMEM_TRY_VOID(locals.back().add(transfer::descriptor{run.local_base + slot * size, size}));
        NXMEM_TRY_VOID(remotes.back().add(transfer::descriptor{run.remote_base + slot * size, size}));
    }
    const auto submit = [&](std::uint64_t slot) {
        return run.write ? run.agent.write(run.target, locals[slot], remotes[slot])
                         : run.agent.read(run.target, locals[slot], remotes[slot]);
    };
    std::deque<transfer::transfer_request> in_flight;
    std::uint64_t done = 0;
    std::uint64_t issued = 0;
    const std::uint64_t minimum = run.quick ? 2 : 8;
    const auto start = clock_type::now();
    while (seconds_since(start) < budget.count() || done < minimum) {
        while (in_flight.size() < window) {
            NXMEM_TRY(request, submit(issued++ % slots));
            in_flight.push_back(std::move(request));
        }
        NXMEM_TRY_VOID(in_flight.front().wait(60s));
        in_flight.pop_front();
        ++done;
    }
    for (auto& left : in_flight) {
        NXMEM_TRY_VOID(left.wait(60s));
        ++done;
    }
    const double elapsed = seconds_since(start);
    return measurement{static_cast<double>(done * size) / elapsed, elapsed / static_cast<double>(done)};
}

// NXMEM_TRANSFER_PATH=messages|rma sets the initiator's transfer path (default: automatic).
inline transfer::transfer_path transfer_path_from_environment() {
    const char* chosen = std::getenv("NXMEM_TRANSFER_PATH");
    const std::string_view name = chosen != nullptr ? chosen : "";
    return name == "messages"    ? transfer::transfer_path::messages
           : name == "rma"      ? transfer::transfer_path::rma
                                 : transfer::transfer_path::automatic;
}

struct batch_times {
    double one_request_seconds = 0;
    double single_requests_seconds = 0;
};

// One request of `blocks` blocks of 4 KiB against as many single requests one after another.
inline result<batch_times> run_batch(const window_run& run, std::uint64_t blocks) {
    using namespace std::chrono_literals;
    constexpr std::uint64_t block = batch_block_bytes;
    transfer::descriptor_list local;
    transfer::descriptor_list remote;
    NXMEM_TRY_VOID(local.add(transfer::strided_descriptor{run.local_base, block, block, blocks}));
    NXMEM_TRY_VOID(remote.add(transfer::strided_descriptor{run.remote_base, block, 2 * block, blocks}));
    const auto submit = [&](const transfer::descriptor_list& mine, const transfer::descriptor_list& theirs) {
        return run.write ? run.agent.write(run.target, mine, theirs) : run.agent.read(run.target, mine, theirs);
    };
    const int rounds = run.quick ? 1 : 5;
    // One untimed round first: a ucx_perftest run just before leaves both processes' caches and
    // the scheduler's view of them cold (the read batch measured 2x slower right after it).
    {
        NXMEM_TRY(warm_up, submit(local, remote));
        NXMEM_TRY_VOID(warm_up.wait(120s));
    }
    const auto batched_start = clock_type::now();
    for (int round = 0; round < rounds; ++round) {
        NXMEM_TRY(request, submit(local, remote));
        NXMEM_TRY_VOID(request.wait(120s));
    }
    const double batched = seconds_since(batched_start) / rounds;
    const auto single_start = clock_type::now();
    for (int round = 0; round < rounds; ++round) {
        for (std::uint64_t i = 0; i < blocks; ++i) {
            transfer::descriptor_list one_local;
            transfer::descriptor_list one_remote;
            NXMEM_TRY_VOID(one_local.add(transfer::descriptor{run.local_base + i * block, block}));
            NXMEM_TRY_VOID(one_remote.add(transfer::descriptor{run.remote_base + 2 * i * block, block}));
            NXMEM_TRY(request, submit(one_local, one_remote));
            NXMEM_TRY_VOID(request.wait(60s));
        }
    }
    return batch_times{batched, seconds_since(single_start) / rounds};
}

// ---- ucx_perftest, a server and a client on 127.0.0.1 ----

struct perftest_figures {
    bool ran = false;
    double bytes_per_second = 0;
    double seconds_per_op = 0;
    std::string why; // why it did not run
};

// Where ucx_perftest is on PATH; empty when it is not installed.
inline std::string find_perftest() {
    const char* path = std::getenv("PATH");
    std::string_view rest = path == nullptr ? "/usr/bin:/bin" : path;
    while (!rest.empty()) {
        const std::size_t colon = rest.find(':');
        const std::string_view directory = rest.substr(0, colon);
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
        const std::filesystem::path candidate = std::filesystem::path(directory.empty() ? "." : directory) / "ucx_perftest";
        if (::access(candidate.c_str(), X_OK) == 0) {
            return candidate.string();
        }
    }
    return {};
}

inline perftest_figures run_perftest(const std::string& perftest, const std::string& transports,
                                     const std::string& test, std::uint64_t size, bool quick) {
    static int port = 20000 + static_cast<int>(::getpid() % 20000);
    ++port;
    const std::uint64_t iterations =
        quick ? 20 : std::max<std::uint64_t>(20, std::min<std::uint64_t>(20000, (256ull << 20) / size));
    const std::string env = "UCX_TLS=" + transports + " UCX_LOG_LEVEL=error ";
    const std::string common = " -t " + test + " -s " + std::to_string(size) + " -n " + std::to_string(iterations) +
                               " -w " + std::to_string(std::max<std::uint64_t>(2, iterations / 10)) + " -p " +
                               std::to_string(port);
    std::fflush(nullptr);
    const pid_t server = ::fork();
    if (server == 0) {
        ::alarm(300);
        const std::string command = env + "exec '" + perftest + "' -p " + std::to_string(port) + " >/dev/null 2>&1";
        ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    perftest_figures figures;
    // The server listens a moment after it starts: the client retries a refused connection, bounded.
    for (int attempt = 0; attempt < 100 && !figures.ran; ++attempt) {
        std::FILE* client = ::popen((env + "timeout 300 '" + perftest + "' 127.0.0.1" + common + " 2>&1").c_str(), "r");
        if (client == nullptr) {
            figures.why = "cannot start ucx_perftest";
            break;
        }
        char line[512];
        std::string all;
        while (std::fgets(line, sizeof line, client) != nullptr) {
            all += line;
            double iters = 0, p50 = 0, overhead_average = 0, overhead_overall = 0, bw_average = 0, bw_overall = 0;
            if (std::sscanf(line, "Final: %lf %lf %lf %lf %lf %lf", &iters, &p50, &overhead_average, &overhead_overall,
                            &bw_average, &bw_overall) == 6) {
                figures.ran = true;
                figures.bytes_per_second = bw_overall * 1024.0 * 1024.0; // UCX's MB is 2^20 bytes
                figures.seconds_per_op = overhead_overall * 1e-6;
            }
        }
        const int status = ::pclose(client);
        if (!figures.ran) {
            figures.why = all.substr(0, 300);
            if (all.find("refused") == std::string::npos && all.find("connect") == std::string::npos &&
                WIFEXITED(status) && WEXITSTATUS(status) != 0) {
                break; // not a race with the server's start
            }
            ::usleep(20000);
        }
    }
    ::kill(server, SIGTERM);
    ::waitpid(server, nullptr, 0);
    return figures;
}

// ---- registration cost ----

inline result<nlohmann::json> registration_costs(const std::string& transports, const memory_source& source,
                                                 const transfer_bench_options& options) {
    NXMEM_TRY(memory, source(options.pool_bytes));
    NXMEM_TRY(agent, transfer::agent::start({"registrar", transports, false}));
    // The agent's first registration pays UCX's one-off set-up (its pools and caches): not the
    // pool's cost nor the tensors'. One untimed registration first, then each figure is the
    // median of 5 rounds (register, then deregister).
    {
        NXMEM_TRY(warm_up, agent.register_memory(memory.base, 4096));
        NXMEM_TRY_VOID(warm_up.deregister());
    }
    const auto median_of_rounds = [&](int rounds, auto&& round) -> result<double> {
        std::vector<double> times;
        for (int i = 0; i < rounds; ++i) {
            const auto start = clock_type::now();
            NXMEM_TRY_VOID(round());
            times.push_back(seconds_since(start));
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
    };
    nlohmann::json costs;
    NXMEM_TRY(whole, median_of_rounds(5, [&]() -> result<void> {
        NXMEM_TRY(pool, memory.register_whole(agent));
        return pool.deregister();
    }));
    costs["pool_seconds"] = whole;
    costs["pool_bytes"] = memory.bytes;
    std::uint64_t largest_count = 1;
    for (const std::uint64_t count : options.tensor_counts) {
        largest_count = std::max(largest_count, count);
    }
    const std::uint64_t tensor_bytes = memory.bytes / largest_count; // tensors of the pool, side by side
    costs["tensor_bytes"] = tensor_bytes;
    for (const std::uint64_t tensors : options.tensor_counts) {
        NXMEM_TRY(seconds, median_of_rounds(tensors > 100 || options.quick ? 1 : 5, [&]() -> result<void> {
            std::vector<transfer::registration> registered;
            registered.reserve(tensors);
            for (std::uint64_t i = 0; i < tensors; ++i) {
                NXMEM_TRY(tensor, agent.register_memory(memory.base + i * tensor_bytes, tensor_bytes));
                registered.push_back(std::move(tensor));
            }
            for (auto& each : registered) {
                NXMEM_TRY_VOID(each.deregister());
            }
            return boost::outcome_v2::success();
        }));
        costs["tensors_" + std::to_string(tensors) + "_seconds"] = seconds;
    }
    return costs;
}

// Measures one transport: forks the target, measures every size both ways and the batch.
inline result<nlohmann::json> measure_transport(const std::string& tls, const memory_source& source,
                                                const transfer_bench_options& options, const std::string& perftest,
                                                std::FILE* out) {
    using namespace std::chrono_literals;
    // UCX's refusal of this transport here, before a process is forked for it.
    if (result<transfer::agent> probe = transfer::agent::start({"probe", tls, false}); !probe) {
        return fail(probe.error().code,
                    "UCX is not usable here over transport '" + tls + "': " + probe.error().message);
    }
    const std::uint64_t bytes = target_bytes(options);
    int sockets[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
        return fail(status_code::internal_error, "socketpair failed");
    }
    std::fflush(nullptr); // the child must not print what this process buffered
    const pid_t target_pid = ::fork();
    if (target_pid == 0) {
        ::close(sockets[0]);
        ::alarm(600);
        const result<void> served = serve(tls, source, bytes, sockets[1]);
        if (!served) {
            std::fprintf(stderr, "%s: the target process (%s): %s\n", options.tool.c_str(), tls.c_str(),
                         served.error().describe().c_str());
        }
        std::fflush(nullptr);
        _exit(served ? 0 : 1);
    }
    ::close(sockets[1]);
    // Whatever happens below, the target is told to stop and waited for.
    const auto stop_target = [&] {
        const std::string stop = "stop";
        ::send(sockets[0], stop.data(), stop.size(), MSG_NOSIGNAL);
        ::waitpid(target_pid, nullptr, 0);
        ::close(sockets[0]);
    };
    const auto measured = [&]() -> result<nlohmann::json> {
        NXMEM_TRY(memory, take_filled(source, bytes, 0x11));
        NXMEM_TRY(agent, transfer::agent::start({"initiator", tls, false, transfer_path_from_environment()}));
        NXMEM_TRY(registered, memory.register_whole(agent));
        NXMEM_TRY(metadata, receive_blob(sockets[0]));
        NXMEM_TRY(target, agent.connect(metadata));
        NXMEM_TRY(regions, receive_blob(sockets[0]));
        NXMEM_TRY_VOID(target.load_regions(regions));
        const auto budget = options.quick ? 0.05s : 0.6s;
        nlohmann::json figures;
        nlohmann::json rows = nlohmann::json::array();
        for (const bool write : {false, true}) {
            const window_run run{agent, target, target.regions().at(0).address, registered.base(), bytes, write, options.quick};
            const std::string op = write ? "write" : "read";
            const std::string baseline = write ? "ucp_put_bw" : "ucp_get";
            for (const std::uint64_t size : options.sizes) {
                NXMEM_TRY(bandwidth, run_window(run, size, bandwidth_window, budget));
                NXMEM_TRY(latency, run_window(run, size, 1, budget));
                perftest_figures beside;
                if (!options.baseline) {
                    beside.why = "not asked for (--baseline)";
                } else if (perftest.empty()) {
                    beside.why = "ucx_perftest is not installed (not found on PATH)";
                } else {
                    beside = run_perftest(perftest, tls, baseline, size, options.quick);
                }
                const double bw_ratio = beside.ran ? bandwidth.bytes_per_second / beside.bytes_per_second : 0;
                // Per-transfer time at the same pipelining as the baseline's bandwidth test.
                const double time_ratio = beside.ran ? bandwidth.seconds_per_transfer / beside.seconds_per_op : 0;
                const std::string size_text =
                    size >= (1 << 20) ? std::to_string(size >> 20) + " MiB" : std::to_string(size >> 10) + " KiB";
                // The baseline's columns read "-" where it did not run.
                const auto or_dash = [&beside](double value, const char* format) {
                    char text[32] = "-";
                    if (beside.ran) {
                        std::snprintf(text, sizeof text, format, value);
                    }
                    return std::string(text);
                };
                std::fprintf(out, "%-6s %-6s %-8s %14.1f %14.2f %14.2f %14s %14s %8s %8s\n", tls.c_str(), op.c_str(),
                             size_text.c_str(), bandwidth.bytes_per_second / (1 << 20),
                             bandwidth.seconds_per_transfer * 1e6, latency.seconds_per_transfer * 1e6,
                             or_dash(beside.bytes_per_second / (1 << 20), "%.1f").c_str(),
                             or_dash(beside.seconds_per_op * 1e6, "%.2f").c_str(), or_dash(bw_ratio, "%.2f").c_str(),
                             or_dash(time_ratio, "%.2f").c_str());
                if (!beside.ran && options.baseline) {
                    std::fprintf(out, "       (ucx_perftest did not run: %s)\n", beside.why.c_str());
                }
                rows.push_back({{"op", op}, {"size", size}, {"baseline", "ucx_perftest " + baseline},
                                {"nxmem_bytes_per_second", bandwidth.bytes_per_second},
                                {"nxmem_seconds_per_transfer_16_in_flight", bandwidth.seconds_per_transfer},
                                {"nxmem_seconds_per_transfer_one_at_a_time", latency.seconds_per_transfer},
                                {"perftest_ran", beside.ran},
                                {"perftest_why_not", beside.ran ? nlohmann::json() : nlohmann::json(beside.why)},
                                {"perftest_bytes_per_second", beside.bytes_per_second},
                                {"perftest_seconds_per_op", beside.seconds_per_op},
                                {"bandwidth_ratio", bw_ratio}, {"time_ratio", time_ratio}});
            }
            NXMEM_TRY(batch, run_batch(run, options.batch_blocks));
            const double ratio = batch.single_requests_seconds / batch.one_request_seconds;
            const char* path = target.uses_messages() ? "batch messages" : "a get or put per block";
            std::fprintf(out, "%-6s %-6s %llu x 4 KiB: one request %.2f ms, %llu requests %.2f ms: batch %.1fx the throughput (%s)\n",
                         tls.c_str(), op.c_str(), static_cast<unsigned long long>(options.batch_blocks),
                         batch.one_request_seconds * 1e3, static_cast<unsigned long long>(options.batch_blocks),
                         batch.single_requests_seconds * 1e3, ratio, path);
            figures["batch"][op] = {{"blocks", options.batch_blocks}, {"block_bytes", batch_block_bytes}, {"path", path},
                                    {"one_request_seconds", batch.one_request_seconds},
                                    {"single_requests_seconds", batch.single_requests_seconds},
                                    {"throughput_ratio", ratio}};
        }
        figures["rows"] = std::move(rows);
        target.disconnect();
        return figures;
    }();
    stop_target();
    return measured;
}

} // namespace transfer_detail

// Runs every measurement, prints the table and the in-run ratios on `out` and returns them as one
// JSON document (context, transports, registration, ratios).
inline result<nlohmann::json> run_transfer_bench(const transfer_bench_options& options, const memory_source& source,
                                                 std::FILE* out) {
    const std::string perftest = options.baseline ? transfer_detail::find_perftest() : std::string();
    nlohmann::json document;
    document["context"] = {{"tool", options.tool}, {"quick", options.quick},
                           {"note", "figures of one run on a shared machine: compare the ratios"}};
    document["baseline"] = {{"asked", options.baseline},
                            {"ucx_perftest", perftest.empty() ? nlohmann::json() : nlohmann::json(perftest)}};
    if (options.baseline && perftest.empty()) {
        document["baseline"]["why_not"] = "ucx_perftest is not installed (not found on PATH)";
        std::fprintf(out, "ucx_perftest is not installed (not found on PATH): no baseline, nxmem's figures only\n");
    }
    std::fprintf(out, "%-6s %-6s %-8s %14s %14s %14s %14s %14s %8s %8s\n", "tls", "op", "size", "MiB/s", "us/xfer 16",
                 "us/xfer 1", "perftest MiB/s", "perftest us", "bw ratio", "t ratio");
    for (const std::string& tls : options.transports) {
        NXMEM_TRY(figures, transfer_detail::measure_transport(tls, source, options, perftest, out));
        document["transports"][tls] = std::move(figures);
    }
    for (const std::string& tls : options.transports) {
        NXMEM_TRY(costs, transfer_detail::registration_costs(tls, source, options));
        const double whole = costs["pool_seconds"].get<double>();
        std::fprintf(out, "%-6s registration: one %llu MiB pool %.3f ms; tensors of %llu KiB", tls.c_str(),
                     costs["pool_bytes"].get<unsigned long long>() >> 20, whole * 1e3,
                     costs["tensor_bytes"].get<unsigned long long>() >> 10);
        for (const std::uint64_t tensors : options.tensor_counts) {
            const double seconds = costs["tensors_" + std::to_string(tensors) + "_seconds"].get<double>();
            std::fprintf(out, ", %llu: %.3f ms (%.1fx the pool)", static_cast<unsigned long long>(tensors),
                         seconds * 1e3, seconds / whole);
            document["ratios"]["registration_" + std::to_string(tensors) + "_tensors_over_pool_" + tls] = seconds / whole;
        }
        std::fprintf(out, "\n");
        document["registration"][tls] = std::move(costs);
    }
    for (auto& [tls, figures] : document["transports"].items()) {
        for (const auto& row : figures["rows"]) {
            if (!row["perftest_ran"].get<bool>()) {
                continue; // no baseline, no ratio to it
            }
            const std::string key =
                tls + "_" + row["op"].get<std::string>() + "_" + std::to_string(row["size"].get<std::uint64_t>());
            document["ratios"][key + "_bandwidth_vs_perftest"] = row["bandwidth_ratio"];
            document["ratios"][key + "_time_vs_perftest"] = row["time_ratio"];
        }
        for (const char* op : {"read", "write"}) {
            document["ratios"][tls + "_" + op + "_batch_vs_single"] = figures["batch"][op]["throughput_ratio"];
        }
    }
    std::fprintf(out, "ratios (same run):\n");
    for (auto& [key, value] : document["ratios"].items()) {
        std::fprintf(out, "  %-58s %.2f\n", key.c_str(), value.get<double>());
    }
    return document;
}

} // namespace nxmem::measure
