// Sharing memory across processes (minor 3), measured. Table and in-run ratios, or one JSON
// document with --benchmark_format=json:
//   prefix_round_trip/SIZE      export a prefix + send over a SOCK_SEQPACKET pair + receive +
//                               import + commit into one sequence + close + release (both ends in
//                               this process: the cost of the calls and system calls, not of a
//                               context switch)
//   allocation_round_trip/SIZE  the same for a live allocation (posix-lazy share=memfd): export +
//                               send + receive + import + read its last byte + close
//   copy/SIZE                   what an engine without shared memory does: copy the bytes
//   lazy_cycle/private|memfd/SIZE  commit + touch every page + decommit of one posix-lazy
//                               allocation, private anonymous memory (the default) against
//                               share=memfd (shmem: what sharing allocations costs every cycle)
//   prefix_processes/shared|copied/N  a 16 MiB prefix reaching N processes (the exporter and
//                               N - 1 children, fork + exec of this program): each child imports
//                               it and maps it into a sequence, touching every page (shared), or
//                               imports it and copies it into memory of its own, closing the
//                               import (copied). The time runs from the first export to the last
//                               child's "ready" (the children have started and loaded the plugin
//                               before); counter prefix_pss_MiB is the prefix's memory across the
//                               N processes: the rise of their summed Pss (/proc/PID/smaps_rollup)
//                               plus the exporter's own copy
//   read_only_export/mode|seal|copy/SIZE  what making one read-only export of a filled memfd costs
//                               (docs/ABI.md IP5; the thread's CPU time of the export step only,
//                               the memfd made and filled outside it): mode, today's: fchmod 0400 + reopen O_RDONLY (holds
//                               against another uid only); seal: F_SEAL_FUTURE_WRITE (and the
//                               size seals, final) + reopen O_RDONLY (holds against every peer, but
//                               freezes the file: no hole can be punched, no new writable mapping);
//                               copy: a new memfd with a copy of the bytes, sealed F_SEAL_WRITE
//                               (holds against every peer, a snapshot: the exporter's later writes
//                               are not seen, and the memory is paid twice)
// Build and run: ninja -C build/gcc bench/nxmem_ipc_bench && build/gcc/bench/nxmem_ipc_bench
#include "ratio_summary.hpp"

#include <nxmem/host.hpp>

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nxmem::cpu_device;
namespace host = nxmem::host;

constexpr std::uint64_t page = 4096;
constexpr std::uint64_t process_prefix_bytes = 16u << 20;

std::string size_name(std::uint64_t bytes) {
    return bytes >= (1u << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

std::shared_ptr<host::plugin_module> load_posix() {
    return host::plugin_module::load(NXMEM_BENCH_POSIX_PLUGIN).value();
}

struct socket_pair {
    socket_pair() {
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) {
            throw std::runtime_error("socketpair failed");
        }
    }
    ~socket_pair() {
        ::close(ends[0]);
        ::close(ends[1]);
    }
    socket_pair(const socket_pair&) = delete;
    socket_pair& operator=(const socket_pair&) = delete;
    int ends[2] = {-1, -1};
};

void prefix_round_trip(benchmark::State& state, std::uint64_t bytes) {
    auto module = load_posix();
    auto exporter = host::open_allocator<cpu_device>(module, "posix-lazy").value();
    auto importer = host::open_allocator<cpu_device>(module, "posix-lazy").value();
    socket_pair channel;
    auto mapping = exporter.shared_mapping().value();
    auto sharing = exporter.ipc().value();
    auto imported_mapping = importer.shared_mapping().value();
    auto importing = importer.ipc().value();
    auto prefix = mapping.create_prefix(bytes).value();
    auto filled = exporter.allocate(bytes, page).value();
    (void)mapping.commit_prefix(filled, prefix).value();
    std::memset(filled.address, 0x42, bytes);
    for (auto _ : state) {
        host::ipc_handle handle = sharing.export_prefix(prefix).value();
        host::send_handle(channel.ends[0], handle.record()).value();
        host::ipc_handle received = host::receive_handle(channel.ends[1]).value();
        auto imported = importing.import(received).value();
        auto sequence = importer.allocate(bytes, page).value();
        (void)imported_mapping.commit_prefix(sequence, imported.prefix()).value();
        benchmark::DoNotOptimize(static_cast<const unsigned char*>(sequence.address)[bytes - 1]);
        imported.close().value();
        (void)importer.release(sequence).value();
    }
    (void)exporter.release(filled);
    (void)mapping.release_prefix(prefix);
}

void allocation_round_trip(benchmark::State& state, std::uint64_t bytes) {
    auto module = load_posix();
    auto exporter = host::open_allocator<cpu_device>(module, "posix-lazy", 0, "share=memfd").value();
    auto importer = host::open_allocator<cpu_device>(module, "posix-lazy").value();
    socket_pair channel;
    auto sharing = exporter.ipc().value();
    auto importing = importer.ipc().value();
    auto filled = exporter.allocate(bytes, page).value();
    exporter.virtual_backing().value().commit(filled, {0, bytes}).value();
    std::memset(filled.address, 0x42, bytes);
    for (auto _ : state) {
        host::ipc_handle handle = sharing.export_allocation(filled).value();
        host::send_handle(channel.ends[0], handle.record()).value();
        host::ipc_handle received = host::receive_handle(channel.ends[1]).value();
        auto imported = importing.import(received).value();
        benchmark::DoNotOptimize(static_cast<const unsigned char*>(imported.address())[bytes - 1]);
        imported.close().value();
    }
    (void)exporter.release(filled);
}

void copy(benchmark::State& state, std::uint64_t bytes) {
    std::vector<unsigned char> source(bytes, 0x42);
    for (auto _ : state) {
        std::vector<unsigned char> copied(bytes);
        std::memcpy(copied.data(), source.data(), bytes);
        benchmark::DoNotOptimize(copied.data());
        benchmark::ClobberMemory();
    }
}

// A memfd of `bytes` bytes that takes seals, every page written; throws when the kernel refuses.
int filled_memfd(std::uint64_t bytes) {
    const int fd = ::memfd_create("nxmem-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
        throw std::runtime_error("memfd_create or ftruncate failed");
    }
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) {
        throw std::runtime_error("mmap failed");
    }
    std::memset(memory, 0x42, bytes);
    ::munmap(memory, bytes);
    return fd;
}

int reopen_read_only(int fd) {
    return ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_CLOEXEC);
}

// One read-only export of a filled memfd by `how` (mode, seal, copy): the new descriptor.
int read_only_export(int fd, std::uint64_t bytes, const std::string& how) {
    if (how == "mode") {
        (void)::fchmod(fd, S_IRUSR);
        return reopen_read_only(fd);
    }
    if (how == "seal") {
        (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
        return reopen_read_only(fd);
    }
    const int snapshot = ::memfd_create("nxmem-bench-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    (void)::ftruncate(snapshot, static_cast<off_t>(bytes));
    void* from = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    void* to = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, snapshot, 0);
    std::memcpy(to, from, bytes);
    ::munmap(from, bytes);
    ::munmap(to, bytes);
    (void)::fcntl(snapshot, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
    const int reader = reopen_read_only(snapshot);
    ::close(snapshot);
    return reader;
}

void read_only_export_cost(benchmark::State& state, std::uint64_t bytes, std::string how) {
    // The time is this thread's CPU time (system calls included): on a busy machine wall time
    // mostly measures the other processes.
    const auto thread_seconds = [] {
        timespec now{};
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
        return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
    };
    for (auto _ : state) {
        const int fd = filled_memfd(bytes);
        const double start = thread_seconds();
        const int exported = read_only_export(fd, bytes, how);
        const double end = thread_seconds();
        if (exported < 0) {
            state.SkipWithError("the read-only export failed");
        }
        state.SetIterationTime(end - start);
        ::close(exported);
        ::close(fd);
    }
}

void lazy_cycle(benchmark::State& state, std::uint64_t bytes, const char* options) {
    auto module = load_posix();
    auto lazy = host::open_allocator<cpu_device>(module, "posix-lazy", 0, options).value();
    auto backing = lazy.virtual_backing().value();
    auto live = lazy.allocate(bytes, page).value();
    auto* memory = static_cast<volatile unsigned char*>(live.address);
    for (auto _ : state) {
        backing.commit(live, {0, bytes}).value();
        for (std::uint64_t offset = 0; offset < bytes; offset += page) {
            memory[offset] = 1;
        }
        backing.decommit(live, {0, bytes}).value();
    }
    (void)lazy.release(live);
}

// ---- a prefix reaching N processes ----

void say(int socket, const char* word) { (void)::send(socket, word, std::strlen(word), MSG_NOSIGNAL); }

bool hear(int socket, const char* word) {
    char buffer[32];
    const ssize_t got = ::recv(socket, buffer, sizeof buffer, 0);
    return got == static_cast<ssize_t>(std::strlen(word)) && std::memcmp(buffer, word, std::strlen(word)) == 0;
}

// A child process (this program, run as `--peer shared|copied FD`): loads the plugin, says "up",
// imports the handle it is sent, maps or copies the prefix, says "ready", and exits when told.
int run_peer(const std::string& mode, int control) {
    auto module = load_posix();
    std::optional<host::plugin_allocator<cpu_device>> lazy(
        host::open_allocator<cpu_device>(module, "posix-lazy").value());
    auto mapping = lazy->shared_mapping().value();
    auto sharing = lazy->ipc().value();
    say(control, "up");
    std::optional<host::ipc_handle> handle(host::receive_handle(control).value());
    std::optional<host::imported_memory<cpu_device>> imported(sharing.import(*handle).value());
    handle.reset();
    const std::uint64_t bytes = imported->size();
    std::optional<nxmem::allocation<cpu_device>> sequence(lazy->allocate(bytes, page).value());
    (void)mapping.commit_prefix(*sequence, imported->prefix()).value();
    const auto* memory = static_cast<const volatile unsigned char*>(sequence->address);
    std::vector<unsigned char> copied;
    if (mode == "copied") {
        copied.resize(bytes);
        std::memcpy(copied.data(), const_cast<const unsigned char*>(memory), bytes);
        (void)lazy->release(*sequence).value();
        sequence.reset();
        imported->close().value();
    } else {
        unsigned sum = 0;
        for (std::uint64_t offset = 0; offset < bytes; offset += page) {
            sum += memory[offset];
        }
        benchmark::DoNotOptimize(sum);
    }
    say(control, "ready");
    (void)hear(control, "exit");
    if (sequence) {
        (void)lazy->release(*sequence);
    }
    imported.reset();
    lazy.reset();
    return 0;
}

std::uint64_t pss_bytes(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Pss:", 0) == 0) {
            std::istringstream fields(line.substr(4));
            std::uint64_t kilobytes = 0;
            fields >> kilobytes;
            return kilobytes * 1024;
        }
    }
    return 0;
}

struct child {
    pid_t pid = -1;
    int control = -1;
};

child start_peer(const std::string& mode) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
        return {};
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int control = ::dup(pair[1]); // without close-on-exec
        const std::string fd = std::to_string(control);
        ::execl("/proc/self/exe", "nxmem_ipc_bench", "--peer", mode.c_str(), fd.c_str(), nullptr);
        std::_Exit(127);
    }
    ::close(pair[1]);
    if (pid < 0) {
        ::close(pair[0]);
        return {};
    }
    return {pid, pair[0]};
}

void stop_peer(const child& peer) {
    say(peer.control, "exit");
    (void)::waitpid(peer.pid, nullptr, 0);
    ::close(peer.control);
}

void prefix_processes(benchmark::State& state, const std::string& mode, int processes) {
    auto module = load_posix();
    auto exporter = host::open_allocator<cpu_device>(module, "posix-lazy").value();
    auto mapping = exporter.shared_mapping().value();
    auto sharing = exporter.ipc().value();
    auto prefix = mapping.create_prefix(process_prefix_bytes).value();
    auto filled = exporter.allocate(process_prefix_bytes, page).value();
    (void)mapping.commit_prefix(filled, prefix).value();
    std::memset(filled.address, 0x42, process_prefix_bytes);
    double pss_total = 0;
    for (auto _ : state) {
        std::vector<child> peers;
        for (int index = 1; index < processes; ++index) {
            peers.push_back(start_peer(mode));
        }
        bool ok = true;
        for (const child& peer : peers) {
            ok = ok && peer.pid > 0 && hear(peer.control, "up");
        }
        std::uint64_t before = pss_bytes(::getpid());
        for (const child& peer : peers) {
            before += peer.pid > 0 ? pss_bytes(peer.pid) : 0;
        }
        const auto start = std::chrono::steady_clock::now();
        for (const child& peer : peers) {
            if (!ok) {
                break;
            }
            host::ipc_handle handle = sharing.export_prefix(prefix).value();
            ok = host::send_handle(peer.control, handle.record()).has_value();
        }
        for (const child& peer : peers) {
            ok = ok && hear(peer.control, "ready");
        }
        const auto end = std::chrono::steady_clock::now();
        std::uint64_t after = pss_bytes(::getpid());
        for (const child& peer : peers) {
            after += peer.pid > 0 ? pss_bytes(peer.pid) : 0;
        }
        for (const child& peer : peers) {
            if (peer.pid > 0) {
                stop_peer(peer);
            }
        }
        if (!ok) {
            state.SkipWithError("a child process did not start, import or answer");
            break;
        }
        state.SetIterationTime(std::chrono::duration<double>(end - start).count());
        pss_total += static_cast<double>(after) - static_cast<double>(before) +
                     static_cast<double>(process_prefix_bytes);
    }
    state.counters["prefix_pss_MiB"] =
        state.iterations() == 0 ? 0 : pss_total / static_cast<double>(state.iterations()) / (1u << 20);
    state.counters["processes"] = processes;
    (void)exporter.release(filled);
    (void)mapping.release_prefix(prefix);
}

std::vector<nxmem::bench::ratio_spec> register_benchmarks() {
    using nxmem::bench::ratio_spec;
    std::vector<ratio_spec> ratios;
    for (const std::uint64_t bytes : {std::uint64_t{64} << 10, std::uint64_t{16} << 20}) {
        const std::string size = size_name(bytes);
        benchmark::RegisterBenchmark(("prefix_round_trip/" + size).c_str(), prefix_round_trip, bytes)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("allocation_round_trip/" + size).c_str(), allocation_round_trip, bytes)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("copy/" + size).c_str(), copy, bytes)->Unit(benchmark::kMicrosecond);
        ratios.push_back({"allocation_round_trip_vs_prefix/" + size,
                          "an allocation's export + send + import + close against a prefix's",
                          "allocation_round_trip/" + size, "prefix_round_trip/" + size});
        ratios.push_back({"allocation_round_trip_vs_copy/" + size,
                          "sharing an allocation against copying its bytes",
                          "allocation_round_trip/" + size, "copy/" + size});
    }
    for (const std::uint64_t bytes : {std::uint64_t{64} << 10, std::uint64_t{2} << 20}) {
        const std::string size = size_name(bytes);
        benchmark::RegisterBenchmark(("lazy_cycle/private/" + size).c_str(), lazy_cycle, bytes, "")
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("lazy_cycle/memfd/" + size).c_str(), lazy_cycle, bytes, "share=memfd")
            ->Unit(benchmark::kMicrosecond);
        ratios.push_back({"lazy_cycle_memfd_vs_private/" + size,
                          "commit + touch + decommit: share=memfd (shmem) against private memory",
                          "lazy_cycle/memfd/" + size, "lazy_cycle/private/" + size});
    }
    for (const std::uint64_t bytes : {std::uint64_t{64} << 10, std::uint64_t{16} << 20}) {
        const std::string size = size_name(bytes);
        for (const char* how : {"mode", "seal", "copy"}) {
            benchmark::RegisterBenchmark(("read_only_export/" + std::string(how) + "/" + size).c_str(),
                                         read_only_export_cost, bytes, std::string(how))
                ->UseManualTime()
                // Each iteration makes and fills a memfd untimed: a fixed count keeps the run short.
                ->Iterations(bytes > (1u << 20) ? 30 : 1000)
                ->Unit(benchmark::kMicrosecond);
        }
        ratios.push_back({"read_only_export_seal_vs_mode/" + size,
                          "a read-only export sealed F_SEAL_FUTURE_WRITE against today's fchmod + reopen",
                          "read_only_export/seal/" + size, "read_only_export/mode/" + size});
        ratios.push_back({"read_only_export_copy_vs_mode/" + size,
                          "a read-only export as a sealed copy against today's fchmod + reopen",
                          "read_only_export/copy/" + size, "read_only_export/mode/" + size});
    }
    for (const int processes : {2, 4, 8}) {
        const std::string count = std::to_string(processes);
        for (const char* mode : {"shared", "copied"}) {
            benchmark::RegisterBenchmark(("prefix_processes/" + std::string(mode) + "/" + count).c_str(),
                                         prefix_processes, std::string(mode), processes)
                ->UseManualTime()
                ->Iterations(3)
                ->Unit(benchmark::kMillisecond);
        }
        ratios.push_back({"prefix_processes_setup_shared_vs_copied/" + count,
                          "time for a 16 MiB prefix to reach " + count + " processes: shared / copied",
                          "prefix_processes/shared/" + count, "prefix_processes/copied/" + count});
        ratios.push_back({"prefix_processes_pss_shared_vs_copied/" + count,
                          "the prefix's memory (summed Pss) across " + count + " processes: shared / copied",
                          "prefix_processes/shared/" + count, "prefix_processes/copied/" + count,
                          "prefix_pss_MiB"});
        ratios.push_back({"prefix_processes_pss_shared_MiB/" + count,
                          "the 16 MiB prefix's memory (summed Pss, MiB) across " + count + " processes, shared",
                          "prefix_processes/shared/" + count, "", "prefix_pss_MiB"});
    }
    return ratios;
}

} // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "--peer") {
        return run_peer(argv[2], std::atoi(argv[3]));
    }
    return nxmem::bench::run_with_ratios(argc, argv, register_benchmarks(), {});
}
