// The kit's minor-4 slots: fenced release over the deferred-release queue (the kit's own
// HOST_TIMELINE waits and a mechanism's watched fences) and copies, each request checked before
// anything is touched. In-process, through the C table the kit builds.
#include <nxmem/abi/fence.hpp>
#include <nxmem/abi/stream_requests.hpp>
#include <nxmem/plugin.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

using namespace nxmem;
using namespace nxmem::plugin;

namespace {

// What the test's device fences (kind CUDA_EVENT) say when polled: id -> completed.
std::map<std::uint64_t, bool>& device_work() {
    static std::map<std::uint64_t, bool> work;
    return work;
}
int& watch_calls() {
    static int calls = 0;
    return calls;
}
int& copy_calls() {
    static int calls = 0;
    return calls;
}

class scripted_work final : public pending_work {
public:
    explicit scripted_work(std::uint64_t id) : id_(id) {}
    result<bool> poll() override { return device_work().at(id_); }

private:
    std::uint64_t id_;
};

// Heap memory; queued releases retire at once unless fenced; copies are memcpy. It watches
// CUDA_EVENT fences (scripted by the test) and accepts no stream for its copies unless
// `copy_streams` is set.
struct streamed_by_kit {
    static constexpr const char* name = "streamed-by-kit";
    static constexpr std::uint64_t mechanism_id = 0x6b697473; // "kits"
    static constexpr std::uint64_t device_types = device_bit(NXMEM_DEVICE_CPU);
    static constexpr bool retires_through_release_allocation = true;
    static constexpr bool accepts_host_timeline_fences = true;

    static result<std::unique_ptr<streamed_by_kit>> open(open_context&) {
        return std::make_unique<streamed_by_kit>();
    }
    result<block> allocate(std::uint64_t size, std::uint64_t) {
        void* memory = std::calloc(1, static_cast<std::size_t>(size));
        return block{reinterpret_cast<std::uint64_t>(memory), size, size};
    }
    result<release_outcome> release_allocation(const allocation_record& record) {
        std::free(reinterpret_cast<void*>(record.address));
        return release_outcome{NXMEM_RELEASE_COMPLETE, record.size, 0};
    }

    result<std::unique_ptr<pending_work>> watch_fence(const fence& watched) {
        ++watch_calls();
        return std::unique_ptr<pending_work>(std::make_unique<scripted_work>(watched.handle));
    }
    std::uint64_t watched_fence_kinds() const { return abi::fence_kind_bit(NXMEM_FENCE_CUDA_EVENT); }

    result<void> copy(const allocation_record& record, const copy_job& job) {
        ++copy_calls();
        auto* memory = reinterpret_cast<unsigned char*>(record.address) + job.offset;
        if (job.direction == NXMEM_COPY_TO_HOST) {
            std::memcpy(job.host_buffer, memory, job.length);
        } else {
            std::memcpy(memory, job.host_buffer, job.length);
        }
        return success();
    }
};

std::vector<NxmemReleaseCompletion>& completions() {
    static std::vector<NxmemReleaseCompletion> seen;
    return seen;
}
void note_completion(void*, const NxmemReleaseCompletion* completion) {
    completions().push_back(*completion);
}

// One allocator of streamed_by_kit through its C table, opened as a host at `minor` would.
class opened {
public:
    explicit opened(std::uint32_t minor = NXMEM_ABI_MINOR, bool release_completed = true) {
        this_module().negotiated_minor.store(minor);
        completions().clear();
        device_work().clear();
        watch_calls() = 0;
        copy_calls() = 0;
        callbacks_ = abi::make_struct<NxmemHostCallbacks>();
        callbacks_.abi_minor = NXMEM_ABI_MINOR;
        callbacks_.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
        callbacks_.release_completed = release_completed ? &note_completion : nullptr;
        auto request = abi::make_struct<NxmemOpenRequest>();
        request.device = device_.to_wire();
        request.callbacks = &callbacks_;
        table_ = allocator_object<streamed_by_kit>::open(request).value();
    }
    ~opened() {
        table_->release(table_);
        this_module().negotiated_minor.store(NXMEM_ABI_MINOR);
    }
    opened(const opened&) = delete;
    opened& operator=(const opened&) = delete;

    NxmemAllocatorVtable* table() const { return table_; }
    NxmemDeviceId device() const { return device_.to_wire(); }

    NxmemAllocation allocate(std::uint64_t size) {
        auto request = abi::make_struct<NxmemAllocRequest>();
        request.mechanism_id = streamed_by_kit::mechanism_id;
        request.device = device_.to_wire();
        request.allocation_id = ++last_id_;
        request.size = size;
        request.alignment = 64;
        auto made = abi::make_struct<NxmemAllocResult>();
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->allocate(table_, &request, &made, &status) == NXMEM_STATUS_OK);
        auto live = abi::make_struct<NxmemAllocation>();
        live.mechanism_id = streamed_by_kit::mechanism_id;
        live.device = request.device;
        live.allocation_id = request.allocation_id;
        live.address = made.address;
        live.size = size;
        live.alignment = 64;
        return live;
    }
    NxmemStatusCode release(const NxmemAllocation& live) {
        auto outcome = abi::make_struct<NxmemReleaseOutcome>();
        auto status = abi::make_struct<NxmemStatus>();
        return table_->release_allocation(table_, &live, &outcome, &status);
    }

    NxmemFence timeline(const std::atomic<std::uint64_t>& counter, std::uint64_t value) const {
        return abi::make_fence(NXMEM_FENCE_HOST_TIMELINE, device_.to_wire(), reinterpret_cast<std::uint64_t>(&counter), value);
    }
    NxmemFence device_fence(std::uint64_t id) const { return abi::make_fence(NXMEM_FENCE_CUDA_EVENT, device_.to_wire(), id); }

    NxmemStatusCode enqueue_fenced(const NxmemAllocation& live, std::uint64_t ticket,
                                   const std::vector<NxmemFence>& fences,
                                   std::uint32_t stride = sizeof(NxmemFence)) {
        const NxmemFencedReleaseRequest request =
            abi::make_fenced_release_request(live, ticket, fences.data(), static_cast<std::uint32_t>(fences.size()), stride);
        auto status = abi::make_struct<NxmemStatus>();
        const NxmemStatusCode code =
            table_->fenced_release->enqueue_fenced_release(table_, &request, &status);
        UNSCOPED_INFO(status.message);
        return code;
    }
    std::uint64_t drain() {
        std::uint64_t retired = 0;
        auto status = abi::make_struct<NxmemStatus>();
        REQUIRE(table_->drain_releases(table_, &retired, &status) == NXMEM_STATUS_OK);
        return retired;
    }

    NxmemStatusCode copy(const NxmemAllocation& live, NxmemCopyDirection direction,
                         std::uint64_t offset, std::uint64_t length, void* buffer,
                         const NxmemFence* stream = nullptr) {
        const NxmemCopyRequest request = abi::make_copy_request(direction, live, offset, length, buffer, stream);
        auto status = abi::make_struct<NxmemStatus>();
        const NxmemStatusCode code = table_->copy->copy(table_, &request, &status);
        UNSCOPED_INFO(status.message);
        return code;
    }

private:
    device_id device_{NXMEM_DEVICE_CPU, 0};
    NxmemHostCallbacks callbacks_{};
    NxmemAllocatorVtable* table_ = nullptr;
    std::uint64_t last_id_ = 0;
};

std::vector<std::uint64_t> retired_tickets() {
    std::vector<std::uint64_t> tickets;
    for (const NxmemReleaseCompletion& completion : completions()) {
        tickets.push_back(completion.ticket);
    }
    return tickets;
}

} // namespace

TEST_CASE("kit: a mechanism offering fences and copies declares minor 4 and fills both tables",
          "[plugin-kit][streams]") {
    STATIC_REQUIRE(offers_fenced_release<streamed_by_kit>);
    STATIC_REQUIRE(watches_fences<streamed_by_kit>);
    STATIC_REQUIRE(offers_copy<streamed_by_kit>);
    STATIC_REQUIRE(declared_minor_of<streamed_by_kit>() == 4);
    opened allocator;
    const NxmemAllocatorVtable& table = *allocator.table();
    CHECK(table.abi_minor == 4);
    CHECK((table.capabilities & NXMEM_CAP_FENCED_RELEASE) != 0);
    CHECK((table.capabilities & NXMEM_CAP_COPY) != 0);
    REQUIRE(table.fenced_release != nullptr);
    CHECK(table.fenced_release->type_tag == NXMEM_TYPE_TAG_FENCED_RELEASE);
    CHECK(table.fenced_release->fence_kinds ==
          (abi::fence_kind_bit(NXMEM_FENCE_HOST_TIMELINE) | abi::fence_kind_bit(NXMEM_FENCE_CUDA_EVENT)));
    REQUIRE(table.copy != nullptr);
    CHECK(table.copy->type_tag == NXMEM_TYPE_TAG_COPY);
    CHECK(table.copy->stream_kinds == 0);
}

TEST_CASE("kit: below minor 4, or without release_completed, the minor-4 tables stay NULL",
          "[plugin-kit][streams]") {
    SECTION("negotiated minor 3") {
        opened allocator(3);
        CHECK(allocator.table()->abi_minor == 3);
        CHECK((allocator.table()->capabilities & (NXMEM_CAP_FENCED_RELEASE | NXMEM_CAP_COPY)) == 0);
        CHECK(allocator.table()->struct_size == abi::bytes_required<NxmemAllocatorVtable>(3));
    }
    SECTION("no release_completed: no deferred release, so no fenced release (F2)") {
        opened allocator(NXMEM_ABI_MINOR, false);
        CHECK((allocator.table()->capabilities & NXMEM_CAP_FENCED_RELEASE) == 0);
        CHECK(allocator.table()->fenced_release == nullptr);
        CHECK(allocator.table()->copy != nullptr);
    }
}

TEST_CASE("kit: a fenced release retires after its host timeline fence, in enqueue order, and a "
          "drain never waits",
          "[plugin-kit][streams]") {
    opened allocator;
    std::atomic<std::uint64_t> counter{0};
    const NxmemAllocation first = allocator.allocate(100);
    const NxmemAllocation second = allocator.allocate(100);
    REQUIRE(allocator.enqueue_fenced(first, 1, {allocator.timeline(counter, 5)}) == NXMEM_STATUS_OK);
    auto status = abi::make_struct<NxmemStatus>();
    REQUIRE(allocator.table()->enqueue_release(allocator.table(), &second, 2, &status) == NXMEM_STATUS_OK);
    CHECK(allocator.release(first) == NXMEM_STATUS_UNKNOWN_ALLOCATION); // handed over (D9)

    CHECK(allocator.drain() == 0); // the fenced one is first: nothing behind it retires either
    counter.store(4);
    CHECK(allocator.drain() == 0);
    counter.store(5);
    CHECK(allocator.drain() == 2);
    CHECK(retired_tickets() == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("kit: a mechanism's watched fences are polled at each drain until every one completed",
          "[plugin-kit][streams]") {
    opened allocator;
    std::atomic<std::uint64_t> counter{1};
    const NxmemAllocation live = allocator.allocate(64);
    device_work()[7] = false;
    REQUIRE(allocator.enqueue_fenced(live, 9, {allocator.device_fence(7), allocator.timeline(counter, 1)}) ==
            NXMEM_STATUS_OK);
    CHECK(watch_calls() == 1); // the host timeline is the kit's own
    CHECK(allocator.drain() == 0);
    device_work()[7] = true;
    CHECK(allocator.drain() == 1);
    CHECK(retired_tickets() == std::vector<std::uint64_t>{9});
}

TEST_CASE("kit: a malformed fenced release is refused before anything is touched",
          "[plugin-kit][streams]") {
    opened allocator;
    std::atomic<std::uint64_t> counter{0};
    const NxmemAllocation live = allocator.allocate(64);
    const NxmemFence good = allocator.timeline(counter, 1);
    NxmemFence stream = allocator.device_fence(1);
    stream.kind = NXMEM_FENCE_CUDA_STREAM;
    NxmemFence unknown = good;
    unknown.kind = 77;
    NxmemFence elsewhere = good;
    elsewhere.device.index = 1;
    NxmemFence unaligned = good;
    unaligned.handle += 4;

    CHECK(allocator.enqueue_fenced(live, 1, {}) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.enqueue_fenced(live, 1, std::vector<NxmemFence>(NXMEM_MAX_FENCES + 1, good)) ==
          NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.enqueue_fenced(live, 1, {good}, 32) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.enqueue_fenced(live, 1, {good, good}, 44) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.enqueue_fenced(live, 1, {unaligned}) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.enqueue_fenced(live, 1, {good, unknown}) == NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
    CHECK(allocator.enqueue_fenced(live, 1, {good, stream}) == NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
    CHECK(allocator.enqueue_fenced(live, 1, {good, elsewhere}) == NXMEM_STATUS_WRONG_DEVICE);
    NxmemAllocation misdescribed = live;
    misdescribed.size = 65;
    CHECK(allocator.enqueue_fenced(misdescribed, 1, {allocator.device_fence(3)}) ==
          NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(watch_calls() == 0); // no fence was watched for a refused release
    CHECK(allocator.drain() == 0);
    CHECK(allocator.release(live) == NXMEM_STATUS_OK); // still live: nothing was queued
}

TEST_CASE("kit: copies go both ways, a refused one touches nothing, length 0 copies nothing",
          "[plugin-kit][streams]") {
    opened allocator;
    const NxmemAllocation live = allocator.allocate(256);
    std::vector<unsigned char> in(16, 0xAB);
    std::vector<unsigned char> out(16, 0);
    REQUIRE(allocator.copy(live, NXMEM_COPY_FROM_HOST, 240, 16, in.data()) == NXMEM_STATUS_OK);
    REQUIRE(allocator.copy(live, NXMEM_COPY_TO_HOST, 240, 16, out.data()) == NXMEM_STATUS_OK);
    CHECK(out == in);
    CHECK(copy_calls() == 2);

    std::atomic<std::uint64_t> counter{0};
    const NxmemFence stream = allocator.timeline(counter, 1);
    NxmemAllocation misdescribed = live;
    misdescribed.size = 300;
    NxmemAllocation foreign = live;
    foreign.device.index = 2;
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, 241, 16, out.data()) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, ~0ull - 4, 16, out.data()) ==
          NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, 0, 16, nullptr) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.copy(live, 3, 0, 16, out.data()) == NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.copy(misdescribed, NXMEM_COPY_TO_HOST, 0, 16, out.data()) ==
          NXMEM_STATUS_INVALID_ARGUMENT);
    CHECK(allocator.copy(foreign, NXMEM_COPY_TO_HOST, 0, 16, out.data()) == NXMEM_STATUS_WRONG_DEVICE);
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, 0, 16, out.data(), &stream) ==
          NXMEM_STATUS_UNSUPPORTED_CAPABILITY);
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, 256, 0, nullptr) == NXMEM_STATUS_OK);
    CHECK(allocator.copy(live, NXMEM_COPY_FROM_HOST, 0, 0, nullptr) == NXMEM_STATUS_OK);
    CHECK(copy_calls() == 2); // neither the refused copies nor the empty ones reached the mechanism
    REQUIRE(allocator.release(live) == NXMEM_STATUS_OK);
    CHECK(allocator.copy(live, NXMEM_COPY_TO_HOST, 0, 16, out.data()) == NXMEM_STATUS_UNKNOWN_ALLOCATION);
}
