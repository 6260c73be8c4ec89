// A span piece's ticket: whether it is live, under which generation, and the description a
// release is checked against, all readable and claimable without the pool's span lock. A
// release claims the piece by one compare-and-swap of the tag (generation and live bit), so of
// two threads releasing the same id exactly one wins; a release that misdescribes the piece
// changes nothing. The description is published before the tag (release, acquire), and every
// field is atomic: a stale id may name a record that is being handed out again at that moment.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

namespace nxmem::pool_detail {

class span_ticket {
public:
    enum class verdict { claimed, not_live, misdescribed };

    // The generation of the piece's latest hand-out (0 before the first).
    std::uint32_t generation() const noexcept {
        return static_cast<std::uint32_t>(tag_.load(std::memory_order_acquire) >> 1);
    }

    // What a release must name while the piece is live; none while it is not. Read at one
    // moment: a piece released and handed out again meanwhile gives the later description.
    struct description {
        std::uint32_t generation = 0;
        std::uint64_t size = 0;
        std::uint64_t alignment = 0;
    };
    std::optional<description> live_description() const noexcept {
        const std::uint64_t tag = tag_.load(std::memory_order_acquire);
        if ((tag & live_bit) == 0) {
            return std::nullopt;
        }
        return description{static_cast<std::uint32_t>(tag >> 1), size_.load(std::memory_order_acquire),
                           alignment_.load(std::memory_order_acquire)};
    }

    // By whoever holds the piece out of every list (the span lock's holder, or the thread that
    // took it from its shard's cache): hands it out under the next generation, which it returns.
    std::uint32_t publish(std::uint64_t base, std::uint64_t size, std::uint64_t alignment) noexcept {
        const std::uint64_t generation = (tag_.load(std::memory_order_relaxed) >> 1) + 1;
        base_.store(base, std::memory_order_release);
        size_.store(size, std::memory_order_release);
        alignment_.store(alignment, std::memory_order_release);
        tag_.store((generation << 1) | live_bit, std::memory_order_release);
        return static_cast<std::uint32_t>(generation);
    }

    // A release of the piece handed out under `generation` as (base, size, alignment): claimed
    // (the caller now holds the piece, no longer live), not_live (never handed out under that
    // generation, or released already: by another thread too), or misdescribed (live, but not
    // as described; nothing changed).
    verdict claim(std::uint32_t generation, std::uint64_t base, std::uint64_t size, std::uint64_t alignment) noexcept {
        std::uint64_t expected = (std::uint64_t{generation} << 1) | live_bit;
        if (tag_.load(std::memory_order_acquire) != expected) {
            return verdict::not_live;
        }
        if (base_.load(std::memory_order_acquire) != base || size_.load(std::memory_order_acquire) != size ||
            alignment_.load(std::memory_order_acquire) != alignment) {
            // A field read from a later hand-out follows the claim that ended this one: the
            // tag has moved on, and this release names a piece no longer live.
            return tag_.load(std::memory_order_acquire) == expected ? verdict::misdescribed : verdict::not_live;
        }
        return tag_.compare_exchange_strong(expected, std::uint64_t{generation} << 1, std::memory_order_acq_rel,
                                            std::memory_order_relaxed)
                   ? verdict::claimed
                   : verdict::not_live;
    }

    // By the thread that claimed the piece under `generation` and could not finish its release:
    // live again, under the same generation and description.
    void restore(std::uint32_t generation) noexcept {
        tag_.store((std::uint64_t{generation} << 1) | live_bit, std::memory_order_release);
    }

private:
    static constexpr std::uint64_t live_bit = 1;
    std::atomic<std::uint64_t> tag_{0}; // generation << 1 | live
    std::atomic<std::uint64_t> base_{0};
    std::atomic<std::uint64_t> size_{0};
    std::atomic<std::uint64_t> alignment_{0};
};

} // namespace nxmem::pool_detail
