// nxmem::pytorch::cuda_stream_policy: stream_ordered_pool's StreamPolicy for CUDA streams. A fence
// is an event recorded on the stream (cuEventRecord), completed when cuEventQuery says so, and a
// stream waits for one with cuStreamWaitEvent, so another stream takes pending memory at once.
// Events are created without timing and kept for reuse once the pool retires them.
//
// The driver's entry points come from the caller's table `Api` (plugins/cuda/driver.hpp's
// driver_api, or any struct with the same members: ctx_push_current, ctx_pop_current,
// event_create, event_record, event_query, event_destroy, stream_wait_event), resolved as it
// resolves the rest of the driver, and every call is made with the device's context pushed. The
// table must outlive the policy. Needs cuda.h and cudaTypedefs.h (types only): it lives
// beside the PyTorch adapters, out of the headers every build compiles.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/pool/stream_policy.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::pytorch {

template <class Api> class cuda_stream_policy {
public:
    using stream_type = CUstream;
    using fence_type = CUevent;

    // `context`: the device's (primary) context, current during every call.
    cuda_stream_policy(const Api& api, CUcontext context) : state_(std::make_shared<shared_state>(api, context)) {}

    result<CUevent> record(CUstream stream) {
        const context_scope scope(*state_);
        CUevent event = state_->take_event();
        if (event == nullptr) {
            if (const CUresult created = state_->api.event_create(&event, CU_EVENT_DISABLE_TIMING); created != CUDA_SUCCESS) {
                return failed("cuEventCreate", created);
            }
        }
        if (const CUresult recorded = state_->api.event_record(event, stream); recorded != CUDA_SUCCESS) {
            state_->api.event_destroy(event);
            return failed("cuEventRecord", recorded);
        }
        return event;
    }

    bool completed(CUevent event) {
        const context_scope scope(*state_);
        return state_->api.event_query(event) == CUDA_SUCCESS; // CUDA_ERROR_NOT_READY: pending
    }

    result<void> wait(CUstream stream, CUevent event) {
        const context_scope scope(*state_);
        if (const CUresult waited = state_->api.stream_wait_event(stream, event, 0); waited != CUDA_SUCCESS) {
            return failed("cuStreamWaitEvent", waited);
        }
        return boost::outcome_v2::success();
    }

    // Kept for the next record; destroyed when there is no room to keep it.
    void retire(CUevent&& event) noexcept { state_->keep_event(event); }

private:
    struct shared_state {
        shared_state(const Api& functions, CUcontext device_context) : api(functions), context(device_context) {}
        shared_state(const shared_state&) = delete;
        shared_state& operator=(const shared_state&) = delete;
        ~shared_state() {
            const context_scope scope(*this);
            for (CUevent event : idle) {
                api.event_destroy(event);
            }
        }

        CUevent take_event() noexcept {
            std::lock_guard hold(mutex);
            if (idle.empty()) {
                return nullptr;
            }
            CUevent event = idle.back();
            idle.pop_back();
            return event;
        }
        void keep_event(CUevent event) noexcept {
            {
                std::lock_guard hold(mutex);
                try {
                    idle.push_back(event);
                    return;
                } catch (const std::bad_alloc&) {
                }
            }
            const context_scope scope(*this);
            api.event_destroy(event);
        }

        const Api& api;
        CUcontext context;
        std::mutex mutex; // idle
        std::vector<CUevent> idle;
    };

    // The device's context, current for the scope (and the caller's back after it).
    class context_scope {
    public:
        explicit context_scope(const shared_state& state) : state_(state) { state_.api.ctx_push_current(state_.context); }
        ~context_scope() {
            CUcontext popped = nullptr;
            state_.api.ctx_pop_current(&popped);
        }
        context_scope(const context_scope&) = delete;
        context_scope& operator=(const context_scope&) = delete;

    private:
        const shared_state& state_;
    };

    [[gnu::cold]] static error failed(const char* call, CUresult code) {
        return {code == CUDA_ERROR_OUT_OF_MEMORY ? status_code::out_of_memory : status_code::internal_error,
                std::string("cuda stream policy: ") + call + " failed: CUresult " + std::to_string(static_cast<int>(code))};
    }

    std::shared_ptr<shared_state> state_;
};

namespace detail {
// Stand-in for the driver table (declared only: never called).
struct cuda_api_archetype {
    PFN_cuCtxPushCurrent_v4000 ctx_push_current;
    PFN_cuCtxPopCurrent_v4000 ctx_pop_current;
    PFN_cuEventCreate_v2000 event_create;
    PFN_cuEventRecord_v2000 event_record;
    PFN_cuEventQuery_v2000 event_query;
    PFN_cuEventDestroy_v4000 event_destroy;
    PFN_cuStreamWaitEvent_v3020 stream_wait_event;
};
} // namespace detail
static_assert(stream_policy_waits<cuda_stream_policy<detail::cuda_api_archetype>>);

} // namespace nxmem::pytorch
