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
// Every DataPtr's context is its data pointer, and its deleter a function bound to the adapter's
// slot (at most cpu_allocator_limit adapters per process), so raw_deleter() is that deleter and
// c10's raw_allocate/raw_deallocate work: oneDNN, on by default, allocates through them and
// requires context == data. The deleter finds the allocation from its address alone:
// * an upstream that releases by address (`release_by_address(void*)`, nxmem's pool) is asked to;
// * any other (a plugin_allocator used directly) has its allocations kept in the adapter's table
//   by address (nxmem::detail::sharded_table: no heap node per allocation; taking an entry out
//   never fails for want of memory).
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/detail/sharded_table.hpp>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

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

// Claims the next slot; address_slot_count when every slot is taken (the count never passes it,
// so a refused claim takes nothing).
inline std::size_t claim_address_slot() noexcept {
    std::size_t claimed = address_slots_claimed.load(std::memory_order_relaxed);
    while (claimed < address_slot_count &&
           !address_slots_claimed.compare_exchange_weak(claimed, claimed + 1, std::memory_order_relaxed)) {
    }
    return claimed;
}

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

// How many cpu_allocator adapters one process can have, of every upstream type together: each
// deleter is a plain function bound to its adapter's slot, and adapters live until the process
// exits (installing the same allocator again reuses nothing).
inline constexpr std::size_t cpu_allocator_limit = detail::address_slot_count;

// Adapters that can still be created in this process.
inline std::size_t cpu_allocators_left() noexcept {
    return cpu_allocator_limit - detail::address_slots_claimed.load(std::memory_order_relaxed);
}

// Why one more adapter cannot be made, for the error that refuses it.
inline std::string cpu_allocator_limit_reached() {
    return "this process already has " + std::to_string(cpu_allocator_limit) +
           " nxmem PyTorch allocators (nxmem::pytorch::cpu_allocator), the most it can have: each "
           "install makes one that lives until the process exits, and uninstall gives none back; "
           "install once and keep it (docs/TORCH.md, \"How many allocators a process can have\")";
}

template <DeviceAllocator A>
    requires std::same_as<typename A::device_type, cpu_device>
class cpu_allocator final : public c10::Allocator, detail::address_releaser {
public:
    // Creates an immortal adapter over `upstream` (see the lifetime rule above). Throws c10::Error
    // when the process already has cpu_allocator_limit adapters.
    static cpu_allocator& create(std::shared_ptr<A> upstream) {
        TORCH_CHECK(upstream != nullptr, "nxmem::pytorch::cpu_allocator needs an upstream allocator");
        const std::size_t slot = detail::claim_address_slot();
        TORCH_CHECK(slot < cpu_allocator_limit, "nxmem: cannot make another PyTorch allocator: ",
                    cpu_allocator_limit_reached());
        return *new cpu_allocator(std::move(upstream), slot); // never deleted, by design
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
        if constexpr (!releases_by_address<A>) {
            try {
                by_address_.insert(key_of(data), granted.value());
            } catch (const std::bad_alloc&) {
                (void)upstream_->release(granted.value());
                TORCH_CHECK_WITH(OutOfMemoryError, false,
                                 "nxmem: no memory to record the allocation by its address");
            }
        }
        return {data, data, deleter(), c10::Device(c10::DeviceType::CPU)};
    }

    // The deleter of every DataPtr this adapter makes: it needs the data pointer alone, which is
    // what c10's raw_allocate/raw_deallocate (oneDNN's allocations) require.
    c10::DeleterFnPtr raw_deleter() const override { return deleter(); }

    // Whether `data_ptr` was handed out by this adapter: its deleter is this adapter's alone.
    bool owns(const c10::DataPtr& data_ptr) const noexcept {
        return data_ptr.get() != nullptr && data_ptr.get_deleter() == deleter();
    }

    // Releases that failed inside a deleter (a deleter cannot report, so it counts), including an
    // address this adapter never handed out (raw_deallocate of another allocator's memory).
    std::uint64_t failed_releases() const noexcept {
        return failed_releases_.load(std::memory_order_relaxed);
    }

    A& upstream() const noexcept { return *upstream_; }
    const std::shared_ptr<A>& shared_upstream() const noexcept { return upstream_; }

private:
    // Where an upstream that cannot release by address has its live allocations found again.
    using address_table = nxmem::detail::sharded_table<allocation<cpu_device>>;
    struct no_table {};

    cpu_allocator(std::shared_ptr<A> upstream, std::size_t slot) : upstream_(std::move(upstream)), slot_(slot) {
        detail::address_slots[slot_].store(this, std::memory_order_release);
    }
    ~cpu_allocator() = default; // never runs: adapters are immortal

    static std::uint64_t key_of(void* data) noexcept { return reinterpret_cast<std::uintptr_t>(data); }

    c10::DeleterFnPtr deleter() const noexcept { return detail::slot_deleters[slot_]; }

    void release_address(void* data) const noexcept override {
        bool released = false;
        if constexpr (releases_by_address<A>) {
            released = upstream_->release_by_address(data).has_value();
        } else {
            allocation<cpu_device> live{};
            if (by_address_.take_into(key_of(data), live, [](const allocation<cpu_device>* found) {
                    return found != nullptr;
                })) [[likely]] {
                released = upstream_->release(live).has_value();
            }
        }
        if (!released) [[unlikely]] {
            failed_releases_.fetch_add(1, std::memory_order_relaxed);
        }
    }

    std::shared_ptr<A> upstream_;
    std::size_t slot_ = 0;
    mutable std::atomic<std::uint64_t> failed_releases_{0};
    [[no_unique_address]] mutable std::conditional_t<releases_by_address<A>, no_table, address_table> by_address_;
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
