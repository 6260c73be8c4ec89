// Stream-ordered release in the cuda plugin (ABI minor 4), against the fake driver, whose streams
// run their work later on threads of their own: a "kernel" (a host function queued on a stream,
// writing device memory) still pending when its memory is released must not land in the memory's
// next owner. With the release fenced on the kernel's stream it cannot: the memory is neither
// freed nor handed on until the stream has passed the fence. Without the fence it does, which is
// what shows the test able to fail. In the suite 'concurrency', so scripts/test runs it under
// ThreadSanitizer; the streams are held (fake_cuda_hold_stream), never slept on.
#include "cuda_support.hpp"
#include "raw_allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

using namespace nxmem;
using nxmem::test::chunk;
using nxmem::test::cuda_fence;
using nxmem::test::current_context;
using nxmem::test::driver_calls;
using nxmem::test::fake_driver;
using nxmem::test::raw_allocator;
using nxmem::test::scoped_stream;

namespace {

constexpr std::uint64_t block_size = 64 * 1024;
constexpr unsigned char kernel_byte = 'X';
constexpr unsigned char owner_byte = 'Y';

// The kernel: fills device memory with one byte, from the stream's thread (the fake's device
// memory is host memory).
struct fill {
    std::uint64_t address;
    std::uint64_t length;
    unsigned char byte;
};
void run_fill(void* user_data) {
    const auto* job = static_cast<const fill*>(user_data);
    std::memset(reinterpret_cast<void*>(static_cast<std::uintptr_t>(job->address)), job->byte, job->length);
}

// What the scenario saw: where each owner's block was and the second owner's bytes at the end.
struct outcome {
    std::uint64_t first_address = 0;
    std::uint64_t second_address = 0;
    std::vector<unsigned char> second_bytes;
};

// Stream A (held) queues the kernel writing X into block B; B is released (`fenced`: after A's
// work, else at once); a block of the same size is allocated and written with Y through stream
// C; A is let go; the second owner's bytes are read back.
outcome kernel_then_release(fake_driver& fake, bool fenced) {
    raw_allocator eager(test::cuda_plugin_path(), "cuda-eager");
    const driver_calls calls = fake.calls();
    current_context context(calls);
    scoped_stream kernel_stream(calls, CU_STREAM_NON_BLOCKING);
    scoped_stream owner_stream(calls, CU_STREAM_NON_BLOCKING);
    outcome seen;

    const NxmemAllocation first = eager.allocate(block_size);
    seen.first_address = first.address;
    auto held_kernel_stream = fake.holding(kernel_stream.get());
    fill kernel{first.address, block_size, kernel_byte};
    REQUIRE(calls.launch_host_func(kernel_stream.get(), &run_fill, &kernel) == CUDA_SUCCESS);

    std::uint64_t ticket = 0;
    if (fenced) {
        ticket = eager.release_after(first, {cuda_fence(NXMEM_FENCE_CUDA_STREAM, kernel_stream.get())});
        CHECK(eager.drain().empty()); // the kernel has not run: the release stays queued
        CHECK(eager.queued_releases() == 1);
    } else {
        eager.deallocate(first);
    }

    const NxmemAllocation second = eager.allocate(block_size);
    seen.second_address = second.address;
    const std::vector<unsigned char> mine(block_size, owner_byte);
    const NxmemFence on_owner_stream = cuda_fence(NXMEM_FENCE_CUDA_STREAM, owner_stream.get());
    REQUIRE(eager.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, second, 0, block_size,
                                    const_cast<unsigned char*>(mine.data()), &on_owner_stream)) == NXMEM_STATUS_OK);
    REQUIRE(calls.stream_synchronize(owner_stream.get()) == CUDA_SUCCESS);

    held_kernel_stream.let_go();
    REQUIRE(calls.stream_synchronize(kernel_stream.get()) == CUDA_SUCCESS);
    seen.second_bytes.assign(block_size, 0);
    REQUIRE(eager.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, second, 0, block_size, seen.second_bytes.data())) ==
            NXMEM_STATUS_OK);
    if (fenced) {
        CHECK(eager.drain() == std::vector<std::uint64_t>{ticket}); // the fence has passed
        CHECK(eager.queued_releases() == 0);
    }
    eager.deallocate(second);
    return seen;
}

bool all_bytes(const std::vector<unsigned char>& bytes, unsigned char expected) {
    return std::all_of(bytes.begin(), bytes.end(), [&](unsigned char b) { return b == expected; });
}

} // namespace

TEST_CASE("a release fenced on a stream waits for the stream's kernel: the next owner keeps its bytes",
          "[cuda][concurrency][fenced]") {
    fake_driver fake;
    const outcome seen = kernel_then_release(fake, true);
    CHECK(seen.second_address != seen.first_address); // B was not handed on while the kernel was pending
    CHECK(all_bytes(seen.second_bytes, owner_byte));
    fake.require_idle();
}

TEST_CASE("without a fence the memory is handed on at once and the pending kernel overwrites the "
          "next owner's bytes",
          "[cuda][concurrency][fenced]") {
    fake_driver fake;
    const outcome seen = kernel_then_release(fake, false);
    REQUIRE(seen.second_address == seen.first_address); // the driver handed B on
    CHECK(all_bytes(seen.second_bytes, kernel_byte));
    fake.require_idle();
}

TEST_CASE("a release fenced on an event retires once the event's work has run; drains never wait "
          "and the memory stays mapped until then",
          "[cuda][concurrency][fenced]") {
    fake_driver fake;
    {
        raw_allocator vmm(test::cuda_plugin_path(), "cuda-vmm");
        CHECK((vmm.table().capabilities & NXMEM_CAP_FENCED_RELEASE) != 0);
        CHECK(vmm.table().fenced_release->fence_kinds ==
              ((1u << NXMEM_FENCE_HOST_TIMELINE) | (1u << NXMEM_FENCE_CUDA_STREAM) | (1u << NXMEM_FENCE_CUDA_EVENT)));
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        const NxmemAllocation live = vmm.allocate(chunk);
        vmm.commit_all(live);

        auto held_stream = fake.holding(stream.get());
        fill kernel{live.address, chunk, kernel_byte};
        REQUIRE(calls.launch_host_func(stream.get(), &run_fill, &kernel) == CUDA_SUCCESS);
        CUevent done = nullptr;
        REQUIRE(calls.event_create(&done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
        REQUIRE(calls.event_record(done, stream.get()) == CUDA_SUCCESS);
        const std::uint64_t ticket = vmm.release_after(live, {cuda_fence(NXMEM_FENCE_CUDA_EVENT, done)});
        // The event is borrowed for the call only: the plugin waits on its own.
        REQUIRE(calls.event_destroy(done) == CUDA_SUCCESS);
        CHECK(fake.counts().events == 1);
        CHECK(vmm.drain().empty());
        CHECK(vmm.drain().empty());
        CHECK(fake.counts().mappings == 1); // not unmapped while the kernel may still write
        CHECK(vmm.queued_releases() == 1);

        held_stream.let_go();
        REQUIRE(calls.ctx_synchronize() == CUDA_SUCCESS); // the plugin's stream too
        CHECK(vmm.drain() == std::vector<std::uint64_t>{ticket});
        CHECK(fake.counts().mappings == 0);
        CHECK(fake.counts().events == 0); // destroyed on retirement
        CHECK(vmm.queued_releases() == 0);
    }
    fake.require_idle();
}

TEST_CASE("fenced releases retire in enqueue order, a host timeline's once the counter reaches its "
          "value, and fences of other devices or kinds are refused with nothing queued",
          "[cuda][concurrency][fenced]") {
    fake_driver fake;
    {
        raw_allocator eager(test::cuda_plugin_path(), "cuda-eager");
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        alignas(8) std::uint64_t timeline = 0;
        NxmemFence at_two = cuda_fence(NXMEM_FENCE_HOST_TIMELINE, &timeline);
        at_two.value = 2;

        const NxmemAllocation on_timeline = eager.allocate(4096);
        const NxmemAllocation on_stream = eager.allocate(4096);
        NxmemFence elsewhere = cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream.get());
        elsewhere.device.index = 1;
        NxmemStatusCode refused = NXMEM_STATUS_OK;
        CHECK(eager.release_after(on_stream, {elsewhere}, &refused) == 0);
        CHECK(refused == NXMEM_STATUS_WRONG_DEVICE);
        NxmemFence unknown_kind = cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream.get());
        unknown_kind.kind = 9;
        CHECK(eager.release_after(on_stream, {unknown_kind}, &refused) == 0);
        CHECK(refused == NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
        CHECK(fake.counts().events == 0);
        CHECK(eager.queued_releases() == 0);

        const std::uint64_t first = eager.release_after(on_timeline, {at_two});
        const std::uint64_t second =
            eager.release_after(on_stream, {cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream.get())});
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(eager.drain().empty()); // the second's fence has passed, the first's has not
        std::atomic_ref<std::uint64_t>(timeline).store(1, std::memory_order_release);
        CHECK(eager.drain().empty());
        std::atomic_ref<std::uint64_t>(timeline).store(2, std::memory_order_release);
        CHECK(eager.drain() == std::vector<std::uint64_t>{first, second});
        CHECK(fake.counts().device_allocations == 0);
    }
    fake.require_idle();
}

TEST_CASE("through the host, a release after a stream's work is the plugin's to wait on, and the "
          "module's unload report counts it until it retires",
          "[cuda][concurrency][fenced]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        auto eager = test::open_or_fail<cuda_device>(module, "cuda-eager");
        CHECK((eager.fence_kinds() & (1u << NXMEM_FENCE_CUDA_STREAM)) != 0);
        const allocation<cuda_device> live = test::value_or_fail(eager.allocate(block_size, 256));
        const std::vector<std::byte> written(block_size, std::byte{7});
        test::value_or_fail(eager.copy_from_host(live, 0, written));

        auto held_stream = fake.holding(stream.get());
        fill kernel{live.address.value, block_size, kernel_byte};
        REQUIRE(calls.launch_host_func(stream.get(), &run_fill, &kernel) == CUDA_SUCCESS);
        const host::fence after_kernel{NXMEM_FENCE_CUDA_STREAM, eager.device(),
                                       reinterpret_cast<std::uint64_t>(stream.get()), 0};
        const std::uint64_t ticket = test::value_or_fail(eager.release_after(live, std::span(&after_kernel, 1)));
        CHECK(test::value_or_fail(eager.drain_releases()).empty());
        CHECK(test::value_or_fail(module->readiness()).plugin.queued_releases == 1);
        CHECK(fake.counts().device_allocations == 1);

        held_stream.let_go();
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        const auto retired = test::value_or_fail(eager.drain_releases());
        REQUIRE(retired.size() == 1);
        CHECK(retired[0].ticket == ticket);
        CHECK(test::value_or_fail(module->readiness()).plugin.queued_releases == 0);
        CHECK(fake.counts().device_allocations == 0);
    });
}

TEST_CASE("through the host, a copy on a stream is queued after the stream's work and the call returns at "
          "once; a stream the copy table does not list, or another device's, is refused before the plugin",
          "[cuda][concurrency][copy]") {
    test::with_cuda_plugin([&](fake_driver& fake, const test::module_ptr& module) {
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        auto eager = test::open_or_fail<cuda_device>(module, "cuda-eager");
        CHECK(eager.copy_stream_kinds() == (1u << NXMEM_FENCE_CUDA_STREAM));
        const allocation<cuda_device> live = test::value_or_fail(eager.allocate(block_size, 256));
        const host::fence on_stream{NXMEM_FENCE_CUDA_STREAM, eager.device(),
                                    reinterpret_cast<std::uint64_t>(stream.get()), 0};
        const std::vector<std::byte> nothing_yet(block_size, std::byte{0});
        std::vector<std::byte> read = nothing_yet;
        fill kernel{live.address.value, block_size, kernel_byte};
        {
            auto held_stream = fake.holding(stream.get());
            REQUIRE(calls.launch_host_func(stream.get(), &run_fill, &kernel) == CUDA_SUCCESS);
            test::value_or_fail(eager.copy_to_host(live, 0, read, on_stream)); // queued behind the kernel
            CHECK(read == nothing_yet);
            held_stream.let_go();
        }
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(read == std::vector<std::byte>(block_size, std::byte{kernel_byte}));

        std::atomic<std::uint64_t> timeline{0};
        const auto refused_kind = eager.copy_to_host(live, 0, read, host::fence::host_timeline(timeline, 1, eager.device()));
        REQUIRE(!refused_kind);
        CHECK(refused_kind.error().code == status_code::unsupported_capability);
        host::fence elsewhere = on_stream;
        elsewhere.device.index += 1;
        const std::vector<std::byte> written(block_size, std::byte{owner_byte});
        const auto refused_device = eager.copy_from_host(live, 0, written, elsewhere);
        REQUIRE(!refused_device);
        CHECK(refused_device.error().code == status_code::wrong_device);
        CHECK(read == std::vector<std::byte>(block_size, std::byte{kernel_byte}));
        test::value_or_fail(eager.release(live));
    });
}
