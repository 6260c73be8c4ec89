// owned_allocation: one allocation that releases itself. plugin_allocator's allocate / release stay
// for engines that manage lifetimes themselves (a governor, a pool); an owned_allocation makes an
// early return or an exception unable to leak one.
#pragma once

#include <nxmem/host/plugin_allocator.hpp>

#include <optional>
#include <utility>

namespace nxmem::host {

template <Device D> class owned_allocation {
public:
    // Adopts a live allocation the caller made with `allocator`.
    owned_allocation(plugin_allocator<D> allocator, const allocation<D>& adopted)
        : allocator_(std::move(allocator)), live_(adopted) {}

    static result<owned_allocation> allocate(plugin_allocator<D> allocator, std::uint64_t size,
                                             std::uint64_t alignment) {
        NXMEM_TRY(made, allocator.allocate(size, alignment));
        return owned_allocation(std::move(allocator), made);
    }

    owned_allocation(const owned_allocation&) = delete;
    owned_allocation& operator=(const owned_allocation&) = delete;
    owned_allocation(owned_allocation&& other) noexcept
        : allocator_(std::move(other.allocator_)), live_(std::exchange(other.live_, std::nullopt)) {}
    owned_allocation& operator=(owned_allocation&& other) noexcept {
        if (this != &other) {
            release_quietly();
            allocator_ = std::move(other.allocator_);
            live_ = std::exchange(other.live_, std::nullopt);
        }
        return *this;
    }

    // Releases the allocation it still holds. A failed release cannot be reported from here (the
    // allocation then stays live, counted in the unload tally); call reset() to see it.
    ~owned_allocation() { release_quietly(); }

    // The allocation. Only while the handle owns one.
    const allocation<D>& get() const noexcept { return *live_; }
    const allocation<D>* operator->() const noexcept { return &*live_; }
    explicit operator bool() const noexcept { return live_.has_value(); }

    // Gives the allocation up without releasing it: the caller now releases it through the
    // allocator (as with std::unique_ptr::release).
    allocation<D> release() noexcept { return *std::exchange(live_, std::nullopt); }

    // Releases the allocation now and reports how (complete or quarantined). On a failed release
    // the allocation stays live and the handle keeps owning it, so the destructor tries again.
    result<release_report> reset() {
        if (!live_.has_value()) {
            return release_report{};
        }
        NXMEM_TRY(report, allocator_.release(*live_));
        live_.reset();
        return report;
    }

private:
    void release_quietly() noexcept {
        try {
            static_cast<void>(reset());
        } catch (...) {
            // Only building an error message can throw (std::bad_alloc); the allocation then stays
            // live, which the unload tally reports.
        }
    }

    plugin_allocator<D> allocator_;
    std::optional<allocation<D>> live_;
};

} // namespace nxmem::host
