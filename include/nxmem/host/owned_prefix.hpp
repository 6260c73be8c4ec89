// owned_prefix: one shared-prefix reference that releases itself. The raw SharedMapping calls
// (create_prefix / retain_prefix / release_prefix, one release per create or retain) stay for
// engines that manage references themselves; an owned_prefix makes an early return or an
// exception unable to leak one.
#pragma once

#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/owner.hpp>
#include <nxmem/host/shared_prefix.hpp>

namespace nxmem::host {

namespace detail {
struct prefix_release {
    template <Device D>
    static result<void> release(shared_mapping_view<D>& mapping, const shared_prefix& prefix) {
        return mapping.release_prefix(prefix);
    }
    static result<void> nothing_held() { return boost::outcome_v2::success(); }
};
} // namespace detail

// Adopt a reference the caller holds with owned_prefix(mapping, prefix), or take one here.
template <Device D>
class owned_prefix : public owner<shared_mapping_view<D>, shared_prefix, detail::prefix_release> {
public:
    using owner<shared_mapping_view<D>, shared_prefix, detail::prefix_release>::owner;

    // Takes the first reference on a new prefix of `size` bytes.
    static result<owned_prefix> create(shared_mapping_view<D> mapping, std::uint64_t size) {
        NXMEM_TRY(created, mapping.create_prefix(size));
        return owned_prefix(std::move(mapping), created);
    }

    // Takes one more reference on an existing prefix (its other owners keep theirs).
    static result<owned_prefix> retain(shared_mapping_view<D> mapping, const shared_prefix& prefix) {
        NXMEM_TRY_VOID(mapping.retain_prefix(prefix));
        return owned_prefix(std::move(mapping), prefix);
    }
};

} // namespace nxmem::host
