// Streams on the fake driver (work runs later, in order; a held stream keeps it pending; events;
// stream 0's ordering) and the cuda plugin's copies (ABI minor 4): synchronous and queued on a
// stream, both ways, for cuda-eager and cuda-vmm, and the copies the kit refuses touching nothing.
#include "cuda_support.hpp"
#include "raw_allocator.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
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

// A host function's record of the order it ran in.
struct run_log {
    std::mutex mutex;
    std::vector<int> order;
};
struct logged_step {
    run_log* log;
    int step;
};
void log_step(void* user_data) {
    auto* step = static_cast<logged_step*>(user_data);
    std::lock_guard lock(step->log->mutex);
    step->log->order.push_back(step->step);
}

std::vector<int> logged(run_log& log) {
    std::lock_guard lock(log.mutex);
    return log.order;
}

std::vector<unsigned char> pattern(std::size_t length, unsigned seed) {
    std::vector<unsigned char> made(length);
    for (std::size_t i = 0; i < length; ++i) {
        made[i] = static_cast<unsigned char>(seed + i * 7);
    }
    return made;
}

unsigned char* host_view(const NxmemAllocation& live) {
    return reinterpret_cast<unsigned char*>(static_cast<std::uintptr_t>(live.address));
}

} // namespace

TEST_CASE("the fake driver runs a stream's work later and in order; a held stream keeps it pending",
          "[cuda][streams]") {
    fake_driver fake;
    {
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        run_log log;
        logged_step first{&log, 1};
        logged_step second{&log, 2};
        CUevent after_both = nullptr;
        REQUIRE(calls.event_create(&after_both, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
        CHECK(calls.event_query(after_both) == CUDA_SUCCESS); // never recorded: complete

        auto held_stream = fake.holding(stream.get());
        REQUIRE(calls.launch_host_func(stream.get(), &log_step, &first) == CUDA_SUCCESS);
        REQUIRE(calls.launch_host_func(stream.get(), &log_step, &second) == CUDA_SUCCESS);
        REQUIRE(calls.event_record(after_both, stream.get()) == CUDA_SUCCESS);
        CHECK(calls.stream_query(stream.get()) == CUDA_ERROR_NOT_READY);
        CHECK(calls.event_query(after_both) == CUDA_ERROR_NOT_READY);
        CHECK(fake.counts().stream_work_pending == 3);
        CHECK(logged(log).empty());
        CHECK(fake.counts().streams == 1);
        CHECK(fake.counts().events == 1);

        held_stream.let_go();
        REQUIRE(calls.event_synchronize(after_both) == CUDA_SUCCESS);
        CHECK(logged(log) == std::vector<int>{1, 2});
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(calls.stream_query(stream.get()) == CUDA_SUCCESS);
        CHECK(calls.event_query(after_both) == CUDA_SUCCESS);
        REQUIRE(calls.event_destroy(after_both) == CUDA_SUCCESS);
    }
    fake.require_idle();
}

TEST_CASE("cuStreamWaitEvent orders a stream after another's recorded work; stream 0 waits for "
          "blocking streams and not for non-blocking ones",
          "[cuda][streams]") {
    fake_driver fake;
    {
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream producer(calls, CU_STREAM_NON_BLOCKING);
        scoped_stream consumer(calls, CU_STREAM_NON_BLOCKING);
        run_log log;
        logged_step produced{&log, 1};
        logged_step consumed{&log, 2};
        CUevent ready = nullptr;
        REQUIRE(calls.event_create(&ready, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);

        auto held_producer = fake.holding(producer.get());
        REQUIRE(calls.launch_host_func(producer.get(), &log_step, &produced) == CUDA_SUCCESS);
        REQUIRE(calls.event_record(ready, producer.get()) == CUDA_SUCCESS);
        REQUIRE(calls.stream_wait_event(consumer.get(), ready, 0) == CUDA_SUCCESS);
        REQUIRE(calls.launch_host_func(consumer.get(), &log_step, &consumed) == CUDA_SUCCESS);
        CHECK(calls.stream_query(consumer.get()) == CUDA_ERROR_NOT_READY);
        // Stream 0 does not wait for non-blocking streams.
        REQUIRE(calls.stream_synchronize(nullptr) == CUDA_SUCCESS);

        held_producer.let_go();
        REQUIRE(calls.stream_synchronize(consumer.get()) == CUDA_SUCCESS);
        CHECK(logged(log) == std::vector<int>{1, 2});

        SECTION("stream 0 waits for a blocking stream") {
            scoped_stream blocking(calls, CU_STREAM_DEFAULT);
            logged_step late{&log, 3};
            logged_step on_stream_zero{&log, 4};
            auto held_blocking = fake.holding(blocking.get());
            REQUIRE(calls.launch_host_func(blocking.get(), &log_step, &late) == CUDA_SUCCESS);
            REQUIRE(calls.launch_host_func(nullptr, &log_step, &on_stream_zero) == CUDA_SUCCESS);
            CHECK(calls.stream_query(nullptr) == CUDA_ERROR_NOT_READY);
            held_blocking.let_go();
            REQUIRE(calls.stream_synchronize(nullptr) == CUDA_SUCCESS);
            CHECK(logged(log) == std::vector<int>{1, 2, 3, 4});
        }
        REQUIRE(calls.event_destroy(ready) == CUDA_SUCCESS);
    }
    fake.require_idle();
}

TEST_CASE("the fake's driver copies go both ways, synchronously and on a stream", "[cuda][streams]") {
    fake_driver fake;
    {
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        std::vector<unsigned char> device(4096, 0); // the fake's device memory is host memory
        const auto at = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(device.data()));
        const std::vector<unsigned char> written = pattern(device.size(), 3);
        std::vector<unsigned char> read(device.size(), 0);

        REQUIRE(calls.memcpy_htod(at, written.data(), written.size()) == CUDA_SUCCESS);
        CHECK(device == written);
        REQUIRE(calls.memcpy_dtoh(read.data(), at, read.size()) == CUDA_SUCCESS);
        CHECK(read == written);

        const std::vector<unsigned char> later = pattern(device.size(), 11);
        std::vector<unsigned char> read_later(device.size(), 0);
        auto held_stream = fake.holding(stream.get());
        REQUIRE(calls.memcpy_htod_async(at, later.data(), later.size(), stream.get()) == CUDA_SUCCESS);
        REQUIRE(calls.memcpy_dtoh_async(read_later.data(), at, read_later.size(), stream.get()) == CUDA_SUCCESS);
        CHECK(calls.stream_query(stream.get()) == CUDA_ERROR_NOT_READY);
        held_stream.let_go();
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(device == later);
        CHECK(read_later == later);
    }
    fake.require_idle();
}

TEST_CASE("cuda-eager and cuda-vmm copy to and from the host, synchronously and on a stream",
          "[cuda][streams][copy]") {
    fake_driver fake;
    {
        const char* mechanism = GENERATE("cuda-eager", "cuda-vmm");
        INFO(mechanism);
        raw_allocator allocator(test::cuda_plugin_path(), mechanism);
        CHECK((allocator.table().capabilities & NXMEM_CAP_COPY) != 0);
        CHECK(allocator.table().copy->stream_kinds == (1u << NXMEM_FENCE_CUDA_STREAM));
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);

        const std::uint64_t size = 2 * chunk + 100;
        const NxmemAllocation live = allocator.allocate(size);
        if (allocator.table().virtual_backing != nullptr) {
            allocator.commit_all(live);
        }
        const std::vector<unsigned char> written = pattern(5000, 1);
        const std::uint64_t offset = chunk - 1000; // across a chunk boundary
        REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, live, offset, written.size(),
                                            const_cast<unsigned char*>(written.data()))) == NXMEM_STATUS_OK);
        CHECK(std::equal(written.begin(), written.end(), host_view(live) + offset));
        std::vector<unsigned char> read(written.size(), 0);
        REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, offset, read.size(), read.data())) ==
                NXMEM_STATUS_OK);
        CHECK(read == written);

        // On a stream: queued behind the stream's work, done once the stream is.
        const NxmemFence on_stream = cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream.get());
        const std::vector<unsigned char> later = pattern(100, 5);
        std::vector<unsigned char> read_later(later.size(), 0);
        auto held_stream = fake.holding(stream.get());
        REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_FROM_HOST, live, size - 100, later.size(),
                                            const_cast<unsigned char*>(later.data()), &on_stream)) ==
                NXMEM_STATUS_OK);
        REQUIRE(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, size - 100, read_later.size(),
                                            read_later.data(), &on_stream)) == NXMEM_STATUS_OK);
        CHECK(fake.counts().stream_work_pending == 2);
        CHECK(std::all_of(read_later.begin(), read_later.end(), [](unsigned char b) { return b == 0; }));
        held_stream.let_go();
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(read_later == later);

        SECTION("a copy the kit refuses touches nothing") {
            std::vector<unsigned char> untouched(200, 0xEE);
            std::string message;
            CHECK(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, size - 100, 101, untouched.data()),
                                 &message) == NXMEM_STATUS_INVALID_ARGUMENT);
            CHECK(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, UINT64_MAX, 2, untouched.data()),
                                 &message) == NXMEM_STATUS_INVALID_ARGUMENT);
            CUevent event = nullptr;
            REQUIRE(calls.event_create(&event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
            const NxmemFence on_event = cuda_fence(NXMEM_FENCE_CUDA_EVENT, event);
            CHECK(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, 0, 100, untouched.data(), &on_event),
                                 &message) == NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
            NxmemFence elsewhere = on_stream;
            elsewhere.device.index = 1;
            CHECK(allocator.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, 0, 100, untouched.data(), &elsewhere),
                                 &message) == NXMEM_STATUS_WRONG_DEVICE);
            CHECK(std::all_of(untouched.begin(), untouched.end(), [](unsigned char b) { return b == 0xEE; }));
            CHECK(fake.counts().stream_work_pending == 0);
            REQUIRE(calls.event_destroy(event) == CUDA_SUCCESS);
        }
        allocator.deallocate(live);
    }
    fake.require_idle();
}

TEST_CASE("cuda-vmm refuses a copy over memory that is not committed", "[cuda][streams][copy]") {
    fake_driver fake;
    {
        raw_allocator vmm(test::cuda_plugin_path(), "cuda-vmm");
        const NxmemAllocation live = vmm.allocate(2 * chunk);
        std::vector<unsigned char> buffer(100, 0xEE);
        std::string message;
        CHECK(vmm.copy(abi::make_copy_request(NXMEM_COPY_TO_HOST, live, 0, buffer.size(), buffer.data()), &message) ==
              NXMEM_STATUS_INVALID_ARGUMENT);
        CHECK(message.find("not all committed") != std::string::npos);
        CHECK(std::all_of(buffer.begin(), buffer.end(), [](unsigned char b) { return b == 0xEE; }));
        vmm.deallocate(live);
    }
    fake.require_idle();
}

TEST_CASE("cuda-vmm copies to and from a shared prefix mapped nowhere, through a window it unmaps "
          "when the prefix goes",
          "[cuda][streams][copy]") {
    fake_driver fake;
    {
        raw_allocator vmm(test::cuda_plugin_path(), "cuda-vmm");
        const driver_calls calls = fake.calls();
        current_context context(calls);
        scoped_stream stream(calls, CU_STREAM_NON_BLOCKING);
        const std::uint64_t size = chunk + 10;
        const NxmemSharedPrefixHandle prefix = vmm.create_prefix(size);
        const std::vector<unsigned char> written = pattern(size, 9);
        REQUIRE(vmm.copy(abi::make_prefix_copy_request(NXMEM_COPY_FROM_HOST, prefix, 0, size,
                                             const_cast<unsigned char*>(written.data()))) == NXMEM_STATUS_OK);
        CHECK(fake.counts().mappings == 1); // the window
        std::vector<unsigned char> read(size, 0);
        const NxmemFence on_stream = cuda_fence(NXMEM_FENCE_CUDA_STREAM, stream.get());
        REQUIRE(vmm.copy(abi::make_prefix_copy_request(NXMEM_COPY_TO_HOST, prefix, 0, size, read.data(), &on_stream)) ==
                NXMEM_STATUS_OK);
        REQUIRE(calls.stream_synchronize(stream.get()) == CUDA_SUCCESS);
        CHECK(read == written);
        CHECK(vmm.copy(abi::make_prefix_copy_request(NXMEM_COPY_TO_HOST, prefix, 1, size, read.data())) ==
              NXMEM_STATUS_INVALID_ARGUMENT);

        // An allocation mapping the prefix sees what the copy wrote.
        const NxmemAllocation live = vmm.allocate(2 * chunk);
        vmm.commit_prefix(live, prefix);
        CHECK(std::equal(written.begin(), written.end(), host_view(live)));
        vmm.deallocate(live);
        vmm.release_prefix(prefix);
        CHECK(fake.counts().mappings == 0);
        CHECK(fake.counts().reservations == 0);
    }
    fake.require_idle();
}
