// The transformer of issue 22 (6 layers, d_model 512, batch 8 x 128, OpenBLAS) with PyTorch's own
// CPU allocator and with nxmem's posix plugin (direct and pooled, eager and lazy): a forward pass
// and a training step, at 1 and 2 threads, in interleaved rounds (every allocator once per round,
// the order rotating), medians and minor page faults per pass (getrusage), ratios against
// PyTorch's allocator in the same run.
//
//   torch_bench [--rounds N] [--threads 1,2] [--shape small] [--trace DIR] [--contenders ...]
//   [--colour 1]   (--help says more)
//
// OMP_WAIT_POLICY: unless the environment sets it, the bench runs itself again with PASSIVE.
// PyTorch's intra-op threads are libgomp's, and an idle libgomp worker spins (ACTIVE, the
// default) while OpenBLAS's own pthread workers run the matrix products; with 2 threads on a
// 2-core machine the spinning worker takes a core from OpenBLAS, a 2-thread forward pass then takes
// 1.8-2.3x the time it takes with PASSIVE (slower than 1 thread), and how much depends on timing,
// which swamps the allocator being measured. `OMP_WAIT_POLICY=ACTIVE torch_bench` measures that.
// libgomp reads the variable once, when it is loaded, hence running again rather than setenv.
//
// --trace DIR writes the allocation trace of one forward pass and one training step
// (DIR/transformer_forward.trace, DIR/transformer_train_step.trace; format in bench/traces/README.md)
// and their size distributions, and measures nothing.
#include "torch_installation.hpp"
#include "transformer_workload.hpp"

#include <CLI/CLI.hpp>

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace nxmem;
using torch_engine::installation;
using torch_engine::transformer_shape;
using torch_engine::transformer_workload;

// PyTorch's threads and OpenBLAS's threads (OpenBLAS has its own pool; the call is looked up at
// run time because libtorch reaches OpenBLAS through Debian's libblas.so.3 alternative).
void set_threads(int threads) {
    at::set_num_threads(threads);
    using set_fn = void (*)(int);
    if (auto set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
        set(threads);
    } else {
        std::fprintf(stderr, "torch_bench: openblas_set_num_threads not found: is OpenBLAS libblas.so.3?\n");
    }
}

// Minor faults and CPU seconds (user + system, all threads) of the process so far.
struct process_counts {
    long faults = 0;
    double cpu_seconds = 0;
};
process_counts process_now() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
    return {usage.ru_minflt, seconds(usage.ru_utime) + seconds(usage.ru_stime)};
}

// Wall time is the figure; CPU time is also kept, since on a loaded machine it varies less (it
// counts what the pass itself spent, not the time other processes held the cores).
struct sample {
    double seconds = 0;
    double cpu_seconds = 0;
    long faults = 0;
};

template <class Pass> sample measure(Pass&& pass) {
    const process_counts before = process_now();
    const auto start = std::chrono::steady_clock::now();
    pass();
    const auto stop = std::chrono::steady_clock::now();
    const process_counts after = process_now();
    return {std::chrono::duration<double>(stop - start).count(), after.cpu_seconds - before.cpu_seconds,
            after.faults - before.faults};
}

template <class T> T median(std::vector<T> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

struct contender {
    std::string name;
    c10::Allocator* allocator;
};

// ---- the trace: every allocation and free c10 asks of the CPU allocator ----
class tracing_allocator final : public c10::Allocator {
public:
    explicit tracing_allocator(c10::Allocator& upstream) : upstream_(upstream) {}
    c10::DataPtr allocate(std::size_t bytes) const override {
        if (bytes == 0) {
            ++zero_sized_;
            return upstream_.allocate(0); // nxmem's adapter never passes size 0 on: not traced
        }
        auto* traced = new record{upstream_.allocate(bytes), next_id_++, this};
        events_.push_back("a " + std::to_string(bytes) + " " + std::to_string(traced->id));
        sizes_.push_back(bytes);
        void* data = traced->data.get();
        return {data, traced, &release, c10::Device(c10::DeviceType::CPU)};
    }
    std::vector<std::string> take_events() { return std::exchange(events_, {}); }
    std::vector<std::size_t> take_sizes() { return std::exchange(sizes_, {}); }
    std::size_t take_zero_sized() { return std::exchange(zero_sized_, 0); }

private:
    struct record {
        c10::DataPtr data;
        std::uint64_t id;
        const tracing_allocator* owner;
    };
    static void release(void* context) {
        auto* traced = static_cast<record*>(context);
        traced->owner->events_.push_back("f " + std::to_string(traced->id));
        delete traced;
    }
    c10::Allocator& upstream_;
    mutable std::uint64_t next_id_ = 1;
    mutable std::vector<std::string> events_;
    mutable std::vector<std::size_t> sizes_;
    mutable std::size_t zero_sized_ = 0;
};

// ---- colouring: each tensor placed at a different cache-line offset within its first page ----
// An experiment on placement (--colour): the upstream's block is 4 KiB larger and the tensor
// starts 64 B x (0..63) into it, the offset cycling, as glibc's heap offsets vary.
class colouring_allocator final : public c10::Allocator {
public:
    explicit colouring_allocator(c10::Allocator& upstream) : upstream_(upstream) {}
    c10::DataPtr allocate(std::size_t bytes) const override {
        if (bytes == 0) {
            return upstream_.allocate(0);
        }
        const std::size_t offset = (next_colour_.fetch_add(1, std::memory_order_relaxed) * 29 % 64) * 64;
        auto* held = new c10::DataPtr(upstream_.allocate(bytes + 4096));
        void* data = static_cast<char*>(held->get()) + offset;
        return {data, held, &release, c10::Device(c10::DeviceType::CPU)};
    }

private:
    static void release(void* context) { delete static_cast<c10::DataPtr*>(context); }
    c10::Allocator& upstream_;
    mutable std::atomic<std::size_t> next_colour_{0};
};

void write_trace(const std::string& path, const std::string& what, std::vector<std::string> events,
                 std::vector<std::size_t> sizes, std::size_t zero_sized) {
    std::ofstream out(path);
    std::uint64_t total = 0;
    for (std::size_t size : sizes) {
        total += size;
    }
    out << "# nxmem allocation trace (bench/traces/README.md): " << what << "\n"
        << "# PyTorch 1.13 CPU, torch::nn::TransformerEncoder 6 layers, d_model 512, 8 heads, "
           "feedforward 2048, batch 8 x 128, float32\n"
        << "# " << sizes.size() << " allocations, " << total << " bytes; " << zero_sized
        << " size-0 requests not traced (the adapter serves them without an allocation)\n";
    for (const std::string& event : events) {
        out << event << "\n";
    }
    // The distribution, for the report: by power-of-two class, count and bytes.
    std::map<int, std::pair<std::size_t, std::uint64_t>> classes;
    for (std::size_t size : sizes) {
        int log2 = 0;
        while ((std::size_t{1} << log2) < size) {
            ++log2;
        }
        classes[log2].first += 1;
        classes[log2].second += size;
    }
    std::printf("%s: %zu allocations, %.1f MiB (%zu size-0 requests)\n  size up to   count    MiB\n",
                what.c_str(), sizes.size(), static_cast<double>(total) / (1 << 20), zero_sized);
    for (const auto& [log2, figures] : classes) {
        std::printf("  %10llu  %6zu  %6.1f\n", 1ULL << log2, figures.first,
                    static_cast<double>(figures.second) / (1 << 20));
    }
}

int trace(const std::string& directory, const transformer_shape& shape) {
    set_threads(1);
    transformer_workload workload(shape);
    workload.train_step(); // the first step makes the optimizer's momenta: trace a steady one
    tracing_allocator tracer(*c10::GetCPUAllocator());
    c10::Allocator* pytorch = pytorch::install_cpu_allocator(tracer);
    workload.forward(); // the output dies inside the traced window
    auto forward_events = tracer.take_events();
    auto forward_sizes = tracer.take_sizes();
    auto forward_zero = tracer.take_zero_sized();
    workload.train_step();
    auto step_events = tracer.take_events();
    auto step_sizes = tracer.take_sizes();
    auto step_zero = tracer.take_zero_sized();
    c10::SetCPUAllocator(pytorch, 0);
    write_trace(directory + "/transformer_forward.trace", "one forward pass (no gradients)",
                std::move(forward_events), std::move(forward_sizes), forward_zero);
    write_trace(directory + "/transformer_train_step.trace",
                "one training step (forward, MSE loss, backward, SGD with momentum; gradients zeroed in place)",
                std::move(step_events), std::move(step_sizes), step_zero);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0); // each table line as soon as it is measured
    int rounds = 11;
    std::vector<int> thread_counts{1, 2};
    std::string shape_name = "full";
    std::string trace_directory;
    std::vector<std::string> chosen; // empty: all
    int colour = 0;
    CLI::App app{"The transformer of issue 22 with PyTorch's CPU allocator and nxmem's posix plugin, direct and "
                 "pooled: median forward pass and training step times, ratios against PyTorch's allocator "
                 "(docs/TORCH.md, \"Cost\")",
                 "torch_bench"};
    app.add_option("--rounds", rounds, "Interleaved rounds, after one warm-up round")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    app.add_option("--threads", thread_counts, "PyTorch's intra-op thread counts to measure, e.g. 1,2")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    app.add_option("--shape", shape_name, "The model: full (issue 22's) or small (a quick look)")
        ->capture_default_str()
        ->check(CLI::IsMember({"full", "small"}));
    app.add_option("--trace", trace_directory,
                   "Write the allocation traces of one forward pass and one training step to DIR and measure "
                   "nothing (format: bench/traces/README.md)");
    app.add_option("--contenders", chosen, "A subset of the nxmem contenders (PyTorch's allocator is always measured)")
        ->delimiter(',')
        ->check(CLI::IsMember({"eager-direct", "eager-pooled", "lazy-direct", "lazy-pooled"}));
    app.add_option("--colour", colour, "1: add each contender again with its tensors at varied cache-line offsets")
        ->check(CLI::Range(0, 1));
    CLI11_PARSE(app, argc, argv);
    if (const char* policy = std::getenv("OMP_WAIT_POLICY"); policy == nullptr || *policy == '\0') { // see the top
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);
        std::perror("torch_bench: running again with OMP_WAIT_POLICY=PASSIVE");
        return 1;
    }
    const transformer_shape shape = shape_name == "small" ? torch_engine::small_transformer : transformer_shape{};
    if (!trace_directory.empty()) {
        return trace(trace_directory, shape);
    }
    const char* plugin = std::getenv("NXMEM_POSIX_PLUGIN");
    if (plugin == nullptr) {
        plugin = NXMEM_BENCH_POSIX_PLUGIN;
    }

    // The model is made with PyTorch's allocator; each pass's tensors come from the contender.
    std::vector<contender> contenders{{"PyTorch's allocator", c10::GetCPUAllocator()}};
    for (const char* mechanism : {"posix-eager", "posix-lazy"}) {
        for (bool pooled : {false, true}) {
            const std::string key = std::string(mechanism + 6) + (pooled ? "-pooled" : "-direct");
            if (!chosen.empty() && std::find(chosen.begin(), chosen.end(), key) == chosen.end()) {
                continue;
            }
            auto& installed = installation::install(plugin, mechanism, "", pooled);
            contenders.push_back({std::string("nxmem ") + mechanism + (pooled ? " pooled" : " direct"),
                                  &installed.allocator()});
            if (colour == 1) {
                contenders.push_back({std::string("nxmem ") + mechanism + (pooled ? " pooled" : " direct") +
                                          " col",
                                      new colouring_allocator(installed.allocator())});
            }
        }
    }
    installation::uninstall();
    transformer_workload workload(shape);

    std::printf("transformer %lld layers, d_model %lld, batch %lld x %lld; %d interleaved rounds, medians; "
                "OMP_WAIT_POLICY=%s\n",
                static_cast<long long>(shape.layers), static_cast<long long>(shape.d_model),
                static_cast<long long>(shape.batch), static_cast<long long>(shape.sequence), rounds,
                std::getenv("OMP_WAIT_POLICY"));
    for (int threads : thread_counts) {
        set_threads(threads);
        std::vector<std::vector<sample>> forward(contenders.size()), step(contenders.size());
        for (int round = -1; round < rounds; ++round) { // round -1 warms every contender up
            for (std::size_t k = 0; k < contenders.size(); ++k) {
                const std::size_t which = (k + static_cast<std::size_t>(std::max(round, 0))) % contenders.size();
                pytorch::install_cpu_allocator(*contenders[which].allocator);
                sample f = measure([&] { workload.forward(); });
                sample s = measure([&] { workload.train_step(); });
                if (round >= 0) {
                    forward[which].push_back(f);
                    step[which].push_back(s);
                }
            }
        }
        pytorch::install_cpu_allocator(*contenders[0].allocator);
        auto seconds = [](const std::vector<sample>& samples) {
            std::vector<double> values;
            for (const sample& s : samples) values.push_back(s.seconds);
            return median(values);
        };
        auto cpu = [](const std::vector<sample>& samples) {
            std::vector<double> values;
            for (const sample& s : samples) values.push_back(s.cpu_seconds);
            return median(values);
        };
        auto faults = [](const std::vector<sample>& samples) {
            std::vector<long> values;
            for (const sample& s : samples) values.push_back(s.faults);
            return median(values);
        };
        std::printf("\n%d thread%s          forward ms  ratio  cpu ratio  faults/pass | train step ms  ratio  cpu ratio  faults/pass\n",
                    threads, threads == 1 ? " " : "s");
        const double forward_base = seconds(forward[0]);
        const double step_base = seconds(step[0]);
        const double forward_cpu_base = cpu(forward[0]);
        const double step_cpu_base = cpu(step[0]);
        for (std::size_t k = 0; k < contenders.size(); ++k) {
            std::printf("%-27s %8.1f  %5.3f  %9.3f  %11ld | %13.1f  %5.3f  %9.3f  %11ld\n", contenders[k].name.c_str(),
                        seconds(forward[k]) * 1e3, seconds(forward[k]) / forward_base,
                        cpu(forward[k]) / forward_cpu_base, faults(forward[k]), seconds(step[k]) * 1e3,
                        seconds(step[k]) / step_base, cpu(step[k]) / step_cpu_base, faults(step[k]));
        }
        std::printf("(ratio: median wall time against PyTorch's allocator; cpu ratio: median CPU time, user + system)\n");
    }
    return 0;
}
