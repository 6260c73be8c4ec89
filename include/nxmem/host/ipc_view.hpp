// Sharing memory across processes (minor 3): the capability view that exports a prefix (or an
// allocation) as a handle and imports another process's handle, the owner of a handle's
// descriptors, and the RAII owner of an import. docs/HOST.md, "Sharing memory across processes".
//
// An import holds its allocator (and so the module) alive and counts in the module's tally until
// it is closed: unload is refused while imports live.
#pragma once

#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/registration_lease.hpp>
#include <nxmem/host/shared_prefix.hpp>

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <utility>

namespace nxmem::host {

// A handle record and the descriptors it names, owned: they are closed when it goes. Move-only.
// The record's descriptor numbers are this process's; a transport carries the descriptors and
// rewrites the numbers (handle_transport.hpp).
class ipc_handle {
public:
    ipc_handle() noexcept { record_.fd_count = 0; }
    // Takes ownership of the first fd_count descriptors of `record` (at most NXMEM_IPC_MAX_FDS).
    static ipc_handle adopt(const NxmemIpcHandle& record) noexcept {
        ipc_handle owned;
        owned.record_ = record;
        if (owned.record_.fd_count > NXMEM_IPC_MAX_FDS) {
            owned.record_.fd_count = NXMEM_IPC_MAX_FDS;
        }
        return owned;
    }
    ipc_handle(ipc_handle&& other) noexcept : record_(other.record_) { other.record_.fd_count = 0; }
    ipc_handle& operator=(ipc_handle&& other) noexcept {
        if (this != &other) {
            close_descriptors();
            record_ = other.record_;
            other.record_.fd_count = 0;
        }
        return *this;
    }
    ipc_handle(const ipc_handle&) = delete;
    ipc_handle& operator=(const ipc_handle&) = delete;
    ~ipc_handle() { close_descriptors(); }

    const NxmemIpcHandle& record() const noexcept { return record_; }
    // Gives up the descriptors without closing them: the caller owns what the record names.
    NxmemIpcHandle release() noexcept {
        const NxmemIpcHandle record = record_;
        record_.fd_count = 0;
        return record;
    }
    std::uint32_t kind() const noexcept { return record_.kind; }
    std::uint32_t access() const noexcept { return record_.access; }
    std::uint64_t size() const noexcept { return record_.size; }

private:
    void close_descriptors() noexcept {
        for (std::uint32_t index = 0; index < record_.fd_count; ++index) {
            if (record_.fds[index] >= 0) {
                (void)::close(record_.fds[index]);
            }
        }
        record_.fd_count = 0;
    }
    NxmemIpcHandle record_ = abi::make_struct<NxmemIpcHandle>();
};

// An open import. A prefix import's `prefix()` is a local shared prefix: commit it into this
// process's allocations through the shared-mapping view like a created one (its bytes are
// imported bytes, never costed here). An allocation import is mapped at `address()`, `size()`
// bytes readable (and writable for a read-write import), until it is closed; it is no allocation
// of this process (release, commit and decommit do not apply). close() ends it (the destructor
// closes too, ignoring a failure); allocations mapping a prefix keep their mapping until they
// are released.
template <Device D> class imported_memory {
public:
    imported_memory(std::shared_ptr<detail::allocator_core> core, const NxmemImport& described) noexcept
        : core_(std::move(core)), described_(described) {}
    imported_memory(imported_memory&& other) noexcept
        : core_(std::move(other.core_)), described_(other.described_) {}
    imported_memory& operator=(imported_memory&& other) noexcept {
        if (this != &other) {
            (void)close();
            core_ = std::move(other.core_);
            described_ = other.described_;
        }
        return *this;
    }
    imported_memory(const imported_memory&) = delete;
    imported_memory& operator=(const imported_memory&) = delete;
    ~imported_memory() { (void)close(); }

    std::uint32_t kind() const noexcept { return described_.kind; }
    std::uint32_t access() const noexcept { return described_.access; }
    std::uint64_t size() const noexcept { return described_.size; }
    std::uint64_t mapped_bytes() const noexcept { return described_.mapped_bytes; }
    std::uint64_t import_id() const noexcept { return described_.import_id; }
    typename D::address_type address() const noexcept { return D::from_wire(described_.address); }
    shared_prefix prefix() const noexcept {
        return shared_prefix{described_.prefix.prefix_id, described_.prefix.size,
                             described_.prefix.mechanism_id,
                             device_id::from_wire(described_.prefix.device)};
    }
    bool open() const noexcept { return core_ != nullptr; }

    // A lease (what a transfer registration holds, docs/TRANSFER.md): until it ends, close() is
    // BUSY and the module's tally counts a registration. INVALID_ARGUMENT on a closed import.
    result<registration_lease> lease() const {
        if (core_ == nullptr) {
            return fail(status_code::invalid_argument, "lease of a closed import");
        }
        return registration_lease::import(core_, described_.import_id);
    }

    // Ends the import; a second close is a no-op. On failure the import stays open.
    result<void> close() noexcept {
        if (core_ == nullptr) {
            return boost::outcome_v2::success();
        }
        result<void> closed = core_->close_import(described_);
        if (closed) {
            core_.reset();
        }
        return closed;
    }

private:
    std::shared_ptr<detail::allocator_core> core_; // pins the allocator and the module
    NxmemImport described_;
};

template <Device D> class ipc_view : detail::view_base {
public:
    using device_type = D;
    explicit ipc_view(std::shared_ptr<detail::allocator_core> core) : view_base(std::move(core)) {}

    // A handle for another process; its descriptors are new and owned by the result.
    result<ipc_handle> export_prefix(const shared_prefix& prefix,
                                     std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        auto request = abi::make_struct<NxmemExportRequest>();
        request.kind = NXMEM_IPC_PREFIX;
        request.access = access;
        request.prefix = prefix.to_wire();
        NXMEM_TRY(record, core_->export_handle(request));
        return ipc_handle::adopt(record);
    }
    result<ipc_handle> export_allocation(const allocation<D>& live,
                                         std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        auto request = abi::make_struct<NxmemExportRequest>();
        request.kind = NXMEM_IPC_ALLOCATION;
        request.access = access;
        request.allocation = detail::to_wire(live);
        NXMEM_TRY(record, core_->export_handle(request));
        return ipc_handle::adopt(record);
    }

    // Imports a handle from another process; the handle keeps its descriptors (close it after).
    result<imported_memory<D>> import(const NxmemIpcHandle& handle,
                                      std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        NXMEM_TRY(described, core_->import_handle(handle, access));
        return imported_memory<D>(core_, described);
    }
    result<imported_memory<D>> import(const ipc_handle& handle,
                                      std::uint32_t access = NXMEM_IPC_READ_WRITE) {
        return import(handle.record(), access);
    }
};

template <Device D> result<ipc_view<D>> plugin_allocator<D>::ipc() const {
    return detail::contain("ipc", [&]() -> result<ipc_view<D>> {
        if (!core_->has_ipc()) {
            return fail(status_code::unsupported_capability,
                        "'" + core_->mechanism_name() + "' does not share memory across processes");
        }
        return ipc_view<D>(core_);
    });
}

} // namespace nxmem::host
