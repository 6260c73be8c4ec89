// The cuda plugin on a real GPU: correctness through device copies, and the figures of
// docs/plugins/cuda.md (lines starting "FIGURE"):
//   commit and decommit latency per chunk, through the plugin and as raw driver calls
//   allocate/release round trips of each mechanism against the raw driver calls they wrap
//   cuMemGetInfo deltas: 8 sequences sharing a 64 MiB prefix, one 64 MiB, 8 private 64 MiB
//   sharing across processes: a prefix read and written by another process (cuda_ipc_peer, next
//   to this program or named by NXMEM_CUDA_IPC_PEER), export+import+close latency, and what
//   asking for the POSIX file descriptor handle type costs cuMemCreate
//   stream order (ABI minor 4): the plugin's copies both ways, synchronous and on a stream, and a
//   release fenced on a stream whose work is still pending (held by a host function waiting on
//   a gate) leaving the next owner's bytes alone
//   residency: a resident pool over cuda-vmm slept with host backups and woken (cuMemGetInfo
//   before, asleep and after; sleep and wake times; every byte back at its device address)
// Without libcuda.so.1 or a device it prints why and exits 77 (skipped). It runs from any
// directory: the plugin is the first argument (or NXMEM_CUDA_PLUGIN); NXMEM_CUDA_DRIVER, if set,
// names the driver (the meson smoke run points it at the fake driver).
#define CATCH_CONFIG_RUNNER
#include "../../plugins/cuda/driver.hpp"
#include "cuda_ipc_peer.hpp"
#include "raw_allocator.hpp"

#include <nxmem/host.hpp>
#include <nxmem/host/handle_transport.hpp>
#include <nxmem/residency.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

using namespace nxmem;

namespace {

constexpr std::uint64_t mib = 1ull << 20;

std::string plugin_path;

// The test's own use of the driver: raw calls to compare against, copies, cuMemGetInfo. The
// primary context of device 0 stays current on the main thread for the whole run.
struct raw_driver {
    std::unique_ptr<cuda::driver> loaded;
    CUdevice device = 0;
    CUcontext context = nullptr;
    std::uint64_t granularity = 0;
    PFN_cuMemcpyHtoD_v3020 copy_to_device = nullptr;
    PFN_cuMemcpyDtoH_v3020 copy_to_host = nullptr;

    const cuda::driver_api& api() const { return loaded->api(); }
    void require(CUresult code, const char* what) const {
        INFO(what << ": " << loaded->describe(code));
        REQUIRE(code == CUDA_SUCCESS);
    }
    std::uint64_t free_bytes() const {
        std::size_t free_now = 0;
        std::size_t total = 0;
        require(api().mem_get_info(&free_now, &total), "cuMemGetInfo");
        return free_now;
    }
    CUmemAllocationProp chunk_properties() const {
        CUmemAllocationProp properties{};
        properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        properties.location.id = 0;
        return properties;
    }
    CUmemAccessDesc access() const {
        CUmemAccessDesc granted{};
        granted.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        granted.location.id = 0;
        granted.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        return granted;
    }
};

raw_driver raw;

// Loads and initialises the driver; the reason when there is no usable GPU.
std::optional<std::string> start_driver() {
    auto loaded = cuda::driver::load("cuda_gpu_tests");
    if (!loaded) {
        return loaded.error().describe();
    }
    raw.loaded = std::move(loaded).value();
    const cuda::driver_api& api = raw.api();
    if (const CUresult code = api.init(0); code != CUDA_SUCCESS) {
        return "cuInit failed: " + raw.loaded->describe(code);
    }
    int count = 0;
    if (api.device_get_count(&count) != CUDA_SUCCESS || count == 0) {
        return std::string("the CUDA driver sees no device");
    }
    if (api.device_get(&raw.device, 0) != CUDA_SUCCESS ||
        api.primary_ctx_retain(&raw.context, raw.device) != CUDA_SUCCESS ||
        api.ctx_push_current(raw.context) != CUDA_SUCCESS) {
        return std::string("device 0's primary context cannot be made current");
    }
    const CUmemAllocationProp properties = raw.chunk_properties();
    std::size_t granularity = 0;
    if (api.mem_get_allocation_granularity(&granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
        CUDA_SUCCESS) {
        return std::string("cuMemGetAllocationGranularity failed");
    }
    raw.granularity = granularity;
    if (!raw.loaded->entry("cuda_gpu_tests", "cuMemcpyHtoD", 3020, raw.copy_to_device) ||
        !raw.loaded->entry("cuda_gpu_tests", "cuMemcpyDtoH", 3020, raw.copy_to_host)) {
        return std::string("the driver has no cuMemcpyHtoD/cuMemcpyDtoH");
    }
    int version = 0;
    (void)api.device_get_attribute(&version, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, raw.device);
    std::cout << "driver " << raw.loaded->path() << " version "
              << cuda::cuda_version_text(raw.loaded->version()) << ", device 0 of " << count
              << " (compute capability major " << version << "), allocation granularity "
              << granularity << " bytes\n";
    return std::nullopt;
}

using clock_type = std::chrono::steady_clock;

double microseconds_since(clock_type::time_point start) {
    return std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
}

// Median and mean of per-operation samples, in microseconds.
struct timing {
    double median = 0;
    double mean = 0;
    static timing of(std::vector<double> samples) {
        timing made;
        std::sort(samples.begin(), samples.end());
        made.median = samples[samples.size() / 2];
        for (double sample : samples) {
            made.mean += sample;
        }
        made.mean /= static_cast<double>(samples.size());
        return made;
    }
};

void figure(const std::string& name, const timing& measured) {
    std::printf("FIGURE %-58s median %9.2f us  mean %9.2f us\n", name.c_str(), measured.median, measured.mean);
    std::fflush(stdout);
}

void figure_bytes(const std::string& name, std::uint64_t bytes) {
    std::printf("FIGURE %-58s %10.1f MiB (%llu bytes)\n", name.c_str(), static_cast<double>(bytes) / mib,
                static_cast<unsigned long long>(bytes));
    std::fflush(stdout);
}

template <class T> T value_or_fail(result<T> outcome) {
    if (!outcome) {
        FAIL(outcome.error().describe());
    }
    if constexpr (!std::is_void_v<T>) {
        return std::move(outcome).value();
    }
}

std::shared_ptr<host::plugin_module> load_plugin() {
    return value_or_fail(host::plugin_module::load(plugin_path));
}

std::uint64_t grew(std::uint64_t free_before, std::uint64_t free_after) {
    return free_before > free_after ? free_before - free_after : 0;
}

} // namespace

TEST_CASE("cuda-eager hands out device memory the device reads and writes", "[gpu][eager]") {
    auto module = load_plugin();
    {
        auto eager = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-eager", 0));
        for (std::uint64_t alignment : {256ull, 65536ull}) {
            auto live = value_or_fail(eager.allocate(3 * mib + 5, alignment));
            CHECK(live.address.value % alignment == 0);
            std::vector<unsigned char> written(live.size, 0xA5);
            written[written.size() - 1] = 0x5A; // the last byte too
            std::vector<unsigned char> read(live.size, 0);
            raw.require(raw.copy_to_device(live.address.value, written.data(), written.size()), "cuMemcpyHtoD");
            raw.require(raw.copy_to_host(read.data(), live.address.value, read.size()), "cuMemcpyDtoH");
            CHECK(read == written);
            REQUIRE(eager.release(live));
        }
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("commit and decommit latency per chunk", "[gpu][vmm][figures]") {
    const std::uint64_t chunk = raw.granularity;
    constexpr std::uint64_t chunks = 64;
    auto module = load_plugin();
    {
        auto vmm = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm", 0));
        auto backing = value_or_fail(vmm.virtual_backing());
        auto live = value_or_fail(vmm.allocate(chunks * chunk, chunk));
        std::vector<double> commits;
        std::vector<double> decommits;
        for (std::uint64_t i = 0; i < chunks; ++i) {
            const auto start = clock_type::now();
            REQUIRE(backing.commit(live, {i * chunk, chunk}));
            commits.push_back(microseconds_since(start));
        }
        CHECK(value_or_fail(backing.mapped_bytes(live)) == chunks * chunk);
        // The committed memory is the device's: a copy in and out of the last chunk agrees.
        const char text[] = "committed";
        char back[sizeof text] = {};
        raw.require(raw.copy_to_device(live.address.value + (chunks - 1) * chunk, text, sizeof text), "cuMemcpyHtoD");
        raw.require(raw.copy_to_host(back, live.address.value + (chunks - 1) * chunk, sizeof back), "cuMemcpyDtoH");
        CHECK(std::strcmp(back, text) == 0);
        for (std::uint64_t i = 0; i < chunks; ++i) {
            const auto start = clock_type::now();
            REQUIRE(backing.decommit(live, {i * chunk, chunk}));
            decommits.push_back(microseconds_since(start));
        }
        CHECK(value_or_fail(backing.mapped_bytes(live)) == 0);
        figure("cuda-vmm commit, one chunk per call", timing::of(commits));
        figure("cuda-vmm decommit, one chunk per call", timing::of(decommits));

        auto start = clock_type::now();
        REQUIRE(backing.commit(live, {0, chunks * chunk}));
        const double bulk_commit = microseconds_since(start) / chunks;
        start = clock_type::now();
        REQUIRE(backing.decommit(live, {0, chunks * chunk}));
        const double bulk_decommit = microseconds_since(start) / chunks;
        figure("cuda-vmm commit, 64 chunks in one call, per chunk", {bulk_commit, bulk_commit});
        figure("cuda-vmm decommit, 64 chunks in one call, per chunk", {bulk_decommit, bulk_decommit});
        REQUIRE(vmm.release(live));
    }
    REQUIRE(module->try_unload());

    // The same work as raw driver calls on a reserved range.
    const cuda::driver_api& api = raw.api();
    CUdeviceptr base = 0;
    raw.require(api.mem_address_reserve(&base, chunks * chunk, chunk, 0, 0), "cuMemAddressReserve");
    const CUmemAllocationProp properties = raw.chunk_properties();
    const CUmemAccessDesc access = raw.access();
    std::vector<CUmemGenericAllocationHandle> handles(chunks);
    std::vector<double> creates;
    std::vector<double> releases;
    for (std::uint64_t i = 0; i < chunks; ++i) {
        const auto start = clock_type::now();
        raw.require(api.mem_create(&handles[i], chunk, &properties, 0), "cuMemCreate");
        raw.require(api.mem_map(base + i * chunk, chunk, 0, handles[i], 0), "cuMemMap");
        raw.require(api.mem_set_access(base + i * chunk, chunk, &access, 1), "cuMemSetAccess");
        creates.push_back(microseconds_since(start));
    }
    for (std::uint64_t i = 0; i < chunks; ++i) {
        const auto start = clock_type::now();
        raw.require(api.mem_unmap(base + i * chunk, chunk), "cuMemUnmap");
        raw.require(api.mem_release(handles[i]), "cuMemRelease");
        releases.push_back(microseconds_since(start));
    }
    raw.require(api.mem_address_free(base, chunks * chunk), "cuMemAddressFree");
    figure("raw cuMemCreate+cuMemMap+cuMemSetAccess, one chunk", timing::of(creates));
    figure("raw cuMemUnmap+cuMemRelease, one chunk", timing::of(releases));
}

TEST_CASE("allocate/release round trips against the raw driver calls", "[gpu][figures]") {
    const std::uint64_t chunk = raw.granularity;
    const cuda::driver_api& api = raw.api();
    constexpr int rounds = 500;
    auto module = load_plugin();
    {
        auto eager = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-eager", 0));
        std::vector<double> plugin_rounds;
        std::vector<double> raw_rounds;
        for (int i = 0; i < rounds; ++i) {
            auto start = clock_type::now();
            auto live = value_or_fail(eager.allocate(mib, 256));
            REQUIRE(eager.release(live));
            plugin_rounds.push_back(microseconds_since(start));
            start = clock_type::now();
            CUdeviceptr address = 0;
            raw.require(api.mem_alloc(&address, mib), "cuMemAlloc");
            raw.require(api.mem_free(address), "cuMemFree");
            raw_rounds.push_back(microseconds_since(start));
        }
        figure("cuda-eager allocate+release 1 MiB", timing::of(plugin_rounds));
        figure("raw cuMemAlloc+cuMemFree 1 MiB", timing::of(raw_rounds));
    }
    {
        auto vmm = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm", 0));
        auto backing = value_or_fail(vmm.virtual_backing());
        const CUmemAllocationProp properties = raw.chunk_properties();
        const CUmemAccessDesc access = raw.access();
        std::vector<double> plugin_rounds;
        std::vector<double> raw_rounds;
        std::vector<double> plugin_reserves;
        std::vector<double> raw_reserves;
        for (int i = 0; i < rounds; ++i) {
            auto start = clock_type::now();
            auto live = value_or_fail(vmm.allocate(chunk, chunk));
            REQUIRE(backing.commit(live, {0, chunk}));
            REQUIRE(vmm.release(live));
            plugin_rounds.push_back(microseconds_since(start));

            start = clock_type::now();
            CUdeviceptr base = 0;
            CUmemGenericAllocationHandle handle = 0;
            raw.require(api.mem_address_reserve(&base, chunk, chunk, 0, 0), "cuMemAddressReserve");
            raw.require(api.mem_create(&handle, chunk, &properties, 0), "cuMemCreate");
            raw.require(api.mem_map(base, chunk, 0, handle, 0), "cuMemMap");
            raw.require(api.mem_set_access(base, chunk, &access, 1), "cuMemSetAccess");
            raw.require(api.mem_unmap(base, chunk), "cuMemUnmap");
            raw.require(api.mem_release(handle), "cuMemRelease");
            raw.require(api.mem_address_free(base, chunk), "cuMemAddressFree");
            raw_rounds.push_back(microseconds_since(start));

            start = clock_type::now();
            REQUIRE(vmm.release(value_or_fail(vmm.allocate(chunk, chunk))));
            plugin_reserves.push_back(microseconds_since(start));
            start = clock_type::now();
            raw.require(api.mem_address_reserve(&base, chunk, chunk, 0, 0), "cuMemAddressReserve");
            raw.require(api.mem_address_free(base, chunk), "cuMemAddressFree");
            raw_reserves.push_back(microseconds_since(start));
        }
        figure("cuda-vmm allocate+commit+release one chunk", timing::of(plugin_rounds));
        figure("raw reserve+create+map+set access+unmap+release+free", timing::of(raw_rounds));
        figure("cuda-vmm allocate+release (reservation only)", timing::of(plugin_reserves));
        figure("raw cuMemAddressReserve+cuMemAddressFree", timing::of(raw_reserves));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("8 sequences sharing a 64 MiB prefix cost the device what one 64 MiB costs",
          "[gpu][vmm][shared-mapping][figures]") {
    const std::uint64_t chunk = raw.granularity;
    constexpr std::uint64_t prefix_size = 64 * mib;
    auto module = load_plugin();
    {
        auto vmm = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm", 0));
        auto backing = value_or_fail(vmm.virtual_backing());
        auto mapping = value_or_fail(vmm.shared_mapping());

        std::uint64_t before = raw.free_bytes();
        auto single = value_or_fail(vmm.allocate(prefix_size, chunk));
        REQUIRE(backing.commit(single, {0, prefix_size}));
        const std::uint64_t single_delta = grew(before, raw.free_bytes());
        REQUIRE(vmm.release(single));

        before = raw.free_bytes();
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        std::vector<allocation<cuda_device>> sequences;
        for (int i = 0; i < 8; ++i) {
            sequences.push_back(value_or_fail(vmm.allocate(prefix_size + chunk, chunk)));
            REQUIRE(mapping.commit_prefix(sequences.back(), prefix));
        }
        const std::uint64_t shared_delta = grew(before, raw.free_bytes());
        // One memory behind every sequence: written through the first, read through the last.
        const char text[] = "one prefix, eight sequences";
        char back[sizeof text] = {};
        raw.require(raw.copy_to_device(sequences.front().address.value + prefix_size - sizeof text, text, sizeof text),
                    "cuMemcpyHtoD");
        raw.require(raw.copy_to_host(back, sequences.back().address.value + prefix_size - sizeof text, sizeof back),
                    "cuMemcpyDtoH");
        CHECK(std::strcmp(back, text) == 0);
        REQUIRE(mapping.release_prefix(prefix));
        for (const auto& sequence : sequences) {
            REQUIRE(vmm.release(sequence));
        }

        before = raw.free_bytes();
        std::vector<allocation<cuda_device>> privates;
        for (int i = 0; i < 8; ++i) {
            privates.push_back(value_or_fail(vmm.allocate(prefix_size, chunk)));
            REQUIRE(backing.commit(privates.back(), {0, prefix_size}));
        }
        const std::uint64_t private_delta = grew(before, raw.free_bytes());
        for (const auto& one : privates) {
            REQUIRE(vmm.release(one));
        }

        figure_bytes("cuMemGetInfo delta, one 64 MiB committed", single_delta);
        figure_bytes("cuMemGetInfo delta, 8 sequences sharing a 64 MiB prefix", shared_delta);
        figure_bytes("cuMemGetInfo delta, 8 private 64 MiB", private_delta);
        CHECK(single_delta >= prefix_size);
        CHECK(shared_delta < 2 * single_delta);
        CHECK(private_delta >= 6 * single_delta);
    }
    REQUIRE(module->try_unload());
}

namespace {

// The importing process: NXMEM_CUDA_IPC_PEER, or cuda_ipc_peer beside this program (the bundle).
std::string ipc_peer_path() {
    if (const char* configured = std::getenv("NXMEM_CUDA_IPC_PEER"); configured != nullptr && *configured != '\0') {
        return configured;
    }
    return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "cuda_ipc_peer").string();
}

} // namespace

TEST_CASE("a cuda-vmm prefix is read and written by another process", "[gpu][vmm][ipc]") {
    const std::uint64_t chunk = raw.granularity;
    const std::uint64_t prefix_size = 2 * chunk + 10; // three chunks, the last partly used
    const std::string peer = ipc_peer_path();
    INFO("importing process: " << peer);
    REQUIRE(std::filesystem::exists(peer));
    auto module = load_plugin();
    {
        auto vmm = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm", 0));
        INFO("cuda-vmm shares across processes only where the driver and device export POSIX file descriptors");
        REQUIRE((vmm.capabilities() & NXMEM_CAP_IPC) != 0);
        auto mapping = value_or_fail(vmm.shared_mapping());
        auto sharing = value_or_fail(vmm.ipc());
        auto prefix = value_or_fail(mapping.create_prefix(prefix_size));
        auto filled = value_or_fail(vmm.allocate(prefix_size + chunk, chunk));
        REQUIRE(mapping.commit_prefix(filled, prefix));
        std::vector<unsigned char> bytes(prefix_size);
        for (std::uint64_t index = 0; index < prefix_size; ++index) {
            bytes[index] = test::exported_byte(index);
        }
        for (const char* access : {"ro", "rw"}) {
            INFO("import " << access);
            raw.require(raw.copy_to_device(filled.address.value, bytes.data(), bytes.size()), "cuMemcpyHtoD");
            test::importer_process importer(peer, plugin_path, access);
            REQUIRE(importer.started());
            {
                host::ipc_handle handle = value_or_fail(sharing.export_prefix(prefix));
                REQUIRE(host::send_handle(importer.socket(), handle.record()));
            }
            const int status = importer.finish();
            INFO("the importing process failed at: " << test::peer_step(status) << " (its stderr says why)");
            REQUIRE(status == 0);
            char marker[sizeof test::importer_marker] = {};
            raw.require(raw.copy_to_host(marker, filled.address.value, sizeof marker), "cuMemcpyDtoH");
            if (std::string(access) == "rw") {
                CHECK(std::strcmp(marker, test::importer_marker) == 0);
            } else {
                CHECK(static_cast<unsigned char>(marker[0]) == test::exported_byte(0));
            }
        }

        // Export, import (into a second allocator of this process) and close, one round each.
        constexpr int rounds = 50;
        auto importer = value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm", 0));
        auto importing = value_or_fail(importer.ipc());
        std::vector<double> exports;
        std::vector<double> imports;
        std::vector<double> closes;
        for (int i = 0; i < rounds; ++i) {
            auto start = clock_type::now();
            host::ipc_handle handle = value_or_fail(sharing.export_prefix(prefix));
            exports.push_back(microseconds_since(start));
            start = clock_type::now();
            auto imported = value_or_fail(importing.import(handle));
            imports.push_back(microseconds_since(start));
            start = clock_type::now();
            REQUIRE(imported.close());
            closes.push_back(microseconds_since(start));
        }
        figure("cuda-vmm export of a 3-chunk prefix", timing::of(exports));
        figure("cuda-vmm import of it (checked, size proved by a map)", timing::of(imports));
        figure("cuda-vmm close of the import", timing::of(closes));
        REQUIRE(vmm.release(filled));
        REQUIRE(mapping.release_prefix(prefix));
    }
    REQUIRE(module->try_unload());
}

TEST_CASE("what the POSIX file descriptor handle type costs cuMemCreate", "[gpu][ipc][figures]") {
    const std::uint64_t chunk = raw.granularity;
    const cuda::driver_api& api = raw.api();
    constexpr int rounds = 200;
    CUmemAllocationProp plain = raw.chunk_properties();
    CUmemAllocationProp exportable = raw.chunk_properties();
    exportable.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    std::vector<double> plain_rounds;
    std::vector<double> exportable_rounds;
    for (int i = 0; i < rounds; ++i) {
        CUmemGenericAllocationHandle handle = 0;
        auto start = clock_type::now();
        raw.require(api.mem_create(&handle, chunk, &plain, 0), "cuMemCreate");
        raw.require(api.mem_release(handle), "cuMemRelease");
        plain_rounds.push_back(microseconds_since(start));
        start = clock_type::now();
        raw.require(api.mem_create(&handle, chunk, &exportable, 0), "cuMemCreate (POSIX fd handle type)");
        raw.require(api.mem_release(handle), "cuMemRelease");
        exportable_rounds.push_back(microseconds_since(start));
    }
    figure("raw cuMemCreate+cuMemRelease one chunk", timing::of(plain_rounds));
    figure("raw cuMemCreate+cuMemRelease one chunk, POSIX fd handle type", timing::of(exportable_rounds));
}

namespace {

// A host function that holds its stream until the test opens the gate (work queued after it stays
// pending, on a real GPU as on the fake).
struct stream_gate {
    std::mutex mutex;
    std::condition_variable opened;
    bool open = false;

    static void wait(void* user_data) {
        auto* gate = static_cast<stream_gate*>(user_data);
        std::unique_lock lock(gate->mutex);
        gate->opened.wait(lock, [&] { return gate->open; });
    }
    void let_go() {
        {
            std::lock_guard lock(mutex);
            open = true;
        }
        opened.notify_all();
    }
};

// The stream calls beyond the plugin's driver_api.
struct stream_calls {
    PFN_cuLaunchHostFunc_v10000 launch_host_func = nullptr;
    PFN_cuMemsetD8Async_v3020 memset_async = nullptr;
    PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;

    stream_calls() {
        REQUIRE(raw.loaded->entry("cuda_gpu_tests", "cuLaunchHostFunc", 10000, launch_host_func));
        REQUIRE(raw.loaded->entry("cuda_gpu_tests", "cuMemsetD8Async", 3020, memset_async));
        REQUIRE(raw.loaded->entry("cuda_gpu_tests", "cuStreamSynchronize", 2000, stream_synchronize));
    }
};

CUstream new_stream() {
    CUstream made = nullptr;
    raw.require(raw.api().stream_create(&made, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return made;
}

NxmemFence stream_fence(CUstream stream) { return test::cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream); }

} // namespace

TEST_CASE("the plugin copies both ways, synchronously and on a stream", "[gpu][copy]") {
    const stream_calls calls;
    const char* mechanism = GENERATE("cuda-eager", "cuda-vmm");
    INFO(mechanism);
    test::raw_allocator allocator(plugin_path, mechanism);
    const std::uint64_t size = 2 * raw.granularity + 100;
    const NxmemAllocation live = allocator.allocate(size);
    if (allocator.table().virtual_backing != nullptr) {
        allocator.commit_all(live);
    }
    std::vector<unsigned char> written(size);
    for (std::size_t i = 0; i < written.size(); ++i) {
        written[i] = static_cast<unsigned char>(i * 13 + 1);
    }
    std::vector<unsigned char> read(size, 0);
    REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, live, 0, size, written.data())) ==
            NXMEM_STATUS_OK);
    raw.require(raw.copy_to_host(read.data(), live.address, read.size()), "cuMemcpyDtoH");
    CHECK(read == written);
    std::fill(read.begin(), read.end(), 0);
    REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, 0, size, read.data())) == NXMEM_STATUS_OK);
    CHECK(read == written);

    CUstream stream = new_stream();
    const NxmemFence on_stream = stream_fence(stream);
    std::vector<unsigned char> later(1000, 0x3C);
    std::vector<unsigned char> read_later(later.size(), 0);
    const std::uint64_t offset = raw.granularity - 500; // across a chunk boundary
    REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, live, offset, later.size(), later.data(),
                                              &on_stream)) == NXMEM_STATUS_OK);
    REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, offset, read_later.size(),
                                              read_later.data(), &on_stream)) == NXMEM_STATUS_OK);
    raw.require(calls.stream_synchronize(stream), "cuStreamSynchronize");
    CHECK(read_later == later);
    raw.require(raw.api().stream_destroy(stream), "cuStreamDestroy");
    allocator.deallocate(live);
}

TEST_CASE("a resident cuda-vmm pool sleeps with a host backup, frees the device, and wakes with every byte at "
          "its address",
          "[gpu][residency]") {
    auto module = load_plugin();
    const std::uint64_t free_at_start = raw.free_bytes();
    pool_options options;
    options.reserve_bytes = 1024 * mib;
    auto pool = std::make_shared<resident_pool<host::plugin_allocator<cuda_device>>>(
        "weights", options, value_or_fail(host::open_allocator<cuda_device>(module, "cuda-vmm")));
    std::vector<allocation<cuda_device>> tensors;
    std::vector<std::vector<unsigned char>> contents;
    for (int index = 0; index < 4; ++index) {
        tensors.push_back(value_or_fail(pool->allocate(32 * mib + index * 4096, 256)));
        contents.emplace_back(tensors.back().size);
        for (std::size_t at = 0; at < contents.back().size(); ++at) {
            contents.back()[at] = static_cast<unsigned char>(at * 7 + index);
        }
        raw.require(raw.copy_to_device(tensors.back().address.value, contents.back().data(), contents.back().size()),
                    "cuMemcpyHtoD");
    }
    const std::uint64_t free_awake = raw.free_bytes();
    const auto sleep_start = clock_type::now();
    const auto slept = value_or_fail(pool->sleep(sleep_policy::host()));
    const double sleep_us = microseconds_since(sleep_start);
    const std::uint64_t free_asleep = raw.free_bytes();
    const auto wake_start = clock_type::now();
    value_or_fail(pool->wake());
    const double wake_us = microseconds_since(wake_start);
    const std::uint64_t free_woken = raw.free_bytes();

    figure_bytes("residency: pool committed, awake (cuMemGetInfo delta)", grew(free_at_start, free_awake));
    figure_bytes("residency: pool committed, asleep (cuMemGetInfo delta)", grew(free_at_start, free_asleep));
    figure_bytes("residency: pool committed, woken (cuMemGetInfo delta)", grew(free_at_start, free_woken));
    figure_bytes("residency: backed up to host memory", slept.backed_up_bytes);
    figure("residency: sleep, host backup of the pool", timing::of({sleep_us}));
    figure("residency: wake, host backup restored", timing::of({wake_us}));
    CHECK(grew(free_at_start, free_awake) >= 128 * mib);
    // Asleep, the device holds none of the pool's memory (the driver's own bookkeeping aside).
    CHECK(grew(free_at_start, free_asleep) < raw.granularity);
    CHECK(free_woken == free_awake);
    for (std::size_t index = 0; index < tensors.size(); ++index) {
        std::vector<unsigned char> back(tensors[index].size);
        raw.require(raw.copy_to_host(back.data(), tensors[index].address.value, back.size()), "cuMemcpyDtoH");
        CHECK(back == contents[index]);
        REQUIRE(pool->release(tensors[index]));
    }
}

TEST_CASE("a release fenced on a stream waits for the stream's work: the next owner keeps its bytes",
          "[gpu][fenced]") {
    const stream_calls calls;
    constexpr std::uint64_t block = 1 * mib;
    test::raw_allocator eager(plugin_path, "cuda-eager");
    CUstream kernel_stream = new_stream();
    CUstream owner_stream = new_stream();
    stream_gate gate;
    raw.require(calls.launch_host_func(kernel_stream, &stream_gate::wait, &gate), "cuLaunchHostFunc");

    const NxmemAllocation first = eager.allocate(block);
    raw.require(calls.memset_async(first.address, 'X', block, kernel_stream), "cuMemsetD8Async"); // the kernel
    const std::uint64_t ticket = eager.release_after(first, {stream_fence(kernel_stream)});
    CHECK(eager.drain().empty()); // the kernel is held behind the gate

    const NxmemAllocation second = eager.allocate(block);
    CHECK(second.address != first.address);
    std::vector<unsigned char> mine(block, 'Y');
    const NxmemFence on_owner_stream = stream_fence(owner_stream);
    REQUIRE(eager.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, second, 0, block, mine.data(), &on_owner_stream)) ==
            NXMEM_STATUS_OK);
    raw.require(calls.stream_synchronize(owner_stream), "cuStreamSynchronize");

    gate.let_go();
    raw.require(calls.stream_synchronize(kernel_stream), "cuStreamSynchronize");
    std::vector<unsigned char> read(block, 0);
    REQUIRE(eager.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, second, 0, block, read.data())) == NXMEM_STATUS_OK);
    CHECK(read == mine);
    CHECK(eager.drain() == std::vector<std::uint64_t>{ticket});
    eager.deallocate(second);
    raw.require(raw.api().stream_destroy(kernel_stream), "cuStreamDestroy");
    raw.require(raw.api().stream_destroy(owner_stream), "cuStreamDestroy");
}

int main(int argc, char* argv[]) {
    // The plugin: the first argument unless it is an option, else NXMEM_CUDA_PLUGIN.
    std::vector<char*> arguments(argv, argv + argc);
    if (argc > 1 && argv[1][0] != '-') {
        plugin_path = argv[1];
        arguments.erase(arguments.begin() + 1);
    } else if (const char* configured = std::getenv("NXMEM_CUDA_PLUGIN")) {
        plugin_path = configured;
    }
    if (plugin_path.empty()) {
        std::cerr << "usage: cuda_gpu_tests PLUGIN [catch options] (or set NXMEM_CUDA_PLUGIN)\n";
        return 2;
    }
    if (std::optional<std::string> unusable = start_driver()) {
        std::cout << "skipped: no usable GPU: " << *unusable << '\n';
        return 77;
    }
    const int failed = Catch::Session().run(static_cast<int>(arguments.size()), arguments.data());
    CUcontext popped = nullptr;
    (void)raw.api().ctx_pop_current(&popped);
    (void)raw.api().primary_ctx_release(raw.device);
    raw.loaded.reset();
    return failed;
}
