// owned_prefix: one shared-prefix reference that releases itself. The raw SharedMapping calls
// (create_prefix / retain_prefix / release_prefix, one release per create or retain) stay for
// engines that manage references themselves; an owned_prefix makes an early return or an
// exception unable to leak one.
#pragma once

#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/shared_prefix.hpp>

#include <optional>
#include <utility>

namespace nxmem::host {

template <Device D> class owned_prefix {
public:
    // Adopts one reference the caller already holds (from create_prefix or retain_prefix).
    owned_prefix(shared_mapping_view<D> mapping, const shared_prefix& adopted)
        : mapping_(std::move(mapping)), prefix_(adopted) {}

    // Takes a new reference on a new prefix of `size` bytes.
    static result<owned_prefix> create(shared_mapping_view<D> mapping, std::uint64_t size) {
        NXMEM_TRY(created, mapping.create_prefix(size));
        return owned_prefix(std::move(mapping), created);
    }

    // Takes one more reference on an existing prefix (another owner keeps its own).
    static result<owned_prefix> retain(shared_mapping_view<D> mapping, const shared_prefix& prefix) {
        NXMEM_TRY_VOID(mapping.retain_prefix(prefix));
        return owned_prefix(std::move(mapping), prefix);
    }

    owned_prefix(const owned_prefix&) = delete;
    owned_prefix& operator=(const owned_prefix&) = delete;
    owned_prefix(owned_prefix&& other) noexcept
        : mapping_(std::move(other.mapping_)), prefix_(std::exchange(other.prefix_, std::nullopt)) {}
    owned_prefix& operator=(owned_prefix&& other) noexcept {
        if (this != &other) {
            release_quietly();
            mapping_ = std::move(other.mapping_);
            prefix_ = std::exchange(other.prefix_, std::nullopt);
        }
        return *this;
    }

    // Releases the reference it still holds. A failure cannot be reported from here (the
    // reference then stays counted, visible in the unload tally); call reset() to see it.
    ~owned_prefix() { release_quietly(); }

    // The prefix (for commit_prefix, or to hand to retain). Only while the handle owns one.
    const shared_prefix& get() const noexcept { return *prefix_; }
    explicit operator bool() const noexcept { return prefix_.has_value(); }

    // Gives the reference up without releasing it: the caller now owns it and must release it
    // with release_prefix (as with std::unique_ptr::release).
    shared_prefix release() noexcept { return *std::exchange(prefix_, std::nullopt); }

    // Releases the reference now, and says how it went. On a failure the handle keeps owning the
    // reference (the host still counts it), so the destructor tries again; an empty handle's
    // reset() succeeds and does nothing.
    result<void> reset() {
        if (!prefix_.has_value()) {
            return boost::outcome_v2::success();
        }
        NXMEM_TRY_VOID(mapping_.release_prefix(*prefix_));
        prefix_.reset();
        return boost::outcome_v2::success();
    }

private:
    void release_quietly() noexcept {
        try {
            static_cast<void>(reset());
        } catch (...) {
            // Only building an error message can throw (std::bad_alloc); the reference is then
            // still counted, which the unload tally reports.
        }
    }

    shared_mapping_view<D> mapping_;
    std::optional<shared_prefix> prefix_;
};

} // namespace nxmem::host
