// Stream-ordered release and copies (ABI minor 4), as both cuda mechanisms do them.
//   fences     a CUDA_STREAM fence becomes an event the plugin records on that stream during the
//              enqueue; a CUDA_EVENT fence (the host's event, borrowed for the call) becomes an
//              event the plugin records on a stream of its own after cuStreamWaitEvent on the
//              host's, which captures the host's latest record then. Drains poll the plugin's
//              event with cuEventQuery and never wait; the event is destroyed when its release
//              retires (or when the allocator goes with the release still queued).
//              HOST_TIMELINE fences are the kit's.
//   copies     cuMemcpyDtoH / cuMemcpyHtoD, which return once done; with a CUDA_STREAM fence as
//              the stream, cuMemcpyDtoHAsync / cuMemcpyHtoDAsync queued on that stream.
// Every call runs with the device's primary context current.
#pragma once

#include "device_context.hpp"

#include <nxmem/plugin.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace nxmem::cuda {

// An event of the plugin's, recorded after the work a fence names: complete once that work is.
class recorded_event final : public plugin::pending_work {
public:
    recorded_event(std::shared_ptr<const device_context> device, CUevent event) noexcept
        : device_(std::move(device)), event_(event) {}
    ~recorded_event() override { destroy(*device_, event_); }

    result<bool> poll() override {
        CUresult code = CUDA_SUCCESS;
        NXMEM_TRY_VOID(device_->current([&]() -> result<void> {
            code = device_->api().event_query(event_);
            return boost::outcome_v2::success();
        }));
        if (code == CUDA_ERROR_NOT_READY) {
            return false;
        }
        NXMEM_TRY_VOID(device_->check(code, [&] { return device_->who() + ": cuEventQuery"; }));
        return true;
    }

    static void destroy(const device_context& device, CUevent event) noexcept {
        (void)device.current([&] {
            return device.check(device.api().event_destroy(event), [] { return ""; });
        });
    }

private:
    std::shared_ptr<const device_context> device_; // the driver stays loaded while the event lives
    CUevent event_;
};

class stream_order {
public:
    static constexpr std::uint64_t fence_kinds =
        (1ull << NXMEM_FENCE_CUDA_STREAM) | (1ull << NXMEM_FENCE_CUDA_EVENT);
    static constexpr std::uint64_t copy_stream_kinds = 1ull << NXMEM_FENCE_CUDA_STREAM;

    explicit stream_order(std::shared_ptr<const device_context> device) : device_(std::move(device)) {}
    stream_order(const stream_order&) = delete;
    stream_order& operator=(const stream_order&) = delete;
    // The relay stream goes last: every release still queued gave up its event with the kit.
    ~stream_order() {
        if (relay_ != nullptr) {
            (void)device_->current([&] {
                return device_->check(device_->api().stream_destroy(relay_), [] { return ""; });
            });
        }
    }

    // The pending work a checked CUDA_STREAM or CUDA_EVENT fence becomes.
    result<std::unique_ptr<plugin::pending_work>> watch(const plugin::fence& fence) {
        return device_->current([&]() -> result<std::unique_ptr<plugin::pending_work>> {
            CUstream recorded_on = stream_of(fence.handle);
            if (fence.kind == NXMEM_FENCE_CUDA_EVENT) {
                NXMEM_TRY(relay, relay_stream());
                NXMEM_TRY_VOID(device_->check(
                    device_->api().stream_wait_event(relay, reinterpret_cast<CUevent>(fence.handle), 0),
                    [&] { return device_->who() + ": cuStreamWaitEvent on the fence's event"; }));
                recorded_on = relay;
            }
            CUevent event = nullptr;
            NXMEM_TRY_VOID(device_->check(device_->api().event_create(&event, CU_EVENT_DISABLE_TIMING),
                                          [&] { return device_->who() + ": cuEventCreate"; }));
            if (result<void> recorded = device_->check(
                    device_->api().event_record(event, recorded_on),
                    [&] { return device_->who() + ": cuEventRecord on the fence's stream"; });
                !recorded) {
                recorded_event::destroy(*device_, event);
                return boost::outcome_v2::failure(recorded.error());
            }
            try {
                return std::unique_ptr<plugin::pending_work>(std::make_unique<recorded_event>(device_, event));
            } catch (...) {
                recorded_event::destroy(*device_, event);
                throw; // the guard reports it
            }
        });
    }

    // A copy the kit has checked, at `address` on the device.
    result<void> copy(std::uint64_t address, const plugin::copy_job& job) const {
        if (job.length == 0) {
            return boost::outcome_v2::success();
        }
        const auto at = static_cast<CUdeviceptr>(address);
        const auto bytes = static_cast<std::size_t>(job.length);
        const bool to_host = job.direction == NXMEM_COPY_TO_HOST;
        return device_->current([&] {
            const driver_api& api = device_->api();
            if (!job.stream) {
                return device_->check(to_host ? api.memcpy_dtoh(job.host_buffer, at, bytes)
                                              : api.memcpy_htod(at, job.host_buffer, bytes),
                                      [&] { return describe(to_host ? "cuMemcpyDtoH" : "cuMemcpyHtoD", job); });
            }
            const CUstream stream = stream_of(job.stream->handle);
            return device_->check(to_host ? api.memcpy_dtoh_async(job.host_buffer, at, bytes, stream)
                                          : api.memcpy_htod_async(at, job.host_buffer, bytes, stream),
                                  [&] {
                                      return describe(to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync", job);
                                  });
        });
    }

private:
    static CUstream stream_of(std::uint64_t handle) noexcept {
        return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(handle));
    }

    std::string describe(const char* call, const plugin::copy_job& job) const {
        return device_->who() + ": " + call + " of " + std::to_string(job.length) + " bytes at offset " +
               std::to_string(job.offset);
    }

    // The plugin's own stream, made on first use, on which host events are relayed.
    result<CUstream> relay_stream() {
        std::lock_guard lock(relay_mutex_);
        if (relay_ == nullptr) {
            NXMEM_TRY_VOID(device_->check(device_->api().stream_create(&relay_, CU_STREAM_NON_BLOCKING),
                                          [&] { return device_->who() + ": cuStreamCreate"; }));
        }
        return relay_;
    }

    std::shared_ptr<const device_context> device_;
    std::mutex relay_mutex_; // guards relay_'s creation
    CUstream relay_ = nullptr;
};

// What both cuda mechanisms offer the kit for minor 4, as a base: the kit finds these members on
// the mechanism (cuda-vmm adds range_committed for its virtual backing).
class stream_ordered {
public:
    static constexpr bool accepts_host_timeline_fences = true; // the kit's to wait on
    std::uint64_t watched_fence_kinds() const { return stream_order::fence_kinds; }
    result<std::unique_ptr<plugin::pending_work>> watch_fence(const plugin::fence& fence) {
        return streams_.watch(fence);
    }
    std::uint64_t copy_stream_kinds() const { return stream_order::copy_stream_kinds; }
    result<void> copy(const plugin::allocation_record& record, const plugin::copy_job& job) {
        return streams_.copy(record.address + job.offset, job);
    }

protected:
    explicit stream_ordered(std::shared_ptr<const device_context> device) : streams_(std::move(device)) {}
    // A checked copy at `address` (a shared prefix's window, for cuda-vmm).
    result<void> copy_at(std::uint64_t address, const plugin::copy_job& job) const {
        return streams_.copy(address, job);
    }

private:
    stream_order streams_;
};

} // namespace nxmem::cuda
