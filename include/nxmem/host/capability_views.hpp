// The capability views of a plugin allocator. Each view keeps the allocator core alive and is
// counted in the module's tally while it lives, so unload waits for it.
#pragma once

#include <nxmem/concepts/shared_mapping.hpp>
#include <nxmem/concepts/virtual_backing.hpp>
#include <nxmem/host/plugin_allocator.hpp>

#include <memory>

namespace nxmem::host {

namespace detail {
// Shared ownership of the core plus the view count.
class view_base {
public:
    explicit view_base(std::shared_ptr<allocator_core> core) : core_(std::move(core)) {
        core_->view_opened();
    }
    view_base(const view_base& other) : view_base(other.core_) {}
    view_base(view_base&& other) noexcept = default;
    view_base& operator=(view_base other) noexcept {
        std::swap(core_, other.core_);
        return *this;
    }
    ~view_base() {
        if (core_ != nullptr) {
            core_->view_closed();
        }
    }

protected:
    std::shared_ptr<allocator_core> core_;
};
} // namespace detail

template <Device D> class virtual_backing_view : detail::view_base {
public:
    using device_type = D;
    explicit virtual_backing_view(std::shared_ptr<detail::allocator_core> core)
        : view_base(std::move(core)) {}

    result<void> commit(const allocation<D>& live, byte_range range) {
        return core_->change_range(detail::to_wire(live), range, true);
    }
    result<void> decommit(const allocation<D>& live, byte_range range) {
        return core_->change_range(detail::to_wire(live), range, false);
    }
    result<std::uint64_t> mapped_bytes(const allocation<D>& live) {
        return core_->mapped_bytes(detail::to_wire(live));
    }
    // The unit of commit and decommit, a power of two: a range starts at a multiple of it and is a
    // multiple of it long, except one that ends at the allocation's end. The mechanism states it
    // from minor 2 on; for an older table it is the host's page size.
    std::uint64_t commit_granularity() const noexcept { return core_->commit_granularity(); }
};

template <Device D> class shared_mapping_view : detail::view_base {
public:
    using device_type = D;
    using prefix_type = shared_prefix;
    explicit shared_mapping_view(std::shared_ptr<detail::allocator_core> core)
        : view_base(std::move(core)) {}

    result<shared_prefix> create_prefix(std::uint64_t size) { return core_->create_prefix(size); }
    result<void> retain_prefix(const shared_prefix& prefix) { return core_->retain_prefix(prefix); }
    result<void> release_prefix(const shared_prefix& prefix) { return core_->release_prefix(prefix); }
    result<prefix_commit> commit_prefix(const allocation<D>& live, const shared_prefix& prefix) {
        return core_->commit_prefix(detail::to_wire(live), prefix);
    }
};

template <Device D> result<virtual_backing_view<D>> plugin_allocator<D>::virtual_backing() const {
    return detail::contain("virtual_backing", [&]() -> result<virtual_backing_view<D>> {
        if (!core_->has_virtual_backing()) {
            return fail(status_code::unsupported_capability,
                        "'" + core_->mechanism_name() + "' does not offer virtual backing");
        }
        return virtual_backing_view<D>(core_);
    });
}

template <Device D> result<shared_mapping_view<D>> plugin_allocator<D>::shared_mapping() const {
    return detail::contain("shared_mapping", [&]() -> result<shared_mapping_view<D>> {
        if (!core_->has_shared_mapping()) {
            return fail(status_code::unsupported_capability,
                        "'" + core_->mechanism_name() + "' does not offer shared mapping");
        }
        return shared_mapping_view<D>(core_);
    });
}

static_assert(assert_virtual_backing<virtual_backing_view<cpu_device>>());
static_assert(assert_virtual_backing<virtual_backing_view<cuda_device>>());
static_assert(assert_shared_mapping<shared_mapping_view<cpu_device>>());
static_assert(assert_shared_mapping<shared_mapping_view<cuda_device>>());

} // namespace nxmem::host
