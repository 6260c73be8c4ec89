// registration_lease: what a transfer registration holds on the memory it registered (an
// allocation of a plugin_allocator, or an import). While it lives the allocation cannot be
// released (release and enqueue_release are BUSY, naming the lease), the import cannot be
// closed, the allocator and its module stay alive, and the module's tally counts one
// registration, so try_unload is refused. docs/TRANSFER.md, "Leases".
#pragma once

#include <nxmem/host/detail/allocator_core.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace nxmem::host {

class registration_lease {
public:
    registration_lease() = default;
    registration_lease(registration_lease&& other) noexcept
        : core_(std::move(other.core_)), kind_(other.kind_), id_(other.id_) {}
    registration_lease& operator=(registration_lease&& other) noexcept {
        if (this != &other) {
            reset();
            core_ = std::move(other.core_);
            kind_ = other.kind_;
            id_ = other.id_;
        }
        return *this;
    }
    registration_lease(const registration_lease&) = delete;
    registration_lease& operator=(const registration_lease&) = delete;
    ~registration_lease() { reset(); }

    // Ends the lease now (allocates nothing); a second reset is a no-op.
    void reset() noexcept {
        if (core_ != nullptr) {
            core_->end_lease(kind_, id_);
            core_.reset();
        }
    }
    explicit operator bool() const noexcept { return core_ != nullptr; }
    // The allocation id or import id leased.
    std::uint64_t id() const noexcept { return id_; }

    // Leases a live allocation described as its allocator describes it (plugin_allocator::lease).
    static result<registration_lease> allocation(std::shared_ptr<detail::allocator_core> core,
                                                 const NxmemAllocation& described) {
        NXMEM_TRY_VOID(core->lease_allocation(described));
        return registration_lease(std::move(core), kind::allocation, described.allocation_id);
    }
    // Leases an open import (imported_memory::lease).
    static result<registration_lease> import(std::shared_ptr<detail::allocator_core> core,
                                             std::uint64_t import_id) {
        NXMEM_TRY_VOID(core->lease_import(import_id));
        return registration_lease(std::move(core), kind::import, import_id);
    }

private:
    using kind = detail::allocator_core::lease_kind;
    registration_lease(std::shared_ptr<detail::allocator_core> core, kind leased, std::uint64_t id) noexcept
        : core_(std::move(core)), kind_(leased), id_(id) {}
    std::shared_ptr<detail::allocator_core> core_; // keeps the allocator and the module alive
    kind kind_ = kind::allocation;
    std::uint64_t id_ = 0;
};

} // namespace nxmem::host
