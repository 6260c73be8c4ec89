#include "transfer.hpp"

#include "plugin_args.hpp"

#include <measure/plugin_figures.hpp>
#include <measure/transfer_figures.hpp>

#include <nxmem/host.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::tool {

namespace {

struct transfer_options {
    std::string plugin;
    std::string mechanism;
    std::string mechanism_options;
    std::vector<std::string> transports;
    std::vector<std::string> sizes;
    std::uint64_t batch = 1000;
    std::string json;
    bool baseline = false;
    bool quick = false;
};

// "4K", "64KiB", "1M", "16MiB", "4096": a block size in bytes (binary suffixes); nothing when it
// is not one.
std::optional<std::uint64_t> parse_block_size(const std::string& text) {
    std::size_t used = 0;
    unsigned long long number = 0;
    try {
        number = std::stoull(text, &used);
    } catch (const std::exception&) {
        return std::nullopt;
    }
    const std::string suffix = text.substr(used);
    unsigned shift = 0;
    if (suffix == "K" || suffix == "k" || suffix == "KiB") {
        shift = 10;
    } else if (suffix == "M" || suffix == "MiB") {
        shift = 20;
    } else if (!suffix.empty() && suffix != "B") {
        return std::nullopt;
    }
    constexpr unsigned long long largest = 1ull << 30; // one block may not exceed 1 GiB
    if (number == 0 || number > (largest >> shift)) {
        return std::nullopt;
    }
    return std::uint64_t{number} << shift;
}

// The plugin's mechanism as the measurements' memory: each piece one allocation of it, committed
// whole where the mechanism commits by range, registered with its lease (register_allocation).
struct plugin_memory {
    host::plugin_allocator<cpu_device> allocator;

    result<measure::held_memory> take(std::uint64_t bytes) const {
        auto opened = std::make_shared<host::plugin_allocator<cpu_device>>(allocator);
        NXMEM_TRY(live, opened->allocate(bytes, 4096));
        // Released when the last holder goes (after its registrations: they are declared later).
        auto owned = std::shared_ptr<allocation<cpu_device>>(new allocation<cpu_device>(live),
                                                             [opened](allocation<cpu_device>* gone) {
                                                                 (void)opened->release(*gone);
                                                                 delete gone;
                                                             });
        if (result<host::virtual_backing_view<cpu_device>> view = opened->virtual_backing()) {
            NXMEM_TRY_VOID(view.value().commit(live, byte_range{0, live.size}));
        }
        measure::held_memory held;
        held.base = static_cast<std::byte*>(live.address);
        held.bytes = bytes;
        held.register_whole = [opened, owned](transfer::agent& agent) {
            return agent.register_allocation(*opened, *owned);
        };
        held.owner = std::move(owned);
        return held;
    }
};

int run_transfer(const transfer_options& options) {
    const std::string where = "nxmem transfer: " + options.plugin + ": ";
    measure::transfer_bench_options wanted;
    wanted.tool = "nxmem transfer";
    wanted.quick = options.quick;
    wanted.baseline = options.baseline;
    wanted.batch_blocks = options.batch;
    if (!options.transports.empty()) {
        wanted.transports = options.transports;
    }
    if (!options.sizes.empty()) {
        wanted.sizes.clear();
        for (const std::string& size : options.sizes) {
            wanted.sizes.push_back(*parse_block_size(size)); // validated when parsed
        }
    }
    if (options.quick) {
        // A smoke run: a 64 MiB pool against 100 and 1,000 of its tensors.
        wanted.pool_bytes = 64ull << 20;
        wanted.tensor_counts = {100, 1000};
    }

    result<std::shared_ptr<host::plugin_module>> module = host::plugin_module::load(std::filesystem::absolute(options.plugin));
    if (!module) {
        std::cerr << where << module.error().describe() << '\n';
        return exit_refused;
    }
    result<std::string> mechanism = measure::pick_cpu_mechanism(*module.value(), options.mechanism);
    if (!mechanism) {
        std::cerr << where << mechanism.error().describe()
                  << " (the transfer layer registers host memory only, docs/TRANSFER.md)\n";
        return exit_refused;
    }
    result<host::plugin_allocator<cpu_device>> allocator =
        host::open_allocator<cpu_device>(module.value(), mechanism.value(), 0, options.mechanism_options);
    if (!allocator) {
        std::cerr << where << "mechanism '" << mechanism.value() << "': " << allocator.error().describe() << '\n';
        return exit_refused;
    }
    ::setenv("UCX_LOG_LEVEL", "error", 0);
    ::setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    std::printf("%s: mechanism '%s' on cpu:0%s%s\n", options.plugin.c_str(), mechanism.value().c_str(),
                options.mechanism_options.empty() ? "" : ", options ", options.mechanism_options.c_str());
    const plugin_memory memory{std::move(allocator).value()};
    result<nlohmann::json> document = measure::run_transfer_bench(
        wanted, [&memory](std::uint64_t bytes) { return memory.take(bytes); }, stdout);
    if (!document) {
        std::cerr << where << document.error().describe() << '\n';
        return exit_refused;
    }
    document.value()["context"]["plugin"] = options.plugin;
    document.value()["context"]["mechanism"] = mechanism.value();
    document.value()["context"]["options"] = options.mechanism_options;
    std::printf("Ratios come from one run of this process; absolute figures depend on the machine.\n");
    if (!options.json.empty()) {
        std::ofstream file(options.json);
        file << document.value().dump(2) << '\n';
        if (!file.flush()) {
            std::cerr << "nxmem transfer: cannot write " << options.json << '\n';
            return exit_refused;
        }
    }
    std::fflush(stdout);
    return std::ferror(stdout) ? exit_refused : exit_ok;
}

} // namespace

subcommand add_transfer(CLI::App& parent) {
    auto options = std::make_shared<transfer_options>();
    CLI::App* transfer = parent.add_subcommand(
        "transfer", "Measure reads and writes of a plugin's host memory through the transfer layer (UCX).");
    transfer->footer(
        "Opens one mechanism on cpu:0 and, for each transport: forks a target that registers an\n"
        "allocation of it (64 MiB or more) and serves; this process reads from it and writes to\n"
        "it with single-block requests, 16 in flight (MiB/s, us per transfer) and one at a time\n"
        "(us), at each block size; then --batch blocks of 4 KiB in one request against as many\n"
        "requests; then the registration cost: one 1 GiB allocation (a pool) against its memory\n"
        "registered as 100 and 10,000 tensors. With --baseline, ucx_perftest on the same transport\n"
        "(ucp_get for reads, ucp_put_bw for writes; a server and a client on 127.0.0.1) beside each\n"
        "figure, where it is installed. Network: loopback only. Read the ratios: absolute figures\n"
        "depend on the machine. docs/TRANSFER.md, \"What it costs\".\n"
        "\n"
        "Exit status: 0 when every figure was measured, 1 when the plugin or mechanism was\n"
        "refused, UCX could not be used or a transfer failed, 2 on bad usage.");
    add_plugin_argument(*transfer, options->plugin, "The plugin shared object (.so)")->required();
    add_mechanism_option(*transfer, options->mechanism,
                         "The mechanism (factory) whose memory is measured (default: the first serving cpu)");
    add_mechanism_options_option(*transfer, options->mechanism_options,
                                 "Open the mechanism with these options (key=value entries separated by ';')");
    transfer->add_option("--transport", options->transports, "UCX transports to measure, each in turn (default: tcp,sm)")
        ->type_name("tcp|sm")
        ->delimiter(',')
        ->check(CLI::IsMember({"tcp", "sm"}));
    transfer->add_option("--sizes", options->sizes, "Block sizes (default: 4K,64K,1M,16M; suffixes K, M)")
        ->type_name("SIZE,...")
        ->delimiter(',')
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                return parse_block_size(text) ? std::string() : "'" + text + "' is not a block size from 1 B to 1 GiB (4096, 64K, 1M)";
            },
            std::string()));
    transfer->add_option("--batch", options->batch, "Blocks of 4 KiB in the batched request")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{16384}));
    transfer->add_option("--json", options->json, "Also write the figures as one JSON document to FILE")->type_name("FILE");
    transfer->add_flag("--baseline", options->baseline,
                       "Run ucx_perftest on the same transport beside each figure (when it is not installed, "
                       "the output says so and the figures are nxmem's alone)");
    transfer->add_flag("--quick", options->quick,
                       "A smoke run of a few seconds: short timed runs, one batch round, a 64 MiB pool against "
                       "100 and 1,000 tensors");
    return {transfer, [options] { return run_transfer(*options); }};
}

} // namespace nxmem::tool
