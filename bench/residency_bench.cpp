// Residency (issue 33), measured: a resident_pool over posix-lazy holding SIZE of weights (1 to
// 16 MiB tensors, every byte written) put to sleep and woken with each policy, against the
// physical floor of the same work measured in the same benchmark, iteration by iteration (the two
// take turns, so a busy machine slows both alike). Table and in-run ratios, or one JSON document
// with --benchmark_format=json:
//   sleep_wake/discard|host|file/SIZE  the time is the pool's sleep + wake (discard: + the first
//                               touch of every page of the tensors, see below); counters, in ms
//                               per iteration: sleep_ms, wake_ms, first_touch_ms and
//                               wake_touched_ms (discard: the touch, and wake + touch),
//                               sleep_wake_ms (their sum, the time), floor_sleep_ms,
//                               floor_wake_ms, floor_ms; the fastest iteration of each
//                               (sleep_wake_best_ms, floor_best_ms); page faults per iteration
//                               (faults_sleep, faults_wake, floor_faults_sleep,
//                               floor_faults_wake); what the pool walked (ranges, walked_MiB:
//                               committed ranges and their bytes; content_MiB: the tensors')
// The floors, on a plain anonymous mapping S of the same bytes filled with the same data (no
// huge pages, as posix-lazy's default), in the same process:
//   host     sleep: mmap a fresh buffer B, memcpy S -> B, madvise(S, MADV_DONTNEED);
//            wake: memcpy B -> S, munmap B. The page faults of both fresh buffers (B as it is
//            written, S as it is written again) are in the floor: the pool pays them too (its
//            backup is mmap'd MAP_POPULATE, its pages are committed again and written by the
//            restore), as it pays giving both back (decommit at sleep, the backup's munmap at wake).
//   file     sleep: a fresh file in the same directory (O_TMPFILE, as the pool's), write S to it,
//            madvise(S, MADV_DONTNEED); wake: read it back into S (freshly mapped memory: every
//            page faults in as it is read into), close the file. No fsync on either side: the
//            bytes go to the page cache, as the pool's do.
//   discard  sleep: madvise(S, MADV_DONTNEED); wake: write one byte on every page of S. The pool's
//            wake commits the ranges again (mprotect) but faults nothing in: an engine pays that
//            at first use, so the pool's figure includes the same touch of every tensor page
//            (first_touch_ms) for a like-for-like ratio.
// Environment: NXMEM_BENCH_DIR, the directory of the file backups (default /tmp);
// NXMEM_BENCH_RESIDENCY_MIB, the sizes in MiB, comma-separated (default 64,256,1024,2048; the
// smoke test gives tiny ones); NXMEM_BENCH_LAZY_OPTIONS, posix-lazy's open options for the pool
// (default none; e.g. populate=1, so the commits of wake pre-fault with MADV_POPULATE_WRITE).
// Build and run: ninja -C build/gcc bench/nxmem_residency_bench && build/gcc/bench/nxmem_residency_bench
#include "ratio_summary.hpp"

#include <nxmem/host.hpp>
#include <nxmem/residency.hpp>

#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using nxmem::cpu_device;
namespace host = nxmem::host;
using resident = nxmem::resident_pool<host::plugin_allocator<cpu_device>>;

constexpr std::uint64_t page = 4096;
constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t largest_tensor = 16 * mib;

std::string size_name(std::uint64_t bytes) {
    if (bytes >= (std::uint64_t{1} << 30) && bytes % (std::uint64_t{1} << 30) == 0) {
        return std::to_string(bytes >> 30) + "GiB";
    }
    return std::to_string(bytes >> 20) + "MiB";
}

std::string backup_directory() {
    const char* set = std::getenv("NXMEM_BENCH_DIR");
    return set != nullptr && *set != '\0' ? std::string(set) : std::string("/tmp");
}

// The sizes to measure: NXMEM_BENCH_RESIDENCY_MIB, or 64 MiB to 2 GiB. Empty when the variable
// names none.
std::vector<std::uint64_t> content_sizes() {
    const char* set = std::getenv("NXMEM_BENCH_RESIDENCY_MIB");
    if (set == nullptr || *set == '\0') {
        return {64 * mib, 256 * mib, 1024 * mib, 2048 * mib};
    }
    std::vector<std::uint64_t> sizes;
    const std::string text(set);
    for (std::size_t at = 0; at <= text.size();) {
        const std::size_t comma = std::min(text.find(',', at), text.size());
        const std::string each = text.substr(at, comma - at);
        char* end = nullptr;
        const unsigned long long value = std::strtoull(each.c_str(), &end, 10);
        if (each.empty() || *end != '\0' || value == 0 || value > (std::uint64_t{1} << 20)) {
            return {};
        }
        sizes.push_back(value * mib);
        at = comma + 1;
    }
    return sizes;
}

// Tensors as a model has them, 1 to 16 MiB (the last one cut to what remains).
std::vector<std::uint64_t> tensor_sizes(std::uint64_t bytes) {
    static constexpr std::uint64_t cycle[] = {1, 4, 2, 16, 8, 3, 12, 6, 1, 10};
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t placed = 0, index = 0; placed < bytes; ++index) {
        const std::uint64_t size = std::min(cycle[index % std::size(cycle)] * mib, bytes - placed);
        sizes.push_back(size);
        placed += size;
    }
    return sizes;
}

// Every word written, none zero (a page of zeros would cost less to back up than weights).
std::uint64_t word_at(std::uint64_t seed, std::uint64_t index) noexcept {
    return ((seed << 40) ^ index) * 0x9e3779b97f4a7c15ULL | 1;
}
void fill(void* memory, std::uint64_t bytes, std::uint64_t seed) {
    auto* words = static_cast<std::uint64_t*>(memory);
    for (std::uint64_t index = 0; index < bytes / 8; ++index) {
        words[index] = word_at(seed, index);
    }
}
bool holds(const void* memory, std::uint64_t bytes, std::uint64_t seed) {
    const auto* words = static_cast<const std::uint64_t*>(memory);
    bool same = true;
    for (std::uint64_t index = 0; index < bytes / 8; ++index) {
        same &= words[index] == word_at(seed, index);
    }
    return same;
}

void touch_pages(void* memory, std::uint64_t bytes) {
    auto* bytes_of = static_cast<volatile unsigned char*>(memory);
    for (std::uint64_t offset = 0; offset < bytes; offset += page) {
        bytes_of[offset] = 1;
    }
}

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This thread's page faults so far (minor and major).
double faults() {
    rusage used{};
    ::getrusage(RUSAGE_THREAD, &used);
    return static_cast<double>(used.ru_minflt + used.ru_majflt);
}

// An unnamed file in `directory`, as the pool's file backup makes one (O_TMPFILE, else a named
// file unlinked at once); -1 when neither can be made.
int fresh_file(const std::string& directory) {
    int descriptor = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (descriptor >= 0) {
        return descriptor;
    }
    std::string name = directory + "/nxmem-residency-bench-XXXXXX";
    descriptor = ::mkostemp(name.data(), O_CLOEXEC);
    if (descriptor >= 0) {
        ::unlink(name.c_str());
    }
    return descriptor;
}

bool write_all(int descriptor, const unsigned char* from, std::uint64_t bytes) {
    for (std::uint64_t done = 0; done < bytes;) {
        const ssize_t wrote = ::write(descriptor, from + done, std::min<std::uint64_t>(bytes - done, 1u << 30));
        if (wrote < 0 && errno == EINTR) {
            continue;
        }
        if (wrote <= 0) {
            return false;
        }
        done += static_cast<std::uint64_t>(wrote);
    }
    return true;
}
bool read_all(int descriptor, unsigned char* into, std::uint64_t bytes) {
    for (std::uint64_t done = 0; done < bytes;) {
        const ssize_t got = ::read(descriptor, into + done, std::min<std::uint64_t>(bytes - done, 1u << 30));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return false;
        }
        done += static_cast<std::uint64_t>(got);
    }
    return true;
}

// The floor's memory: a plain anonymous mapping of `bytes`, filled as the tensors are.
class floor_memory {
public:
    floor_memory(std::uint64_t bytes, std::string directory) : bytes_(bytes), directory_(std::move(directory)) {
        void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memory_ = mapped == MAP_FAILED ? nullptr : static_cast<unsigned char*>(mapped);
        if (memory_ != nullptr) {
            fill(memory_, bytes, 0);
        }
    }
    ~floor_memory() {
        if (memory_ != nullptr) {
            ::munmap(memory_, bytes_);
        }
        if (backup_ != nullptr) {
            ::munmap(backup_, bytes_);
        }
        if (file_ >= 0) {
            ::close(file_);
        }
    }
    floor_memory(const floor_memory&) = delete;
    floor_memory& operator=(const floor_memory&) = delete;

    bool mapped() const noexcept { return memory_ != nullptr; }
    bool holds_its_data() const { return holds(memory_, bytes_, 0); }

    // The floor of a sleep and of a wake with `policy`; false (with `why`) when a call failed.
    bool sleep(nxmem::sleep_policy_kind policy, std::string& why) {
        if (policy == nxmem::sleep_policy_kind::host) {
            void* mapped = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (mapped == MAP_FAILED) {
                why = "floor: mmap of the host buffer failed";
                return false;
            }
            backup_ = static_cast<unsigned char*>(mapped);
            std::memcpy(backup_, memory_, bytes_);
        } else if (policy == nxmem::sleep_policy_kind::file) {
            file_ = fresh_file(directory_);
            if (file_ < 0 || !write_all(file_, memory_, bytes_)) {
                why = "floor: writing a fresh file in " + directory_ + " failed: " + std::strerror(errno);
                return false;
            }
        }
        if (::madvise(memory_, bytes_, MADV_DONTNEED) != 0) {
            why = "floor: madvise(MADV_DONTNEED) failed";
            return false;
        }
        return true;
    }
    bool wake(nxmem::sleep_policy_kind policy, std::string& why) {
        if (policy == nxmem::sleep_policy_kind::host) {
            std::memcpy(memory_, backup_, bytes_);
            ::munmap(backup_, bytes_);
            backup_ = nullptr;
        } else if (policy == nxmem::sleep_policy_kind::file) {
            const bool read = ::lseek(file_, 0, SEEK_SET) == 0 && read_all(file_, memory_, bytes_);
            ::close(file_);
            file_ = -1;
            if (!read) {
                why = "floor: reading the file back failed";
                return false;
            }
        } else {
            touch_pages(memory_, bytes_);
        }
        benchmark::ClobberMemory();
        return true;
    }

private:
    std::uint64_t bytes_;
    std::string directory_;
    unsigned char* memory_ = nullptr;
    unsigned char* backup_ = nullptr;
    int file_ = -1;
};

std::shared_ptr<host::plugin_module> load_posix() {
    auto loaded = host::plugin_module::load(NXMEM_BENCH_POSIX_PLUGIN);
    return loaded.has_value() ? loaded.value() : nullptr;
}

nxmem::sleep_policy policy_of(nxmem::sleep_policy_kind kind, const std::string& directory) {
    switch (kind) {
    case nxmem::sleep_policy_kind::host: return nxmem::sleep_policy::host();
    case nxmem::sleep_policy_kind::file: return nxmem::sleep_policy::file_in(directory);
    case nxmem::sleep_policy_kind::discard: break;
    }
    return nxmem::sleep_policy::discard();
}

// Sums over the iterations, and the fastest.
struct phase_totals {
    double sleep = 0, wake = 0, touch = 0, faults_sleep = 0, faults_wake = 0;
    double best = std::numeric_limits<double>::infinity();
};

void sleep_wake(benchmark::State& state, nxmem::sleep_policy_kind kind, std::uint64_t bytes) {
    const std::string directory = backup_directory();
    auto module = load_posix();
    if (!module) {
        state.SkipWithError("the posix plugin did not load");
        return;
    }
    const char* lazy_options = std::getenv("NXMEM_BENCH_LAZY_OPTIONS");
    auto upstream = host::open_allocator<cpu_device>(module, "posix-lazy", 0, lazy_options != nullptr ? lazy_options : "");
    if (!upstream.has_value()) {
        state.SkipWithError(upstream.error().describe().c_str());
        return;
    }
    nxmem::pool_options options;
    // Every tensor is carved from the pool's one reservation (none passes through), which holds
    // them all with room to spare.
    options.pass_through_bytes = 2 * largest_tensor;
    options.reserve_bytes = 2 * bytes + 64 * mib;
    std::optional<resident> pool(std::in_place, "weights", options, std::move(upstream).value());
    std::vector<nxmem::allocation<cpu_device>> tensors;
    for (const std::uint64_t size : tensor_sizes(bytes)) {
        auto made = pool->allocate(size, 64);
        if (!made.has_value()) {
            state.SkipWithError(made.error().describe().c_str());
            return;
        }
        tensors.push_back(made.value());
        fill(made.value().address, size, tensors.size());
    }
    floor_memory baseline(bytes, directory);
    if (!baseline.mapped()) {
        state.SkipWithError("the floor's memory could not be mapped");
        return;
    }
    const nxmem::sleep_policy policy = policy_of(kind, directory);

    phase_totals pooled;
    phase_totals physical;
    double ranges = 0;
    double walked = 0;
    std::string failure;
    const auto run_pool = [&]() -> double {
        const double f0 = faults();
        const double t0 = now_seconds();
        auto slept = pool->sleep(policy);
        const double t1 = now_seconds();
        const double f1 = faults();
        if (!slept.has_value()) {
            failure = slept.error().describe();
            return -1;
        }
        auto woken = pool->wake();
        const double t2 = now_seconds();
        if (!woken.has_value()) {
            failure = woken.error().describe();
            return -1;
        }
        if (kind == nxmem::sleep_policy_kind::discard) {
            for (const auto& tensor : tensors) {
                touch_pages(tensor.address, tensor.size);
            }
        }
        const double t3 = now_seconds();
        const double f3 = faults();
        pooled.sleep += t1 - t0;
        pooled.wake += t2 - t1;
        pooled.touch += t3 - t2;
        pooled.faults_sleep += f1 - f0;
        pooled.faults_wake += f3 - f1;
        pooled.best = std::min(pooled.best, t3 - t0);
        ranges += static_cast<double>(slept.value().ranges);
        walked += static_cast<double>(slept.value().bytes);
        return t3 - t0;
    };
    const auto run_floor = [&]() -> bool {
        const double f0 = faults();
        const double t0 = now_seconds();
        if (!baseline.sleep(kind, failure)) {
            return false;
        }
        const double t1 = now_seconds();
        const double f1 = faults();
        if (!baseline.wake(kind, failure)) {
            return false;
        }
        const double t2 = now_seconds();
        const double f2 = faults();
        physical.sleep += t1 - t0;
        physical.wake += t2 - t1;
        physical.faults_sleep += f1 - f0;
        physical.faults_wake += f2 - f1;
        physical.best = std::min(physical.best, t2 - t0);
        return true;
    };

    // One untimed round of each first: the first file backups of a run fill the page cache with
    // pages the kernel had not handed out before (a write of 1 GiB took 2 to 4.4 s in the first
    // rounds, 0.2 s after, here), and which of the two pays that must not depend on who goes first.
    if (run_pool() < 0 || !run_floor()) {
        state.SkipWithError(failure.c_str()); // the loop below then runs no iteration
    }
    pooled = {};
    physical = {};
    ranges = 0;
    walked = 0;

    std::uint64_t turn = 0;
    for (auto _ : state) {
        // The two take turns going first, so neither always runs on the other's freed memory or
        // page cache.
        double pool_seconds = 0;
        bool ok = true;
        if (turn++ % 2 == 0) {
            pool_seconds = run_pool();
            ok = pool_seconds >= 0 && run_floor();
        } else {
            ok = run_floor();
            pool_seconds = ok ? run_pool() : -1;
        }
        if (!ok || pool_seconds < 0) {
            state.SkipWithError(failure.c_str());
            break;
        }
        state.SetIterationTime(pool_seconds);
    }

    if (!state.error_occurred()) {
        // What was backed up came back, at the same addresses (discard: the bytes are the
        // touch's); the floor really moved its bytes.
        bool intact = baseline.holds_its_data() || kind == nxmem::sleep_policy_kind::discard;
        for (std::size_t index = 0; index < tensors.size() && kind != nxmem::sleep_policy_kind::discard; ++index) {
            intact = intact && holds(tensors[index].address, tensors[index].size, index + 1);
        }
        if (!intact) {
            state.SkipWithError("the bytes after wake are not those written before sleep");
        }
    }
    for (const auto& tensor : tensors) {
        (void)pool->release(tensor);
    }
    pool.reset();

    const double runs = std::max<double>(1, static_cast<double>(state.iterations()));
    const double ms = 1e3 / runs;
    state.counters["sleep_ms"] = pooled.sleep * ms;
    state.counters["wake_ms"] = pooled.wake * ms;
    if (kind == nxmem::sleep_policy_kind::discard) {
        state.counters["first_touch_ms"] = pooled.touch * ms;
        state.counters["wake_touched_ms"] = (pooled.wake + pooled.touch) * ms;
    }
    state.counters["sleep_wake_ms"] = (pooled.sleep + pooled.wake + pooled.touch) * ms;
    state.counters["sleep_wake_best_ms"] = pooled.best * 1e3;
    state.counters["floor_sleep_ms"] = physical.sleep * ms;
    state.counters["floor_wake_ms"] = physical.wake * ms;
    state.counters["floor_ms"] = (physical.sleep + physical.wake) * ms;
    state.counters["floor_best_ms"] = physical.best * 1e3;
    state.counters["faults_sleep"] = pooled.faults_sleep / runs;
    state.counters["faults_wake"] = pooled.faults_wake / runs;
    state.counters["floor_faults_sleep"] = physical.faults_sleep / runs;
    state.counters["floor_faults_wake"] = physical.faults_wake / runs;
    state.counters["ranges"] = ranges / runs;
    state.counters["walked_MiB"] = walked / runs / static_cast<double>(mib);
    state.counters["content_MiB"] = static_cast<double>(bytes) / static_cast<double>(mib);
}

std::vector<nxmem::bench::ratio_spec> register_benchmarks(const std::vector<std::uint64_t>& sizes) {
    using nxmem::bench::ratio_spec;
    std::vector<ratio_spec> ratios;
    for (const std::uint64_t bytes : sizes) {
        const std::string size = size_name(bytes);
        for (const auto kind : {nxmem::sleep_policy_kind::discard, nxmem::sleep_policy_kind::host,
                                nxmem::sleep_policy_kind::file}) {
            const std::string policy(nxmem::sleep_policy_name(kind));
            const std::string name = "sleep_wake/" + policy + "/" + size;
            // Seconds an iteration (two at 2 GiB, pool and floor): a few are enough.
            benchmark::RegisterBenchmark(name.c_str(), sleep_wake, kind, bytes)
                ->UseManualTime()
                ->Iterations(bytes <= 64 * mib ? 10 : bytes <= 256 * mib ? 5 : 3)
                ->Unit(benchmark::kMillisecond);
            ratios.push_back({"sleep_wake_vs_floor/" + policy + "/" + size,
                              "sleep + wake of " + size + " (" + policy + ") against its physical floor (target <= 1.2)",
                              name, name, "sleep_wake_ms", false, "floor_ms"});
            ratios.push_back({"sleep_wake_vs_floor_best/" + policy + "/" + size,
                              "the same, fastest iteration against fastest", name, name, "sleep_wake_best_ms", false,
                              "floor_best_ms"});
            ratios.push_back({"sleep_vs_floor/" + policy + "/" + size, "sleep alone against the floor's sleep", name,
                              name, "sleep_ms", false, "floor_sleep_ms"});
            ratios.push_back({"wake_vs_floor/" + policy + "/" + size,
                              kind == nxmem::sleep_policy_kind::discard
                                  ? "wake + first touch against the floor's touch"
                                  : "wake alone against the floor's wake",
                              name, name,
                              kind == nxmem::sleep_policy_kind::discard ? "wake_touched_ms" : "wake_ms", false,
                              "floor_wake_ms"});
        }
    }
    return ratios;
}

} // namespace

int main(int argc, char** argv) {
    const std::vector<std::uint64_t> sizes = content_sizes();
    if (sizes.empty()) {
        std::fprintf(stderr, "NXMEM_BENCH_RESIDENCY_MIB must be sizes in MiB, comma-separated (e.g. 4,8)\n");
        return 2;
    }
    return nxmem::bench::run_with_ratios(argc, argv, register_benchmarks(sizes), {});
}
