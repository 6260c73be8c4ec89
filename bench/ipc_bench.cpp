// Sharing a prefix across processes (minor 3), timed: export + send over a SOCK_SEQPACKET socket
// pair + receive + import + commit into one sequence + close + release, against copying the same
// bytes (what an engine without shared memory does). Both ends run in this process: the figure is
// the cost of the calls and system calls, not of a context switch. Build and run:
//   ninja -C build/gcc bench/nxmem_ipc_bench && build/gcc/bench/nxmem_ipc_bench
#include <nxmem/host.hpp>

#include <benchmark/benchmark.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

struct sharing_setup {
    std::shared_ptr<nxmem::host::plugin_module> module =
        nxmem::host::plugin_module::load(NXMEM_BENCH_POSIX_PLUGIN).value();
    std::optional<nxmem::host::plugin_allocator<nxmem::cpu_device>> exporter;
    std::optional<nxmem::host::plugin_allocator<nxmem::cpu_device>> importer;
    int ends[2] = {-1, -1};

    sharing_setup() {
        exporter.emplace(nxmem::host::open_allocator<nxmem::cpu_device>(module, "posix-lazy").value());
        importer.emplace(nxmem::host::open_allocator<nxmem::cpu_device>(module, "posix-lazy").value());
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) != 0) {
            throw std::runtime_error("socketpair");
        }
    }
    ~sharing_setup() {
        ::close(ends[0]);
        ::close(ends[1]);
    }
};

void export_send_import_close(benchmark::State& state) {
    const auto bytes = static_cast<std::uint64_t>(state.range(0));
    sharing_setup setup;
    auto mapping = setup.exporter->shared_mapping().value();
    auto sharing = setup.exporter->ipc().value();
    auto imported_mapping = setup.importer->shared_mapping().value();
    auto importing = setup.importer->ipc().value();
    auto prefix = mapping.create_prefix(bytes).value();
    auto filled = setup.exporter->allocate(bytes, 4096).value();
    (void)mapping.commit_prefix(filled, prefix).value();
    std::memset(filled.address, 0x42, bytes);
    for (auto _ : state) {
        nxmem::host::ipc_handle handle = sharing.export_prefix(prefix).value();
        nxmem::host::send_handle(setup.ends[0], handle.record()).value();
        nxmem::host::ipc_handle received = nxmem::host::receive_handle(setup.ends[1]).value();
        auto imported = importing.import(received).value();
        auto sequence = setup.importer->allocate(bytes, 4096).value();
        (void)imported_mapping.commit_prefix(sequence, imported.prefix()).value();
        benchmark::DoNotOptimize(static_cast<const unsigned char*>(sequence.address)[bytes - 1]);
        imported.close().value();
        (void)setup.importer->release(sequence).value();
    }
    (void)setup.exporter->release(filled);
    (void)mapping.release_prefix(prefix);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

// The alternative: the decode side copies the prefill's bytes into its own memory.
void copy_instead(benchmark::State& state) {
    const auto bytes = static_cast<std::size_t>(state.range(0));
    std::vector<unsigned char> source(bytes, 0x42);
    for (auto _ : state) {
        std::vector<unsigned char> copy(bytes);
        std::memcpy(copy.data(), source.data(), bytes);
        benchmark::DoNotOptimize(copy.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

} // namespace

BENCHMARK(export_send_import_close)->Arg(64 << 10)->Arg(16 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK(copy_instead)->Arg(64 << 10)->Arg(16 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
