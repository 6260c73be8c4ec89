// cuda-vmm: device address space reserved at allocation, committed chunk by chunk, and shared
// prefixes as one physical allocation mapped into many allocations, in this process and in
// others. A chunk is the device's allocation granularity (cuMemGetAllocationGranularity, minimum;
// 2 MiB on current GPUs), which is also the commit granularity the allocator reports.
//
//   allocate              cuMemAddressReserve of the size rounded up to whole chunks, aligned as
//                         asked (at least to a chunk); costs no device memory
//   commit                per uncommitted chunk: cuMemCreate (pinned, on this device) + cuMemMap;
//                         then one cuMemSetAccess (read/write for this device) per run of them
//   decommit              per committed chunk: cuMemUnmap + cuMemRelease
//   create_shared_prefix  one cuMemCreate of the prefix's whole chunks (not mapped yet), with
//                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested when the allocator
//                         shares (sharing.hpp)
//   commit_shared_prefix  one cuMemMap of it over the allocation's first chunks (private chunks
//                         there are decommitted first) + cuMemSetAccess (read-only for a
//                         read-only import)
//   export (prefix)       cuMemExportToShareableHandle: a descriptor, read-write only (a CUDA
//                         shareable handle cannot forbid its holder a writable mapping, IP5)
//   import (prefix)       the handle checked (sharing.hpp), cuMemImportFromShareableHandle, its
//                         size proved by one mapping into a scratch reservation; a local prefix
//   release               unmap and release every private chunk, unmap the prefix, then
//                         cuMemAddressFree; a fenced release (minor 4) only once its fences have
//                         completed (stream_order.hpp)
//   copy                  cuMemcpyDtoH / cuMemcpyHtoD over committed memory (the prefix's
//                         included), or their Async forms on a CUDA_STREAM fence's stream; a
//                         shared prefix through a window of its own: one cuMemAddressReserve +
//                         cuMemMap + cuMemSetAccess on its first copy, undone when it goes
// Every call runs with the device's primary context current.
//
// Ranges: the offset is a multiple of the chunk and the length too, or it reaches the end of the
// allocation. Anything else is INVALID_ARGUMENT and changes nothing. Committing committed chunks
// and decommitting uncommitted ones are successful no-ops.
//
// Accounting (as posix-lazy): mapped_bytes counts the allocation's committed private chunks, the
// last one by its bytes within the allocation. A shared prefix is costed once, in whole chunks, as the
// newly_mapped_bytes of its first mapping, and never in an allocation's mapped_bytes; chunks
// under a mapped prefix belong to it. The budget counts device memory: whole chunks, private and
// prefix alike. An imported prefix is the exporter's memory: it is counted in imported_bytes (whole
// chunks) until its last mapping goes, never charged to the budget, and its first mapping costs
// nothing (IP10).
//
// Release: if the driver refuses to unmap or release a chunk, the release ends QUARANTINED: what
// could be freed is credited, the rest is kept (residual_owned_bytes) and the address range is
// never reused.
//
// Threads: reservations live in a table sharded by address; each has its own mutex, so calls on
// different allocations share no lock beyond a shard's, held only for a lookup. The budget and
// the usage totals are atomic counters.
#pragma once

#include "../posix/budget.hpp"
#include "../posix/page_runs.hpp"
#include "../posix/pages.hpp"
#include "../posix/prefix_table.hpp"
#include "../posix/retire_now.hpp"
#include "device_context.hpp"
#include "settings.hpp"
#include "sharing.hpp"
#include "stream_order.hpp"

#include <nxmem/detail/sharded_table.hpp>
#include <nxmem/plugin.hpp>
#include <nxmem/usage.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nxmem::cuda {

using posix::page_run; // [first, end) chunk indices here
using posix::page_runs;
using posix::round_up;

class vmm_mechanism : public stream_ordered {
public:
    static constexpr const char* name = "cuda-vmm";
    static constexpr std::uint64_t mechanism_id = 0x43554402; // "CUD" 2
    static constexpr std::uint64_t device_types = plugin::device_bit(NXMEM_DEVICE_CUDA);
    static constexpr bool uses_host_reclaim = true; // when a budget is set

    vmm_mechanism(const settings& taken, const plugin::open_context& context,
                  std::shared_ptr<device_context> device, std::uint64_t granularity)
        : stream_ordered(device), device_(std::move(device)), sharing_(*device_), chunk_(granularity),
          budget_(taken.budget, context.host, mechanism_id, context.device, name) {}

    vmm_mechanism(const vmm_mechanism&) = delete;
    vmm_mechanism& operator=(const vmm_mechanism&) = delete;

    // The kit hands every live allocation and prefix back before the mechanism goes; what is
    // left is what quarantined releases kept, which is given back to the driver now.
    ~vmm_mechanism() {
        for (const std::shared_ptr<reservation>& kept : quarantine_) {
            (void)device_->current([&] { return free_reservation(*kept); });
        }
    }

    static result<std::unique_ptr<vmm_mechanism>> open(plugin::open_context& context) {
        NXMEM_TRY(taken, settings::take(context.options, name));
        NXMEM_TRY(device, device_context::open(name, context.device));
        NXMEM_TRY(granularity, chunk_granularity(*device));
        return std::make_unique<vmm_mechanism>(taken, context, std::move(device), granularity);
    }

    // The minor-2 commit granularity: one chunk.
    std::uint64_t commit_granularity() const noexcept { return chunk_; }

    // Whether this allocator offers NXMEM_CAP_IPC: the driver and the device can share
    // (sharing.hpp); the kit clears the flag otherwise.
    bool ipc_available() const { return sharing_.available(); }

    // ---- allocation ----

    result<plugin::block> allocate(std::uint64_t size, std::uint64_t alignment) {
        NXMEM_TRY(length, round_up(size, chunk_, name));
        CUdeviceptr address = 0;
        const std::size_t placed = alignment > chunk_ ? static_cast<std::size_t>(alignment) : 0;
        NXMEM_TRY_VOID(device_->current([&] {
            return device_->check(
                device_->api().mem_address_reserve(&address, static_cast<std::size_t>(length),
                                                   placed, 0, 0),
                [&] {
                    return std::string(name) + ": cuMemAddressReserve of " +
                           std::to_string(length) + " bytes aligned to " +
                           std::to_string(std::max(alignment, chunk_));
                });
        }));
        try {
            reservations_.insert(address, std::make_shared<reservation>(address, size, length));
        } catch (...) {
            (void)device_->current([&] {
                return device_->check(device_->api().mem_address_free(address, length), [] { return ""; });
            });
            throw; // the guard reports it
        }
        live_allocations_.fetch_add(1, std::memory_order_relaxed);
        reserved_bytes_.fetch_add(size, std::memory_order_relaxed);
        return plugin::block{static_cast<std::uint64_t>(address), size, 0};
    }

    // COMPLETE with unmapped_bytes = the committed private bytes (the prefix is costed apart);
    // QUARANTINED when the driver kept some chunks.
    result<plugin::release_outcome> release_allocation(const plugin::allocation_record& record) {
        NXMEM_TRY(held, take(record));
        std::lock_guard lock(held->mutex);
        held->released = true;
        live_allocations_.fetch_sub(1, std::memory_order_relaxed);
        reserved_bytes_.fetch_sub(held->size, std::memory_order_relaxed);
        if (held->prefix) {
            held->prefix->sharers.fetch_sub(1, std::memory_order_relaxed);
        }
        const std::uint64_t committed_before = held->committed_bytes;
        const std::uint64_t chunks_before = held->chunks.size();
        result<void> freed = device_->current([&] { return free_reservation(*held); });
        const std::uint64_t unmapped = committed_before - held->committed_bytes;
        mapped_bytes_.fetch_sub(unmapped, std::memory_order_relaxed);
        budget_.credit((chunks_before - held->chunks.size()) * chunk_);
        if (freed) {
            return plugin::release_outcome{NXMEM_RELEASE_COMPLETE, unmapped, 0};
        }
        // The driver kept something: it stays ours, its address range is never handed out again.
        // The residue is the committed bytes still mapped, or, when only the address range could
        // not be freed, that range.
        const std::uint64_t residual = held->committed_bytes != 0 ? held->committed_bytes : held->length;
        quarantined_bytes_.fetch_add(residual, std::memory_order_relaxed);
        mapped_bytes_.fetch_sub(held->committed_bytes, std::memory_order_relaxed);
        std::lock_guard quarantine_lock(quarantine_mutex_);
        quarantine_.push_back(held);
        return plugin::release_outcome{NXMEM_RELEASE_QUARANTINED, unmapped, residual};
    }

    // Deferred release retires at once: the driver's unmap does not wait for anything the
    // plugin could observe (the engine drains once its streams are done with the memory).
    result<std::optional<plugin::release_outcome>> retire(const plugin::allocation_record& record) {
        return posix::retired_now(release_allocation(record));
    }

    // ---- copies (minor 4; the rest is stream_ordered's) ----

    // A prefix is reached through a window of its own, mapped on its first copy (it need not be
    // mapped into any allocation) and kept until the prefix goes; it costs address space only.
    result<void> copy_prefix(std::uint64_t prefix_id, const plugin::copy_job& job) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        NXMEM_TRY(window, window_of(*shared));
        return copy_at(window + job.offset, job);
    }

    // Whether every chunk the bytes touch is committed, or lies under the mapped prefix.
    bool range_committed(const plugin::allocation_record& record, byte_range range) const {
        result<std::shared_ptr<reservation>> held = reservations_.find(
            record.address, [&](const std::shared_ptr<reservation>* found) { return matches(record, found); });
        if (!held || range.length == 0) {
            return held.has_value();
        }
        std::lock_guard lock(held.value()->mutex);
        const std::uint64_t first = std::max(range.offset / chunk_, held.value()->prefix_chunks);
        const std::uint64_t end = (range.offset + range.length + chunk_ - 1) / chunk_;
        return first >= end || held.value()->committed.uncommitted_within(first, end).empty();
    }

    // ---- virtual backing ----

    result<void> commit(const plugin::allocation_record& record, byte_range range) {
        NXMEM_TRY(chunks, chunks_of(record, range));
        NXMEM_TRY(held, find(record));
        return budget_.with_reclaim<void>([&](posix::byte_budget::refusal& refused) -> result<void> {
            std::lock_guard lock(held->mutex);
            NXMEM_TRY_VOID(check_live(*held));
            const std::uint64_t first = std::max(chunks.first, held->prefix_chunks);
            if (first >= chunks.second) {
                return boost::outcome_v2::success(); // all under the prefix
            }
            const std::vector<page_run> gaps = held->committed.uncommitted_within(first, chunks.second);
            std::uint64_t wanted = 0;
            for (const page_run& gap : gaps) {
                wanted += (gap.second - gap.first) * chunk_;
            }
            if (wanted == 0) {
                return boost::outcome_v2::success(); // committed already: costs nothing more
            }
            NXMEM_TRY_VOID(budget_.charge(wanted, refused));
            return device_->current([&] { return commit_gaps(*held, gaps, wanted); });
        });
    }

    result<void> decommit(const plugin::allocation_record& record, byte_range range) {
        NXMEM_TRY(chunks, chunks_of(record, range));
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        const std::uint64_t first = std::max(chunks.first, held->prefix_chunks);
        if (first >= chunks.second) {
            return boost::outcome_v2::success();
        }
        return device_->current([&]() -> result<void> {
            for (const page_run& run : held->committed.committed_within(first, chunks.second)) {
                NXMEM_TRY_VOID(decommit_run(*held, run));
            }
            return boost::outcome_v2::success();
        });
    }

    result<std::uint64_t> mapped_bytes(const plugin::allocation_record& record) {
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        return held->committed_bytes;
    }

    // ---- shared mapping ----

    result<std::uint64_t> create_shared_prefix(std::uint64_t size) {
        NXMEM_TRY(length, round_up(size, chunk_, name));
        return budget_.charged<std::uint64_t>(length, [&] {
            return device_->current([&] { return make_prefix(size, length); });
        });
    }

    result<prefix_commit> commit_shared_prefix(const plugin::allocation_record& record,
                                               std::uint64_t prefix_id) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        NXMEM_TRY(held, find(record));
        std::lock_guard lock(held->mutex);
        NXMEM_TRY_VOID(check_live(*held));
        NXMEM_TRY_VOID(posix::check_prefix_fits(name, held->address, held->size,
                                                held->prefix ? held->prefix->id : 0, shared->size));
        const std::uint64_t count = shared->length / chunk_;
        NXMEM_TRY_VOID(device_->current([&]() -> result<void> {
            // The private chunks the prefix will cover go first.
            for (const page_run& run : held->committed.committed_within(0, count)) {
                NXMEM_TRY_VOID(decommit_run(*held, run));
            }
            return map_prefix(*held, *shared);
        }));
        held->prefix = shared;
        held->prefix_chunks = count;
        const std::uint64_t sharers = shared->sharers.fetch_add(1, std::memory_order_relaxed) + 1;
        // An imported prefix is never costed here: its bytes are the exporter's (imported bytes).
        const bool first = !shared->ever_mapped.exchange(true, std::memory_order_relaxed);
        return prefix_commit{shared->size, first && !shared->imported ? shared->length : 0,
                             sharers}; // C8: whole chunks
    }

    void destroy_shared_prefix(std::uint64_t prefix_id) {
        const std::shared_ptr<prefix_memory> gone = prefixes_.take(prefix_id);
        if (!gone) {
            return;
        }
        // Its last mapping went with its last sharer: releasing the handle frees the memory (an
        // imported one: this process's hold on it; the exporter and other importers keep theirs).
        (void)device_->current([&]() -> result<void> {
            if (gone->window != 0) {
                (void)unmap_range(gone->window, gone->length);
                (void)device_->api().mem_address_free(gone->window, static_cast<std::size_t>(gone->length));
            }
            return release_handle(gone->physical);
        });
        if (gone->imported) {
            imported_bytes_.fetch_sub(gone->length, std::memory_order_relaxed);
        } else {
            budget_.credit(gone->length);
            shared_prefix_bytes_.fetch_sub(gone->length, std::memory_order_relaxed);
        }
    }

    // ---- sharing across processes (minor 3) ----

    // Read-write only: the descriptor lets its holder map the memory writable whatever the
    // handle says, so a read-only export could not be enforced (IP5). A read-only import of the
    // read-write handle maps it with CU_MEM_ACCESS_FLAGS_PROT_READ.
    result<void> export_shared_prefix(std::uint64_t prefix_id, std::uint32_t access,
                                      NxmemIpcHandle& handle) {
        NXMEM_TRY(shared, prefixes_.find(prefix_id, name));
        if (!sharing_.available()) {
            return fail(status_code::unsupported_capability, sharing_.unavailable());
        }
        if (access != NXMEM_IPC_READ_WRITE) {
            return fail(status_code::unsupported_capability,
                        std::string(name) + ": a CUDA shareable handle cannot forbid a writable "
                                            "mapping, so prefixes are exported read-write only (the "
                                            "importer may still import read-only)");
        }
        if (shared->read_only) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": prefix " + std::to_string(prefix_id) +
                            " was imported read-only and cannot be exported read-write");
        }
        vmm_handle_opaque opaque{};
        NXMEM_TRY(descriptor, device_->current([&] {
            return sharing_.export_descriptor(shared->physical, shared->length, chunk_, opaque);
        }));
        handle.size = shared->size;
        handle.fd_count = 1;
        handle.fds[0] = descriptor;
        handle.opaque_length = sizeof opaque;
        std::memcpy(handle.opaque, &opaque, sizeof opaque);
        return boost::outcome_v2::success();
    }

    // The kit has checked the record's form, mechanism, device and access.
    result<plugin::imported_prefix> import_shared_prefix(const NxmemIpcHandle& record,
                                                         std::uint32_t access) {
        if (!sharing_.available()) {
            return fail(status_code::unsupported_capability, sharing_.unavailable());
        }
        NXMEM_TRY(length, round_up(record.size, chunk_, name));
        NXMEM_TRY(opaque, sharing_.read_opaque(record, length, chunk_));
        NXMEM_TRY_VOID(sharing_.remember_import(opaque.export_id));
        result<handle> imported = device_->current([&]() -> result<handle> {
            NXMEM_TRY(physical, sharing_.import_descriptor(record.fds[0]));
            if (result<void> whole = prove_length(physical, length); !whole) {
                (void)release_handle(physical);
                return boost::outcome_v2::failure(whole.error());
            }
            return physical;
        });
        if (!imported) {
            sharing_.forget_import(opaque.export_id);
            return boost::outcome_v2::failure(imported.error());
        }
        const std::uint64_t prefix_id = prefixes_.next_id();
        try {
            auto made = std::make_shared<prefix_memory>(prefix_id, record.size, length, imported.value());
            made->imported = true;
            made->read_only = access == NXMEM_IPC_READ_ONLY;
            prefixes_.insert(prefix_id, std::move(made));
        } catch (...) {
            (void)device_->current([&] { return release_handle(imported.value()); });
            sharing_.forget_import(opaque.export_id);
            throw;
        }
        imported_bytes_.fetch_add(length, std::memory_order_relaxed);
        return plugin::imported_prefix{prefix_id, length};
    }

    // ---- usage query (minor 2) ----

    // Read from atomic totals: no lock, no walk.
    result<allocator_usage> usage() const {
        allocator_usage now{};
        now.live_allocations = live_allocations_.load(std::memory_order_relaxed);
        now.reserved_bytes = reserved_bytes_.load(std::memory_order_relaxed);
        now.mapped_bytes = mapped_bytes_.load(std::memory_order_relaxed);
        now.shared_prefix_bytes = shared_prefix_bytes_.load(std::memory_order_relaxed);
        now.quarantined_bytes = quarantined_bytes_.load(std::memory_order_relaxed);
        now.imported_bytes = imported_bytes_.load(std::memory_order_relaxed);
        return now;
    }

private:
    using handle = CUmemGenericAllocationHandle;

    // A prefix is one physical allocation of whole chunks, so that it travels to another
    // process as one descriptor.
    struct prefix_memory {
        prefix_memory(std::uint64_t prefix_id, std::uint64_t bytes, std::uint64_t whole_chunks, handle made)
            : id(prefix_id), size(bytes), length(whole_chunks), physical(made) {}
        const std::uint64_t id;
        const std::uint64_t size;   // as asked
        const std::uint64_t length; // whole chunks
        const handle physical;
        std::atomic<std::uint64_t> sharers{0};
        std::atomic<bool> ever_mapped{false};
        bool imported = false;  // from another process: imported bytes, never charged here
        bool read_only = false; // mapped with CU_MEM_ACCESS_FLAGS_PROT_READ
        std::mutex window_mutex; // guards window
        CUdeviceptr window = 0;  // where copies reach it (mapped on the first copy), or 0
    };

    struct reservation {
        reservation(std::uint64_t at, std::uint64_t bytes, std::uint64_t whole_chunks)
            : address(at), size(bytes), length(whole_chunks) {}

        const std::uint64_t address;
        const std::uint64_t size;   // as asked
        const std::uint64_t length; // whole chunks
        std::mutex mutex;           // guards everything below
        page_runs committed;        // chunk indices of the private chunks
        std::map<std::uint64_t, handle> chunks; // chunk index -> its physical handle
        std::uint64_t committed_bytes = 0;
        std::shared_ptr<prefix_memory> prefix;
        std::uint64_t prefix_chunks = 0;
        bool prefix_mapped = false;
        bool released = false;
    };

    static result<std::uint64_t> chunk_granularity(const device_context& device) {
        int supported = 0;
        NXMEM_TRY_VOID(device.check(
            device.api().device_get_attribute(
                &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device.device()),
            [&] { return device.who() + ": cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)"; }));
        if (supported == 0) {
            return fail(status_code::wrong_device,
                        device.who() + ": the device does not support virtual memory management");
        }
        const CUmemAllocationProp properties = chunk_properties(device.ordinal());
        std::size_t granularity = 0;
        NXMEM_TRY_VOID(device.check(device.api().mem_get_allocation_granularity(
                                        &granularity, &properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                    [&] { return device.who() + ": cuMemGetAllocationGranularity"; }));
        if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
            return fail(status_code::internal_error,
                        device.who() + ": the driver reports an allocation granularity of " +
                            std::to_string(granularity) + " bytes, not a power of two");
        }
        return static_cast<std::uint64_t>(granularity);
    }

    static CUmemAllocationProp chunk_properties(int ordinal) noexcept {
        CUmemAllocationProp properties{};
        properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        properties.location.id = ordinal;
        return properties;
    }

    // Accepts the reservation if it is the one the record describes (a stale copy, released or
    // with its address reused since, is refused).
    static result<void> matches(const plugin::allocation_record& record,
                                const std::shared_ptr<reservation>* held) {
        if (held == nullptr || (*held)->size != record.size) {
            return fail(status_code::unknown_allocation,
                        std::string(name) + ": no live reservation at 0x" +
                            nxmem::detail::to_hex(record.address));
        }
        return boost::outcome_v2::success();
    }

    result<std::shared_ptr<reservation>> find(const plugin::allocation_record& record) {
        return reservations_.find(record.address, [&](const std::shared_ptr<reservation>* held) {
            return matches(record, held);
        });
    }

    // Removes the reservation from the table before it is freed, so a new reservation at the
    // same address can be recorded the moment the old one is gone.
    result<std::shared_ptr<reservation>> take(const plugin::allocation_record& record) {
        return reservations_.take(record.address, [&](const std::shared_ptr<reservation>* held) {
            return matches(record, held);
        });
    }

    static result<void> check_live(const reservation& held) {
        if (held.released) {
            return fail(status_code::unknown_allocation,
                        std::string(name) + ": the allocation at 0x" +
                            nxmem::detail::to_hex(held.address) + " was released meanwhile");
        }
        return boost::outcome_v2::success();
    }

    // [first, end) chunk indices of a chunk-granular range; INVALID_ARGUMENT otherwise. The kit
    // has checked that the range is non-empty and lies within the allocation.
    result<page_run> chunks_of(const plugin::allocation_record& record, byte_range range) const {
        const bool reaches_end = range.offset + range.length == record.size;
        if (range.offset % chunk_ != 0 || (range.length % chunk_ != 0 && !reaches_end)) {
            return fail(status_code::invalid_argument,
                        std::string(name) + ": ranges are chunk-granular (" +
                            std::to_string(chunk_) + " bytes, the device's allocation "
                            "granularity): offset " + std::to_string(range.offset) +
                            " must be a multiple and length " + std::to_string(range.length) +
                            " a multiple or reach the allocation's end at " +
                            std::to_string(record.size));
        }
        return page_run{range.offset / chunk_, (range.offset + range.length + chunk_ - 1) / chunk_};
    }

    // The bytes of the chunks `run` that lie within the allocation (the last may be partial).
    std::uint64_t bytes_of(const reservation& held, const page_run& run) const noexcept {
        return std::min(run.second * chunk_, held.size) - run.first * chunk_;
    }

    std::uint64_t address_of(const reservation& held, std::uint64_t chunk) const noexcept {
        return held.address + chunk * chunk_;
    }

    // Physical memory of `bytes` (whole chunks); `exportable` asks for the handle type sharing
    // needs, when the allocator shares.
    result<handle> create_chunk(std::uint64_t bytes, bool exportable = false) const {
        CUmemAllocationProp properties = chunk_properties(device_->ordinal());
        if (exportable) {
            properties.requestedHandleTypes = sharing_.handle_types();
        }
        handle made = 0;
        NXMEM_TRY_VOID(device_->check(
            device_->api().mem_create(&made, static_cast<std::size_t>(bytes), &properties, 0), [&] {
                return std::string(name) + ": cuMemCreate of " + std::to_string(bytes) + " bytes";
            }));
        return made;
    }

    // Maps the first `bytes` of `physical` at `at`.
    result<void> map_physical(std::uint64_t at, std::uint64_t bytes, handle physical) const {
        return device_->check(device_->api().mem_map(at, static_cast<std::size_t>(bytes), 0, physical, 0), [&] {
            return std::string(name) + ": cuMemMap of " + std::to_string(bytes) + " bytes at 0x" +
                   nxmem::detail::to_hex(at);
        });
    }
    result<void> map_chunk(std::uint64_t at, handle chunk) const { return map_physical(at, chunk_, chunk); }

    result<void> unmap_range(std::uint64_t at, std::uint64_t bytes) const {
        return device_->check(device_->api().mem_unmap(at, static_cast<std::size_t>(bytes)), [&] {
            return std::string(name) + ": cuMemUnmap of " + std::to_string(bytes) + " bytes at 0x" +
                   nxmem::detail::to_hex(at);
        });
    }
    result<void> unmap_chunk(std::uint64_t at) const { return unmap_range(at, chunk_); }

    result<void> allow_access(std::uint64_t at, std::uint64_t bytes, bool read_only = false) const {
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = device_->ordinal();
        access.flags = read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        return device_->check(device_->api().mem_set_access(at, static_cast<std::size_t>(bytes), &access, 1), [&] {
            return std::string(name) + ": cuMemSetAccess of " + std::to_string(bytes) +
                   " bytes at 0x" + nxmem::detail::to_hex(at);
        });
    }

    // One handle: allocates nothing unless the driver fails, since it runs where the kit tears an
    // allocator down (no exception may leave a destructor, nxmem conform --oom).
    result<void> release_handle(handle chunk) const {
        return device_->check(device_->api().mem_release(chunk),
                              [] { return std::string(name) + ": cuMemRelease"; });
    }
    result<void> release_handles(const std::vector<handle>& handles) const {
        result<void> outcome = boost::outcome_v2::success();
        for (handle chunk : handles) {
            result<void> released = release_handle(chunk);
            if (!released && outcome) {
                outcome = std::move(released);
            }
        }
        return outcome;
    }

    // Commits each gap; `wanted` (whole chunks) has been charged. A gap is all or nothing: on a
    // failure its chunks are undone, the earlier gaps stay committed (mapped_bytes tells) and the
    // rest of the charge is given back.
    result<void> commit_gaps(reservation& held, const std::vector<page_run>& gaps, std::uint64_t wanted) {
        for (const page_run& gap : gaps) {
            std::vector<handle> made;
            const auto undo = [&] {
                for (std::size_t i = made.size(); i-- > 0;) {
                    (void)unmap_chunk(address_of(held, gap.first + i));
                }
                (void)release_handles(made);
                budget_.credit(wanted);
            };
            result<void> committed = commit_gap(held, gap, made);
            if (!committed) {
                undo();
                return committed;
            }
            // Out of memory for the bookkeeping undoes the gap too (page_runs::insert changes
            // nothing when it throws).
            std::uint64_t recorded = gap.first;
            try {
                for (; recorded < gap.second; ++recorded) {
                    held.chunks.emplace(recorded, made[recorded - gap.first]);
                }
                held.committed.insert(gap.first, gap.second);
            } catch (...) {
                for (std::uint64_t chunk = gap.first; chunk < recorded; ++chunk) {
                    held.chunks.erase(chunk);
                }
                undo();
                throw;
            }
            const std::uint64_t bytes = bytes_of(held, gap);
            held.committed_bytes += bytes;
            mapped_bytes_.fetch_add(bytes, std::memory_order_relaxed);
            wanted -= (gap.second - gap.first) * chunk_;
        }
        return boost::outcome_v2::success();
    }

    // Creates and maps the gap's chunks (`made` holds those mapped), then opens them to the device.
    result<void> commit_gap(reservation& held, const page_run& gap, std::vector<handle>& made) {
        made.reserve(gap.second - gap.first);
        for (std::uint64_t chunk = gap.first; chunk < gap.second; ++chunk) {
            NXMEM_TRY(created, create_chunk(chunk_));
            if (result<void> mapped = map_chunk(address_of(held, chunk), created); !mapped) {
                (void)device_->api().mem_release(created);
                return mapped;
            }
            made.push_back(created);
        }
        return allow_access(address_of(held, gap.first), (gap.second - gap.first) * chunk_);
    }

    // Unmaps and releases the committed chunks of `run`, one by one; a chunk the driver keeps
    // mapped stays committed and the failure is reported. A chunk unmapped but not released is
    // no longer committed (nothing can reach it); that failure is reported too.
    result<void> decommit_run(reservation& held, const page_run& run) {
        result<void> outcome = boost::outcome_v2::success();
        for (std::uint64_t chunk = run.first; chunk < run.second; ++chunk) {
            NXMEM_TRY_VOID(unmap_chunk(address_of(held, chunk)));
            auto found = held.chunks.find(chunk);
            if (result<void> released = device_->check(device_->api().mem_release(found->second),
                                                       [] { return std::string(name) + ": cuMemRelease"; });
                !released && outcome) {
                outcome = std::move(released);
            }
            held.chunks.erase(found);
            held.committed.erase(chunk, chunk + 1);
            const std::uint64_t bytes = bytes_of(held, {chunk, chunk + 1});
            held.committed_bytes -= bytes;
            mapped_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
            budget_.credit(chunk_);
        }
        return outcome;
    }

    // Maps the prefix over the allocation's first chunks; all or nothing.
    result<void> map_prefix(reservation& held, const prefix_memory& shared) {
        NXMEM_TRY_VOID(map_physical(held.address, shared.length, shared.physical));
        if (result<void> opened = allow_access(held.address, shared.length, shared.read_only); !opened) {
            (void)unmap_range(held.address, shared.length);
            return opened;
        }
        held.prefix_mapped = true;
        return boost::outcome_v2::success();
    }

    result<CUdeviceptr> window_of(prefix_memory& shared) const {
        std::lock_guard lock(shared.window_mutex);
        if (shared.window != 0) {
            return shared.window;
        }
        return device_->current([&]() -> result<CUdeviceptr> {
            CUdeviceptr window = 0;
            NXMEM_TRY_VOID(device_->check(
                device_->api().mem_address_reserve(&window, static_cast<std::size_t>(shared.length), 0, 0, 0),
                [&] { return std::string(name) + ": cuMemAddressReserve of a prefix's copy window"; }));
            result<void> mapped = map_physical(window, shared.length, shared.physical);
            if (mapped) {
                mapped = allow_access(window, shared.length, shared.read_only);
                if (!mapped) {
                    (void)unmap_range(window, shared.length);
                }
            }
            if (!mapped) {
                (void)device_->api().mem_address_free(window, static_cast<std::size_t>(shared.length));
                return boost::outcome_v2::failure(std::move(mapped).error());
            }
            shared.window = window;
            return window;
        });
    }

    // An imported handle whose memory is smaller than the handle claims must not pass: it is
    // mapped whole once into a scratch reservation, which the driver refuses beyond its memory.
    result<void> prove_length(handle physical, std::uint64_t length) const {
        CUdeviceptr scratch = 0;
        NXMEM_TRY_VOID(device_->check(
            device_->api().mem_address_reserve(&scratch, static_cast<std::size_t>(length), 0, 0, 0),
            [&] { return std::string(name) + ": cuMemAddressReserve of " + std::to_string(length) +
                         " bytes to check an import"; }));
        const CUresult mapped = device_->api().mem_map(scratch, static_cast<std::size_t>(length), 0, physical, 0);
        if (mapped == CUDA_SUCCESS) {
            (void)device_->api().mem_unmap(scratch, static_cast<std::size_t>(length));
        }
        (void)device_->api().mem_address_free(scratch, static_cast<std::size_t>(length));
        if (mapped != CUDA_SUCCESS) {
            return fail(status_code::invalid_argument,
                        device_->who() + ": IPC handle refused: descriptor 0: its memory does not "
                                         "hold the " + std::to_string(length) + " bytes the handle "
                                         "claims (cuMemMap: " + device_->cuda().describe(mapped) + ")");
        }
        return boost::outcome_v2::success();
    }

    // Unmaps the prefix and every private chunk, releases the private chunks and frees the
    // address range. What the driver refuses stays recorded in `held` (committed_bytes, chunks).
    result<void> free_reservation(reservation& held) {
        result<void> outcome = boost::outcome_v2::success();
        const auto keep_first_failure = [&outcome](result<void> step) {
            if (!step && outcome) {
                outcome = std::move(step);
            }
        };
        if (held.prefix_mapped) {
            result<void> unmapped = unmap_range(held.address, held.prefix_chunks * chunk_);
            held.prefix_mapped = !unmapped.has_value();
            keep_first_failure(std::move(unmapped));
        }
        for (auto it = held.chunks.begin(); it != held.chunks.end();) {
            const std::uint64_t chunk = it->first;
            if (result<void> unmapped = unmap_chunk(address_of(held, chunk)); !unmapped) {
                keep_first_failure(std::move(unmapped));
                ++it;
                continue;
            }
            keep_first_failure(device_->check(device_->api().mem_release(it->second), [] {
                return std::string(name) + ": cuMemRelease";
            }));
            held.committed.erase(chunk, chunk + 1);
            held.committed_bytes -= bytes_of(held, {chunk, chunk + 1});
            it = held.chunks.erase(it);
        }
        if (outcome) {
            keep_first_failure(device_->check(
                device_->api().mem_address_free(held.address, static_cast<std::size_t>(held.length)),
                [&] {
                    return std::string(name) + ": cuMemAddressFree of " +
                           std::to_string(held.length) + " bytes at 0x" +
                           nxmem::detail::to_hex(held.address);
                }));
        }
        return outcome;
    }

    result<std::uint64_t> make_prefix(std::uint64_t size, std::uint64_t length) {
        NXMEM_TRY(made, create_chunk(length, true));
        const std::uint64_t prefix_id = prefixes_.next_id();
        try {
            prefixes_.insert(prefix_id, std::make_shared<prefix_memory>(prefix_id, size, length, made));
        } catch (...) {
            (void)release_handle(made);
            throw;
        }
        shared_prefix_bytes_.fetch_add(length, std::memory_order_relaxed);
        return prefix_id;
    }

    std::shared_ptr<device_context> device_;
    device_sharing sharing_; // refers to *device_
    const std::uint64_t chunk_;
    posix::byte_budget budget_;
    // mutable: a lookup (range_committed is const) takes a shard lock and changes nothing
    mutable nxmem::detail::sharded_table<std::shared_ptr<reservation>> reservations_;
    posix::prefix_table<prefix_memory> prefixes_;
    std::mutex quarantine_mutex_;
    std::vector<std::shared_ptr<reservation>> quarantine_;
    std::atomic<std::uint64_t> live_allocations_{0};
    std::atomic<std::uint64_t> reserved_bytes_{0};
    std::atomic<std::uint64_t> mapped_bytes_{0};
    std::atomic<std::uint64_t> shared_prefix_bytes_{0};
    std::atomic<std::uint64_t> quarantined_bytes_{0};
    std::atomic<std::uint64_t> imported_bytes_{0};
};

} // namespace nxmem::cuda
