// The pool's bottom layer: where chunks (for small blocks), segments and the span arena (for
// spans) come from, and the one place that gives memory back to the upstream. It owns the
// upstream, the reservation when the pool grows by commit, the chunk table, which arena granules
// are committed, the address map of its regions, the upstream figures, and the lease gate:
// - growth by allocation: a chunk or a segment is one upstream allocation;
// - growth by commit: one reservation, its lower half chunks (chunk i at i * chunk_bytes, so an
//   address finds its chunk by a division), its upper half the span arena, committed granule by
//   granule by the layer above; segments only for spans the arena cannot hold.
// Nothing is decommitted or given back while a lease is held (pool/pool_lease.hpp): each give-back
// primitive below refuses then, and the layers above keep what was refused. It knows nothing of
// blocks or spans: a segment's map entry carries a tag the span layer chose.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/detail/page_size.hpp>
#include <nxmem/detail/spin_lock.hpp>
#include <nxmem/pool/detail/pool_errors.hpp>
#include <nxmem/pool/detail/pool_records.hpp>
#include <nxmem/pool/detail/stable_directory.hpp>
#include <nxmem/pool/pool_lease.hpp>
#include <nxmem/pool/pool_options.hpp>
#include <nxmem/pool/pool_region.hpp>
#include <nxmem/pool/pool_usage.hpp>
#include <nxmem/pool/size_classes.hpp>
#include <nxmem/pool/virtual_upstream.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

namespace nxmem::pool_detail {

// The upstream's virtual backing, when it has one; an empty type otherwise.
template <class Upstream> struct backing_holder {
    static constexpr bool possible = false;
};
template <class Upstream>
    requires offers_virtual_backing<Upstream>
struct backing_holder<Upstream> {
    static constexpr bool possible = true;
    std::optional<virtual_backing_of<Upstream>> view;
};

// What the address map says about an address outside the arena.
struct mapped_region {
    bool segment = false;   // else a chunk
    std::uint32_t tag = 0;  // the chunk's slot, or the segment's tag (the span layer's first piece)
    std::uint64_t base = 0; // the chunk's or segment's base
};

template <DeviceAllocator Upstream> class chunk_source {
public:
    using device_type = typename Upstream::device_type;
    using upstream_type = Upstream;

    chunk_source(Upstream upstream, const pool_options& options)
        : upstream_(std::move(upstream)), device_(upstream_.device()) {
        configure(options);
    }
    template <class... Arguments>
    chunk_source(std::in_place_t, const pool_options& options, Arguments&&... arguments)
        : upstream_(std::forward<Arguments>(arguments)...), device_(upstream_.device()) {
        configure(options);
    }
    chunk_source(const chunk_source&) = delete;
    chunk_source& operator=(const chunk_source&) = delete;

    // Gives back every chunk (or the reservation); the layers above gave their segments back
    // first (release_at_exit).
    ~chunk_source() {
        if (reservation_.has_value()) {
            if constexpr (backing_type::possible) {
                backing_.view.reset();
            }
            (void)upstream_.release(*reservation_);
            return;
        }
        for (std::uint64_t index = 0; index < next_chunk_; ++index) {
            if (chunk_entry& chunk = chunks_[index]; chunk.in_use) {
                (void)upstream_.release(chunk.upstream);
            }
        }
    }

    Upstream& upstream() noexcept { return upstream_; }
    const Upstream& upstream() const noexcept { return upstream_; }
    device_id device() const noexcept { return device_; }
    std::uint64_t granule() const noexcept { return granule_; }
    std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    bool grows_by_commit() const noexcept { return reservation_.has_value(); }
    std::uint64_t mechanism_id() const noexcept { return mechanism_id_.load(std::memory_order_relaxed); }
    bool mechanism_known() const noexcept { return mechanism_known_.load(std::memory_order_relaxed); }

    // The layer above can describe at most `count` chunks (its id space).
    void limit_chunks(std::uint64_t count) noexcept { chunk_limit_ = std::min(chunk_limit_, count); }

    // ---- chunks ----

    // One more chunk, from the upstream (an allocation, or a commit of the reservation); no lock
    // held while it is called.
    result<chunk_grant> take_chunk() {
        try {
            std::optional<std::uint32_t> slot = take_chunk_slot();
            if (!slot.has_value()) {
                if (reservation_.has_value()) {
                    return out_of_memory("the chunks' half of the pool's reservation of " +
                                         std::to_string(reservation_->size) + " bytes is fully committed");
                }
                return out_of_memory("the pool's chunk table is full");
            }
            if (reservation_.has_value()) {
                return commit_chunk(*slot);
            }
            auto fresh = upstream_.allocate(chunk_bytes_, pool_classes::slab_bytes);
            if (!fresh.has_value()) {
                free_chunk_slot(*slot);
                return upstream_refused("a chunk of " + std::to_string(chunk_bytes_) + " bytes", fresh.error());
            }
            count_upstream_allocation(fresh.value());
            const allocation<device_type> chunk = fresh.value();
            const std::uint64_t base = device_type::to_wire(chunk.address);
            if (!map_insert(base, base + chunk_bytes_, false, *slot)) {
                free_chunk_slot(*slot);
                give_back_upstream(chunk);
                return out_of_memory("the host could not record a chunk");
            }
            publish_chunk(*slot, chunk, base);
            return chunk_grant{*slot, base, chunk.mechanism_id};
        } catch (const std::bad_alloc&) {
            return error{status_code::out_of_memory, {}};
        }
    }

    // Gives chunk `slot` back (decommits it, growing by commit); false, nothing changed, under a
    // lease. Its slot may be handed out again.
    bool give_back_chunk(std::uint32_t slot) {
        if (!gate_.begin_give_back()) {
            return false;
        }
        abandon_chunk(slot);
        gate_.end_give_back();
        return true;
    }

    // A chunk the layer above could not use (no memory for its records): given back at once,
    // lease or not, since it never held anything.
    void abandon_chunk(std::uint32_t slot) {
        chunk_entry& chunk = chunks_[slot];
        {
            std::lock_guard lock(chunk_mutex_);
            chunk.in_use = false;
        }
        if (reservation_.has_value()) {
            decommit_chunk(slot);
        } else {
            map_erase(chunk.base);
            give_back_upstream(chunk.upstream);
        }
        free_chunk_slot(slot);
    }

    // ---- segments ----

    // An upstream allocation of `bytes` for spans (aligned to at least a granule) or for one
    // pass-through, committed whole over a virtual backing; mapped under `tag` by map_segment.
    result<allocation<device_type>> take_segment(std::uint64_t bytes, std::uint64_t alignment, bool pass_through) {
        try {
            const std::uint64_t upstream_alignment = pass_through ? alignment : std::max(alignment, granule_);
            auto fresh = upstream_.allocate(bytes, upstream_alignment);
            if (!fresh.has_value()) {
                return upstream_refused("a span of " + std::to_string(bytes) + " bytes", fresh.error());
            }
            count_upstream_allocation(fresh.value());
            const allocation<device_type> memory = fresh.value();
            if (auto usable = commit_segment(memory); !usable.has_value()) {
                give_back_upstream(memory);
                return std::move(usable).error();
            }
            return memory;
        } catch (const std::bad_alloc&) {
            return error{status_code::out_of_memory, {}};
        }
    }
    // Records a segment taken by take_segment under the span layer's `tag`; false (give it back)
    // when the host has no memory for the record.
    bool map_segment(const allocation<device_type>& memory, std::uint32_t tag, bool pass_through) noexcept {
        const std::uint64_t base = device_type::to_wire(memory.address);
        return map_insert(base, base + memory.size, true, tag, pass_through);
    }
    // Gives a segment back (unmapped first); false, nothing changed, under a lease.
    bool give_back_segment(const allocation<device_type>& memory) {
        if (!gate_.begin_give_back()) {
            return false;
        }
        map_erase(device_type::to_wire(memory.address));
        give_back_upstream(memory);
        gate_.end_give_back();
        return true;
    }
    // A segment that never held anything (a failure right after take_segment): given back at once.
    void abandon_segment(const allocation<device_type>& memory) noexcept {
        map_erase(device_type::to_wire(memory.address));
        give_back_upstream(memory);
    }
    // A pass-through's release: the engine's allocation goes, lease or not (a lease keeps the
    // pool's own regions); reports what the upstream reported.
    result<release_report> release_pass_through(const allocation<device_type>& memory) {
        map_erase(device_type::to_wire(memory.address));
        auto report = upstream_.release(memory);
        upstream_releases_.fetch_add(1, std::memory_order_relaxed);
        held_bytes_.fetch_sub(memory.size, std::memory_order_relaxed);
        return report;
    }
    // At the pool's destruction: given back, live pieces included, nothing counted.
    void release_at_exit(const allocation<device_type>& memory) noexcept {
        try {
            (void)upstream_.release(memory);
        } catch (...) {
        }
    }

    // ---- the span arena (growth by commit) ----

    bool has_arena() const noexcept { return arena_limit_ != 0; }
    std::uint64_t arena_base() const noexcept { return arena_base_; }
    std::uint64_t arena_limit() const noexcept { return arena_limit_; }
    bool in_arena(std::uint64_t wire) const noexcept {
        return arena_limit_ != 0 && wire >= arena_base_ && wire - arena_base_ < arena_limit_;
    }
    // The allocation an arena piece is part of (its mechanism, for the ids).
    const allocation<device_type>& arena_allocation() const noexcept { return *reservation_; }
    // Makes the records of the arena's granules up to `end` bytes into it (from `from`); false
    // when the host has no memory for them. Callers serialise it (the span lock).
    bool prepare_arena(std::uint64_t from, std::uint64_t end) noexcept {
        const std::uint64_t count = end / granule_;
        if (!committed_.make_leaves_for(from / granule_, count)) {
            return false;
        }
        if (count > arena_granules_.load(std::memory_order_relaxed)) {
            arena_granules_.store(count, std::memory_order_release);
        }
        return true;
    }
    // By the one thread that holds the arena range [base, base + bytes) (busy to the span
    // layer), outside every lock: commits (or decommits) each run of its granules not yet in
    // that state, one upstream call a run, and counts them. Returns the bytes changed; stops at
    // the first refusal (`refused`). A decommit under a lease changes nothing.
    std::uint64_t change_commitment(std::uint64_t base, std::uint64_t bytes, bool commit, std::optional<error>& refused) {
        std::uint64_t changed = 0;
        if constexpr (backing_type::possible) {
            if (!commit && !gate_.begin_give_back()) {
                return 0;
            }
            const std::uint64_t first = granule_of(base);
            const std::uint64_t end = first + bytes / granule_;
            for (std::uint64_t at = first; at < end;) {
                if (committed_[at].committed == commit) {
                    ++at;
                    continue;
                }
                std::uint64_t run_end = at + 1;
                while (run_end < end && committed_[run_end].committed != commit) {
                    ++run_end;
                }
                const byte_range range{arena_offset_ + at * granule_, (run_end - at) * granule_};
                auto done = commit ? backing_.view->commit(*reservation_, range)
                                   : backing_.view->decommit(*reservation_, range);
                if (!done.has_value()) {
                    refused = commitment_refused(commit, range.length, done.error());
                    break;
                }
                for (std::uint64_t granule = at; granule < run_end; ++granule) {
                    committed_[granule].committed = commit;
                }
                if (commit) {
                    upstream_commits_.fetch_add(1, std::memory_order_relaxed);
                    held_bytes_.fetch_add(range.length, std::memory_order_relaxed);
                } else {
                    upstream_decommits_.fetch_add(1, std::memory_order_relaxed);
                    held_bytes_.fetch_sub(range.length, std::memory_order_relaxed);
                }
                changed += range.length;
                at = run_end;
                region_generation_.fetch_add(1, std::memory_order_release); // an arena run grew or shrank
            }
            if (!commit) {
                gate_.end_give_back();
            }
        }
        (void)base;
        (void)bytes;
        (void)commit;
        (void)refused;
        return changed;
    }
    // The committed bytes of the arena range [base, base + bytes).
    std::uint64_t committed_bytes_in(std::uint64_t base, std::uint64_t bytes) const noexcept {
        std::uint64_t committed = 0;
        for (std::uint64_t at = granule_of(base), end = at + bytes / granule_; at < end; ++at) {
            committed += committed_[at].committed ? granule_ : 0;
        }
        return committed;
    }
    // The bytes at the top of [base, base + bytes) whose committed granules add up to at least
    // `wanted` bytes.
    std::uint64_t top_bytes_holding(std::uint64_t base, std::uint64_t bytes, std::uint64_t wanted) const noexcept {
        std::uint64_t taken = 0;
        std::uint64_t committed = 0;
        for (std::uint64_t at = granule_of(base + bytes); committed < wanted && taken < bytes;) {
            --at;
            taken += granule_;
            committed += committed_[at].committed ? granule_ : 0;
        }
        return taken;
    }

    // ---- the address map ----

    // Calls visit(mapped_region) with the chunk or segment holding `wire` (outside the arena),
    // with the map held so neither is given back meanwhile; returns whether one holds it.
    template <class Visit> bool visit_region_holding(std::uint64_t wire, Visit&& visit) const {
        std::lock_guard reader(readers_[this_thread_shard()].lock);
        auto after = ranges_.upper_bound(wire);
        if (after == ranges_.begin()) {
            return false;
        }
        const auto& [begin, range] = *std::prev(after);
        if (wire >= range.end) {
            return false;
        }
        if (range.segment) {
            visit(mapped_region{true, range.index, begin});
            return true;
        }
        const std::uint64_t chunk_index = reservation_.has_value() ? (wire - begin) / chunk_bytes_ : range.index;
        const std::uint64_t chunk_base = reservation_.has_value() ? begin + chunk_index * chunk_bytes_ : begin;
        visit(mapped_region{false, static_cast<std::uint32_t>(chunk_index), chunk_base});
        return true;
    }

    // ---- regions and leases ----

    // Calls visit(const pool_region&) for each region the source holds now: the reservation (if
    // any), then its committed chunks and runs of committed arena granules, then every chunk,
    // segment and pass-through of its own. Holds the source's records meanwhile: `visit` must not
    // call into the pool. The arena's runs are read without the span lock; take a lease first
    // for a list that stays true.
    template <class Visit> void for_each_region(Visit&& visit) const {
        lock_all_readers();
        std::lock_guard lock(chunk_mutex_);
        if (reservation_.has_value()) {
            visit(pool_region{device_type::to_wire(reservation_->address), reservation_->size,
                              pool_region_kind::reservation, false});
            for (std::uint64_t slot = 0; slot < next_chunk_; ++slot) {
                if (const chunk_entry& chunk = chunks_[slot]; chunk.in_use) {
                    visit(pool_region{chunk.base, chunk_bytes_, pool_region_kind::chunk, true});
                }
            }
            std::uint64_t run = 0;
            const std::uint64_t extent = arena_granules_.load(std::memory_order_acquire);
            for (std::uint64_t at = 0; at <= extent; ++at) {
                if (at < extent && committed_[at].committed) {
                    ++run;
                } else if (run != 0) {
                    visit(pool_region{arena_base_ + (at - run) * granule_, run * granule_, pool_region_kind::arena_run,
                                      true});
                    run = 0;
                }
            }
        }
        for (const auto& [begin, range] : ranges_) {
            if (reservation_.has_value() && !range.segment) {
                continue; // the reservation itself, listed above
            }
            visit(pool_region{begin, range.end - begin,
                              !range.segment      ? pool_region_kind::chunk
                              : range.pass_through ? pool_region_kind::pass_through
                                                   : pool_region_kind::segment,
                              true});
        }
        unlock_all_readers();
    }
    // Grows by one each time a region is added or removed (so a registrar knows when to list
    // them again).
    std::uint64_t region_generation() const noexcept { return region_generation_.load(std::memory_order_acquire); }

    pool_lease lease() noexcept { return pool_lease(gate_); }
    std::uint64_t leases() const noexcept { return gate_.leases(); }
    lease_gate& gate() noexcept { return gate_; }

    // The upstream figures of pool_usage: held bytes and upstream calls.
    void add_upstream_figures(pool_usage& totals) const noexcept {
        totals.held_bytes = held_bytes_.load(std::memory_order_relaxed);
        totals.upstream_allocations = upstream_allocations_.load(std::memory_order_relaxed);
        totals.upstream_releases = upstream_releases_.load(std::memory_order_relaxed);
        totals.upstream_commits = upstream_commits_.load(std::memory_order_relaxed);
        totals.upstream_decommits = upstream_decommits_.load(std::memory_order_relaxed);
    }
    std::uint64_t reserved_bytes() const noexcept { return reservation_.has_value() ? reservation_->size : 0; }

private:
    using backing_type = backing_holder<Upstream>;
    static constexpr std::size_t directory_leaves = 1024;
    // A byte a granule of the arena's extent, in leaves of 8,192: at most 2^24 granules (64 GiB
    // of arena at 4 KiB pages).
    struct granule_commitment {
        bool committed = false;
    };
    using granule_directory = stable_directory<granule_commitment, 2048, 13>;

    // A chunk: one upstream allocation (or one committed range of the reservation).
    struct chunk_entry {
        allocation<device_type> upstream{};
        std::uint64_t base = 0;
        std::uint32_t next = none; // in the free slot list
        bool in_use = false;
    };
    using chunk_directory = stable_directory<chunk_entry, directory_leaves>;

    // One entry per chunk and segment (or one for the whole reservation), by start address.
    struct mapped_range {
        std::uint64_t end = 0;
        bool segment = false;
        bool pass_through = false;
        std::uint32_t index = 0;
    };
    struct alignas(64) padded_lock {
        nxmem::detail::spin_lock lock;
    };

    // Resolves the options against what the upstream offers; reserves when growing by commit.
    void configure(const pool_options& options) {
        std::uint64_t granule = nxmem::detail::system_page_bytes();
        bool by_commit = false;
        if constexpr (backing_type::possible) {
            if (options.growth != pool_growth::by_allocation) {
                auto offered = upstream_.virtual_backing();
                if (offered.has_value()) {
                    backing_.view.emplace(std::move(offered).value());
                    if constexpr (states_commit_granularity<virtual_backing_of<Upstream>>) {
                        granule = std::max<std::uint64_t>(granule, backing_.view->commit_granularity());
                    }
                    by_commit = true;
                }
            }
        }
        granule_ = granule;
        chunk_bytes_ = options.chunk_bytes != 0 ? options.chunk_bytes : std::max(pool_default_chunk_bytes, granule);
        chunk_bytes_ = pool_classes::round_up(pool_classes::round_up(chunk_bytes_, pool_classes::slab_bytes), granule);
        if (by_commit) {
            reserve_for_commit(options.reserve_bytes != 0 ? options.reserve_bytes : pool_default_reserve_bytes);
        }
    }

    void reserve_for_commit(std::uint64_t asked) {
        const std::uint64_t wanted = pool_classes::round_up(asked, chunk_bytes_);
        auto reserved = upstream_.allocate(wanted, pool_classes::slab_bytes);
        if (!reserved.has_value()) {
            if constexpr (backing_type::possible) {
                backing_.view.reset(); // grows by allocation instead
            }
            return;
        }
        upstream_allocations_.fetch_add(1, std::memory_order_relaxed);
        mechanism_id_.store(reserved.value().mechanism_id, std::memory_order_relaxed);
        mechanism_known_.store(true, std::memory_order_relaxed);
        reservation_ = reserved.value();
        // Address space costs nothing until committed: two fixed halves never meet, and neither
        // needs a map of the other.
        const std::uint64_t chunk_region = pool_classes::round_up(wanted / 2, chunk_bytes_);
        chunk_limit_ = std::min(chunk_limit_, chunk_region / chunk_bytes_);
        const std::uint64_t base = device_type::to_wire(reserved.value().address);
        arena_offset_ = chunk_region;
        arena_base_ = base + chunk_region;
        arena_limit_ = std::min(wanted - chunk_region, granule_directory::capacity * granule_);
        try {
            ranges_.emplace(base, mapped_range{base + wanted, false, false, 0});
        } catch (const std::bad_alloc&) {
            (void)upstream_.release(*reservation_);
            upstream_releases_.fetch_add(1, std::memory_order_relaxed);
            reservation_.reset();
            arena_limit_ = 0;
            chunk_limit_ = std::numeric_limits<std::uint64_t>::max();
            if constexpr (backing_type::possible) {
                backing_.view.reset();
            }
        }
    }

    result<chunk_grant> commit_chunk(std::uint32_t slot) {
        if constexpr (backing_type::possible) {
            const std::uint64_t offset = std::uint64_t{slot} * chunk_bytes_;
            auto committed = backing_.view->commit(*reservation_, byte_range{offset, chunk_bytes_});
            if (!committed.has_value()) {
                free_chunk_slot(slot);
                return upstream_refused("a commit of " + std::to_string(chunk_bytes_) + " bytes", committed.error());
            }
            upstream_commits_.fetch_add(1, std::memory_order_relaxed);
            held_bytes_.fetch_add(chunk_bytes_, std::memory_order_relaxed);
            const std::uint64_t base = device_type::to_wire(reservation_->address) + offset;
            publish_chunk(slot, *reservation_, base);
            return chunk_grant{slot, base, reservation_->mechanism_id};
        }
        (void)slot;
        return out_of_memory("no virtual backing");
    }
    void decommit_chunk(std::uint32_t slot) {
        if constexpr (backing_type::possible) {
            const std::uint64_t offset = std::uint64_t{slot} * chunk_bytes_;
            if (backing_.view->decommit(*reservation_, byte_range{offset, chunk_bytes_}).has_value()) {
                upstream_decommits_.fetch_add(1, std::memory_order_relaxed);
            }
            held_bytes_.fetch_sub(chunk_bytes_, std::memory_order_relaxed);
            region_generation_.fetch_add(1, std::memory_order_release);
        }
        (void)slot;
    }

    // A free chunk slot, its record made; none when the table is full or the host has no memory.
    std::optional<std::uint32_t> take_chunk_slot() noexcept {
        std::lock_guard lock(chunk_mutex_);
        if (free_chunks_ != none) {
            const std::uint32_t slot = free_chunks_;
            free_chunks_ = chunks_[slot].next;
            return slot;
        }
        const std::uint64_t slot = next_chunk_;
        if (slot >= chunk_limit_) {
            return std::nullopt;
        }
        try {
            chunks_.make_leaf_for(slot);
        } catch (const std::bad_alloc&) {
            return std::nullopt;
        }
        next_chunk_ = slot + 1;
        return static_cast<std::uint32_t>(slot);
    }
    void free_chunk_slot(std::uint32_t slot) noexcept {
        std::lock_guard lock(chunk_mutex_);
        chunks_[slot].next = free_chunks_;
        free_chunks_ = slot;
    }
    void publish_chunk(std::uint32_t slot, const allocation<device_type>& upstream, std::uint64_t base) noexcept {
        std::lock_guard lock(chunk_mutex_);
        chunk_entry& chunk = chunks_[slot];
        chunk.upstream = upstream;
        chunk.base = base;
        chunk.in_use = true;
        region_generation_.fetch_add(1, std::memory_order_release);
    }

    // Inserts or erases with every reader lock held; readers take the one of their shard.
    bool map_insert(std::uint64_t begin, std::uint64_t end, bool segment, std::uint32_t index,
                    bool pass_through = false) noexcept {
        lock_all_readers();
        bool inserted = true;
        try {
            ranges_.insert_or_assign(begin, mapped_range{end, segment, pass_through, index});
        } catch (...) {
            inserted = false;
        }
        unlock_all_readers();
        region_generation_.fetch_add(1, std::memory_order_release);
        return inserted;
    }
    void map_erase(std::uint64_t begin) noexcept {
        lock_all_readers();
        ranges_.erase(begin);
        unlock_all_readers();
        region_generation_.fetch_add(1, std::memory_order_release);
    }
    void lock_all_readers() const noexcept {
        for (padded_lock& reader : readers_) {
            reader.lock.lock();
        }
    }
    void unlock_all_readers() const noexcept {
        for (padded_lock& reader : readers_) {
            reader.lock.unlock();
        }
    }

    void count_upstream_allocation(const allocation<device_type>& memory) noexcept {
        upstream_allocations_.fetch_add(1, std::memory_order_relaxed);
        held_bytes_.fetch_add(memory.size, std::memory_order_relaxed);
        mechanism_id_.store(memory.mechanism_id, std::memory_order_relaxed);
        mechanism_known_.store(true, std::memory_order_relaxed);
    }
    void give_back_upstream(const allocation<device_type>& memory) noexcept {
        try {
            (void)upstream_.release(memory);
        } catch (...) {
        }
        upstream_releases_.fetch_add(1, std::memory_order_relaxed);
        held_bytes_.fetch_sub(memory.size, std::memory_order_relaxed);
    }

    // Over a virtual backing, an upstream allocation is reserved only: the source commits it whole.
    result<void> commit_segment(const allocation<device_type>& memory) {
        if constexpr (backing_type::possible) {
            if (reservation_.has_value()) {
                auto committed = backing_.view->commit(memory, byte_range{0, memory.size});
                if (!committed.has_value()) {
                    return upstream_refused("a commit of " + std::to_string(memory.size) + " bytes",
                                            committed.error());
                }
                upstream_commits_.fetch_add(1, std::memory_order_relaxed);
            }
        }
        (void)memory;
        return boost::outcome_v2::success();
    }

    std::uint64_t granule_of(std::uint64_t address) const noexcept { return (address - arena_base_) / granule_; }
    // Declared first, destroyed last: the records below describe its memory.
    Upstream upstream_;
    device_id device_;
    backing_type backing_;
    std::optional<allocation<device_type>> reservation_;
    std::uint64_t granule_ = 0;
    std::uint64_t chunk_bytes_ = 0;
    std::uint64_t chunk_limit_ = std::numeric_limits<std::uint64_t>::max();

    // The chunk table, behind chunk_mutex_ (never held across an upstream call).
    mutable std::mutex chunk_mutex_;
    chunk_directory chunks_;
    std::uint32_t free_chunks_ = none;
    std::uint64_t next_chunk_ = 0;

    // The span arena: the upper half of the reservation, from arena_base_ (a wire address,
    // arena_offset_ into the reservation) for at most arena_limit_ bytes (0: no arena), and which
    // of its granules are committed (changed by the thread that holds the covering range busy).
    std::uint64_t arena_offset_ = 0;
    std::uint64_t arena_base_ = 0;
    std::uint64_t arena_limit_ = 0;
    granule_directory committed_;
    std::atomic<std::uint64_t> arena_granules_{0}; // records made so far

    std::map<std::uint64_t, mapped_range> ranges_;
    mutable std::array<padded_lock, shard_count> readers_;

    lease_gate gate_;
    std::atomic<std::uint64_t> region_generation_{0};
    std::atomic<std::uint64_t> mechanism_id_{0};
    std::atomic<bool> mechanism_known_{false};
    std::atomic<std::uint64_t> held_bytes_{0};
    std::atomic<std::uint64_t> upstream_allocations_{0};
    std::atomic<std::uint64_t> upstream_releases_{0};
    std::atomic<std::uint64_t> upstream_commits_{0};
    std::atomic<std::uint64_t> upstream_decommits_{0};
};

} // namespace nxmem::pool_detail
