// owner: the move-only handle behind owned_prefix and owned_allocation. It holds what it releases
// through (a view, an allocator) and the value it owns, and releases the value on destruction.
#pragma once

#include <nxmem/abi/result.hpp>

#include <optional>
#include <utility>

namespace nxmem::host {

// `Release` says how a value goes back: `static result<R> release(Holder&, const Value&)`, and
// `static result<R> nothing_held()`, what reset() answers on an empty handle.
template <class Holder, class Value, class Release> class owner {
public:
    using reset_result = decltype(Release::nothing_held());

    // Adopts a value the caller holds (made through `holder`).
    owner(Holder holder, const Value& adopted) : holder_(std::move(holder)), value_(adopted) {}

    owner(const owner&) = delete;
    owner& operator=(const owner&) = delete;
    owner(owner&& other) noexcept
        : holder_(std::move(other.holder_)), value_(std::exchange(other.value_, std::nullopt)) {}
    owner& operator=(owner&& other) noexcept {
        if (this != &other) {
            release_quietly();
            holder_ = std::move(other.holder_);
            value_ = std::exchange(other.value_, std::nullopt);
        }
        return *this;
    }

    // Releases the value it still holds. A failure cannot be reported from here (the value then
    // stays counted, which the unload tally shows); call reset() to see it.
    ~owner() { release_quietly(); }

    // The value. Only while the handle owns one.
    const Value& get() const noexcept { return *value_; }
    const Value* operator->() const noexcept { return &*value_; }
    explicit operator bool() const noexcept { return value_.has_value(); }

    // Gives the value up without releasing it: the caller releases it now (as with
    // std::unique_ptr::release).
    Value release() noexcept { return *std::exchange(value_, std::nullopt); }

    // Releases the value now and says how it went. On a failure the handle keeps owning it (the
    // host still counts it), so the destructor tries once more; an empty handle answers
    // Release::nothing_held().
    reset_result reset() {
        if (!value_.has_value()) {
            return Release::nothing_held();
        }
        reset_result outcome = Release::release(holder_, *value_);
        if (outcome) {
            value_.reset();
        }
        return outcome;
    }

private:
    void release_quietly() noexcept {
        try {
            static_cast<void>(reset());
        } catch (...) {
            // Only building an error message can throw (std::bad_alloc); the value then stays
            // counted, which the unload tally reports.
        }
    }

    Holder holder_;
    std::optional<Value> value_;
};

} // namespace nxmem::host
