// nxmem_transfer_bench: the transfer layer against ucx_perftest on the same transport, in the same
// run (docs/TRANSFER.md, "What it costs"), over anonymous mappings; the measurements are
// measure/transfer_figures.hpp's, shared with `nxmem transfer` (which measures a plugin's memory).
//
// For each transport (tcp, sm): a forked target registers 64 MiB and serves; this process reads
// from it and writes to it at 4 KiB, 64 KiB, 1 MiB and 16 MiB (16 in flight, and one at a time),
// 1,000 blocks of 4 KiB in one request against 1,000 requests, with ucx_perftest beside each
// (ucp_put_bw for writes, ucp_get for reads). Then the registration cost: one 1 GiB region (a
// pool's reservation) against its memory registered as 100 and as 10,000 tensors.
//
// Prints a table and the in-run ratios; --json PATH writes them as one JSON document, which
// bench/transfer_plot.py turns into a PNG (bandwidth against block size, per transport).
// --quick: fewer iterations (the smoke test). The machine these run on is shared: compare ratios
// from one run, never figures across runs.
#include <measure/transfer_figures.hpp>

#include <sys/mman.h>

#include <cstdio>
#include <fstream>
#include <string>

using namespace nxmem;

namespace {

// Anonymous private mappings, reserved without swap (the registration cost's 1 GiB is never
// touched), registered as memory of the bench's own.
result<measure::held_memory> map_anonymous(std::uint64_t bytes) {
    void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
        return fail(status_code::out_of_memory, "mmap of " + std::to_string(bytes) + " bytes failed");
    }
    measure::held_memory held;
    held.base = static_cast<std::byte*>(memory);
    held.bytes = bytes;
    held.owner = std::shared_ptr<void>(memory, [bytes](void* mapped) { ::munmap(mapped, bytes); });
    held.register_whole = [memory, bytes](transfer::agent& agent) { return agent.register_memory(memory, bytes); };
    return held;
}

} // namespace

int main(int argc, char** argv) {
    std::string json_path;
    measure::transfer_bench_options options;
    bool chose_transports = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--quick") {
            options.quick = true;
        } else if (arg == "--json" && i + 1 < argc) {
            json_path = argv[++i];
        } else if (arg == "--transports" && i + 1 < argc) {
            // One UCX_TLS value per --transports (repeat it for more): "tcp", "sm", "cma,posix".
            if (!chose_transports) {
                options.transports.clear();
                chose_transports = true;
            }
            options.transports.push_back(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: nxmem_transfer_bench [--quick] [--json PATH] [--transports UCX_TLS]...\n");
            return 2;
        }
    }
    ::setenv("UCX_LOG_LEVEL", "error", 0);
    ::setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    const result<nlohmann::json> document = measure::run_transfer_bench(options, map_anonymous, stdout);
    if (!document) {
        std::fprintf(stderr, "nxmem_transfer_bench: %s\n", document.error().describe().c_str());
        return 1;
    }
    if (!json_path.empty()) {
        std::ofstream(json_path) << document.value().dump(2) << "\n";
    }
    return 0;
}
