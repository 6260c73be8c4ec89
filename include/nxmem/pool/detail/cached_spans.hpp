// The pool's span caches over its span layer: a thread's released span piece parks in its
// shard's cache (pool/detail/span_cache.hpp), and its next request of the same size bin takes it
// back, neither taking the span lock nor writing a line another thread writes. A parked piece is
// live to the span layer (out of the free lists, never merged) and not live to its ticket, so a
// release or a release by address of its last id is refused. Parked pieces go back to the span
// free lists (merging) when their thread's cache cannot serve it, before the pool grows, at trim
// and under the retention limit: so caching never makes the pool hold more.
//
// This layer decides a span request's route: the thread's parked piece; else its own parked
// pieces flushed and best fit; else every cache flushed, best fit again and the arena grown;
// else a segment of its own.
#pragma once

#include <nxmem/pool/detail/pool_records.hpp>
#include <nxmem/pool/detail/span_cache.hpp>
#include <nxmem/pool/detail/span_heap.hpp>
#include <nxmem/pool/size_classes.hpp>

#include <array>
#include <cstdint>
#include <optional>

namespace nxmem::pool_detail {

// Spans: the span layer below (span_heap).
template <class Spans> class cached_spans {
public:
    using device_type = typename Spans::device_type;

    cached_spans(Spans& spans, std::uint64_t cap_bytes) noexcept : spans_(&spans), cap_bytes_(cap_bytes) {}
    cached_spans(const cached_spans&) = delete;
    cached_spans& operator=(const cached_spans&) = delete;

    // A span of `size` (above 16 KiB, up to the pool's pass-through size).
    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        const std::uint64_t bytes = pool_classes::round_up(size, spans_->granule());
        span_cache& own = caches_[this_thread_shard()];
        if (own.parked_bytes() != 0) {
            if (const std::optional<parked_piece> parked = own.take(pool_classes::bin_of(bytes), bytes, alignment, size);
                parked.has_value()) [[likely]] {
                return spans_->hand_out_parked(*parked, size, alignment);
            }
        }
        // A miss: the thread's own parked pieces join the free lists first, so best fit sees them
        // (left parked, they would make it split pieces it would have kept whole).
        flush(own);
        if (auto fitted = spans_->allocate_fitting(bytes, size, alignment, false); fitted.has_value()) {
            return std::move(*fitted);
        }
        // Before the pool grows, every parked piece goes back (merging).
        flush_all();
        if (auto fitted = spans_->allocate_fitting(bytes, size, alignment, true); fitted.has_value()) {
            return std::move(*fitted);
        }
        return spans_->allocate_segment(bytes, size, alignment, false);
    }

    // A span's release (its mechanism and device checked by the caller): claimed without the span
    // lock (of two releases of one id, one wins), then parked in the releasing thread's cache, or
    // handed to the span layer when it may not park or the cache is full. `on_idle()` runs, no
    // lock held, once a pooled piece is idle (parked or free).
    template <class OnIdle> result<release_report> release(const allocation<device_type>& live, OnIdle&& on_idle) {
        span_ticket::verdict verdict = span_ticket::verdict::not_live;
        auto* piece = spans_->claim(live, verdict);
        if (verdict != span_ticket::verdict::claimed) [[unlikely]] {
            return Spans::refused_claim(verdict, live);
        }
        const std::uint32_t generation = generation_of(live.allocation_id);
        if (cap_bytes_ != 0 && Spans::parkable(*piece, generation) &&
            caches_[this_thread_shard()].park(Spans::parking_of(*piece), live.size, cap_bytes_)) [[likely]] {
            on_idle();
            return release_report{release_state::complete, 0, 0};
        }
        if (piece->pass_through) {
            return spans_->release_claimed(*piece, live.size, generation);
        }
        (void)spans_->release_claimed(*piece, live.size, generation); // COMPLETE: a pooled piece
        on_idle();
        return release_report{release_state::complete, 0, 0};
    }

    // Every shard's parked pieces go back to the span free lists, merged with free neighbours;
    // returns how many went.
    std::uint32_t flush_all() noexcept {
        std::uint32_t flushed = 0;
        for (span_cache& cache : caches_) {
            flushed += flush(cache);
        }
        return flushed;
    }

    std::uint64_t parked_bytes() const noexcept {
        std::uint64_t parked = 0;
        for (const span_cache& cache : caches_) {
            parked += cache.parked_bytes();
        }
        return parked;
    }

    // The span figures in one cut across the caches and the span layer (every cache's lock, then
    // the span lock): a piece handed out by one and released into the other counts once. Parked
    // pieces are idle: not handed out.
    span_figures figures() const {
        for (span_cache& cache : caches_) {
            cache.lock();
        }
        span_figures totals;
        spans_->read_figures([&](const span_figures& below) { totals = below; });
        for (span_cache& cache : caches_) {
            const span_cache::figures cached = cache.figures_while_locked();
            totals.live_allocations += cached.live_change;
            totals.in_use_bytes += cached.in_use_change;
            totals.handed_out_bytes -= cached.parked_bytes;
            cache.unlock();
        }
        return totals;
    }

private:
    // A cache is emptied under its own lock, its pieces listed after, under the span lock.
    std::uint32_t flush(span_cache& cache) noexcept {
        if (cache.parked_bytes() == 0) {
            return 0;
        }
        span_cache::pieces taken;
        const std::uint32_t count = cache.take_all(taken);
        if (count != 0) {
            spans_->put_back_parked(taken, count);
        }
        return count;
    }

    Spans* spans_;
    std::uint64_t cap_bytes_;
    // A cache's lock is taken with no other lock of the pool held, or in figures()' cut, all of
    // them before the span lock.
    mutable std::array<span_cache, shard_count> caches_;
};

} // namespace nxmem::pool_detail
