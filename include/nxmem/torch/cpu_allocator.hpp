// nxmem::pytorch::cpu_allocator<A>: PyTorch's CPU tensors served by any DeviceAllocator of host
// memory (typically a pool over a plugin allocator), as a c10::Allocator.
//
// Included only by code that has libtorch (c10); nothing else in nxmem includes it.
//
// Lifetime rule (docs/TORCH.md, "Lifetime"): c10 calls a tensor's deleter whenever the last
// reference dies -- possibly at interpreter exit, possibly long after the engine forgot the
// allocator -- and c10::SetCPUAllocator keeps a raw pointer that it expects to live forever. So an
// adapter is *immortal*: `cpu_allocator<A>::create` allocates it and never destroys it, and it
// holds the upstream (and through it the plugin allocator and the plugin module) for the rest of
// the process. No deleter can then run after the allocator it needs is gone. The code of the
// deleters lives in whatever shared object instantiated this header: that object must stay mapped
// too (engines/torch pins itself with RTLD_NODELETE; an executable is mapped until exit anyway).
//
// Two ways a DataPtr finds its allocation again, chosen at compile time:
// * the upstream releases by address (`release_by_address(void*)`, nxmem's pool): the context is
//   the data pointer itself, the deleter a function bound to the adapter's slot, and raw_deleter()
//   returns it, so c10's raw_allocate/raw_deallocate work (c10 requires context == data for them);
// * otherwise (a plugin_allocator used directly) the context is a record holding the whole
//   allocation value, taken from the adapter's free list (no heap allocation once the list has
//   grown to the number of live tensors); raw_deleter() is null, as c10 requires when the deleter
//   needs more than the data pointer (c10's raw_allocate then refuses with an assertion).
#pragma once

#include <nxmem/concepts/device_allocator.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::pytorch {

// "the allocator takes an allocation back from its address alone" (nxmem::pool_allocator does)
template <class A>
concept releases_by_address = DeviceAllocator<A> &&
    requires(A& allocator, typename A::device_type::address_type address) {
        { allocator.release_by_address(address) } -> std::same_as<result<release_report>>;
    };

// The alignment every CPU tensor gets from PyTorch's own allocator (64 bytes in 1.13).
inline constexpr std::uint64_t tensor_alignment = c10::gAlignment;

namespace detail {

// An adapter that releases by address, as seen from a deleter that has only the data pointer.
class address_releaser {
public:
    virtual void release_address(void* data) const noexcept = 0;

protected:
    ~address_releaser() = default; // never destroyed through this type (adapters are immortal)
};

// Deleters that receive the data pointer alone find their adapter through a slot, one function
// per slot. Slots are claimed once and never freed, as adapters are never destroyed.
inline constexpr std::size_t address_slot_count = 16;
inline std::array<std::atomic<const address_releaser*>, address_slot_count> address_slots{};
inline std::atomic<std::size_t> address_slots_claimed{0};

template <std::size_t Slot> void release_in_slot(void* data) {
    if (data == nullptr) {
        return; // size 0: nothing was allocated
    }
    address_slots[Slot].load(std::memory_order_acquire)->release_address(data);
}

template <std::size_t... Slots>
constexpr std::array<c10::DeleterFnPtr, sizeof...(Slots)>
make_slot_deleters(std::index_sequence<Slots...>) {
    return {&release_in_slot<Slots>...};
}
inline constexpr std::array<c10::DeleterFnPtr, address_slot_count> slot_deleters =
    make_slot_deleters(std::make_index_sequence<address_slot_count>{});

} // namespace detail

template <DeviceAllocator A>
    requires std::same_as<typename A::device_type, cpu_device>
class cpu_allocator final : public c10::Allocator, detail::address_releaser {
public:
    // Creates an immortal adapter over `upstream` (see the lifetime rule above). Throws c10::Error
    // when the process already has address_slot_count adapters that release by address.
    static cpu_allocator& create(std::shared_ptr<A> upstream) {
        TORCH_CHECK(upstream != nullptr, "nxmem::pytorch::cpu_allocator needs an upstream allocator");
        return *new cpu_allocator(std::move(upstream)); // never deleted, by design
    }

    cpu_allocator(const cpu_allocator&) = delete;
    cpu_allocator& operator=(const cpu_allocator&) = delete;

    // Size 0 (c10 asks for it for every empty tensor) allocates nothing: a null data pointer with
    // a deleter that ignores it, as PyTorch's own allocator does. Failure throws c10's
    // OutOfMemoryError with the upstream's reason (c10's allocate has no other way to fail).
    c10::DataPtr allocate(std::size_t bytes) const override {
        if (bytes == 0) {
            return {nullptr, nullptr, deleter(), c10::Device(c10::DeviceType::CPU)};
        }
        auto granted = upstream_->allocate(bytes, tensor_alignment);
        if (!granted) [[unlikely]] {
            TORCH_CHECK_WITH(OutOfMemoryError, false, "nxmem: the allocator refused ", bytes,
                             " bytes: ", granted.error().describe());
        }
        void* data = granted.value().address;
        if constexpr (releases_by_address<A>) {
            return {data, data, deleter(), c10::Device(c10::DeviceType::CPU)};
        } else {
            record* held = take_record();
            if (held == nullptr) [[unlikely]] {
                (void)upstream_->release(granted.value());
                TORCH_CHECK_WITH(OutOfMemoryError, false,
                                 "nxmem: no memory for the allocation's record");
            }
            held->live = granted.value();
            return {data, held, &release_record, c10::Device(c10::DeviceType::CPU)};
        }
    }

    // Non-null only when the deleter needs the data pointer alone (c10's rule for raw_allocate).
    c10::DeleterFnPtr raw_deleter() const override {
        if constexpr (releases_by_address<A>) {
            return deleter();
        } else {
            return nullptr;
        }
    }

    // Whether `data_ptr` was handed out by this adapter (its deleter and, for records, its owner).
    bool owns(const c10::DataPtr& data_ptr) const noexcept {
        if (data_ptr.get() == nullptr || data_ptr.get_deleter() != deleter()) {
            return false;
        }
        if constexpr (releases_by_address<A>) {
            return true;
        } else {
            return static_cast<const record*>(data_ptr.get_context())->owner == this;
        }
    }

    // Releases that failed inside a deleter (a deleter cannot report, so it counts).
    std::uint64_t failed_releases() const noexcept {
        return failed_releases_.load(std::memory_order_relaxed);
    }

    A& upstream() const noexcept { return *upstream_; }
    const std::shared_ptr<A>& shared_upstream() const noexcept { return upstream_; }

private:
    struct record {
        allocation<cpu_device> live{};
        const cpu_allocator* owner = nullptr;
        record* next_free = nullptr;
    };
    static constexpr std::size_t records_per_block = 256;

    explicit cpu_allocator(std::shared_ptr<A> upstream) : upstream_(std::move(upstream)) {
        if constexpr (releases_by_address<A>) {
            slot_ = detail::address_slots_claimed.fetch_add(1);
            TORCH_CHECK(slot_ < detail::address_slot_count, "nxmem: at most ",
                        detail::address_slot_count,
                        " adapters that release by address can exist in one process");
            detail::address_slots[slot_].store(this, std::memory_order_release);
        }
    }
    ~cpu_allocator() = default; // never runs: adapters are immortal

    c10::DeleterFnPtr deleter() const noexcept {
        if constexpr (releases_by_address<A>) {
            return detail::slot_deleters[slot_];
        } else {
            return &release_record;
        }
    }

    void release_address(void* data) const noexcept override {
        if constexpr (releases_by_address<A>) {
            if (!upstream_->release_by_address(data)) [[unlikely]] {
                failed_releases_.fetch_add(1, std::memory_order_relaxed);
            }
        }
    }

    static void release_record(void* context) {
        if (context == nullptr) {
            return; // size 0
        }
        auto* held = static_cast<record*>(context);
        const cpu_allocator& owner = *held->owner;
        if (!owner.upstream_->release(held->live)) [[unlikely]] {
            owner.failed_releases_.fetch_add(1, std::memory_order_relaxed);
        }
        owner.give_back_record(held);
    }

    // The free list grows a block at a time and never shrinks: steady state allocates nothing.
    record* take_record() const noexcept {
        std::lock_guard lock(records_lock_);
        if (free_records_ == nullptr) {
            try {
                auto block = std::make_unique<record[]>(records_per_block);
                for (std::size_t i = 0; i < records_per_block; ++i) {
                    block[i].owner = this;
                    block[i].next_free = i + 1 < records_per_block ? &block[i + 1] : nullptr;
                }
                free_records_ = &block[0];
                record_blocks_.push_back(std::move(block));
            } catch (const std::bad_alloc&) {
                return nullptr;
            }
        }
        record* taken = free_records_;
        free_records_ = taken->next_free;
        return taken;
    }
    void give_back_record(record* held) const noexcept {
        std::lock_guard lock(records_lock_);
        held->next_free = free_records_;
        free_records_ = held;
    }

    std::shared_ptr<A> upstream_;
    std::size_t slot_ = 0;
    mutable std::atomic<std::uint64_t> failed_releases_{0};
    mutable std::mutex records_lock_;
    mutable record* free_records_ = nullptr;
    mutable std::vector<std::unique_ptr<record[]>> record_blocks_;
};

// Makes `adapter` PyTorch's CPU allocator. c10 keeps the raw pointer forever, which the adapter's
// immortality makes safe. Returns the allocator it replaced, so an engine can put it back
// (tensors made by either keep their own deleter). Throws c10::Error when c10 kept another
// allocator (one registered with a higher priority). Not thread-safe in c10: install before
// other threads allocate tensors.
inline c10::Allocator* install_cpu_allocator(c10::Allocator& adapter) {
    c10::Allocator* previous = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&adapter, 0);
    TORCH_CHECK(c10::GetCPUAllocator() == &adapter,
                "nxmem: c10 kept its CPU allocator (one was set with a higher priority)");
    return previous;
}

} // namespace nxmem::pytorch
