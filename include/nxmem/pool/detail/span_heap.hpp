// The pool's span layer: requests above 16 KiB (up to pass_through_bytes) are pieces of the span
// arena (growth by commit) or of segments (growth by allocation), which the chunk source below
// provides. Pieces partition the arena or a segment in address order, each knowing its lower and
// higher neighbour. A request takes the best-fitting free piece (its bytes rounded up to the
// granule) and splits off what it does not need as a new free piece; a released piece merges with
// a free neighbour on either side. Free pieces are listed by size bin (four per doubling,
// pool_classes::bin_of), with a bitmap of the bins that have any, so a search looks at the
// request's bin and the first non-empty bin above it. The records live in a stable directory, so
// an id names its record in constant time; everything about pieces is behind the span lock, never
// held across a call into the source.
//
// When no free piece fits:
// - the arena grows at its top: a free top piece is extended, else a piece starts at the top;
//   only its granules not yet committed are committed, with the span lock dropped (the piece is
//   busy meanwhile, and the arena's top already above it, so a concurrent miss grows above it).
//   Free pieces merge across what were separate requests, which segments cannot do (docs/HOST.md
//   "Pools"). The source keeps which granules are committed; this layer how many per piece and
//   which piece starts at each granule (so an address finds its piece).
// - growing by allocation (or when the arena is full), the source allocates a segment of exactly
//   the request's bytes; a segment whose one piece is free is idle, and trim gives it back whole.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/detail/spin_lock.hpp>
#include <nxmem/pool/detail/pool_errors.hpp>
#include <nxmem/pool/detail/pool_records.hpp>
#include <nxmem/pool/detail/pooled_id.hpp>
#include <nxmem/pool/detail/span_cache.hpp>
#include <nxmem/pool/detail/stable_directory.hpp>
#include <nxmem/pool/size_classes.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <mutex>
#include <new>
#include <optional>

namespace nxmem::pool_detail {

// What the pieces handed out add up to, in the span lock's view (parked pieces count as live).
struct span_figures {
    std::uint64_t live_allocations = 0;
    std::uint64_t in_use_bytes = 0;     // requested
    std::uint64_t handed_out_bytes = 0; // whole pieces
};

// Source: the chunk source below (take_segment, map_segment, give_back_segment, the arena's
// geometry and commitment).
template <class Source> class span_heap {
public:
    using device_type = typename Source::device_type;
    using span_type = span_record<device_type>;

    explicit span_heap(Source& source) noexcept
        : source_(&source), device_(source.device()), granule_(source.granule()) {
        free_pieces_.fill(none);
    }
    span_heap(const span_heap&) = delete;
    span_heap& operator=(const span_heap&) = delete;

    std::uint64_t granule() const noexcept { return granule_; }
    span_type& record(std::uint32_t index) noexcept { return spans_[index]; }

    // At the pool's destruction: every segment goes back, live pieces included (a segment's first
    // piece, with no lower neighbour, stands for it).
    void release_at_exit() noexcept {
        for (std::uint64_t index = 0; index < next_span_; ++index) {
            span_type& piece = spans_[index];
            if (piece.state != span_state::unused && !piece.in_arena && piece.lower == none) {
                source_->release_at_exit(piece.segment);
            }
        }
    }

    // The best-fitting free piece for `bytes` (a multiple of the granule), split and handed out;
    // else, when `may_grow_arena`, a piece at the top of the arena; none when neither can be had.
    std::optional<result<allocation<device_type>>>
    allocate_fitting(std::uint64_t bytes, std::uint64_t size, std::uint64_t alignment, bool may_grow_arena) {
        lock_.lock();
        if (const std::uint32_t fit = best_free_piece(bytes, alignment); fit != none) {
            span_type& piece = spans_[fit];
            unlist_free_piece(piece);
            keep_only(piece, bytes);
            if (piece.committed_bytes == piece.bytes) [[likely]] {
                return hand_out_piece(piece, size, alignment);
            }
            return commit_and_hand_out(piece, size, alignment);
        }
        if (may_grow_arena && source_->has_arena()) {
            if (span_type* grown = grow_arena(bytes, alignment); grown != nullptr) {
                return commit_and_hand_out(*grown, size, alignment);
            }
        }
        lock_.unlock();
        return std::nullopt;
    }

    // A segment of its own for one request: a pass-through (handed out whole, given back at its
    // release), or a span when the pool grows by allocation (or its arena is full).
    [[gnu::noinline]] result<allocation<device_type>>
    allocate_segment(std::uint64_t bytes, std::uint64_t size, std::uint64_t alignment, bool pass_through) {
        auto taken = source_->take_segment(bytes, alignment, pass_through);
        if (!taken.has_value()) {
            return std::move(taken).error();
        }
        const allocation<device_type> memory = taken.value();
        std::optional<std::uint32_t> index = take_span_index();
        if (!index.has_value()) {
            source_->abandon_segment(memory);
            return out_of_memory("the pool's span table is full");
        }
        if (!source_->map_segment(memory, *index, pass_through)) {
            free_span_index(*index);
            source_->abandon_segment(memory);
            return out_of_memory("the host could not record a span");
        }
        span_type& piece = spans_[*index];
        lock_.lock();
        piece.base = device_type::to_wire(memory.address);
        piece.bytes = memory.size;
        piece.committed_bytes = memory.size;
        piece.segment = memory;
        piece.pass_through = pass_through;
        piece.in_arena = false;
        piece.lower = piece.higher = none;
        keep_only(piece, std::min(bytes, memory.size));
        return hand_out_piece(piece, size, alignment);
    }

    // A release's claim on the piece `live` names, without the span lock: the piece, now the
    // caller's (not live), when `verdict` says claimed; else nothing changed (refused_claim says why).
    span_type* claim(const allocation<device_type>& live, span_ticket::verdict& verdict) noexcept {
        span_type* found = spans_.find(span_of(live.allocation_id));
        if (found == nullptr) [[unlikely]] {
            verdict = span_ticket::verdict::not_live;
            return nullptr;
        }
        verdict = found->ticket.claim(generation_of(live.allocation_id), device_type::to_wire(live.address), live.size,
                                      live.alignment);
        return found;
    }
    [[gnu::cold, gnu::noinline]] static error refused_claim(span_ticket::verdict verdict,
                                                           const allocation<device_type>& live) noexcept {
        return verdict == span_ticket::verdict::misdescribed ? refused_release(status_code::invalid_argument, live)
                                                             : refused_as_unknown(live);
    }
    // Whether a claimed piece may park in a cache (not a pass-through, its ids not spent).
    static bool parkable(const span_type& piece, std::uint32_t generation) noexcept {
        return !piece.pass_through && generation < generation_limit;
    }

    // A claimed piece (released as `size` bytes under `generation`) goes back: merged into the
    // free lists, retired when its ids are spent, or to the upstream when it passed through.
    result<release_report> release_claimed(span_type& piece, std::uint64_t size, std::uint32_t generation) {
        lock_.lock();
        live_allocations_ -= 1;
        in_use_bytes_ -= size;
        handed_out_bytes_ -= piece.bytes;
        if (!piece.pass_through) {
            if (generation < generation_limit) [[likely]] {
                put_back_piece(piece);
            } else {
                piece.state = span_state::spent; // never handed out again, nor merged
            }
            lock_.unlock();
            return release_report{release_state::complete, 0, 0};
        }
        piece.state = span_state::leaving;
        lock_.unlock();
        const allocation<device_type> memory = piece.segment;
        auto report = source_->release_pass_through(memory);
        free_span_index(piece.index);
        if (!report.has_value()) {
            // The upstream kept it; to the engine the allocation is gone all the same.
            return release_report{release_state::quarantined, 0, memory.size};
        }
        return report;
    }

    // A piece taken from a span cache by the thread that parked or found it: handed out under its
    // next generation, without the span lock (it is out of every list).
    allocation<device_type> hand_out_parked(const parked_piece& parked, std::uint64_t size, std::uint64_t alignment) noexcept {
        span_type& piece = spans_[parked.index];
        const std::uint64_t mechanism = piece.segment.mechanism_id; // read while the piece is still ours
        const std::uint32_t generation = piece.ticket.publish(parked.base, size, alignment);
        return allocation<device_type>{device_type::from_wire(parked.base), size, alignment,
                                       span_id(generation, parked.index), mechanism, device_};
    }
    // How a claimed piece parks.
    static parked_piece parking_of(const span_type& piece) noexcept {
        return {piece.index, pool_classes::bin_of(piece.bytes), piece.base, piece.bytes};
    }
    // Parked pieces come back: no longer handed out, merged into the free lists.
    void put_back_parked(const span_cache::pieces& taken, std::uint32_t count) noexcept {
        std::lock_guard lock(lock_);
        for (std::uint32_t at = 0; at < count; ++at) {
            span_type& piece = spans_[taken[at].index];
            handed_out_bytes_ -= piece.bytes;
            put_back_piece(piece);
        }
    }

    // Calls read(span_figures) under the span lock (for a cut with the caches above).
    template <class Read> void read_figures(Read&& read) const {
        std::lock_guard lock(lock_);
        read(span_figures{live_allocations_, in_use_bytes_, handed_out_bytes_});
    }
    // The committed bytes of free pieces (read unlocked by the retention check).
    std::uint64_t free_bytes() const noexcept { return free_piece_bytes_.load(std::memory_order_relaxed); }

    // The live arena piece that starts at `wire`: the granule there names the piece starting there.
    std::optional<allocation<device_type>> find_live_in_arena(std::uint64_t wire) const {
        std::lock_guard lock(lock_);
        const std::uint64_t offset = wire - source_->arena_base();
        if (offset % granule_ != 0 || offset >= arena_end_) {
            return std::nullopt;
        }
        const std::uint32_t at = starts_[offset / granule_].piece;
        if (at == none) {
            return std::nullopt;
        }
        return live_description(spans_[at], wire);
    }
    // The live piece that starts at `wire` in the segment whose first piece is `first`.
    std::optional<allocation<device_type>> find_live_in_segment(std::uint32_t first, std::uint64_t wire) const {
        std::lock_guard lock(lock_);
        for (std::uint32_t at = first; at != none; at = spans_[at].higher) {
            if (spans_[at].base == wire) {
                return live_description(spans_[at], wire);
            }
        }
        return std::nullopt;
    }

    // Decommits the committed granules of free arena pieces, from the top down, until `wanted`
    // bytes are given back (each piece busy while the span lock is dropped for the source), and
    // lowers the arena's top when its top piece is free. The last piece gives only the top
    // granules that make up `wanted` (rounded up to whole granules), so trim(keep) keeps what it
    // may keep. Returns the bytes decommitted.
    std::uint64_t decommit_free_arena(std::uint64_t wanted) {
        if (!source_->has_arena()) {
            return 0;
        }
        std::uint32_t taken = none;   // linked through next
        std::uint32_t partial = none; // the piece that gives only its top granules
        std::uint64_t partial_bytes = 0;
        {
            std::lock_guard lock(lock_);
            std::uint64_t taken_bytes = 0;
            for (std::uint32_t at = arena_top_; at != none && taken_bytes < wanted; at = spans_[at].lower) {
                span_type& piece = spans_[at];
                if (piece.state == span_state::free && piece.committed_bytes != 0) {
                    unlist_free_piece(piece);
                    piece.state = span_state::busy;
                    piece.next = taken;
                    taken = piece.index;
                    const std::uint64_t needed = wanted - taken_bytes;
                    if (piece.committed_bytes > needed) {
                        partial = piece.index;
                        partial_bytes = source_->top_bytes_holding(piece.base, piece.bytes, needed);
                        taken_bytes = wanted;
                    } else {
                        taken_bytes += piece.committed_bytes;
                    }
                }
            }
            if (taken == none) {
                lower_arena_top();
                return 0;
            }
        }
        std::uint64_t given = 0;
        while (taken != none) {
            span_type& piece = spans_[taken];
            taken = piece.next;
            piece.next = none;
            const std::uint64_t from = piece.index == partial ? piece.bytes - partial_bytes : 0;
            std::optional<error> refused; // a granule the upstream keeps stays committed, counted
            const std::uint64_t decommitted = source_->change_commitment(piece.base + from, piece.bytes - from, false, refused);
            given += decommitted;
            std::lock_guard lock(lock_);
            piece.committed_bytes -= decommitted;
            put_back_piece(piece);
        }
        lower_arena_top_locked();
        return given;
    }

    // Gives idle segments (one free piece each, never the arena's) back through the source,
    // largest bins first; a segment the source keeps (a lease) is free again.
    std::uint64_t give_back_idle_segments(std::uint64_t wanted) {
        std::uint64_t given = 0;
        std::uint32_t leaving = none;
        {
            std::lock_guard lock(lock_);
            for (std::uint32_t bin = pool_classes::bin_count; bin-- > 0 && given < wanted;) {
                for (std::uint32_t at = free_pieces_[bin]; at != none && given < wanted;) {
                    span_type& piece = spans_[at];
                    at = piece.next;
                    if (!piece.in_arena && piece.lower == none && piece.higher == none) {
                        unlist_free_piece(piece);
                        piece.state = span_state::leaving;
                        piece.next = leaving;
                        leaving = piece.index;
                        given += piece.bytes;
                    }
                }
            }
        }
        while (leaving != none) {
            span_type& piece = spans_[leaving];
            leaving = piece.next;
            piece.next = none;
            if (source_->give_back_segment(piece.segment)) {
                free_span_index(piece.index);
            } else {
                given -= piece.bytes;
                std::lock_guard lock(lock_);
                list_free_piece(piece);
            }
        }
        return given;
    }

    // A free top piece with nothing committed leaves the arena, whose top comes down to its base.
    void lower_arena_top_locked() noexcept {
        if (source_->has_arena()) {
            std::lock_guard lock(lock_);
            lower_arena_top();
        }
    }

private:
    // Which piece starts at a granule of the arena.
    struct granule_start {
        std::uint32_t piece = none;
    };
    static constexpr std::size_t directory_leaves = 1024;
    using span_directory = stable_directory<span_type, directory_leaves>;
    // 4 bytes a granule of the arena's extent, in leaves of 8,192: at most 2^24 granules.
    using start_directory = stable_directory<granule_start, 2048, 13>;
    static constexpr std::uint32_t free_bin_words = pool_classes::bin_count / 64;

    // Under the span lock: the piece's allocation if it is live to the span lock and to its
    // ticket (not parked in a shard's cache) and starts at `wire`.
    std::optional<allocation<device_type>> live_description(const span_type& piece, std::uint64_t wire) const noexcept {
        const auto handed = piece.ticket.live_description();
        if (piece.state != span_state::live || piece.base != wire || !handed.has_value()) {
            return std::nullopt;
        }
        return allocation<device_type>{device_type::from_wire(wire), handed->size, handed->alignment,
                                       span_id(handed->generation, piece.index), piece.segment.mechanism_id, device_};
    }

    // Under the span lock: the smallest free piece of at least `bytes` that starts aligned, from
    // the request's bin and the first non-empty bin above it (any piece there is large enough).
    std::uint32_t best_free_piece(std::uint64_t bytes, std::uint64_t alignment) const noexcept {
        const std::uint32_t own_bin = pool_classes::bin_of(bytes);
        if (const std::uint32_t best = smallest_fitting_piece(free_pieces_[own_bin], bytes, alignment); best != none)
            [[likely]] {
            return best;
        }
        for (std::uint32_t bin = next_free_bin(own_bin + 1); bin < pool_classes::bin_count; bin = next_free_bin(bin + 1)) {
            if (const std::uint32_t best = smallest_fitting_piece(free_pieces_[bin], bytes, alignment); best != none) {
                return best;
            }
        }
        return none;
    }
    std::uint32_t smallest_fitting_piece(std::uint32_t head, std::uint64_t bytes, std::uint64_t alignment) const noexcept {
        std::uint32_t best = none;
        for (std::uint32_t at = head; at != none; at = spans_[at].next) {
            const span_type& piece = spans_[at];
            if (piece.bytes >= bytes && piece.base % alignment == 0 && (best == none || piece.bytes < spans_[best].bytes)) {
                best = at;
                if (piece.bytes == bytes) {
                    break; // none fits better (a pool of one size, the KV cache's, lists many)
                }
            }
        }
        return best;
    }
    // The first bin at or above `from` that lists a free piece; bin_count when none does.
    std::uint32_t next_free_bin(std::uint32_t from) const noexcept {
        for (std::uint32_t word = from / 64; word < free_bin_words; ++word) {
            std::uint64_t bits = free_bins_[word];
            if (word == from / 64) {
                bits &= ~std::uint64_t{0} << (from % 64);
            }
            if (bits != 0) {
                return word * 64 + static_cast<std::uint32_t>(std::countr_zero(bits));
            }
        }
        return pool_classes::bin_count;
    }

    void list_free_piece(span_type& piece) noexcept {
        const std::uint32_t bin = pool_classes::bin_of(piece.bytes);
        piece.state = span_state::free;
        piece.previous = none;
        piece.next = free_pieces_[bin];
        if (piece.next != none) {
            spans_[piece.next].previous = piece.index;
        }
        free_pieces_[bin] = piece.index;
        free_bins_[bin / 64] |= std::uint64_t{1} << (bin % 64);
        free_piece_bytes_.fetch_add(piece.committed_bytes, std::memory_order_relaxed);
    }
    void unlist_free_piece(span_type& piece) noexcept {
        const std::uint32_t bin = pool_classes::bin_of(piece.bytes);
        if (piece.previous != none) {
            spans_[piece.previous].next = piece.next;
        } else {
            free_pieces_[bin] = piece.next;
            if (piece.next == none) {
                free_bins_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
            }
        }
        if (piece.next != none) {
            spans_[piece.next].previous = piece.previous;
        }
        piece.previous = piece.next = none;
        free_piece_bytes_.fetch_sub(piece.committed_bytes, std::memory_order_relaxed);
    }

    // Under the span lock, a piece in no free list: what it holds beyond `bytes` becomes a free
    // piece above it, when a record for it can be had (else the piece is handed out whole).
    void keep_only(span_type& piece, std::uint64_t bytes) noexcept {
        if (piece.bytes <= bytes || piece.pass_through) {
            return;
        }
        std::optional<std::uint32_t> index = take_span_index();
        if (!index.has_value()) {
            return;
        }
        span_type& rest = spans_[*index];
        rest.base = piece.base + bytes;
        rest.bytes = piece.bytes - bytes;
        rest.segment = piece.segment;
        rest.pass_through = false;
        rest.in_arena = piece.in_arena;
        rest.committed_bytes = piece.committed_bytes == piece.bytes ? rest.bytes
                               : piece.committed_bytes == 0       ? 0
                                                                  : source_->committed_bytes_in(rest.base, rest.bytes);
        rest.lower = piece.index;
        rest.higher = piece.higher;
        if (piece.higher != none) {
            spans_[piece.higher].lower = rest.index;
        } else if (piece.in_arena) {
            arena_top_ = rest.index;
        }
        if (rest.in_arena) {
            starts_[granule_of(rest.base)].piece = rest.index;
        }
        piece.higher = rest.index;
        piece.bytes = bytes;
        piece.committed_bytes -= rest.committed_bytes;
        list_free_piece(rest);
    }

    // Under the span lock, a piece in no free list, all of it committed: hands it out. Drops the lock.
    allocation<device_type> hand_out_piece(span_type& piece, std::uint64_t size, std::uint64_t alignment) noexcept {
        piece.state = span_state::live;
        ++live_allocations_;
        in_use_bytes_ += size;
        handed_out_bytes_ += piece.bytes;
        const std::uint32_t generation = piece.ticket.publish(piece.base, size, alignment); // last: now releasable
        const allocation<device_type> handed{device_type::from_wire(piece.base), size, alignment,
                                             span_id(generation, piece.index), piece.segment.mechanism_id, device_};
        lock_.unlock();
        return handed;
    }

    // Under the span lock, an arena piece in no free list with granules not committed: commits
    // them with the lock dropped (the piece busy meanwhile) and hands it out; when the source
    // refuses, the piece is free again (what was committed stays, counted) and the arena's top
    // comes down if it can. Drops the lock.
    [[gnu::noinline]] result<allocation<device_type>> commit_and_hand_out(span_type& piece, std::uint64_t size,
                                                                          std::uint64_t alignment) {
        piece.state = span_state::busy;
        const std::uint64_t base = piece.base;
        const std::uint64_t bytes = piece.bytes;
        lock_.unlock();
        std::optional<error> refused;
        const std::uint64_t committed = source_->change_commitment(base, bytes, true, refused);
        lock_.lock();
        piece.committed_bytes += committed;
        if (!refused.has_value()) [[likely]] {
            return hand_out_piece(piece, size, alignment);
        }
        put_back_piece(piece);
        lower_arena_top();
        lock_.unlock();
        return std::move(*refused);
    }

    // Under the span lock, when no free piece fits: the arena grows at its top by `bytes`,
    // nothing of it committed yet. A free top piece that starts aligned is extended; else a piece
    // starts at the top, aligned (a gap below it, for an alignment beyond the granule, becomes
    // free space). Returns the piece, in no list; null, nothing changed, when the arena cannot
    // hold it or the host has no memory for the records.
    span_type* grow_arena(std::uint64_t bytes, std::uint64_t alignment) noexcept {
        span_type* top = arena_top_ != none ? &spans_[arena_top_] : nullptr;
        const bool top_free = top != nullptr && top->state == span_state::free;
        const std::uint64_t arena_base = source_->arena_base();
        const std::uint64_t end = arena_base + arena_end_;
        const bool extend = top_free && top->base % alignment == 0;
        const std::uint64_t start = extend ? top->base : pool_classes::round_up(end, alignment);
        const std::uint64_t new_end = start + bytes - arena_base;
        if (new_end > source_->arena_limit() || !make_granules_for(new_end)) {
            return nullptr;
        }
        if (extend) {
            // Above the old end nothing is committed: the piece's committed bytes stay.
            unlist_free_piece(*top);
            top->bytes = bytes;
            arena_end_ = new_end;
            return top;
        }
        std::optional<std::uint32_t> index = take_span_index();
        if (!index.has_value()) {
            return nullptr;
        }
        if (start > end) {
            if (top_free) {
                unlist_free_piece(*top);
                top->bytes += start - end;
                list_free_piece(*top);
            } else {
                std::optional<std::uint32_t> gap = take_span_index();
                if (!gap.has_value()) {
                    free_span_index(*index);
                    return nullptr;
                }
                list_free_piece(append_arena_piece(*gap, end, start - end));
            }
        }
        span_type& piece = append_arena_piece(*index, start, bytes);
        piece.state = span_state::busy;
        return &piece;
    }
    // Under the span lock: record `index` becomes the arena's new top piece, [base, base + bytes),
    // nothing committed, in no list.
    span_type& append_arena_piece(std::uint32_t index, std::uint64_t base, std::uint64_t bytes) noexcept {
        span_type& piece = spans_[index];
        piece.base = base;
        piece.bytes = bytes;
        piece.committed_bytes = 0;
        piece.segment = source_->arena_allocation();
        piece.pass_through = false;
        piece.in_arena = true;
        piece.lower = arena_top_;
        piece.higher = none;
        if (arena_top_ != none) {
            spans_[arena_top_].higher = index;
        }
        arena_top_ = index;
        arena_end_ = base + bytes - source_->arena_base();
        starts_[granule_of(base)].piece = index;
        return piece;
    }
    // Under the span lock: the granules' records exist up to `end` bytes into the arena.
    bool make_granules_for(std::uint64_t end) noexcept {
        return starts_.make_leaves_for(arena_end_ / granule_, end / granule_) && source_->prepare_arena(arena_end_, end);
    }
    // Under the span lock: a free top piece with nothing committed leaves the arena, whose top
    // comes down to its base (its free neighbour below, if any, merged with it already).
    void lower_arena_top() noexcept {
        if (arena_top_ == none) {
            return;
        }
        span_type& top = spans_[arena_top_];
        if (top.state != span_state::free || top.committed_bytes != 0) {
            return;
        }
        unlist_free_piece(top);
        starts_[granule_of(top.base)].piece = none;
        arena_end_ = top.base - source_->arena_base();
        arena_top_ = top.lower;
        if (top.lower != none) {
            spans_[top.lower].higher = none;
        }
        top.lower = none;
        free_span_index(top.index);
    }
    std::uint64_t granule_of(std::uint64_t address) const noexcept { return (address - source_->arena_base()) / granule_; }

    // Under the span lock, a piece no longer live: merges it with a free neighbour on either side
    // (the lower piece's record survives, so a segment's first piece keeps its record for the
    // segment's life) and lists what results.
    void put_back_piece(span_type& piece) noexcept {
        if (piece.higher != none && spans_[piece.higher].state == span_state::free) {
            absorb_higher(piece);
        }
        span_type* survivor = &piece;
        if (piece.lower != none && spans_[piece.lower].state == span_state::free) {
            survivor = &spans_[piece.lower];
            unlist_free_piece(*survivor);
            absorb_higher(*survivor);
        }
        list_free_piece(*survivor);
    }
    // `piece` takes in the piece above it, which leaves any free list; its record is freed.
    void absorb_higher(span_type& piece) noexcept {
        span_type& above = spans_[piece.higher];
        if (above.state == span_state::free) {
            unlist_free_piece(above);
        }
        piece.bytes += above.bytes;
        piece.committed_bytes += above.committed_bytes;
        piece.higher = above.higher;
        if (above.higher != none) {
            spans_[above.higher].lower = piece.index;
        } else if (above.in_arena) {
            arena_top_ = piece.index;
        }
        if (above.in_arena) {
            starts_[granule_of(above.base)].piece = none;
        }
        above.lower = above.higher = none;
        free_span_index(above.index);
    }

    std::optional<std::uint32_t> take_span_index() noexcept {
        std::lock_guard lock(index_mutex_);
        if (free_spans_ != none) {
            const std::uint32_t index = free_spans_;
            free_spans_ = spans_[index].next;
            spans_[index].next = none;
            return index;
        }
        if (next_span_ >= span_directory::capacity) {
            return std::nullopt;
        }
        try {
            spans_.make_leaf_for(next_span_);
        } catch (const std::bad_alloc&) {
            return std::nullopt;
        }
        spans_[next_span_].index = static_cast<std::uint32_t>(next_span_);
        return static_cast<std::uint32_t>(next_span_++);
    }
    // A record whose ids are spent keeps its index for good.
    void free_span_index(std::uint32_t index) noexcept {
        std::lock_guard lock(index_mutex_);
        span_type& span = spans_[index];
        span.state = span_state::unused;
        if (span.ticket.generation() >= generation_limit) {
            return;
        }
        span.next = free_spans_;
        free_spans_ = index;
    }

    Source* source_;
    device_id device_;
    std::uint64_t granule_;

    // The free record indices, behind index_mutex_ (taken after the span lock, never before).
    std::mutex index_mutex_;
    span_directory spans_;
    std::uint32_t free_spans_ = none;
    std::uint64_t next_span_ = 0;

    // The pieces' links, free lists by bin, figures and the arena's extent, behind lock_.
    mutable nxmem::detail::spin_lock lock_;
    std::array<std::uint32_t, pool_classes::bin_count> free_pieces_{};
    std::array<std::uint64_t, free_bin_words> free_bins_{}; // bit b: free_pieces_[b] lists a piece
    std::uint64_t live_allocations_ = 0;
    std::uint64_t in_use_bytes_ = 0;     // requested
    std::uint64_t handed_out_bytes_ = 0; // whole pieces
    std::atomic<std::uint64_t> free_piece_bytes_{0}; // committed; read unlocked by the retention check
    // Pieces partition the arena's first arena_end_ bytes; arena_top_ is the highest.
    std::uint64_t arena_end_ = 0;
    std::uint32_t arena_top_ = none;
    start_directory starts_;
};

} // namespace nxmem::pool_detail
