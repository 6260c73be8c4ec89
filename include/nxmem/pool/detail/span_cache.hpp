// A shard's front cache of released span pieces, as tcache and per-CPU caches serve large sizes:
// a thread that releases a piece parks it in its own shard's cache, and its next request of the
// same size bin takes it back, neither taking the pool's span lock nor writing a line another
// thread writes. The pool counts parked pieces as idle and flushes every cache back into its
// span free lists (merging) before it grows, trims or gives memory back under a retention limit.
//
// A few slots a shard, a few pieces a bin: enough for a thread that reuses a handful of large
// buffers (a tensor's activations, a KV block, a staging buffer) to cycle them without the lock,
// and small enough to search linearly under the cache's own lock. The bytes parked are capped
// per shard (pool_options::span_cache_bytes) because parked pieces serve only their thread and
// their bin until a flush.
#pragma once

#include <nxmem/detail/spin_lock.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

namespace nxmem::pool_detail {

// A piece in a cache, as the pool's span records describe it (copied, so a cache reads no
// record).
struct parked_piece {
    std::uint32_t index = 0; // of its span record
    std::uint32_t bin = 0;   // pool_classes::bin_of(bytes)
    std::uint64_t base = 0;  // wire address
    std::uint64_t bytes = 0;
};

class alignas(64) span_cache {
public:
    static constexpr std::uint32_t slots = 8;
    static constexpr std::uint32_t pieces_per_bin = 4;
    using pieces = std::array<parked_piece, slots>;

    // What the span allocations made and released through this cache changed, modulo 2^64 (a
    // piece taken out by one shard is often released into another): summed over every cache and
    // the pool's own span figures in one consistent cut, they are the true figures.
    struct figures {
        std::uint64_t live_change = 0;
        std::uint64_t in_use_change = 0; // requested bytes
        std::uint64_t parked_bytes = 0;
    };

    // Parks a piece just released (its request was `released_size` bytes); false, nothing
    // changed, when every slot is taken, its bin has pieces_per_bin already, or the cache would
    // keep more than cap_bytes.
    bool park(const parked_piece& piece, std::uint64_t released_size, std::uint64_t cap_bytes) noexcept {
        std::lock_guard hold(lock_);
        const std::uint64_t parked = parked_bytes_.load(std::memory_order_relaxed);
        if (count_ == slots || piece.bytes > cap_bytes || parked > cap_bytes - piece.bytes) {
            return false;
        }
        std::uint32_t same_bin = 0;
        for (std::uint32_t at = 0; at < count_; ++at) {
            same_bin += entries_[at].bin == piece.bin ? 1 : 0;
        }
        if (same_bin >= pieces_per_bin) {
            return false;
        }
        entries_[count_++] = piece;
        parked_bytes_.store(parked + piece.bytes, std::memory_order_relaxed);
        live_change_ -= 1;
        in_use_change_ -= released_size;
        return true;
    }

    // The piece parked last in `bin` that holds `bytes` and starts aligned to `alignment`, taken
    // out for a request of `requested` bytes; none when no parked piece fits.
    std::optional<parked_piece> take(std::uint32_t bin, std::uint64_t bytes, std::uint64_t alignment,
                                     std::uint64_t requested) noexcept {
        std::lock_guard hold(lock_);
        for (std::uint32_t at = count_; at-- > 0;) {
            const parked_piece found = entries_[at];
            if (found.bin == bin && found.bytes >= bytes && found.base % alignment == 0) {
                for (std::uint32_t later = at + 1; later < count_; ++later) {
                    entries_[later - 1] = entries_[later];
                }
                --count_;
                parked_bytes_.store(parked_bytes_.load(std::memory_order_relaxed) - found.bytes,
                                    std::memory_order_relaxed);
                live_change_ += 1;
                in_use_change_ += requested;
                return found;
            }
        }
        return std::nullopt;
    }

    // Empties the cache into `out`; returns how many pieces it held.
    std::uint32_t take_all(pieces& out) noexcept {
        std::lock_guard hold(lock_);
        const std::uint32_t taken = count_;
        for (std::uint32_t at = 0; at < taken; ++at) {
            out[at] = entries_[at];
        }
        count_ = 0;
        parked_bytes_.store(0, std::memory_order_relaxed);
        return taken;
    }

    // Read without the lock (the retention check, the test before a flush): a recent value.
    std::uint64_t parked_bytes() const noexcept { return parked_bytes_.load(std::memory_order_relaxed); }

    // The lock, for a consistent cut across caches (usage()): taken only with no other lock of
    // the pool held, or in a cut, where every cache's lock is taken before the span lock.
    void lock() noexcept { lock_.lock(); }
    void unlock() noexcept { lock_.unlock(); }
    figures figures_while_locked() const noexcept {
        return {live_change_, in_use_change_, parked_bytes_.load(std::memory_order_relaxed)};
    }

private:
    nxmem::detail::spin_lock lock_;
    std::uint32_t count_ = 0;
    std::atomic<std::uint64_t> parked_bytes_{0};
    std::uint64_t live_change_ = 0;
    std::uint64_t in_use_change_ = 0;
    pieces entries_{};
};

} // namespace nxmem::pool_detail
