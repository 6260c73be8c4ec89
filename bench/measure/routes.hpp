// The ways an allocate + release round trip can be made, each behind the same two calls
// (`allocate` returning a handle, `release` taking it back), so one loop measures them all:
//   adapter_route      the host adapter, nxmem::host::plugin_allocator (host + kit + mechanism)
//   table_route        the plugin's C allocator table called directly (kit + mechanism)
//   mechanism_route<M> a mechanism object called directly, without the kit (the mechanism alone)
//   malloc_route       malloc + free, the C heap
//   heap_route         nxmem::heap_allocator, the engine's own DeviceAllocator
// The differences between neighbours are the host's share and the kit's share of a round trip.
#pragma once

#include <nxmem/heap_allocator.hpp>
#include <nxmem/host.hpp>
#include <nxmem/plugin/mechanism.hpp>

#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

namespace nxmem::measure {

// Keeps the compiler from proving a value unused, so a malloc + free pair is not removed.
template <class T> inline void keep(const T& value) noexcept { asm volatile("" : : "r,m"(value) : "memory"); }

class adapter_route {
public:
    using handle = allocation<cpu_device>;
    explicit adapter_route(host::plugin_allocator<cpu_device>& allocator) : allocator_(&allocator) {}

    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        result<handle> made = allocator_->allocate(size, alignment);
        if (!made) {
            return std::nullopt;
        }
        return made.value();
    }
    bool release(const handle& live) { return allocator_->release(live).has_value(); }

private:
    host::plugin_allocator<cpu_device>* allocator_;
};

// What a minimal C host does per call: fill the request, call the slot, describe the allocation
// back. No record, no check beyond the status code. Allocation ids start at `id_base` (pick a
// different base per thread, far above the host's own ids, so none collide).
class table_route {
public:
    using handle = NxmemAllocation;
    table_route(const host::plugin_allocator<cpu_device>& allocator, std::uint64_t id_base)
        : self_(allocator.raw_table()), table_(allocator.checked_table()),
          mechanism_id_(allocator.mechanism_id()), device_(allocator.device().to_wire()),
          next_id_(id_base) {}

    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        NxmemAllocRequest request{};
        request.struct_size = sizeof request;
        request.mechanism_id = mechanism_id_;
        request.device = device_;
        request.allocation_id = next_id_++;
        request.size = size;
        request.alignment = alignment;
        NxmemAllocResult out{};
        out.struct_size = sizeof out;
        NxmemStatus status = blank_status();
        if (table_.allocate(self_, &request, &out, &status) != NXMEM_STATUS_OK) {
            return std::nullopt;
        }
        handle described{};
        described.struct_size = sizeof described;
        described.mechanism_id = mechanism_id_;
        described.device = device_;
        described.allocation_id = request.allocation_id;
        described.address = out.address;
        described.size = size;
        described.alignment = alignment;
        return described;
    }

    // Through release_allocation when the table has it, as the host does; else deallocate.
    bool release(const handle& live) {
        NxmemStatus status = blank_status();
        if (table_.release_allocation != nullptr) {
            NxmemReleaseOutcome outcome{};
            outcome.struct_size = sizeof outcome;
            return table_.release_allocation(self_, &live, &outcome, &status) == NXMEM_STATUS_OK;
        }
        return table_.deallocate(self_, &live, &status) == NXMEM_STATUS_OK;
    }

    NxmemAllocatorVtable* self() const noexcept { return self_; }
    const NxmemAllocatorVtable& table() const noexcept { return table_; }

    // A status a plugin may write into; its message is written only on failure.
    static NxmemStatus blank_status() noexcept {
        NxmemStatus status;
        status.struct_size = sizeof status;
        status.code = NXMEM_STATUS_OK;
        status.message[0] = '\0';
        return status;
    }

private:
    NxmemAllocatorVtable* self_;
    NxmemAllocatorVtable table_;
    std::uint64_t mechanism_id_;
    NxmemDeviceId device_;
    std::uint64_t next_id_;
};

// A plugin-kit mechanism class instantiated in this process, opened on cpu device 0 with no
// options and no host callbacks.
template <plugin::mechanism M> class mechanism_route {
public:
    using handle = plugin::allocation_record;

    static result<mechanism_route> open(std::uint64_t id_base = 1) {
        NXMEM_TRY(parsed, plugin::options::parse({}));
        plugin::host_link no_callbacks;
        plugin::open_context context{M::mechanism_id, device_id{NXMEM_DEVICE_CPU, 0}, parsed, no_callbacks,
                                     M::name};
        NXMEM_TRY(opened, M::open(context));
        return mechanism_route(std::move(opened), id_base);
    }

    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        result<plugin::block> made = mechanism_->allocate(size, alignment);
        if (!made) {
            return std::nullopt;
        }
        handle record;
        record.address = made.value().address;
        record.size = size;
        record.alignment = alignment;
        record.allocation_id = next_id_++;
        return record;
    }
    bool release(const handle& live) {
        if constexpr (plugin::offers_structured_release<M>) {
            return mechanism_->release_allocation(live).has_value();
        } else {
            return mechanism_->deallocate(live).has_value();
        }
    }
    // What the kit pays around its mechanism and no more: the record built in place (the kit
    // keeps one per allocation) and handed by reference, without an optional or a copy of it.
    bool round_trip(std::uint64_t size, std::uint64_t alignment) {
        result<plugin::block> made = mechanism_->allocate(size, alignment);
        if (!made) {
            return false;
        }
        handle record;
        record.address = made.assume_value().address;
        record.size = size;
        record.alignment = alignment;
        record.allocation_id = next_id_++;
        return release(record);
    }
    M& mechanism() noexcept { return *mechanism_; }

private:
    mechanism_route(std::unique_ptr<M> opened, std::uint64_t id_base)
        : mechanism_(std::move(opened)), next_id_(id_base) {}
    std::unique_ptr<M> mechanism_;
    std::uint64_t next_id_;
};

class malloc_route {
public:
    using handle = void*;
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t /*alignment: malloc's own*/) {
        void* memory = std::malloc(static_cast<std::size_t>(size));
        keep(memory);
        return memory == nullptr ? std::nullopt : std::optional<handle>(memory);
    }
    bool release(handle memory) {
        std::free(memory);
        return true;
    }
};

class heap_route {
public:
    using handle = allocation<cpu_device>;
    std::optional<handle> allocate(std::uint64_t size, std::uint64_t alignment) {
        result<handle> made = heap_.allocate(size, alignment);
        if (!made) {
            return std::nullopt;
        }
        keep(made.value().address);
        return made.value();
    }
    bool release(const handle& live) { return heap_.release(live).has_value(); }

private:
    heap_allocator heap_;
};

// One allocate + release; false when either failed. A route whose handle costs more to pass
// around than its callers pay (mechanism_route) makes the round trip itself.
template <class Route> inline bool round_trip(Route& route, std::uint64_t size, std::uint64_t alignment) {
    if constexpr (requires { { route.round_trip(size, alignment) } -> std::same_as<bool>; }) {
        return route.round_trip(size, alignment);
    } else {
        std::optional<typename Route::handle> made = route.allocate(size, alignment);
        return made.has_value() && route.release(*made);
    }
}

// The alignment every round trip asks for: what malloc guarantees, so all routes do the same work.
inline constexpr std::uint64_t round_trip_alignment = 16;

} // namespace nxmem::measure
