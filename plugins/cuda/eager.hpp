// cuda-eager: device memory that is usable, and costs, from the moment it is allocated.
//   allocate  cuMemAlloc with the device's primary context current; an alignment above the
//             driver's 256 bytes is met by over-allocating by (alignment - 256) and handing out
//             the aligned address inside (the base is remembered for cuMemFree)
//   release   cuMemFree; a deferred release retires at the next drain, a fenced one (minor 4)
//             once its fences have completed (stream_order.hpp): until then the memory stays
//             allocated, so nothing queued before the fence can write into a next owner's memory
//   copy      cuMemcpyDtoH / cuMemcpyHtoD, or their Async forms on a CUDA_STREAM fence's stream
// It costs (mapped_bytes, budget) exactly the bytes asked of cuMemAlloc.
#pragma once

#include "../posix/budget.hpp"
#include "../posix/retire_now.hpp"
#include "device_context.hpp"
#include "settings.hpp"
#include "stream_order.hpp"

#include <nxmem/plugin.hpp>
#include <nxmem/usage.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace nxmem::cuda {

class eager_mechanism : public stream_ordered {
public:
    static constexpr const char* name = "cuda-eager";
    static constexpr std::uint64_t mechanism_id = 0x43554401; // "CUD" 1
    static constexpr std::uint64_t device_types = plugin::device_bit(NXMEM_DEVICE_CUDA);
    static constexpr bool uses_host_reclaim = true; // when a budget is set
    // cuMemAlloc's addresses are aligned to at least this.
    static constexpr std::uint64_t driver_alignment = 256;

    eager_mechanism(const settings& taken, const plugin::open_context& context,
                    std::shared_ptr<device_context> device)
        : stream_ordered(device), device_(std::move(device)),
          budget_(taken.budget, context.host, mechanism_id, context.device, name) {}

    eager_mechanism(const eager_mechanism&) = delete;
    eager_mechanism& operator=(const eager_mechanism&) = delete;

    static result<std::unique_ptr<eager_mechanism>> open(plugin::open_context& context) {
        NXMEM_TRY(taken, settings::take(context.options, name));
        NXMEM_TRY(device, device_context::open(name, context.device));
        return std::make_unique<eager_mechanism>(taken, context, std::move(device));
    }

    result<plugin::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(cost, cost_of(size, alignment));
        NXMEM_TRY(address, budget_.charged<std::uint64_t>(cost, [&] { return device_memory(cost, alignment); }));
        live_allocations_.fetch_add(1, std::memory_order_relaxed);
        reserved_bytes_.fetch_add(size, std::memory_order_relaxed);
        mapped_bytes_.fetch_add(cost, std::memory_order_relaxed);
        return plugin::block{address, size, cost};
    }

    result<plugin::release_outcome> release_allocation(const plugin::allocation_record& record) {
        NXMEM_TRY(cost, cost_of(record.size, record.alignment)); // it was computed once already
        const CUdeviceptr base = base_of(record);
        NXMEM_TRY_VOID(device_->current([&] {
            return device_->check(device_->api().mem_free(base), [&] {
                return std::string(name) + ": cuMemFree of 0x" + nxmem::detail::to_hex(base);
            });
        }));
        forget_base(record);
        budget_.credit(cost);
        live_allocations_.fetch_sub(1, std::memory_order_relaxed);
        reserved_bytes_.fetch_sub(record.size, std::memory_order_relaxed);
        mapped_bytes_.fetch_sub(cost, std::memory_order_relaxed);
        return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, cost, 0};
    }

    // Deferred release retires at once, as release does; a fenced one is asked only once its
    // fences have completed.
    result<std::optional<plugin::release_outcome>> retire(const plugin::allocation_record& record) {
        return posix::retired_now(release_allocation(record));
    }

    // Usage query (minor 2), read from atomic totals.
    result<allocator_usage> usage() const {
        allocator_usage now{};
        now.live_allocations = live_allocations_.load(std::memory_order_relaxed);
        now.reserved_bytes = reserved_bytes_.load(std::memory_order_relaxed);
        now.mapped_bytes = mapped_bytes_.load(std::memory_order_relaxed);
        return now;
    }

private:
    static bool over_aligned(std::uint64_t alignment) noexcept { return alignment > driver_alignment; }

    // The bytes asked of cuMemAlloc: the size, plus room to align within when over-aligned.
    static result<std::uint64_t> cost_of(std::uint64_t size, std::uint64_t alignment) {
        if (!over_aligned(alignment)) {
            return size;
        }
        const std::uint64_t slack = alignment - driver_alignment;
        if (size > UINT64_MAX - slack) {
            return fail(status_code::out_of_memory,
                        std::string(name) + ": " + std::to_string(size) + " bytes aligned to " +
                            std::to_string(alignment) + " overflow");
        }
        return size + slack;
    }

    result<std::uint64_t> device_memory(std::uint64_t bytes, std::uint64_t alignment) {
        CUdeviceptr base = 0;
        NXMEM_TRY_VOID(device_->current([&] {
            return device_->check(device_->api().mem_alloc(&base, static_cast<std::size_t>(bytes)),
                                  [&] {
                                      return std::string(name) + ": cuMemAlloc of " +
                                             std::to_string(bytes) + " bytes";
                                  });
        }));
        if (!over_aligned(alignment)) {
            return static_cast<std::uint64_t>(base);
        }
        const std::uint64_t aligned = (base + (alignment - 1)) & ~(alignment - 1);
        try {
            std::lock_guard lock(bases_mutex_);
            bases_.emplace(aligned, base);
        } catch (...) {
            (void)device_->current([&] { return device_->check(device_->api().mem_free(base), [] { return ""; }); });
            throw; // the guard reports it
        }
        return aligned;
    }

    CUdeviceptr base_of(const plugin::allocation_record& record) {
        if (!over_aligned(record.alignment)) {
            return static_cast<CUdeviceptr>(record.address);
        }
        std::lock_guard lock(bases_mutex_);
        return bases_.at(record.address); // the kit hands back only live records
    }

    void forget_base(const plugin::allocation_record& record) {
        if (over_aligned(record.alignment)) {
            std::lock_guard lock(bases_mutex_);
            bases_.erase(record.address);
        }
    }

    std::shared_ptr<device_context> device_;
    posix::byte_budget budget_;
    std::mutex bases_mutex_; // guards bases_: only over-aligned allocations take it
    std::unordered_map<std::uint64_t, CUdeviceptr> bases_;
    std::atomic<std::uint64_t> live_allocations_{0};
    std::atomic<std::uint64_t> reserved_bytes_{0};
    std::atomic<std::uint64_t> mapped_bytes_{0};
};

} // namespace nxmem::cuda
