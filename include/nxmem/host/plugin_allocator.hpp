// plugin_allocator<D>: a plugin's mechanism, opened on one device of type D, behind the same
// DeviceAllocator concept as the engine's own allocators.
#pragma once

#include <nxmem/abi/stream_requests.hpp>
#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/host/detail/allocator_core.hpp>
#include <nxmem/host/fence.hpp>
#include <nxmem/host/registration_lease.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace nxmem::host {

template <Device D> class virtual_backing_view;
template <Device D> class shared_mapping_view;
template <Device D> class ipc_view;

namespace detail {
template <Device D> NxmemAllocation to_wire(const allocation<D>& live) {
    return NxmemAllocation{.struct_size = sizeof(NxmemAllocation),
                           .reserved = 0,
                           .mechanism_id = live.mechanism_id,
                           .device = live.device.to_wire(),
                           .allocation_id = live.allocation_id,
                           .address = D::to_wire(live.address),
                           .size = live.size,
                           .alignment = live.alignment};
}
template <Device D> allocation<D> from_wire(const NxmemAllocation& described) {
    return allocation<D>{D::from_wire(described.address), described.size, described.alignment,
                         described.allocation_id, described.mechanism_id,
                         device_id::from_wire(described.device)};
}
} // namespace detail

template <Device D> class plugin_allocator {
public:
    using device_type = D;

    explicit plugin_allocator(std::shared_ptr<detail::allocator_core> core) : core_(std::move(core)) {}

    device_id device() const noexcept { return core_->device(); }

    // allocation_id is assigned by the host: unique in the process, never reused (docs/ABI.md M3).
    result<allocation<D>> allocate(std::uint64_t size, std::uint64_t alignment) {
        return core_->allocate(size, alignment,
                               [](const NxmemAllocation& described) { return detail::from_wire<D>(described); });
    }

    // Mechanism and device are checked, then the description against the live record, before
    // the plugin is called. A FAILED release is an error and the allocation stays live.
    result<release_report> release(const allocation<D>& live) {
        return core_->release(detail::to_wire(live));
    }

    // Deferred release: the allocation retires at a later drain_releases, which reports each
    // retired ticket in enqueue order.
    result<std::uint64_t> enqueue_release(const allocation<D>& live) {
        return core_->enqueue_release(detail::to_wire(live));
    }
    result<std::vector<release_completion>> drain_releases() { return core_->drain_releases(); }

    // Release after device work (minor 4): the allocation is handed over now, under the returned
    // ticket, and retires at a drain after every fence has completed; until then its memory is
    // neither reused nor unmapped. The mechanism waits when its fenced_release table lists every
    // kind among `fences`; otherwise the host keeps the allocation and checks the fences at each
    // drain itself (host timelines) or through `query` (other kinds; without one such a fence is
    // UNSUPPORTED_CAPABILITY). 1 to NXMEM_MAX_FENCES fences, all of this allocator's device.
    result<std::uint64_t> release_after(const allocation<D>& live, std::span<const fence> fences,
                                        fence_query query = {}) {
        return core_->release_after(detail::to_wire(live), fences, std::move(query));
    }

    // Copies (minor 4) between a range of an allocation or a shared prefix and host memory. The
    // range [offset, offset + size) must lie within it (and, for virtual backing, in committed
    // memory); UNSUPPORTED_CAPABILITY without NXMEM_CAP_COPY. The host checks all of it before the
    // plugin is called (CP4).
    // Synchronous: the bytes have moved when the call returns.
    result<void> copy_to_host(const allocation<D>& live, std::uint64_t offset, std::span<std::byte> out) {
        return copy(aimed_at(live, NXMEM_COPY_TO_HOST, offset, out.data(), out.size()), nullptr);
    }
    result<void> copy_from_host(const allocation<D>& live, std::uint64_t offset,
                                std::span<const std::byte> in) {
        return copy(aimed_at(live, NXMEM_COPY_FROM_HOST, offset, in.data(), in.size()), nullptr);
    }
    result<void> copy_to_host(const shared_prefix& prefix, std::uint64_t offset, std::span<std::byte> out) {
        return copy(aimed_at(prefix, NXMEM_COPY_TO_HOST, offset, out.data(), out.size()), nullptr);
    }
    result<void> copy_from_host(const shared_prefix& prefix, std::uint64_t offset,
                                std::span<const std::byte> in) {
        return copy(aimed_at(prefix, NXMEM_COPY_FROM_HOST, offset, in.data(), in.size()), nullptr);
    }
    // Ordered on a stream (CP3): queued after the work `stream` names, a fence of a kind the copy
    // table lists (copy_stream_kinds(); cuda: NXMEM_FENCE_CUDA_STREAM), and the call returns at
    // once. Until the caller has waited on that stream, `out` or `in` and the memory stay alive
    // and untouched. A kind the table does not list is UNSUPPORTED_CAPABILITY (posix copies only
    // synchronously), another device's stream WRONG_DEVICE.
    result<void> copy_to_host(const allocation<D>& live, std::uint64_t offset, std::span<std::byte> out,
                              const fence& stream) {
        return copy(aimed_at(live, NXMEM_COPY_TO_HOST, offset, out.data(), out.size()), &stream);
    }
    result<void> copy_from_host(const allocation<D>& live, std::uint64_t offset, std::span<const std::byte> in,
                                const fence& stream) {
        return copy(aimed_at(live, NXMEM_COPY_FROM_HOST, offset, in.data(), in.size()), &stream);
    }
    result<void> copy_to_host(const shared_prefix& prefix, std::uint64_t offset, std::span<std::byte> out,
                              const fence& stream) {
        return copy(aimed_at(prefix, NXMEM_COPY_TO_HOST, offset, out.data(), out.size()), &stream);
    }
    result<void> copy_from_host(const shared_prefix& prefix, std::uint64_t offset, std::span<const std::byte> in,
                                const fence& stream) {
        return copy(aimed_at(prefix, NXMEM_COPY_FROM_HOST, offset, in.data(), in.size()), &stream);
    }
    // The stream kinds the copy table accepts (bits 1 << kind; 0: synchronous copies only, or none).
    std::uint64_t copy_stream_kinds() const noexcept { return core_->copy_stream_kinds(); }
    // The fence kinds the mechanism waits on itself (bits 1 << kind; 0 without fenced release).
    std::uint64_t fence_kinds() const noexcept { return core_->fence_kinds(); }

    // A lease on a live allocation (what a transfer registration holds, docs/TRANSFER.md): until
    // it ends, release and enqueue_release of the allocation are BUSY and the module's tally
    // counts a registration. UNKNOWN_ALLOCATION / INVALID_ARGUMENT as release would answer.
    result<registration_lease> lease(const allocation<D>& live) const {
        return registration_lease::allocation(core_, detail::to_wire(live));
    }

    // What the allocator holds now (minor 2's usage query); UNSUPPORTED_CAPABILITY when the
    // mechanism does not offer it or the negotiated minor is below 2.
    result<allocator_usage> query_usage() const { return core_->query_usage(); }

    // The capability views; UNSUPPORTED_CAPABILITY when the mechanism does not offer them.
    result<virtual_backing_view<D>> virtual_backing() const;
    result<shared_mapping_view<D>> shared_mapping() const;
    // Sharing across processes (minor 3, include <nxmem/host/ipc_view.hpp>).
    result<ipc_view<D>> ipc() const;

    const std::string& mechanism_name() const noexcept { return core_->mechanism_name(); }
    std::uint64_t mechanism_id() const noexcept { return core_->mechanism_id(); }
    NxmemCapabilities capabilities() const noexcept { return core_->capabilities(); }
    std::uint32_t declared_minor() const noexcept { return core_->declared_minor(); }
    std::uint32_t effective_minor() const noexcept { return core_->effective_minor(); }
    bool offers_reclaim() const noexcept { return core_->offers_reclaim(); }
    // The capability tables the allocator points to, with the levels they declare and were read at.
    const std::vector<capability_table_level>& capability_tables() const noexcept {
        return core_->capability_tables();
    }
    std::uint64_t quarantined_bytes() const noexcept { return core_->quarantined_bytes(); }
    // The memory the host keeps to track this allocator's allocations (its live table and side
    // structures), in bytes: what the boundary costs beyond the mechanism's own memory.
    std::size_t bookkeeping_bytes() const noexcept { return core_->bookkeeping_bytes(); }
    const std::shared_ptr<plugin_module>& module() const noexcept { return core_->module(); }

    // The plugin's raw table and the host's checked copy, for conformance checks that must
    // reach the plugin without the host's own checks in front of it.
    NxmemAllocatorVtable* raw_table() const noexcept { return core_->raw_table(); }
    const NxmemAllocatorVtable& checked_table() const noexcept { return core_->checked_table(); }

private:
    static NxmemCopyRequest aimed_at(const allocation<D>& live, NxmemCopyDirection direction, std::uint64_t offset,
                                     const void* host_memory, std::size_t length) {
        return abi::make_copy_request(direction, detail::to_wire(live), offset, length, host_memory);
    }
    static NxmemCopyRequest aimed_at(const shared_prefix& prefix, NxmemCopyDirection direction, std::uint64_t offset,
                                     const void* host_memory, std::size_t length) {
        return abi::make_prefix_copy_request(direction, prefix.to_wire(), offset, length, host_memory);
    }
    result<void> copy(NxmemCopyRequest request, const fence* stream) {
        NxmemFence wire{};
        if (stream != nullptr) {
            wire = stream->to_wire();
            request.stream = &wire;
        }
        return core_->copy(request);
    }

    std::shared_ptr<detail::allocator_core> core_;
};

static_assert(assert_device_allocator<plugin_allocator<cpu_device>>());
static_assert(assert_device_allocator<plugin_allocator<cuda_device>>());
static_assert(assert_device_allocator<plugin_allocator<hip_device>>());

} // namespace nxmem::host
