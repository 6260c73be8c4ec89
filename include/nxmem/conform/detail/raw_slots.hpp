// Calling an opened allocator's slots directly (plugin_allocator::raw_table() with the host's
// checked copy of its slots), so a request the host itself would refuse still reaches the plugin.
// Allocations made here carry suite-assigned ids far above the host's and are unknown to the host:
// the suite releases them itself, so a plugin that wrongly freed one is never asked to free it
// twice.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/status.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/host/plugin_allocator.hpp>

#include <atomic>
#include <cstdint>
#include <string>

namespace nxmem::conform::detail {

struct slot_reply {
    NxmemStatusCode code = NXMEM_STATUS_OK;
    std::string message;
    bool ok() const noexcept { return code == NXMEM_STATUS_OK; }
    std::string describe() const {
        std::string text(status_code_name(status_code_from_wire(code)));
        return message.empty() ? text : text + " (" + message + ")";
    }
    // The reply of `call(status)`, a slot called with a fresh status.
    template <class Call> static slot_reply of(Call&& call) {
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        reply.code = call(&status);
        reply.message = abi::read_status_message(status);
        return reply;
    }
};

class raw_slots {
public:
    template <Device D>
    explicit raw_slots(const host::plugin_allocator<D>& allocator)
        : self_(allocator.raw_table()), table_(allocator.checked_table()),
          mechanism_id_(allocator.mechanism_id()), device_(allocator.device()) {}

    // An allocator the suite opened itself (detail::callback_allocator): `table` is its read_prefix copy.
    raw_slots(NxmemAllocatorVtable* self, const NxmemAllocatorVtable& table, device_id device)
        : self_(self), table_(table), mechanism_id_(table.mechanism_id), device_(device) {}

    // A well-formed request for this allocator, with a fresh suite-assigned allocation id.
    NxmemAllocRequest request(std::uint64_t size, std::uint64_t alignment) const {
        auto made = abi::make_struct<NxmemAllocRequest>();
        made.mechanism_id = mechanism_id_;
        made.device = device_.to_wire();
        made.allocation_id = next_id().fetch_add(1, std::memory_order_relaxed);
        made.size = size;
        made.alignment = alignment;
        return made;
    }

    // Calls allocate with `request` (which may be followed by more bytes than the header knows).
    slot_reply allocate(const NxmemAllocRequest* request, NxmemAllocResult& out) const {
        announce_step("allocate through the raw slot");
        out = abi::make_struct<NxmemAllocResult>();
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        reply.code = table_.allocate(self_, request, &out, &status);
        reply.message = abi::read_status_message(status);
        return reply;
    }

    // The host's description of what `request` produced.
    static NxmemAllocation describe(const NxmemAllocRequest& request, const NxmemAllocResult& out) {
        auto described = abi::make_struct<NxmemAllocation>();
        described.mechanism_id = request.mechanism_id;
        described.device = request.device;
        described.allocation_id = request.allocation_id;
        described.address = out.address;
        described.size = request.size;
        described.alignment = request.alignment;
        return described;
    }

    // Allocates through the raw slot; the description on success.
    result<NxmemAllocation> allocate(std::uint64_t size, std::uint64_t alignment) const {
        const NxmemAllocRequest made = request(size, alignment);
        NxmemAllocResult out{};
        const slot_reply reply = allocate(&made, out);
        if (!reply.ok()) {
            return fail(status_code_from_wire(reply.code), reply.message);
        }
        return describe(made, out);
    }

    slot_reply deallocate(const NxmemAllocation& described) const {
        announce_step("deallocate through the raw slot");
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        reply.code = table_.deallocate(self_, &described, &status);
        reply.message = abi::read_status_message(status);
        return reply;
    }

    slot_reply release_allocation(const NxmemAllocation& described, NxmemReleaseOutcome& outcome) const {
        announce_step("release_allocation through the raw slot");
        outcome = abi::make_struct<NxmemReleaseOutcome>();
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        reply.code = table_.release_allocation(self_, &described, &outcome, &status);
        reply.message = abi::read_status_message(status);
        return reply;
    }

    // enqueue_release and drain_releases; the caller checks that the slots are there.
    slot_reply enqueue_release(const NxmemAllocation& described, std::uint64_t ticket) const {
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        reply.code = table_.enqueue_release(self_, &described, ticket, &status);
        reply.message = abi::read_status_message(status);
        return reply;
    }
    slot_reply drain_releases(std::uint64_t& retired) const {
        NxmemStatus status = abi::make_status();
        slot_reply reply;
        retired = 0;
        reply.code = table_.drain_releases(self_, &retired, &status);
        reply.message = abi::read_status_message(status);
        return reply;
    }

    const NxmemAllocatorVtable& table() const noexcept { return table_; }
    NxmemAllocatorVtable* self() const noexcept { return self_; } // the slots' first argument
    std::uint64_t mechanism_id() const noexcept { return mechanism_id_; }
    device_id device() const noexcept { return device_; }

private:
    // Ids far above anything the host assigns, so the two never collide.
    static std::atomic<std::uint64_t>& next_id() {
        static std::atomic<std::uint64_t> id{1ull << 62};
        return id;
    }

    NxmemAllocatorVtable* self_;
    NxmemAllocatorVtable table_;
    std::uint64_t mechanism_id_;
    device_id device_;
};

} // namespace nxmem::conform::detail
