// nxmem_transfer_bench: the transfer layer against ucx_perftest on the same transport, in the same
// run (docs/TRANSFER.md, "What it costs").
//
// For each transport (tcp, sm): a target process (forked) registers 64 MiB and serves; this
// process reads from it and writes to it with an agent, at 4 KiB, 64 KiB, 1 MiB and 16 MiB:
//   - bandwidth: single-block requests, 16 in flight (ucx_perftest's bandwidth tests keep many
//     operations outstanding too), bytes per second;
//   - latency: one single-block request at a time, issue to completion;
//   - batch: 1,000 blocks of 4 KiB in one request against 1,000 single requests one at a time.
// Beside each, ucx_perftest (a server and a client process on 127.0.0.1, the same UCX_TLS):
// ucp_put_bw for writes, ucp_get for reads, same sizes. Then the registration cost: one 1 GiB
// region (a pool's reservation) against its memory registered as 100 and as 10,000 tensors.
//
// Prints a table and the in-run ratios; --json PATH writes them as one JSON document, which
// bench/transfer_plot.py turns into a PNG (bandwidth against block size, per transport).
// --quick: fewer iterations (the smoke test). The machine these run on is shared: compare ratios
// from one run, never figures across runs.
#include <nxmem/transfer.hpp>

#include <nlohmann/json.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

using namespace nxmem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t target_bytes = 64ull << 20;
constexpr std::uint64_t sizes[] = {4096, 64 * 1024, 1 << 20, 16 << 20};
bool quick = false;

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "nxmem_transfer_bench: %s\n", what.c_str());
    std::exit(1);
}
template <class T> T take(result<T> outcome, const char* what) {
    if (!outcome) {
        die(std::string(what) + ": " + outcome.error().describe());
    }
    return std::move(outcome).value();
}
void take(result<void> outcome, const char* what) {
    if (!outcome) {
        die(std::string(what) + ": " + outcome.error().describe());
    }
}
std::string size_name(std::uint64_t bytes) {
    return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
}
double seconds_since(clock_type::time_point start) {
    return std::chrono::duration<double>(clock_type::now() - start).count();
}

void send_blob(int socket, const std::vector<std::byte>& bytes) {
    if (::send(socket, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
        die("send failed");
    }
}
std::vector<std::byte> receive_blob(int socket) {
    std::vector<std::byte> bytes(1 << 16);
    const ssize_t got = ::recv(socket, bytes.data(), bytes.size(), 0);
    if (got <= 0) {
        die("receive failed");
    }
    bytes.resize(static_cast<std::size_t>(got));
    return bytes;
}

// The target: registers 64 MiB, sends its metadata and region, progresses until told to stop.
[[noreturn]] void serve(const std::string& transports, int socket) {
    ::alarm(600);
    std::vector<std::uint8_t> memory(target_bytes, 0x5a);
    auto agent = take(transfer::agent::start({"target", transports, false}), "start the target agent");
    auto registered = take(agent.register_memory(memory.data(), memory.size()), "register the target");
    send_blob(socket, take(agent.metadata(), "metadata"));
    send_blob(socket, take(agent.export_regions({&registered}), "regions"));
    pollfd stop{socket, POLLIN, 0};
    for (unsigned spin = 0;; ++spin) {
        (void)agent.progress();
        if (spin % 256 == 0 && ::poll(&stop, 1, 0) > 0) {
            break;
        }
    }
    std::fflush(nullptr);
    _exit(0);
}

struct measurement {
    double bytes_per_second = 0;
    double seconds_per_transfer = 0;
};

// Single-block requests of `size` bytes, `window` in flight at once, for about `budget`.
measurement run_window(transfer::agent& agent, const transfer::peer& target, std::uint64_t remote_base,
                       std::uint64_t local_base, std::uint64_t size, bool write, std::size_t window,
                       std::chrono::duration<double> budget) {
    std::vector<transfer::descriptor_list> locals;
    std::vector<transfer::descriptor_list> remotes;
    const std::uint64_t slots = std::max<std::uint64_t>(1, std::min<std::uint64_t>(window, target_bytes / size));
    for (std::uint64_t slot = 0; slot < slots; ++slot) {
        locals.emplace_back();
        remotes.emplace_back();
        take(locals.back().add(transfer::descriptor{local_base + slot * size, size}), "describe");
        take(remotes.back().add(transfer::descriptor{remote_base + slot * size, size}), "describe");
    }
    std::deque<transfer::transfer_request> in_flight;
    std::uint64_t done = 0;
    std::uint64_t issued = 0;
    const std::uint64_t minimum = quick ? 2 : 8;
    const auto start = clock_type::now();
    while (seconds_since(start) < budget.count() || done < minimum) {
        while (in_flight.size() < window) {
            const std::uint64_t slot = issued++ % slots;
            in_flight.push_back(take(write ? agent.write(target, locals[slot], remotes[slot])
                                           : agent.read(target, locals[slot], remotes[slot]),
                                     "submit"));
        }
        take(in_flight.front().wait(60s), "transfer");
        in_flight.pop_front();
        ++done;
    }
    for (auto& left : in_flight) {
        take(left.wait(60s), "transfer");
        ++done;
    }
    const double elapsed = seconds_since(start);
    return {static_cast<double>(done * size) / elapsed, elapsed / static_cast<double>(done)};
}

// One request of 1,000 blocks of 4 KiB against 1,000 single requests one after another.
std::pair<double, double> run_batch(transfer::agent& agent, const transfer::peer& target, std::uint64_t remote_base,
                                    std::uint64_t local_base, bool write) {
    constexpr std::uint64_t blocks = 1000;
    constexpr std::uint64_t block = 4096;
    transfer::descriptor_list local;
    transfer::descriptor_list remote;
    take(local.add(transfer::strided_descriptor{local_base, block, block, blocks}), "describe");
    take(remote.add(transfer::strided_descriptor{remote_base, block, 2 * block, blocks}), "describe");
    const int rounds = quick ? 1 : 5;
    const auto batched_start = clock_type::now();
    for (int round = 0; round < rounds; ++round) {
        auto request = take(write ? agent.write(target, local, remote) : agent.read(target, local, remote), "batch");
        take(request.wait(120s), "batch");
    }
    const double batched = seconds_since(batched_start) / rounds;
    const auto single_start = clock_type::now();
    for (int round = 0; round < rounds; ++round) {
        for (std::uint64_t i = 0; i < blocks; ++i) {
            transfer::descriptor_list one_local;
            transfer::descriptor_list one_remote;
            take(one_local.add(transfer::descriptor{local_base + i * block, block}), "describe");
            take(one_remote.add(transfer::descriptor{remote_base + 2 * i * block, block}), "describe");
            auto request = take(write ? agent.write(target, one_local, one_remote) : agent.read(target, one_local, one_remote),
                                "single");
            take(request.wait(60s), "single");
        }
    }
    const double singles = seconds_since(single_start) / rounds;
    return {batched, singles};
}

// ---- ucx_perftest, a server and a client on 127.0.0.1 ----

struct perftest_figures {
    bool ran = false;
    double bytes_per_second = 0;
    double seconds_per_op = 0;
    std::string why;
};

perftest_figures run_perftest(const std::string& transports, const std::string& test, std::uint64_t size) {
    static int port = 20000 + static_cast<int>(::getpid() % 20000);
    ++port;
    const std::uint64_t iterations = quick ? 20 : std::max<std::uint64_t>(20, std::min<std::uint64_t>(20000, (256ull << 20) / size));
    const std::string env = "UCX_TLS=" + transports + " UCX_LOG_LEVEL=error ";
    const std::string common = " -t " + test + " -s " + std::to_string(size) + " -n " + std::to_string(iterations) +
                               " -w " + std::to_string(std::max<std::uint64_t>(2, iterations / 10)) + " -p " +
                               std::to_string(port);
    std::fflush(nullptr);
    const pid_t server = ::fork();
    if (server == 0) {
        ::alarm(300);
        const std::string command = env + "exec ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1";
        ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    perftest_figures figures;
    // The server listens a moment after it starts: the client retries a refused connection, bounded.
    for (int attempt = 0; attempt < 100 && !figures.ran; ++attempt) {
        std::FILE* client = ::popen((env + "timeout 300 ucx_perftest 127.0.0.1" + common + " 2>&1").c_str(), "r");
        if (client == nullptr) {
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

nlohmann::json registration_costs(const std::string& transports) {
    constexpr std::uint64_t pool_bytes = 1ull << 30;
    void* memory = ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
        die("mmap of 1 GiB failed");
    }
    auto agent = take(transfer::agent::start({"registrar", transports, false}), "start");
    // The agent's first registration pays UCX's one-off set-up (its pools and caches): not the
    // pool's cost nor the tensors'. One untimed registration first, then each figure is the
    // median of 5 rounds (register, then deregister).
    take(take(agent.register_memory(memory, 4096), "warm up").deregister(), "warm up");
    const auto median_of_rounds = [&](int rounds, auto&& round) {
        std::vector<double> times;
        for (int i = 0; i < rounds; ++i) {
            const auto start = clock_type::now();
            round();
            times.push_back(seconds_since(start));
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
    };
    nlohmann::json costs;
    costs["pool_1GiB_seconds"] = median_of_rounds(5, [&] {
        auto whole = take(agent.register_memory(memory, pool_bytes), "register 1 GiB");
        take(whole.deregister(), "deregister");
    });
    for (const std::uint64_t tensors : {std::uint64_t{100}, std::uint64_t{10000}}) {
        const std::uint64_t tensor_bytes = pool_bytes / 10000; // a tensor of the pool: 1 GiB / 10,000
        costs["tensors_" + std::to_string(tensors) + "_seconds"] = median_of_rounds(tensors > 100 || quick ? 1 : 5, [&] {
            std::vector<transfer::registration> registered;
            registered.reserve(tensors);
            for (std::uint64_t i = 0; i < tensors; ++i) {
                registered.push_back(take(agent.register_memory(static_cast<std::byte*>(memory) + i * tensor_bytes,
                                                                tensor_bytes),
                                          "register a tensor"));
            }
            for (auto& each : registered) {
                take(each.deregister(), "deregister a tensor");
            }
        });
    }
    costs["tensor_bytes"] = pool_bytes / 10000;
    ::munmap(memory, pool_bytes);
    return costs;
}

} // namespace

int main(int argc, char** argv) {
    std::string json_path;
    std::vector<std::string> transports = {"tcp", "sm"};
    bool chose_transports = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--quick") {
            quick = true;
        } else if (arg == "--json" && i + 1 < argc) {
            json_path = argv[++i];
        } else if (arg == "--transports" && i + 1 < argc) {
            // One UCX_TLS value per --transports (repeat it for more): "tcp", "sm", "cma,posix".
            if (!chose_transports) {
                transports.clear();
                chose_transports = true;
            }
            transports.push_back(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: nxmem_transfer_bench [--quick] [--json PATH] [--transports UCX_TLS]...\n");
            return 2;
        }
    }
    ::setenv("UCX_LOG_LEVEL", "error", 0);
    ::setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    const auto budget = quick ? 0.05s : 0.6s;
    nlohmann::json document;
    document["context"] = {{"tool", "nxmem_transfer_bench"}, {"quick", quick},
                           {"note", "figures of one run on a shared machine: compare the ratios"}};
    std::printf("%-6s %-6s %-8s %14s %14s %8s %14s %14s %8s\n", "tls", "op", "size", "nxmem MiB/s", "perftest MiB/s",
                "ratio", "nxmem us/xfer", "perftest us/op", "ratio");
    for (const std::string& tls : transports) {
        int sockets[2];
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0) {
            die("socketpair failed");
        }
        std::fflush(nullptr); // the child must not print what this process buffered
        const pid_t target_pid = ::fork();
        if (target_pid == 0) {
            ::close(sockets[0]);
            serve(tls, sockets[1]);
        }
        ::close(sockets[1]);
        std::vector<std::uint8_t> memory(target_bytes, 0x11);
        auto agent = take(transfer::agent::start({"initiator", tls, false}), "start the agent");
        auto registered = take(agent.register_memory(memory.data(), memory.size()), "register");
        auto target = take(agent.connect(receive_blob(sockets[0])), "connect");
        take(target.load_regions(receive_blob(sockets[0])), "load regions");
        const std::uint64_t remote_base = target.regions().at(0).address;
        const std::uint64_t local_base = registered.base();
        nlohmann::json rows = nlohmann::json::array();
        for (const bool write : {false, true}) {
            const std::string op = write ? "write" : "read";
            const std::string baseline = write ? "ucp_put_bw" : "ucp_get";
            for (const std::uint64_t size : sizes) {
                const measurement bandwidth = run_window(agent, target, remote_base, local_base, size, write, 16, budget);
                const measurement latency = run_window(agent, target, remote_base, local_base, size, write, 1, budget);
                const perftest_figures perftest = run_perftest(tls, baseline, size);
                const double bw_ratio = perftest.ran ? bandwidth.bytes_per_second / perftest.bytes_per_second : 0;
                // Per-transfer time at the same pipelining as the baseline's bandwidth test.
                const double time_ratio = perftest.ran ? bandwidth.seconds_per_transfer / perftest.seconds_per_op : 0;
                std::printf("%-6s %-6s %-8s %14.1f %14.1f %8.2f %14.2f %14.2f %8.2f\n", tls.c_str(), op.c_str(),
                            size_name(size).c_str(), bandwidth.bytes_per_second / (1 << 20),
                            perftest.bytes_per_second / (1 << 20), bw_ratio, bandwidth.seconds_per_transfer * 1e6,
                            perftest.seconds_per_op * 1e6, time_ratio);
                if (!perftest.ran) {
                    std::printf("       (ucx_perftest did not run: %s)\n", perftest.why.c_str());
                }
                rows.push_back({{"op", op}, {"size", size}, {"baseline", "ucx_perftest " + baseline},
                                {"nxmem_bytes_per_second", bandwidth.bytes_per_second},
                                {"nxmem_seconds_per_transfer_16_in_flight", bandwidth.seconds_per_transfer},
                                {"nxmem_seconds_per_transfer_one_at_a_time", latency.seconds_per_transfer},
                                {"perftest_ran", perftest.ran},
                                {"perftest_bytes_per_second", perftest.bytes_per_second},
                                {"perftest_seconds_per_op", perftest.seconds_per_op},
                                {"bandwidth_ratio", bw_ratio}, {"time_ratio", time_ratio}});
            }
            const auto [batched, singles] = run_batch(agent, target, remote_base, local_base, write);
            std::printf("%-6s %-6s 1000 x 4 KiB: one request %.2f ms, 1000 requests %.2f ms: batch %.1fx the throughput\n",
                        tls.c_str(), op.c_str(), batched * 1e3, singles * 1e3, singles / batched);
            document["transports"][tls]["batch"][op] = {{"one_request_seconds", batched},
                                                        {"single_requests_seconds", singles},
                                                        {"throughput_ratio", singles / batched}};
        }
        document["transports"][tls]["rows"] = rows;
        target.disconnect();
        std::string stop = "stop";
        ::send(sockets[0], stop.data(), stop.size(), MSG_NOSIGNAL);
        ::waitpid(target_pid, nullptr, 0);
        ::close(sockets[0]);
    }
    for (const std::string& tls : transports) {
        const nlohmann::json costs = registration_costs(tls);
        const double whole = costs["pool_1GiB_seconds"].get<double>();
        const double hundred = costs["tensors_100_seconds"].get<double>();
        const double many = costs["tensors_10000_seconds"].get<double>();
        std::printf("%-6s registration: one 1 GiB pool %.3f ms; 100 tensors of %llu KiB %.3f ms (%.1fx the pool); "
                    "10,000 tensors %.3f ms (%.1fx)\n",
                    tls.c_str(), whole * 1e3, costs["tensor_bytes"].get<unsigned long long>() >> 10, hundred * 1e3,
                    hundred / whole, many * 1e3, many / whole);
        document["registration"][tls] = costs;
        document["ratios"]["registration_100_tensors_over_pool_" + tls] = hundred / whole;
        document["ratios"]["registration_10000_tensors_over_pool_" + tls] = many / whole;
    }
    for (auto& [tls, figures] : document["transports"].items()) {
        for (const auto& row : figures["rows"]) {
            const std::string key = tls + "_" + row["op"].get<std::string>() + "_" + std::to_string(row["size"].get<std::uint64_t>());
            document["ratios"][key + "_bandwidth_vs_perftest"] = row["bandwidth_ratio"];
            document["ratios"][key + "_time_vs_perftest"] = row["time_ratio"];
        }
        for (const char* op : {"read", "write"}) {
            document["ratios"][tls + "_" + op + "_batch_1000x4KiB_vs_single"] = figures["batch"][op]["throughput_ratio"];
        }
    }
    std::printf("ratios (same run):\n");
    for (auto& [key, value] : document["ratios"].items()) {
        std::printf("  %-58s %.2f\n", key.c_str(), value.get<double>());
    }
    if (!json_path.empty()) {
        std::ofstream(json_path) << document.dump(2) << "\n";
    }
    return 0;
}
