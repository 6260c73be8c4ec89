// nxmem::transfer::agent: one per process (a UCX context, a worker, endpoints to peers). It
// registers nxmem memory with UCX (a plugin allocation, a shared prefix's mapping, an import, a
// pool's chunks, or memory of the engine's own), describes it to peers, reads and writes lists of
// blocks from and to them (ucp_get_nbx / ucp_put_nbx) with a request the caller polls or waits on,
// and notifies the peer when a transfer is complete (ucp_am_send_nbx). docs/TRANSFER.md.
//
// Thread-safe: every call may come from any thread. UCX is called under one lock per agent
// (the worker is serialised), never while a plugin is called. Progress is driven by the caller
// (poll, wait, progress) or by a thread of the agent's own (agent_options::progress_thread).
#pragma once

#include <nxmem/transfer/agent_options.hpp>
#include <nxmem/transfer/detail/agent_core.hpp>
#include <nxmem/transfer/peer.hpp>
#include <nxmem/transfer/registration.hpp>
#include <nxmem/transfer/transfer_request.hpp>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

namespace nxmem::transfer {

class agent {
public:
    static result<agent> start(const agent_options& options = {}) {
        NXMEM_TRY(core, detail::agent_core::start(options));
        agent made(std::move(core));
        if (options.progress_thread) {
            try {
                made.thread_ = std::make_unique<progress_thread>();
                detail::agent_core* raw = made.core_.get();
                progress_thread* own = made.thread_.get();
                own->thread = std::thread([raw, own] { raw->run_progress_thread(own->stop); });
            } catch (const std::system_error& failure) {
                return fail(status_code::internal_error, std::string("cannot start the progress thread: ") + failure.what());
            }
        }
        return made;
    }

    agent(agent&&) noexcept = default;
    agent& operator=(agent&& other) noexcept {
        if (this != &other) {
            stop_thread();
            core_ = std::move(other.core_);
            thread_ = std::move(other.thread_);
        }
        return *this;
    }
    ~agent() { stop_thread(); }

    const agent_id& id() const noexcept { return core_->id(); }
    const std::string& name() const noexcept { return core_->name(); }

    // What a peer needs to connect: this agent's id, name and UCX worker address.
    result<std::vector<std::byte>> metadata() { return core_->metadata(); }
    // Connects to the agent whose metadata this is (untrusted input: checked before UCX sees it).
    result<peer> connect(std::span<const std::byte> metadata) {
        NXMEM_TRY(record, core_->connect(metadata));
        return peer(core_, std::move(record));
    }

    // ---- registration ----

    // A live allocation of a plugin allocator of host memory, whole; leases it.
    result<registration> register_allocation(const host::plugin_allocator<cpu_device>& allocator,
                                             const allocation<cpu_device>& live) {
        NXMEM_TRY(lease, allocator.lease(live));
        // A mechanism with virtual backing may have committed only part of it.
        const bool partly_committed = (allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0;
        return register_leased(reinterpret_cast<std::uint64_t>(live.address), live.size, true, true, std::move(lease),
                               partly_committed);
    }
    // A live allocation of a plugin allocator of GPU memory: refused (UNSUPPORTED_CAPABILITY), and
    // nothing is leased or registered. The message names what is missing: UCX's cuda transport
    // (cuda_copy, cuda_ipc) when this UCX has none, else nxmem's device path, which is a design
    // and not built (docs/TRANSFER.md, "Device memory"). Device memory is never handed to UCX as
    // host memory, though a fake driver's may be mapped in this process.
    template <Device D>
        requires(!std::same_as<D, cpu_device>)
    result<registration> register_allocation(const host::plugin_allocator<D>& allocator, const allocation<D>& live) {
        (void)allocator; // no lease: nothing is registered
        return core_->refuse_device_memory(describe(live), D::name);
    }
    // A shared prefix's mapping: the first prefix.size bytes of the allocation it is committed in
    // (the prefix's own pages); leases the allocation.
    result<registration> register_prefix_mapping(const host::plugin_allocator<cpu_device>& allocator,
                                                 const allocation<cpu_device>& live,
                                                 const host::shared_prefix& prefix) {
        if (prefix.size == 0 || prefix.size > live.size) {
            return fail(status_code::invalid_argument, "register_prefix_mapping: a prefix of " +
                                                           std::to_string(prefix.size) + " bytes in an allocation of " +
                                                           std::to_string(live.size));
        }
        NXMEM_TRY(lease, allocator.lease(live));
        return register_leased(reinterpret_cast<std::uint64_t>(live.address), prefix.size, true, true, std::move(lease));
    }
    // An import from another process (an allocation, mapped whole); leases it. A read-only import
    // is registered read-only: peers may read it, nothing is read into it.
    result<registration> register_import(const host::imported_memory<cpu_device>& imported) {
        NXMEM_TRY(lease, imported.lease());
        const bool writable = imported.access() == NXMEM_IPC_READ_WRITE;
        return register_leased(reinterpret_cast<std::uint64_t>(imported.address()), imported.size(), writable, writable,
                               std::move(lease), true); // the exporter may have committed only part of it
    }
    // A pool, once: its one reservation when it grows by commit (every chunk and span it will
    // ever commit lies inside, so nothing is registered again as it grows), else each chunk it
    // holds now. Leases the pool (pool_allocator::lease): trim, the retention limit and reclaim
    // give nothing back while a registration lives. A pooled allocation is then described by
    // its address (describe(allocation)): no UCX call. Chunks and spans a pool grown by
    // allocation makes later, and pass-throughs, lie outside: a transfer naming them is refused.
    template <class Pool> result<std::vector<registration>> register_pool(const std::shared_ptr<Pool>& pool) {
        if (pool == nullptr) {
            return fail(status_code::invalid_argument, "register_pool: no pool");
        }
        // The reservation alone when there is one (chunks and arena runs lie inside it); else
        // the chunks and span segments. Never a pass-through: its release goes straight back to
        // the upstream, which no pool lease stops.
        std::vector<pool_region> regions;
        bool reserved = false;
        pool->for_each_region([&](const pool_region& region) {
            reserved = reserved || region.kind == pool_region_kind::reservation;
            if (region.kind == pool_region_kind::reservation || region.kind == pool_region_kind::chunk ||
                region.kind == pool_region_kind::segment) {
                regions.push_back(region);
            }
        });
        if (reserved) {
            std::erase_if(regions, [](const pool_region& region) { return region.kind != pool_region_kind::reservation; });
        }
        // Every registration holds the pool (and its lease) until it is deregistered.
        auto lease = std::make_shared<pool_lease>(pool->lease());
        std::shared_ptr<void> keeper(lease, lease.get());
        auto held = std::shared_ptr<void>(pool, pool.get());
        std::vector<registration> made;
        made.reserve(regions.size());
        for (const pool_region& region : regions) {
            // A reservation is committed as the pool grows: the rest of it is PROT_NONE.
            NXMEM_TRY(record, core_->register_region(detail::agent_core::region_request{
                                  region.address, region.bytes, true, true, {},
                                  region.kind == pool_region_kind::reservation}));
            record->pool_keeper = keeper;
            record->pool_owner = held;
            made.push_back(registration(core_, std::move(record)));
        }
        return made;
    }

    // Memory the engine owns and keeps in place itself (a pool's chunk, a buffer of its own):
    // no lease is taken; keeping it mapped while registered is the caller's promise.
    result<registration> register_memory(void* address, std::uint64_t length) {
        return register_leased(reinterpret_cast<std::uint64_t>(address), length, true, true, {});
    }

    // Registrations now live (deregistered ones whose transfers are still in flight included).
    std::size_t registration_count() const { return core_->registration_count(); }

    // The region list a peer loads (peer::load_regions): these registrations with their keys.
    result<std::vector<std::byte>> export_regions(std::span<const registration* const> registrations) {
        std::vector<const detail::registration_record*> records;
        records.reserve(registrations.size());
        for (const registration* each : registrations) {
            if (each == nullptr || !*each) {
                return fail(status_code::invalid_argument, "export_regions: an empty registration handle");
            }
            records.push_back(each->record_.get());
        }
        return core_->export_regions(records);
    }
    result<std::vector<std::byte>> export_regions(std::initializer_list<const registration*> registrations) {
        return export_regions(std::span<const registration* const>(registrations.begin(), registrations.size()));
    }

    // ---- transfers ----

    // Copies the peer's `remote` blocks into the local `local` blocks, pairwise (equal lengths).
    // Every block is checked first: local ones inside this agent's registrations, remote ones
    // inside regions the peer declared; nothing is issued unless all pass. A non-empty
    // `notification` is delivered to the peer once the data is in place.
    result<transfer_request> read(const peer& from, const descriptor_list& local, const descriptor_list& remote,
                                  std::span<const std::byte> notification = {}) {
        return submit(detail::agent_core::direction::read, from, local, remote, notification);
    }
    // Copies local blocks into the peer's; the notification follows the data (after a flush).
    result<transfer_request> write(const peer& to, const descriptor_list& local, const descriptor_list& remote,
                                   std::span<const std::byte> notification = {}) {
        return submit(detail::agent_core::direction::write, to, local, remote, notification);
    }

    // ---- progress and notifications ----

    // Progresses UCX until it is idle (for callers without a progress thread); true if anything
    // happened.
    bool progress() { return core_->progress(); }
    std::optional<notification> take_notification() { return core_->take_notification(); }
    result<notification> wait_notification(std::chrono::nanoseconds timeout) { return core_->wait_notification(timeout); }
    // Notifications refused as malformed (or while the queue was full).
    std::uint64_t dropped_notifications() const noexcept { return core_->dropped_notifications(); }
    // Batch messages refused: requests this agent, as a target, did not serve (malformed, or an
    // entry outside what it exported) and replies that answered nothing it asked.
    std::uint64_t refused_batches() const noexcept { return core_->refused_batches(); }
    // Batch requests served without asking the kernel first whether every page named is there
    // (process_vm_readv refused, by a seccomp filter): a peer naming an uncommitted part of an
    // exported pool reservation would then crash this process (docs/TRANSFER.md, "What is checked").
    std::uint64_t unprobed_batches() const noexcept { return core_->unprobed_batches(); }

private:
    struct progress_thread {
        std::atomic<bool> stop{false};
        std::thread thread;
    };

    explicit agent(std::shared_ptr<detail::agent_core> core) : core_(std::move(core)) {}

    result<registration> register_leased(std::uint64_t base, std::uint64_t length, bool remote_writable,
                                         bool local_writable, host::registration_lease lease, bool probe_pages = false) {
        NXMEM_TRY(record, core_->register_region(detail::agent_core::region_request{
                              base, length, remote_writable, local_writable, std::move(lease), probe_pages}));
        return registration(core_, std::move(record));
    }

    result<transfer_request> submit(detail::agent_core::direction way, const peer& with, const descriptor_list& local,
                                    const descriptor_list& remote, std::span<const std::byte> notification) {
        if (!with || with.core_ != core_) {
            return fail(status_code::invalid_argument, "transfer: the peer is not connected to this agent");
        }
        NXMEM_TRY(state, core_->submit(way, *with.record_, local, remote, notification));
        return transfer_request(core_, std::move(state));
    }

    void stop_thread() noexcept {
        if (thread_ != nullptr) {
            thread_->stop.store(true, std::memory_order_release);
            core_->wake_thread();
            thread_->thread.join();
            thread_.reset();
        }
    }

    std::shared_ptr<detail::agent_core> core_;
    std::unique_ptr<progress_thread> thread_;
};

} // namespace nxmem::transfer
