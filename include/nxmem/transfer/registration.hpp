// registration: local memory registered with UCX, and describe(), a pooled or plugin allocation as
// a descriptor without a UCX call (docs/TRANSFER.md, "The API", "What a lease guarantees").
#pragma once

#include <nxmem/transfer/detail/agent_core.hpp>

#include <concepts>
#include <memory>

namespace nxmem::transfer {

class agent;

// A descriptor of an allocation (a pooled one, a plugin's): its address and size; host memory on
// device 0, a GPU's as memory kind `device` with its device index (NIXL's VRAM). No UCX call: a
// transfer checks that it lies inside one of the agent's registrations (device memory never does
// yet: docs/TRANSFER.md, "Device memory").
template <Device D> descriptor describe(const allocation<D>& live) noexcept {
    if constexpr (std::same_as<D, cpu_device>) {
        return descriptor{D::to_wire(live.address), live.size, 0, memory_kind::host};
    } else {
        return descriptor{D::to_wire(live.address), live.size, static_cast<std::uint32_t>(live.device.index),
                          memory_kind::device};
    }
}

// Local memory registered with UCX. Move-only; deregisters when destroyed (at once, or as soon as
// the transfers using it are done). While it lives, what it registered stays where it is: a
// plugin allocation cannot be released (BUSY), an import cannot be closed (BUSY), and the
// module's tally counts a registration, so the plugin cannot unload.
class registration {
public:
    registration() = default;
    registration(registration&&) noexcept = default;
    registration& operator=(registration&& other) noexcept {
        if (this != &other) {
            abandon();
            core_ = std::move(other.core_);
            record_ = std::move(other.record_);
        }
        return *this;
    }
    ~registration() { abandon(); }

    explicit operator bool() const noexcept { return record_ != nullptr && !record_->deregistered; }
    std::uint64_t id() const noexcept { return record_->id; }
    std::uint64_t base() const noexcept { return record_->base; }
    std::uint64_t length() const noexcept { return record_->length; }
    memory_kind kind() const noexcept { return record_->kind; }
    std::uint32_t device() const noexcept { return record_->device; }
    // The packed remote key (what export_regions sends for it).
    std::span<const std::byte> packed_key() const noexcept { return record_->packed_key; }

    // A descriptor of `length` bytes at `offset` into the registration: no UCX call, only a check
    // that the range lies inside.
    result<descriptor> describe(std::uint64_t offset, std::uint64_t length) const {
        if (length == 0 || offset > record_->length || length > record_->length - offset) {
            return fail(status_code::invalid_argument,
                        "describe: " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                            " lie outside registration " + std::to_string(record_->id) + " (" +
                            std::to_string(record_->length) + " bytes)");
        }
        return descriptor{record_->base + offset, length, record_->device, record_->kind};
    }

    // BUSY while transfers use it (nothing changes); afterwards the handle is empty.
    result<void> deregister() {
        if (record_ == nullptr) {
            return boost::outcome_v2::success();
        }
        NXMEM_TRY_VOID(core_->deregister(*record_));
        record_.reset();
        core_.reset();
        return boost::outcome_v2::success();
    }

private:
    friend class agent;
    registration(std::shared_ptr<detail::agent_core> core, std::shared_ptr<detail::registration_record> record)
        : core_(std::move(core)), record_(std::move(record)) {}
    void abandon() noexcept {
        if (record_ != nullptr) {
            core_->abandon(*record_);
            record_.reset();
            core_.reset();
        }
    }
    std::shared_ptr<detail::agent_core> core_;
    std::shared_ptr<detail::registration_record> record_;
};

} // namespace nxmem::transfer
