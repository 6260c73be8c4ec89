// pool_allocator<Upstream>: serves many allocations from few upstream ones, so an engine crosses
// into its upstream (a plugin, the driver) once per chunk, not once per allocation, and reuses
// memory it already faulted in. Itself a DeviceAllocator, so pools compose.
//
// - Small requests (up to 16 KiB) are blocks of a size class, carved from 64 KiB slabs of
//   chunks taken from the upstream; larger ones up to pass_through_bytes are spans: pieces of
//   one arena when growing by commit, else of segments (upstream allocations), best fit across
//   sizes, split on allocate and merged with free neighbours on release (the spans section
//   below); larger still pass straight through.
// - Metadata is out of band: the pool never reads or writes the memory it hands out.
// - A release is checked as the host adapter checks one (docs/ABI.md M1, M4, M5, M10) in
//   constant time: the id names the record (pool/detail/pooled_id.hpp).
// - Each thread allocates from its shard (sixteen, each behind its own lock on its own cache
//   lines); no lock is held while the upstream is called, so the upstream may call back into
//   the pool on the same thread (a reclaim hook that trims it). A thread's released span pieces
//   park in its shard's span cache (pool/detail/span_cache.hpp) for its next request of the
//   same bin, without the span lock.
// - Over an upstream that offers virtual backing (pool/virtual_upstream.hpp) the pool reserves
//   once, commits chunk by chunk and span arena granule by granule; trim decommits.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/detail/page_size.hpp>
#include <nxmem/pool/detail/pool_records.hpp>
#include <nxmem/pool/detail/pooled_id.hpp>
#include <nxmem/pool/detail/span_cache.hpp>
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
#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <limits>
#include <type_traits>
#include <utility>

namespace nxmem {

namespace pool_detail {
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
} // namespace pool_detail

template <DeviceAllocator Upstream> class pool_allocator {
public:
    using device_type = typename Upstream::device_type;
    using address_type = typename device_type::address_type;

    explicit pool_allocator(Upstream upstream, pool_options options = {})
        : upstream_(std::move(upstream)), options_(options), device_(upstream_.device()) {
        configure();
    }

    // Constructs the upstream in place, from `arguments`: for an upstream that cannot be moved
    // (or see shared_upstream, for one the engine keeps using beside the pool).
    template <class... Arguments>
    explicit pool_allocator(std::in_place_t, pool_options options, Arguments&&... arguments)
        : upstream_(std::forward<Arguments>(arguments)...), options_(options),
          device_(upstream_.device()) {
        configure();
    }

    pool_allocator(const pool_allocator&) = delete;
    pool_allocator& operator=(const pool_allocator&) = delete;

    // Gives everything it holds back to the upstream, live allocations included: they end with
    // the pool.
    ~pool_allocator() {
        for (std::uint64_t index = 0; index < next_span_; ++index) {
            // A segment's first piece (no lower neighbour) gives the segment back.
            span_type& piece = spans_[index];
            if (piece.state != pool_detail::span_state::unused && !piece.in_arena &&
                piece.lower == pool_detail::none) {
                (void)upstream_.release(piece.segment);
            }
        }
        if (reservation_.has_value()) {
            if constexpr (backing_type::possible) {
                backing_.view.reset();
            }
            (void)upstream_.release(*reservation_);
            return;
        }
        for (std::uint64_t index = 0; index < next_chunk_; ++index) {
            if (chunk_type& chunk = chunks_[index]; chunk.in_use) {
                (void)upstream_.release(chunk.upstream);
            }
        }
    }

    device_id device() const noexcept { return device_; }

    result<allocation<device_type>> allocate(std::uint64_t size, std::uint64_t alignment) {
        // The common case first, calling nothing: a small request, the thread's shard chosen
        // and its lock free, a free block in its current slab of the class.
        // Not std::has_single_bit: without -mpopcnt it is a call into libgcc (21 instructions).
        if (size != 0 && alignment != 0 && (alignment & (alignment - 1)) == 0) [[likely]] {
            const std::uint32_t size_class = pool_classes::class_of(size, alignment);
            const std::uint32_t home_index = pool_detail::this_thread_shard_if_chosen();
            if (size_class != pool_classes::not_small && home_index < pool_detail::shard_count) [[likely]] {
                pool_detail::shard& home = shards_[home_index];
                if (home.lock.try_lock()) [[likely]] {
                    pool_detail::slab* slab = home.current[size_class];
                    if (slab != nullptr && slab->free_head != pool_detail::none) [[likely]] {
                        return hand_out_block(home, *slab, size, alignment);
                    }
                    home.lock.unlock();
                }
            }
        }
        return allocate_checked(size, alignment);
    }

    // Checked as the host adapter checks a release (docs/ABI.md M10's order): another mechanism
    // (WRONG_MECHANISM), another device (WRONG_DEVICE), a size or alignment no allocation has
    // (INVALID_ARGUMENT), an allocation not live here (UNKNOWN_ALLOCATION), a live one
    // misdescribed (INVALID_ARGUMENT); a refused release changes nothing. A pooled release
    // reports COMPLETE with unmapped_bytes 0 (the memory stays in the pool, idle); a
    // pass-through one reports what the upstream reported.
    result<release_report> release(const allocation<device_type>& live) {
        // The common case first, calling nothing (so it needs no registers saved): a small block
        // of this pool, its shard's lock free, its slab the shard's current one. Anything else,
        // any doubt included, takes the fully checked path.
        const std::uint64_t id = live.allocation_id;
        if (!pool_detail::names_span(id) && live.mechanism_id == mechanism_id_.load(std::memory_order_relaxed) &&
            pool_detail::same_device(live.device, device_)) [[likely]] {
            if (pool_detail::slab* slab = slabs_.find(pool_detail::slab_of(id)); slab != nullptr) [[likely]] {
                const std::uint32_t owner_index = slab->owner.load(std::memory_order_acquire);
                if (owner_index < pool_detail::shard_count) [[likely]] {
                    pool_detail::shard& owner = shards_[owner_index];
                    if (owner.lock.try_lock()) [[likely]] {
                        if (release_current_block(owner, owner_index, *slab, live)) [[likely]] {
                            owner.lock.unlock();
                            return release_report{release_state::complete, 0, 0};
                        }
                        owner.lock.unlock();
                    }
                }
            }
        }
        return release_checked(live);
    }

    // Releases the allocation that starts at `address`, found in the pool's own records (a
    // sorted map of its chunks and spans), with the same checks.
    result<release_report> release_by_address(address_type address) {
        std::optional<allocation<device_type>> live = find_live(device_type::to_wire(address));
        if (!live.has_value()) {
            return refused_release(status_code::unknown_allocation,
                                   allocation<device_type>{address, 0, 0, 0, 0, device_});
        }
        return release(*live);
    }

    // Gives idle memory back to the upstream (once the span pieces parked in the shards' caches
    // are back in the free lists: the committed granules of free arena pieces, idle span
    // segments, then chunks with no block in use) until at most keep_bytes are idle or nothing
    // idle is left to give; free blocks of slabs still in use stay. Returns the bytes given back.
    // 0 while a lease is held (lease()).
    std::uint64_t trim(std::uint64_t keep_bytes = 0) {
        if (!lease_gate_.begin_give_back()) {
            return 0;
        }
        const std::uint64_t given = trim_unleased(keep_bytes);
        lease_gate_.end_give_back();
        return given;
    }

    // The regions the pool holds from its upstream now (pool/pool_region.hpp): visit(const
    // pool_region&) for each, with the pool's records held (it must not call into the pool).
    // Growing by commit: the reservation (everything the pool commits lies inside it). Growing by
    // allocation: each chunk of small blocks. (The smallest hook for the transfer layer; the
    // `layers` branch lists every region kind.)
    template <class Visit> void for_each_region(Visit&& visit) const {
        std::lock_guard lock(pool_mutex_);
        if (reservation_.has_value()) {
            visit(pool_region{device_type::to_wire(reservation_->address), reservation_->size,
                              pool_region_kind::reservation, false});
            return;
        }
        for (std::uint64_t slot = 0; slot < next_chunk_; ++slot) {
            if (chunks_[slot].in_use) {
                visit(pool_region{chunks_[slot].base, chunk_bytes_, pool_region_kind::chunk, true});
            }
        }
    }
    // While the lease lives the pool gives nothing back and decommits nothing (trim, the
    // retention limit and reclaim give 0), so the regions listed keep their memory and
    // addresses (pool/pool_lease.hpp). It must end before the pool.
    pool_lease lease() noexcept { return pool_lease(lease_gate_); }

private:
    std::uint64_t trim_unleased(std::uint64_t keep_bytes) {
        flush_span_caches(); // parked pieces are idle: back to the free lists, merged, first
        const pool_usage now = usage();
        if (now.idle_bytes <= keep_bytes) {
            lower_arena_top_locked();
            return 0;
        }
        const std::uint64_t excess = now.idle_bytes - keep_bytes;
        std::uint64_t given = decommit_free_arena(excess);
        if (given < excess) {
            given += give_back_idle_segments(excess - given);
        }
        if (given < excess) {
            retire_idle_current_slabs();
            given += give_back_free_chunks(excess - given);
        }
        return given;
    }

public:
    pool_usage usage() const {
        pool_usage totals;
        std::uint64_t handed_out = 0;
        for (pool_detail::shard& shard : shards_) {
            std::lock_guard lock(shard.lock);
            totals.live_allocations += shard.live_allocations;
            totals.in_use_bytes += shard.in_use_bytes;
            handed_out += shard.handed_out_bytes;
        }
        {
            // One cut across the span caches and the span lists (every cache's lock, then the
            // span lock): a piece handed out by one and released into the other counts once.
            for (pool_detail::span_cache& cache : span_caches_) {
                cache.lock();
            }
            std::lock_guard lock(span_lock_);
            totals.live_allocations += span_live_allocations_;
            totals.in_use_bytes += span_in_use_bytes_;
            handed_out += span_handed_out_bytes_;
            for (pool_detail::span_cache& cache : span_caches_) {
                const pool_detail::span_cache::figures cached = cache.figures_while_locked();
                totals.live_allocations += cached.live_change;
                totals.in_use_bytes += cached.in_use_change;
                handed_out -= cached.parked_bytes; // parked pieces are idle
                cache.unlock();
            }
        }
        totals.held_bytes = held_bytes_.load(std::memory_order_relaxed);
        totals.idle_bytes = totals.held_bytes > handed_out ? totals.held_bytes - handed_out : 0;
        totals.upstream_allocations = upstream_allocations_.load(std::memory_order_relaxed);
        totals.upstream_releases = upstream_releases_.load(std::memory_order_relaxed);
        totals.upstream_commits = upstream_commits_.load(std::memory_order_relaxed);
        totals.upstream_decommits = upstream_decommits_.load(std::memory_order_relaxed);
        return totals;
    }

    Upstream& upstream() noexcept { return upstream_; }
    const Upstream& upstream() const noexcept { return upstream_; }

    // What the pool resolved its options to.
    std::uint64_t chunk_bytes() const noexcept { return chunk_bytes_; }
    std::uint64_t pass_through_bytes() const noexcept { return pass_through_bytes_; }
    bool grows_by_commit() const noexcept { return reservation_.has_value(); }

private:
    using backing_type = pool_detail::backing_holder<Upstream>;

    using span_type = pool_detail::span_record<device_type>;
    using chunk_type = pool_detail::chunk_record<device_type>;
    static constexpr std::size_t directory_leaves = 1024;

    // One entry per chunk and span (or one for the whole reservation), by start address.
    struct mapped_range {
        std::uint64_t end = 0;
        bool span = false;
        std::uint32_t index = 0;
    };
    template <std::size_t Count> static constexpr std::array<std::uint32_t, Count> all_none() noexcept {
        std::array<std::uint32_t, Count> heads{};
        heads.fill(pool_detail::none);
        return heads;
    }
    struct alignas(64) padded_lock {
        nxmem::detail::spin_lock lock;
    };

    // Resolves the options against what the upstream offers; reserves when growing by commit.
    void configure() {
        std::uint64_t granule = nxmem::detail::system_page_bytes();
        bool by_commit = false;
        if constexpr (backing_type::possible) {
            if (options_.growth != pool_growth::by_allocation) {
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
        chunk_bytes_ = options_.chunk_bytes != 0 ? options_.chunk_bytes
                                                 : std::max(pool_default_chunk_bytes, granule);
        chunk_bytes_ = pool_classes::round_up(
            pool_classes::round_up(chunk_bytes_, pool_classes::slab_bytes), granule);
        slabs_per_chunk_ = static_cast<std::uint32_t>(chunk_bytes_ / pool_classes::slab_bytes);
        pass_through_bytes_ = options_.pass_through_bytes != 0 ? options_.pass_through_bytes
                                                               : pool_default_pass_through_bytes;
        if (by_commit) {
            reserve_for_commit();
        }
    }

    // ---- small blocks ----

    // Under owner's lock: releases the block `live` names if everything about it is as expected
    // and its slab is its shard's current one; false (nothing changed) otherwise.
    bool release_current_block(pool_detail::shard& owner, std::uint32_t owner_index, pool_detail::slab& slab,
                               const allocation<device_type>& live) noexcept {
        const std::uint32_t block = pool_detail::block_of(live.allocation_id);
        if (slab.owner.load(std::memory_order_relaxed) != owner_index || block >= slab.block_count) {
            return false;
        }
        pool_detail::block_record& record = slab.records[block];
        if (!record.live || record.generation != pool_detail::generation_of(live.allocation_id) ||
            record.generation >= pool_detail::generation_limit ||
            device_type::to_wire(live.address) != slab.base + block * slab.block_bytes ||
            live.size != record.size_or_next || live.alignment != std::uint64_t{1} << record.alignment_log2 ||
            owner.current[slab.class_index] != &slab) {
            return false;
        }
        record.live = false;
        record.size_or_next = slab.free_head;
        slab.free_head = block;
        ++slab.free_count;
        owner.live_allocations -= 1;
        owner.in_use_bytes -= live.size;
        owner.handed_out_bytes -= slab.block_bytes;
        return true;
    }

    [[gnu::noinline]] result<allocation<device_type>> allocate_checked(std::uint64_t size, std::uint64_t alignment) {
        if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) [[unlikely]] {
            return refused_request(size, alignment);
        }
        const std::uint32_t size_class = pool_classes::class_of(size, alignment);
        if (size_class != pool_classes::not_small) [[likely]] {
            return allocate_block_slowly(size_class, size, alignment);
        }
        return allocate_span(size, alignment);
    }

    [[gnu::noinline]] result<release_report> release_checked(const allocation<device_type>& live) {
        if (const auto code = identity_fault(live); code != status_code::ok) [[unlikely]] {
            return refused_release(code, live);
        }
        if (!pool_detail::names_span(live.allocation_id)) [[likely]] {
            return release_block(live);
        }
        return release_span(live);
    }

    // Under home's lock, with a free block in `slab`; drops the lock.
    result<allocation<device_type>> hand_out_block(pool_detail::shard& home, pool_detail::slab& slab,
                                                   std::uint64_t size, std::uint64_t alignment) {
        const std::uint32_t block = slab.free_head;
        pool_detail::block_record& record = slab.records[block];
        slab.free_head = record.size_or_next;
        --slab.free_count;
        const std::uint32_t generation = ++record.generation;
        record.size_or_next = static_cast<std::uint32_t>(size);
        record.alignment_log2 = static_cast<std::uint8_t>(std::countr_zero(alignment));
        record.live = true;
        ++home.live_allocations;
        home.in_use_bytes += size;
        home.handed_out_bytes += slab.block_bytes;
        const std::uint64_t address = slab.base + block * slab.block_bytes;
        const std::uint32_t slab_index = slab.index;
        home.lock.unlock();
        return allocation<device_type>{device_type::from_wire(address), size, alignment,
                                       pool_detail::block_id(generation, slab_index, block),
                                       mechanism_id_.load(std::memory_order_relaxed), device_};
    }

    [[gnu::noinline]] result<allocation<device_type>>
    allocate_block_slowly(std::uint32_t size_class, std::uint64_t size, std::uint64_t alignment) {
        const std::uint32_t home_index = pool_detail::this_thread_shard();
        pool_detail::shard& home = shards_[home_index];
        for (;;) {
            home.lock.lock();
            pool_detail::slab* slab = home.current[size_class];
            bool records_failed = false;
            if (slab == nullptr || slab->free_head == pool_detail::none) {
                slab = next_slab(home, home_index, size_class, records_failed);
            }
            if (records_failed) {
                home.lock.unlock();
                return out_of_memory("the host could not record a slab's blocks");
            }
            if (slab != nullptr) {
                return hand_out_block(home, *slab, size, alignment);
            }
            home.lock.unlock();
            // No slab anywhere: one more chunk, with no lock held.
            if (auto grown = grow(); !grown.has_value()) {
                return std::move(grown).error();
            }
        }
    }

    // Under home's lock: a partly used slab of the class, else a free slab given the class
    // (null when none is free, or when its records could not be made: records_failed).
    pool_detail::slab* next_slab(pool_detail::shard& home, std::uint32_t home_index,
                                 std::uint32_t size_class, bool& records_failed) {
        if (const std::uint32_t partial = home.partial[size_class]; partial != pool_detail::none) {
            pool_detail::slab& slab = slabs_[partial];
            unlist(home, slab);
            home.current[size_class] = &slab;
            return &slab;
        }
        pool_detail::slab* fresh = take_free_slab();
        if (fresh == nullptr) {
            return nullptr;
        }
        if (!carve(*fresh, size_class)) {
            put_free_slab(*fresh);
            records_failed = true;
            return nullptr;
        }
        fresh->owner.store(home_index, std::memory_order_release);
        home.current[size_class] = fresh;
        return fresh;
    }

    // Gives an unowned slab the blocks of a class; false when the host has no memory for its
    // records. Every block starts above the slab's generation floor.
    bool carve(pool_detail::slab& slab, std::uint32_t size_class) noexcept {
        const std::uint64_t block_bytes = pool_classes::class_bytes(size_class);
        const auto count = static_cast<std::uint32_t>(pool_classes::slab_bytes / block_bytes);
        if (slab.record_capacity < count) {
            auto* records = new (std::nothrow) pool_detail::block_record[count];
            if (records == nullptr) {
                return false;
            }
            slab.records.reset(records);
            slab.record_capacity = count;
        }
        for (std::uint32_t block = 0; block < count; ++block) {
            slab.records[block] = {slab.generation_floor,
                                   block + 1 < count ? block + 1 : pool_detail::none, 0, false};
        }
        slab.class_index = size_class;
        slab.block_bytes = block_bytes;
        slab.block_count = count;
        slab.free_count = count;
        slab.free_head = 0;
        slab.listed = false;
        return true;
    }

    result<release_report> release_block(const allocation<device_type>& live) {
        const std::uint64_t id = live.allocation_id;
        pool_detail::slab* slab = slabs_.find(pool_detail::slab_of(id));
        if (slab == nullptr) [[unlikely]] {
            return refused_as_unknown(live);
        }
        pool_detail::shard* owner = lock_owner(*slab);
        if (owner == nullptr) [[unlikely]] {
            return refused_as_unknown(live);
        }
        const std::uint32_t block = pool_detail::block_of(id);
        if (block >= slab->block_count || !slab->records[block].live ||
            slab->records[block].generation != pool_detail::generation_of(id)) [[unlikely]] {
            owner->lock.unlock();
            return refused_as_unknown(live);
        }
        pool_detail::block_record& record = slab->records[block];
        if (device_type::to_wire(live.address) != slab->base + block * slab->block_bytes ||
            live.size != record.size_or_next ||
            live.alignment != std::uint64_t{1} << record.alignment_log2) [[unlikely]] {
            owner->lock.unlock();
            return refused_release(status_code::invalid_argument, live);
        }
        record.live = false;
        owner->live_allocations -= 1;
        owner->in_use_bytes -= live.size;
        owner->handed_out_bytes -= slab->block_bytes;
        if (record.generation < pool_detail::generation_limit) [[likely]] {
            record.size_or_next = slab->free_head;
            slab->free_head = block;
            ++slab->free_count;
            if (owner->current[slab->class_index] != slab) [[unlikely]] {
                return released_outside_current(*owner, *slab);
            }
        } // else its ids are spent: the block is never handed out again (nor its slab given back)
        owner->lock.unlock();
        return release_report{release_state::complete, 0, 0};
    }

    // Under the owner's lock, a block of a slab that is not its shard's current one came back:
    // the slab joins the partly used list, or leaves the shard when wholly free. Drops the lock.
    [[gnu::noinline]] release_report released_outside_current(pool_detail::shard& owner, pool_detail::slab& slab) {
        if (slab.free_count == slab.block_count) {
            if (slab.listed) {
                unlist(owner, slab);
            }
            retire_slab(slab);
            owner.lock.unlock();
            enforce_retention();
            return release_report{release_state::complete, 0, 0};
        }
        if (!slab.listed) {
            enlist(owner, slab);
        }
        owner.lock.unlock();
        return release_report{release_state::complete, 0, 0};
    }

    // Locks the shard that owns `slab` (or span) now; null when nobody owns it.
    template <class Record> pool_detail::shard* lock_owner(Record& record) noexcept {
        std::uint32_t owner = record.owner.load(std::memory_order_acquire);
        for (;;) {
            if (owner >= pool_detail::shard_count) {
                return nullptr;
            }
            pool_detail::shard& shard = shards_[owner];
            shard.lock.lock();
            const std::uint32_t now = record.owner.load(std::memory_order_relaxed);
            if (now == owner) {
                return &shard;
            }
            shard.lock.unlock();
            owner = now;
        }
    }

    void enlist(pool_detail::shard& shard, pool_detail::slab& slab) noexcept {
        const std::uint32_t head = shard.partial[slab.class_index];
        slab.previous = pool_detail::none;
        slab.next = head;
        if (head != pool_detail::none) {
            slabs_[head].previous = slab.index;
        }
        shard.partial[slab.class_index] = slab.index;
        slab.listed = true;
    }
    void unlist(pool_detail::shard& shard, pool_detail::slab& slab) noexcept {
        if (slab.previous != pool_detail::none) {
            slabs_[slab.previous].next = slab.next;
        } else {
            shard.partial[slab.class_index] = slab.next;
        }
        if (slab.next != pool_detail::none) {
            slabs_[slab.next].previous = slab.previous;
        }
        slab.previous = slab.next = pool_detail::none;
        slab.listed = false;
    }

    // Each shard keeps its current slab of a class when its last block comes back (so a thread
    // that allocates and releases one block does not carve a slab each time); trim takes them.
    void retire_idle_current_slabs() noexcept {
        for (pool_detail::shard& shard : shards_) {
            std::lock_guard lock(shard.lock);
            for (pool_detail::slab*& current : shard.current) {
                if (current != nullptr && current->free_count == current->block_count) {
                    pool_detail::slab& idle = *current;
                    current = nullptr;
                    retire_slab(idle);
                }
            }
        }
    }

    // Under the owner's lock, every block free: the slab goes back to the pool's free slabs.
    void retire_slab(pool_detail::slab& slab) noexcept {
        std::uint32_t floor = slab.generation_floor;
        for (std::uint32_t block = 0; block < slab.block_count; ++block) {
            floor = std::max(floor, slab.records[block].generation);
        }
        slab.generation_floor = floor;
        slab.class_index = pool_classes::not_small;
        slab.block_count = 0;
        slab.free_head = pool_detail::none;
        if (floor >= pool_detail::generation_limit - 1) [[unlikely]] {
            return; // spent: never carved again, its chunk never given back
        }
        std::lock_guard lock(pool_mutex_);
        slab.owner.store(pool_detail::none, std::memory_order_release);
        put_free_slab_locked(slab);
    }

    pool_detail::slab* take_free_slab() noexcept {
        std::lock_guard lock(pool_mutex_);
        if (free_slabs_ == pool_detail::none) {
            return nullptr;
        }
        pool_detail::slab& slab = slabs_[free_slabs_];
        free_slabs_ = slab.next;
        slab.next = pool_detail::none;
        chunks_[slab.index / slabs_per_chunk_].free_slabs -= 1;
        free_slab_bytes_.fetch_sub(pool_classes::slab_bytes, std::memory_order_relaxed);
        return &slab;
    }
    void put_free_slab(pool_detail::slab& slab) noexcept {
        std::lock_guard lock(pool_mutex_);
        put_free_slab_locked(slab);
    }
    void put_free_slab_locked(pool_detail::slab& slab) noexcept {
        slab.next = free_slabs_;
        free_slabs_ = slab.index;
        chunks_[slab.index / slabs_per_chunk_].free_slabs += 1;
        free_slab_bytes_.fetch_add(pool_classes::slab_bytes, std::memory_order_relaxed);
    }

    // ---- chunks ----

    // One more chunk of free slabs, from the upstream; no lock held while it is called.
    result<void> grow() {
        try {
            if (reservation_.has_value()) {
                return grow_by_commit();
            }
            auto fresh = upstream_.allocate(chunk_bytes_, pool_classes::slab_bytes);
            if (!fresh.has_value()) {
                return upstream_refused("a chunk of " + std::to_string(chunk_bytes_) + " bytes",
                                        fresh.error());
            }
            count_upstream_allocation(fresh.value());
            const allocation<device_type> chunk = fresh.value();
            const std::uint64_t base = device_type::to_wire(chunk.address);
            std::optional<std::uint32_t> slot = take_chunk_slot();
            if (!slot.has_value()) {
                give_back_upstream(chunk);
                return out_of_memory("the pool's chunk table is full");
            }
            if (!map_insert(base, base + chunk_bytes_, false, *slot)) {
                free_chunk_slot(*slot);
                give_back_upstream(chunk);
                return out_of_memory("the host could not record a chunk");
            }
            publish_chunk(*slot, chunk, base);
            return boost::outcome_v2::success();
        } catch (const std::bad_alloc&) {
            return error{status_code::out_of_memory, {}};
        }
    }

    result<void> grow_by_commit() {
        std::optional<std::uint32_t> slot = take_chunk_slot();
        if (!slot.has_value()) {
            return out_of_memory("the chunks' half of the pool's reservation of " +
                                 std::to_string(reservation_->size) + " bytes is fully committed");
        }
        if constexpr (backing_type::possible) {
            const std::uint64_t offset = std::uint64_t{*slot} * chunk_bytes_;
            auto committed = backing_.view->commit(*reservation_, byte_range{offset, chunk_bytes_});
            if (!committed.has_value()) {
                free_chunk_slot(*slot);
                return upstream_refused("a commit of " + std::to_string(chunk_bytes_) + " bytes",
                                        committed.error());
            }
            upstream_commits_.fetch_add(1, std::memory_order_relaxed);
            held_bytes_.fetch_add(chunk_bytes_, std::memory_order_relaxed);
            allocation<device_type> chunk = *reservation_;
            publish_chunk(*slot, chunk, device_type::to_wire(reservation_->address) + offset);
        }
        return boost::outcome_v2::success();
    }

    // A chunk slot whose records exist (and those of its slabs); none when the tables are full
    // or the host has no memory for them.
    std::optional<std::uint32_t> take_chunk_slot() noexcept {
        std::lock_guard lock(pool_mutex_);
        if (free_chunks_ != pool_detail::none) {
            const std::uint32_t slot = free_chunks_;
            free_chunks_ = chunks_[slot].next;
            return slot;
        }
        const std::uint64_t slot = next_chunk_;
        const std::uint64_t first_slab = slot * slabs_per_chunk_;
        if (first_slab + slabs_per_chunk_ > pool_detail::slab_limit || slot >= chunk_limit_) {
            return std::nullopt;
        }
        try {
            chunks_.make_leaf_for(slot);
            for (std::uint64_t slab = first_slab; slab < first_slab + slabs_per_chunk_;
                 slab += slab_directory::leaf_size) {
                slabs_.make_leaf_for(slab);
            }
            slabs_.make_leaf_for(first_slab + slabs_per_chunk_ - 1);
        } catch (const std::bad_alloc&) {
            return std::nullopt;
        }
        next_chunk_ = slot + 1;
        return static_cast<std::uint32_t>(slot);
    }
    void free_chunk_slot(std::uint32_t slot) noexcept {
        std::lock_guard lock(pool_mutex_);
        chunks_[slot].next = free_chunks_;
        free_chunks_ = slot;
    }

    // The chunk's slabs join the free slabs.
    void publish_chunk(std::uint32_t slot, const allocation<device_type>& upstream, std::uint64_t base) {
        std::lock_guard lock(pool_mutex_);
        chunk_type& chunk = chunks_[slot];
        chunk.upstream = upstream;
        chunk.base = base;
        chunk.in_use = true;
        chunk.free_slabs = 0;
        for (std::uint32_t page = slabs_per_chunk_; page-- > 0;) {
            pool_detail::slab& slab = slabs_[std::uint64_t{slot} * slabs_per_chunk_ + page];
            slab.index = slot * slabs_per_chunk_ + page;
            slab.base = base + std::uint64_t{page} * pool_classes::slab_bytes;
            put_free_slab_locked(slab);
        }
    }

    std::uint64_t give_back_free_chunks(std::uint64_t wanted) {
        std::uint64_t given = 0;
        std::uint32_t leaving = pool_detail::none; // chunks taken out, linked through next
        {
            std::lock_guard lock(pool_mutex_);
            for (std::uint64_t slot = 0; slot < next_chunk_ && given < wanted; ++slot) {
                chunk_type& chunk = chunks_[slot];
                if (chunk.in_use && chunk.free_slabs == slabs_per_chunk_) {
                    chunk.in_use = false;
                    chunk.next = leaving;
                    leaving = static_cast<std::uint32_t>(slot);
                    given += chunk_bytes_;
                }
            }
            if (leaving == pool_detail::none) {
                return 0;
            }
            // Their slabs leave the free list (one pass) and drop their records.
            std::uint32_t* link = &free_slabs_;
            while (*link != pool_detail::none) {
                pool_detail::slab& slab = slabs_[*link];
                if (!chunks_[slab.index / slabs_per_chunk_].in_use) {
                    *link = slab.next;
                    slab.next = pool_detail::none;
                    slab.records.reset();
                    slab.record_capacity = 0;
                    chunks_[slab.index / slabs_per_chunk_].free_slabs -= 1;
                    free_slab_bytes_.fetch_sub(pool_classes::slab_bytes, std::memory_order_relaxed);
                } else {
                    link = &slab.next;
                }
            }
        }
        while (leaving != pool_detail::none) {
            chunk_type& chunk = chunks_[leaving];
            const std::uint32_t slot = leaving;
            leaving = chunk.next;
            if (reservation_.has_value()) {
                decommit_chunk(slot);
            } else {
                map_erase(chunk.base);
                give_back_upstream(chunk.upstream);
            }
            free_chunk_slot(slot);
        }
        return given;
    }

    void decommit_chunk(std::uint32_t slot) {
        if constexpr (backing_type::possible) {
            const std::uint64_t offset = std::uint64_t{slot} * chunk_bytes_;
            if (backing_.view->decommit(*reservation_, byte_range{offset, chunk_bytes_}).has_value()) {
                upstream_decommits_.fetch_add(1, std::memory_order_relaxed);
            }
            held_bytes_.fetch_sub(chunk_bytes_, std::memory_order_relaxed);
        }
    }

    void reserve_for_commit() {
        const std::uint64_t wanted = pool_classes::round_up(
            options_.reserve_bytes != 0 ? options_.reserve_bytes : pool_default_reserve_bytes,
            chunk_bytes_);
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
        // The lower half holds the chunks of small blocks, chunk i at offset i * chunk_bytes (an
        // address finds its chunk by a division); the upper half is the span arena, growing up
        // from its base, so that free span pieces merge across what were separate requests.
        // Address space costs nothing until committed: two fixed halves never meet, and neither
        // needs a map of the other.
        const std::uint64_t chunk_region = pool_classes::round_up(wanted / 2, chunk_bytes_);
        chunk_limit_ = chunk_region / chunk_bytes_;
        const std::uint64_t base = device_type::to_wire(reserved.value().address);
        arena_offset_ = chunk_region;
        arena_base_ = base + chunk_region;
        arena_limit_ = std::min(wanted - chunk_region, granule_directory::capacity * granule_);
        try {
            ranges_.emplace(base, mapped_range{base + wanted, false, 0});
        } catch (const std::bad_alloc&) {
            (void)upstream_.release(*reservation_);
            upstream_releases_.fetch_add(1, std::memory_order_relaxed);
            reservation_.reset();
            if constexpr (backing_type::possible) {
                backing_.view.reset();
            }
        }
    }

    // ---- spans ----
    //
    // A large request is a piece of the arena (growth by commit) or of a segment (growth by
    // allocation): pieces partition the arena or segment in address order, each knowing its lower
    // and higher neighbour. A request takes the best-fitting free piece (its bytes rounded up to
    // the granule) and splits off what it does not need as a new free piece; a released piece
    // merges with a free neighbour on either side. Free pieces are listed by size bin (four per
    // doubling, pool_classes::bin_of), with a bitmap of the bins that have any, so a search looks
    // at the request's bin and the first non-empty bin above it. The records live in spans_, so an
    // id still names its record in constant time; everything about pieces is behind span_lock_.
    //
    // When no free piece fits:
    // - the arena grows at its top: a free top piece is extended, else a piece starts at the top;
    //   only its granules not yet committed are committed, with the span lock dropped (the piece
    //   is busy meanwhile, and the arena's top already above it, so a concurrent miss grows above
    //   it). Free pieces merge across what were separate requests, which segments cannot do: on
    //   the transformer trace this is what brings held / peak live under 1.3 (docs/HOST.md
    //   "Pools"). Which granules are committed is kept per granule (granules_), and how many per
    //   piece: trim decommits the committed granules of free pieces, and a piece handed out again
    //   commits what trim took.
    // - growing by allocation (or when the arena is full), the pool calls the upstream for a
    //   segment of exactly the request's bytes; a segment whose one piece is free is idle, and
    //   trim gives it back whole.

    result<allocation<device_type>> allocate_span(std::uint64_t size, std::uint64_t alignment) {
        if (size > pass_through_bytes_) {
            return allocate_new_span(size, size, alignment, true);
        }
        const std::uint64_t bytes = pool_classes::round_up(size, granule_);
        // ---- span cache: the thread's own parked piece of the bin, without the span lock ----
        pool_detail::span_cache& own_cache = span_caches_[pool_detail::this_thread_shard()];
        if (auto parked = take_parked_piece(own_cache, bytes, size, alignment); parked.has_value()) [[likely]] {
            return *parked;
        }
        // A miss: the thread's own parked pieces join the free lists first, so best fit sees them
        // (left parked, they would make it split pieces it would have kept whole).
        flush_span_cache(own_cache);
        if (auto fitted = allocate_from_free_pieces(bytes, size, alignment, false); fitted.has_value()) {
            return std::move(*fitted);
        }
        // ---- span cache: before the pool grows, every parked piece goes back (merging) ----
        flush_span_caches();
        if (auto fitted = allocate_from_free_pieces(bytes, size, alignment, true); fitted.has_value()) {
            return std::move(*fitted);
        }
        return allocate_new_span(bytes, size, alignment, false);
    }

    // The best-fitting free piece, split and handed out; else, when `may_grow_arena`, a piece at
    // the top of the arena (growth by commit); none when neither can be had.
    std::optional<result<allocation<device_type>>>
    allocate_from_free_pieces(std::uint64_t bytes, std::uint64_t size, std::uint64_t alignment, bool may_grow_arena) {
        span_lock_.lock();
        if (const std::uint32_t fit = best_free_piece(bytes, alignment); fit != pool_detail::none) {
            span_type& piece = spans_[fit];
            unlist_free_piece(piece);
            keep_only(piece, bytes);
            if (piece.committed_bytes == piece.bytes) [[likely]] {
                return hand_out_piece(piece, size, alignment);
            }
            return commit_and_hand_out(piece, size, alignment);
        }
        if (may_grow_arena && arena_limit_ != 0) {
            if (span_type* grown = grow_arena(bytes, alignment); grown != nullptr) {
                return commit_and_hand_out(*grown, size, alignment);
            }
        }
        span_lock_.unlock();
        return std::nullopt;
    }

    // Under span_lock_: the smallest free piece of at least `bytes` that starts aligned, from the
    // request's bin and the first non-empty bin above it (any piece there is large enough); none
    // when neither has one.
    std::uint32_t best_free_piece(std::uint64_t bytes, std::uint64_t alignment) const noexcept {
        const std::uint32_t own_bin = pool_classes::bin_of(bytes);
        if (const std::uint32_t best = smallest_fitting_piece(free_pieces_[own_bin], bytes, alignment);
            best != pool_detail::none) [[likely]] {
            return best;
        }
        for (std::uint32_t bin = next_free_bin(own_bin + 1); bin < pool_classes::bin_count; bin = next_free_bin(bin + 1)) {
            if (const std::uint32_t best = smallest_fitting_piece(free_pieces_[bin], bytes, alignment);
                best != pool_detail::none) {
                return best;
            }
        }
        return pool_detail::none;
    }
    std::uint32_t smallest_fitting_piece(std::uint32_t head, std::uint64_t bytes, std::uint64_t alignment) const noexcept {
        std::uint32_t best = pool_detail::none;
        for (std::uint32_t at = head; at != pool_detail::none; at = spans_[at].next) {
            const span_type& piece = spans_[at];
            if (piece.bytes >= bytes && piece.base % alignment == 0 &&
                (best == pool_detail::none || piece.bytes < spans_[best].bytes)) {
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
        piece.state = pool_detail::span_state::free;
        piece.previous = pool_detail::none;
        piece.next = free_pieces_[bin];
        if (piece.next != pool_detail::none) {
            spans_[piece.next].previous = piece.index;
        }
        free_pieces_[bin] = piece.index;
        free_bins_[bin / 64] |= std::uint64_t{1} << (bin % 64);
        free_piece_bytes_.fetch_add(piece.committed_bytes, std::memory_order_relaxed);
    }
    void unlist_free_piece(span_type& piece) noexcept {
        const std::uint32_t bin = pool_classes::bin_of(piece.bytes);
        if (piece.previous != pool_detail::none) {
            spans_[piece.previous].next = piece.next;
        } else {
            free_pieces_[bin] = piece.next;
            if (piece.next == pool_detail::none) {
                free_bins_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
            }
        }
        if (piece.next != pool_detail::none) {
            spans_[piece.next].previous = piece.previous;
        }
        piece.previous = piece.next = pool_detail::none;
        free_piece_bytes_.fetch_sub(piece.committed_bytes, std::memory_order_relaxed);
    }

    // Under span_lock_, a piece in no free list: what it holds beyond `bytes` becomes a free piece
    // above it, when a record for it can be had (else the piece is handed out whole).
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
                                                                  : committed_bytes_in(rest.base, rest.bytes);
        rest.lower = piece.index;
        rest.higher = piece.higher;
        if (piece.higher != pool_detail::none) {
            spans_[piece.higher].lower = rest.index;
        } else if (piece.in_arena) {
            arena_top_ = rest.index;
        }
        if (rest.in_arena) {
            granules_[granule_of(rest.base)].starting_piece = rest.index;
        }
        piece.higher = rest.index;
        piece.bytes = bytes;
        piece.committed_bytes -= rest.committed_bytes;
        list_free_piece(rest);
    }

    // Under span_lock_, a piece in no free list, all of it committed: hands it out. Drops the lock.
    result<allocation<device_type>> hand_out_piece(span_type& piece, std::uint64_t size, std::uint64_t alignment) {
        piece.state = pool_detail::span_state::live;
        ++span_live_allocations_;
        span_in_use_bytes_ += size;
        span_handed_out_bytes_ += piece.bytes;
        const std::uint32_t generation = piece.ticket.publish(piece.base, size, alignment); // last: now releasable
        const allocation<device_type> handed{device_type::from_wire(piece.base), size, alignment,
                                             pool_detail::span_id(generation, piece.index),
                                             piece.segment.mechanism_id, device_};
        span_lock_.unlock();
        return handed;
    }

    // Under span_lock_, an arena piece in no free list with granules not committed: commits them
    // with the lock dropped (the piece busy meanwhile) and hands it out; when the upstream
    // refuses, the piece is free again (what was committed stays, counted) and the arena's top
    // comes down if it can. Drops the lock.
    [[gnu::noinline]] result<allocation<device_type>> commit_and_hand_out(span_type& piece, std::uint64_t size,
                                                                          std::uint64_t alignment) {
        piece.state = pool_detail::span_state::busy;
        const std::uint64_t base = piece.base;
        const std::uint64_t bytes = piece.bytes;
        span_lock_.unlock();
        std::optional<error> refused;
        const std::uint64_t committed = change_commitment(base, bytes, true, refused);
        span_lock_.lock();
        piece.committed_bytes += committed;
        if (!refused.has_value()) [[likely]] {
            return hand_out_piece(piece, size, alignment);
        }
        put_back_piece(piece);
        lower_arena_top();
        span_lock_.unlock();
        return std::move(*refused);
    }

    // Outside every lock, by the one thread that holds the arena piece [base, base + bytes) busy:
    // commits (or decommits) each run of its granules not yet in that state, one upstream call a
    // run, and counts them. Returns the bytes changed; stops at the first refusal (`refused`).
    std::uint64_t change_commitment(std::uint64_t base, std::uint64_t bytes, bool commit, std::optional<error>& refused) {
        std::uint64_t changed = 0;
        if constexpr (backing_type::possible) {
            const std::uint64_t first = granule_of(base);
            const std::uint64_t end = first + bytes / granule_;
            for (std::uint64_t at = first; at < end;) {
                if (granules_[at].committed == commit) {
                    ++at;
                    continue;
                }
                std::uint64_t run_end = at + 1;
                while (run_end < end && granules_[run_end].committed != commit) {
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
                    granules_[granule].committed = commit;
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
            }
        }
        (void)base;
        (void)bytes;
        (void)commit;
        (void)refused;
        return changed;
    }

    // Under span_lock_, when no free piece fits: the arena grows at its top by `bytes`, nothing of
    // it committed yet. A free top piece that starts aligned is extended; else a piece starts at
    // the top, aligned (a gap below it, for an alignment beyond the granule, becomes free space).
    // Returns the piece, in no list; null, nothing changed, when the arena cannot hold it or the
    // host has no memory for the records.
    span_type* grow_arena(std::uint64_t bytes, std::uint64_t alignment) noexcept {
        span_type* top = arena_top_ != pool_detail::none ? &spans_[arena_top_] : nullptr;
        const bool top_free = top != nullptr && top->state == pool_detail::span_state::free;
        const std::uint64_t end = arena_base_ + arena_end_;
        const bool extend = top_free && top->base % alignment == 0;
        const std::uint64_t start = extend ? top->base : pool_classes::round_up(end, alignment);
        const std::uint64_t new_end = start + bytes - arena_base_;
        if (new_end > arena_limit_ || !make_granules_for(new_end)) {
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
        piece.state = pool_detail::span_state::busy;
        return &piece;
    }
    // Under span_lock_: record `index` becomes the arena's new top piece, [base, base + bytes),
    // nothing committed, in no list.
    span_type& append_arena_piece(std::uint32_t index, std::uint64_t base, std::uint64_t bytes) noexcept {
        span_type& piece = spans_[index];
        piece.base = base;
        piece.bytes = bytes;
        piece.committed_bytes = 0;
        piece.segment = *reservation_;
        piece.pass_through = false;
        piece.in_arena = true;
        piece.lower = arena_top_;
        piece.higher = pool_detail::none;
        if (arena_top_ != pool_detail::none) {
            spans_[arena_top_].higher = index;
        }
        arena_top_ = index;
        arena_end_ = base + bytes - arena_base_;
        granules_[granule_of(base)].starting_piece = index;
        return piece;
    }
    // Under span_lock_: the granules' records exist up to `end` bytes into the arena.
    bool make_granules_for(std::uint64_t end) noexcept {
        const std::uint64_t count = end / granule_;
        try {
            for (std::uint64_t at = arena_end_ / granule_; at < count; at += granule_directory::leaf_size) {
                granules_.make_leaf_for(at);
            }
            if (count != 0) {
                granules_.make_leaf_for(count - 1);
            }
        } catch (const std::bad_alloc&) {
            return false;
        }
        return true;
    }
    // Under span_lock_: a free top piece with nothing committed leaves the arena, whose top comes
    // down to its base (its free neighbour below, if any, merged with it already).
    void lower_arena_top() noexcept {
        if (arena_top_ == pool_detail::none) {
            return;
        }
        span_type& top = spans_[arena_top_];
        if (top.state != pool_detail::span_state::free || top.committed_bytes != 0) {
            return;
        }
        unlist_free_piece(top);
        granules_[granule_of(top.base)].starting_piece = pool_detail::none;
        arena_end_ = top.base - arena_base_;
        arena_top_ = top.lower;
        if (top.lower != pool_detail::none) {
            spans_[top.lower].higher = pool_detail::none;
        }
        top.lower = pool_detail::none;
        free_span_index(top.index);
    }
    void lower_arena_top_locked() noexcept {
        if (arena_limit_ != 0) {
            std::lock_guard lock(span_lock_);
            lower_arena_top();
        }
    }
    std::uint64_t granule_of(std::uint64_t address) const noexcept { return (address - arena_base_) / granule_; }
    // Under span_lock_ (or with the piece busy): the bytes at the top of `piece` whose committed
    // granules add up to at least `wanted` bytes.
    std::uint64_t top_bytes_holding(const span_type& piece, std::uint64_t wanted) const noexcept {
        std::uint64_t bytes = 0;
        std::uint64_t committed = 0;
        for (std::uint64_t at = granule_of(piece.base + piece.bytes); committed < wanted && bytes < piece.bytes;) {
            --at;
            bytes += granule_;
            committed += granules_[at].committed ? granule_ : 0;
        }
        return bytes;
    }
    // Under span_lock_: the committed bytes of the arena range [base, base + bytes).
    std::uint64_t committed_bytes_in(std::uint64_t base, std::uint64_t bytes) const noexcept {
        std::uint64_t committed = 0;
        for (std::uint64_t at = granule_of(base), end = at + bytes / granule_; at < end; ++at) {
            committed += granules_[at].committed ? granule_ : 0;
        }
        return committed;
    }

    // Decommits the committed granules of free arena pieces, from the top down, until `wanted`
    // bytes are given back (each piece busy while the span lock is dropped for the upstream), and
    // lowers the arena's top when its top piece is free. The last piece gives only the top
    // granules that make up `wanted` (rounded up to whole granules), so trim(keep) keeps what it
    // may keep. Returns the bytes decommitted.
    std::uint64_t decommit_free_arena(std::uint64_t wanted) {
        if (arena_limit_ == 0) {
            return 0;
        }
        std::uint32_t taken = pool_detail::none; // linked through next
        std::uint32_t partial = pool_detail::none; // the piece that gives only its top granules
        std::uint64_t partial_bytes = 0;           // how many of its top bytes it gives
        {
            std::lock_guard lock(span_lock_);
            std::uint64_t taken_bytes = 0;
            for (std::uint32_t at = arena_top_; at != pool_detail::none && taken_bytes < wanted; at = spans_[at].lower) {
                span_type& piece = spans_[at];
                if (piece.state == pool_detail::span_state::free && piece.committed_bytes != 0) {
                    unlist_free_piece(piece);
                    piece.state = pool_detail::span_state::busy;
                    piece.next = taken;
                    taken = piece.index;
                    const std::uint64_t needed = wanted - taken_bytes;
                    if (piece.committed_bytes > needed) {
                        partial = piece.index;
                        partial_bytes = top_bytes_holding(piece, needed);
                        taken_bytes = wanted;
                    } else {
                        taken_bytes += piece.committed_bytes;
                    }
                }
            }
            if (taken == pool_detail::none) {
                lower_arena_top();
                return 0;
            }
        }
        std::uint64_t given = 0;
        while (taken != pool_detail::none) {
            span_type& piece = spans_[taken];
            taken = piece.next;
            piece.next = pool_detail::none;
            const std::uint64_t from = piece.index == partial ? piece.bytes - partial_bytes : 0;
            std::optional<error> refused; // a granule the upstream keeps stays committed, counted
            const std::uint64_t decommitted = change_commitment(piece.base + from, piece.bytes - from, false, refused);
            given += decommitted;
            std::lock_guard lock(span_lock_);
            piece.committed_bytes -= decommitted;
            put_back_piece(piece);
        }
        lower_arena_top_locked();
        return given;
    }

    // A segment of its own for one request: a pass-through, or a span when the pool grows by
    // allocation (or its arena is full).
    [[gnu::noinline]] result<allocation<device_type>>
    allocate_new_span(std::uint64_t bytes, std::uint64_t size, std::uint64_t alignment, bool pass_through) {
        try {
            const std::uint64_t upstream_alignment = pass_through ? alignment : std::max(alignment, granule_);
            auto fresh = upstream_.allocate(bytes, upstream_alignment);
            if (!fresh.has_value()) {
                return upstream_refused("a span of " + std::to_string(bytes) + " bytes", fresh.error());
            }
            count_upstream_allocation(fresh.value());
            const allocation<device_type> memory = fresh.value();
            if (auto usable = commit_span(memory); !usable.has_value()) {
                give_back_upstream(memory);
                return std::move(usable).error();
            }
            const std::uint64_t base = device_type::to_wire(memory.address);
            std::optional<std::uint32_t> index = take_span_index();
            if (!index.has_value()) {
                give_back_upstream(memory);
                return out_of_memory("the pool's span table is full");
            }
            if (!map_insert(base, base + memory.size, true, *index)) {
                free_span_index(*index);
                give_back_upstream(memory);
                return out_of_memory("the host could not record a span");
            }
            span_type& piece = spans_[*index];
            span_lock_.lock();
            piece.base = base;
            piece.bytes = memory.size;
            piece.committed_bytes = memory.size;
            piece.segment = memory;
            piece.pass_through = pass_through;
            piece.in_arena = false;
            piece.lower = piece.higher = pool_detail::none;
            keep_only(piece, std::min(bytes, memory.size));
            return hand_out_piece(piece, size, alignment);
        } catch (const std::bad_alloc&) {
            return error{status_code::out_of_memory, {}};
        }
    }

    // Over a virtual backing, an upstream allocation is reserved only: the pool commits it whole.
    result<void> commit_span(const allocation<device_type>& memory) {
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

    result<release_report> release_span(const allocation<device_type>& live) {
        span_type* found = spans_.find(pool_detail::span_of(live.allocation_id));
        if (found == nullptr) [[unlikely]] {
            return refused_as_unknown(live);
        }
        span_type& piece = *found;
        const std::uint32_t generation = pool_detail::generation_of(live.allocation_id);
        // Claimed without the span lock: of two releases of one id, one wins; the piece is ours.
        switch (piece.ticket.claim(generation, device_type::to_wire(live.address), live.size, live.alignment)) {
        case pool_detail::span_ticket::verdict::not_live: return refused_as_unknown(live);
        case pool_detail::span_ticket::verdict::misdescribed: return refused_release(status_code::invalid_argument, live);
        case pool_detail::span_ticket::verdict::claimed: break;
        }
        // ---- span cache: the piece parks in the releasing thread's shard, without the span lock ----
        if (!piece.pass_through && generation < pool_detail::generation_limit && park_piece(piece, live.size)) [[likely]] {
            enforce_retention();
            return release_report{release_state::complete, 0, 0};
        }
        span_lock_.lock();
        span_live_allocations_ -= 1;
        span_in_use_bytes_ -= live.size;
        span_handed_out_bytes_ -= piece.bytes;
        if (!piece.pass_through) {
            if (generation < pool_detail::generation_limit) [[likely]] {
                put_back_piece(piece);
            } else {
                piece.state = pool_detail::span_state::spent; // never handed out again, nor merged
            }
            span_lock_.unlock();
            enforce_retention();
            return release_report{release_state::complete, 0, 0};
        }
        piece.state = pool_detail::span_state::leaving;
        span_lock_.unlock();
        const allocation<device_type> memory = piece.segment;
        map_erase(piece.base);
        auto report = upstream_.release(memory);
        upstream_releases_.fetch_add(1, std::memory_order_relaxed);
        held_bytes_.fetch_sub(memory.size, std::memory_order_relaxed);
        free_span_index(piece.index);
        if (!report.has_value()) {
            // The upstream kept it; to the engine the allocation is gone all the same.
            return release_report{release_state::quarantined, 0, memory.size};
        }
        return report;
    }

    // Under span_lock_, a piece no longer live: merges it with a free neighbour on either side
    // (the lower piece's record survives, so a segment's first piece keeps its record for the
    // segment's life) and lists what results.
    void put_back_piece(span_type& piece) noexcept {
        if (piece.higher != pool_detail::none && spans_[piece.higher].state == pool_detail::span_state::free) {
            absorb_higher(piece);
        }
        span_type* survivor = &piece;
        if (piece.lower != pool_detail::none && spans_[piece.lower].state == pool_detail::span_state::free) {
            survivor = &spans_[piece.lower];
            unlist_free_piece(*survivor);
            absorb_higher(*survivor);
        }
        list_free_piece(*survivor);
    }
    // `piece` takes in the piece above it, which leaves any free list; its record is freed.
    void absorb_higher(span_type& piece) noexcept {
        span_type& above = spans_[piece.higher];
        if (above.state == pool_detail::span_state::free) {
            unlist_free_piece(above);
        }
        piece.bytes += above.bytes;
        piece.committed_bytes += above.committed_bytes;
        piece.higher = above.higher;
        if (above.higher != pool_detail::none) {
            spans_[above.higher].lower = piece.index;
        } else if (above.in_arena) {
            arena_top_ = piece.index;
        }
        if (above.in_arena) {
            granules_[granule_of(above.base)].starting_piece = pool_detail::none;
        }
        above.lower = above.higher = pool_detail::none;
        free_span_index(above.index);
    }

    // Gives idle segments (one free piece each, never the arena's) back to the upstream, largest
    // bins first.
    std::uint64_t give_back_idle_segments(std::uint64_t wanted) {
        std::uint64_t given = 0;
        std::uint32_t leaving = pool_detail::none;
        {
            std::lock_guard lock(span_lock_);
            for (std::uint32_t bin = pool_classes::bin_count; bin-- > 0 && given < wanted;) {
                for (std::uint32_t at = free_pieces_[bin]; at != pool_detail::none && given < wanted;) {
                    span_type& piece = spans_[at];
                    at = piece.next;
                    if (!piece.in_arena && piece.lower == pool_detail::none && piece.higher == pool_detail::none) {
                        unlist_free_piece(piece);
                        piece.state = pool_detail::span_state::leaving;
                        piece.next = leaving;
                        leaving = piece.index;
                        given += piece.bytes;
                    }
                }
            }
        }
        while (leaving != pool_detail::none) {
            span_type& piece = spans_[leaving];
            leaving = piece.next;
            map_erase(piece.base);
            give_back_upstream(piece.segment);
            free_span_index(piece.index);
        }
        return given;
    }

    std::optional<std::uint32_t> take_span_index() noexcept {
        std::lock_guard lock(pool_mutex_);
        if (free_spans_ != pool_detail::none) {
            const std::uint32_t index = free_spans_;
            free_spans_ = spans_[index].next;
            spans_[index].next = pool_detail::none;
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
        std::lock_guard lock(pool_mutex_);
        span_type& span = spans_[index];
        span.state = pool_detail::span_state::unused;
        if (span.ticket.generation() >= pool_detail::generation_limit) {
            return;
        }
        span.next = free_spans_;
        free_spans_ = index;
    }

    // ---- span caches ----
    //
    // A released piece (not a pass-through) parks in the releasing thread's shard cache, up to a
    // few a bin and span_cache_bytes a shard; the thread's next request whose rounded bytes fall
    // in that bin takes it whole (at most a bin's width larger than asked). A parked piece is
    // live to the span lock's bookkeeping (out of the free lists, never merged) and not live to
    // its ticket, so a release or a release by address of its last id is refused. Without the
    // span lock the cache path writes only tickets, and reads only fields that stay fixed while
    // a piece is out of the free lists (its index, base, bytes and segment).

    // The calling thread's parked piece (in `cache`, its shard's) for a request of `size`
    // (`bytes` rounded), handed out under its next generation; none when none fits.
    std::optional<allocation<device_type>> take_parked_piece(pool_detail::span_cache& cache, std::uint64_t bytes,
                                                             std::uint64_t size, std::uint64_t alignment) noexcept {
        if (cache.parked_bytes() == 0) {
            return std::nullopt;
        }
        const std::optional<pool_detail::parked_piece> parked =
            cache.take(pool_classes::bin_of(bytes), bytes, alignment, size);
        if (!parked.has_value()) {
            return std::nullopt;
        }
        span_type& piece = spans_[parked->index];
        const std::uint64_t mechanism = piece.segment.mechanism_id; // read while the piece is still ours
        const std::uint32_t generation = piece.ticket.publish(parked->base, size, alignment);
        return allocation<device_type>{device_type::from_wire(parked->base), size, alignment,
                                       pool_detail::span_id(generation, parked->index), mechanism, device_};
    }

    // A piece its releaser has claimed (its ticket says not live) parks in the releasing thread's
    // cache; false, nothing changed, when that cache has no room for it.
    bool park_piece(const span_type& piece, std::uint64_t released_size) noexcept {
        if (options_.span_cache_bytes == 0) {
            return false;
        }
        return span_caches_[pool_detail::this_thread_shard()].park(
            {piece.index, pool_classes::bin_of(piece.bytes), piece.base, piece.bytes}, released_size,
            options_.span_cache_bytes);
    }

    // Every shard's parked pieces go back to the span free lists, merged with free neighbours;
    // returns how many went. A cache is emptied under its own lock, its pieces listed after,
    // under the span lock.
    std::uint32_t flush_span_caches() noexcept {
        std::uint32_t flushed = 0;
        for (pool_detail::span_cache& cache : span_caches_) {
            flushed += flush_span_cache(cache);
        }
        return flushed;
    }
    std::uint32_t flush_span_cache(pool_detail::span_cache& cache) noexcept {
        if (cache.parked_bytes() == 0) {
            return 0;
        }
        pool_detail::span_cache::pieces taken;
        const std::uint32_t count = cache.take_all(taken);
        if (count == 0) {
            return 0;
        }
        std::lock_guard lock(span_lock_);
        for (std::uint32_t at = 0; at < count; ++at) {
            span_type& piece = spans_[taken[at].index];
            span_handed_out_bytes_ -= piece.bytes;
            put_back_piece(piece);
        }
        return count;
    }

    std::uint64_t parked_span_bytes() const noexcept {
        std::uint64_t parked = 0;
        for (const pool_detail::span_cache& cache : span_caches_) {
            parked += cache.parked_bytes();
        }
        return parked;
    }

    // ---- retention ----

    void enforce_retention() {
        if (options_.retain_limit_bytes == std::numeric_limits<std::uint64_t>::max()) [[likely]] {
            return;
        }
        const std::uint64_t reclaimable = free_slab_bytes_.load(std::memory_order_relaxed) +
                                          free_piece_bytes_.load(std::memory_order_relaxed) + parked_span_bytes();
        if (reclaimable > options_.retain_limit_bytes) {
            trim(options_.retain_limit_bytes);
        }
    }

    // ---- the address map ----

    // Inserts or erases with every reader lock held; readers take the one of their shard.
    bool map_insert(std::uint64_t begin, std::uint64_t end, bool span, std::uint32_t index) noexcept {
        lock_all_readers();
        bool inserted = true;
        try {
            ranges_.insert_or_assign(begin, mapped_range{end, span, index});
        } catch (...) {
            inserted = false;
        }
        unlock_all_readers();
        return inserted;
    }
    void map_erase(std::uint64_t begin) noexcept {
        lock_all_readers();
        ranges_.erase(begin);
        unlock_all_readers();
    }
    void lock_all_readers() noexcept {
        for (padded_lock& reader : readers_) {
            reader.lock.lock();
        }
    }
    void unlock_all_readers() noexcept {
        for (padded_lock& reader : readers_) {
            reader.lock.unlock();
        }
    }

    // The live allocation that starts at `wire`, described from the pool's records.
    std::optional<allocation<device_type>> find_live(std::uint64_t wire) {
        if (arena_limit_ != 0 && wire >= arena_base_ && wire - arena_base_ < arena_limit_) {
            return find_live_in_arena(wire);
        }
        std::lock_guard reader(readers_[pool_detail::this_thread_shard()].lock);
        auto after = ranges_.upper_bound(wire);
        if (after == ranges_.begin()) {
            return std::nullopt;
        }
        const auto& [begin, range] = *std::prev(after);
        if (wire >= range.end) {
            return std::nullopt;
        }
        if (range.span) {
            // The segment's pieces, from its first, in address order.
            std::lock_guard lock(span_lock_);
            for (std::uint32_t at = range.index; at != pool_detail::none; at = spans_[at].higher) {
                const span_type& piece = spans_[at];
                if (piece.base == wire) {
                    // Live to the span lock and to its ticket (not parked in a shard's cache).
                    const auto handed = piece.ticket.live_description();
                    if (piece.state != pool_detail::span_state::live || !handed.has_value()) {
                        break;
                    }
                    return allocation<device_type>{device_type::from_wire(wire), handed->size, handed->alignment,
                                                   pool_detail::span_id(handed->generation, piece.index),
                                                   piece.segment.mechanism_id, device_};
                }
            }
            return std::nullopt;
        }
        const std::uint64_t chunk_index = reservation_.has_value() ? (wire - begin) / chunk_bytes_ : range.index;
        const std::uint64_t chunk_base = reservation_.has_value() ? begin + chunk_index * chunk_bytes_ : begin;
        const std::uint64_t slab_index = chunk_index * slabs_per_chunk_ + (wire - chunk_base) / pool_classes::slab_bytes;
        pool_detail::slab* slab = slabs_.find(slab_index);
        if (slab == nullptr) {
            return std::nullopt;
        }
        pool_detail::shard* owner = lock_owner(*slab);
        if (owner == nullptr) {
            return std::nullopt;
        }
        std::optional<allocation<device_type>> found;
        const std::uint64_t offset = wire - slab->base;
        if (slab->block_bytes != 0 && offset % slab->block_bytes == 0 && offset / slab->block_bytes < slab->block_count) {
            const auto block = static_cast<std::uint32_t>(offset / slab->block_bytes);
            const pool_detail::block_record& record = slab->records[block];
            if (record.live) {
                found = allocation<device_type>{device_type::from_wire(wire), record.size_or_next,
                                                std::uint64_t{1} << record.alignment_log2,
                                                pool_detail::block_id(record.generation, slab->index, block),
                                                mechanism_id_.load(std::memory_order_relaxed), device_};
            }
        }
        owner->lock.unlock();
        return found;
    }

    // The live arena piece that starts at `wire`: the granule there names the piece starting there.
    std::optional<allocation<device_type>> find_live_in_arena(std::uint64_t wire) {
        std::lock_guard lock(span_lock_);
        const std::uint64_t offset = wire - arena_base_;
        if (offset % granule_ != 0 || offset >= arena_end_) {
            return std::nullopt;
        }
        const std::uint32_t at = granules_[offset / granule_].starting_piece;
        if (at == pool_detail::none) {
            return std::nullopt;
        }
        const span_type& piece = spans_[at];
        // Live to the span lock and to its ticket (not parked in a shard's cache).
        const auto handed = piece.ticket.live_description();
        if (piece.state != pool_detail::span_state::live || piece.base != wire || !handed.has_value()) {
            return std::nullopt;
        }
        return allocation<device_type>{device_type::from_wire(wire), handed->size, handed->alignment,
                                       pool_detail::span_id(handed->generation, piece.index),
                                       piece.segment.mechanism_id, device_};
    }

    // ---- upstream calls and failures ----

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

    status_code identity_fault(const allocation<device_type>& live) const noexcept {
        if (live.mechanism_id != mechanism_id_.load(std::memory_order_relaxed)) [[unlikely]] {
            if (mechanism_known_.load(std::memory_order_relaxed)) {
                return status_code::wrong_mechanism;
            }
        }
        if (live.device != device_) [[unlikely]] {
            return status_code::wrong_device;
        }
        return status_code::ok;
    }

    // A release refused as not live: a size or alignment that no allocation has comes first
    // (docs/ABI.md M10), checked only here so a release that succeeds does not pay for it.
    [[gnu::cold, gnu::noinline]] error refused_as_unknown(const allocation<device_type>& live) const noexcept {
        if (live.size == 0 || live.alignment == 0 || (live.alignment & (live.alignment - 1)) != 0) {
            return refused_release(status_code::invalid_argument, live);
        }
        return refused_release(status_code::unknown_allocation, live);
    }

    [[gnu::cold, gnu::noinline]] static error refused_request(std::uint64_t size, std::uint64_t alignment) noexcept {
        try {
            return {status_code::invalid_argument,
                    "size must be non-zero and alignment a power of two (size " + std::to_string(size) +
                        ", alignment " + std::to_string(alignment) + ")"};
        } catch (...) {
            return {status_code::invalid_argument, {}};
        }
    }
    [[gnu::cold, gnu::noinline]] static error refused_release(status_code code,
                                                              const allocation<device_type>& live) noexcept {
        try {
            std::string why;
            switch (code) {
            case status_code::wrong_mechanism: why = "it belongs to another mechanism"; break;
            case status_code::wrong_device: why = "it belongs to another device"; break;
            case status_code::unknown_allocation: why = "it is not live in this pool"; break;
            default: why = "it misdescribes the allocation (address, size, alignment or id)"; break;
            }
            return {code, "pool: release of allocation " + std::to_string(live.allocation_id) + " at 0x" +
                              to_hex(device_type::to_wire(live.address)) + " refused: " + why};
        } catch (...) {
            return {code, {}};
        }
    }
    [[gnu::cold, gnu::noinline]] static error out_of_memory(const std::string& why) noexcept {
        try {
            return {status_code::out_of_memory, std::string("pool: ") + why};
        } catch (...) {
            return {status_code::out_of_memory, {}};
        }
    }
    [[gnu::cold, gnu::noinline]] static error upstream_refused(const std::string& what, const error& failure) noexcept {
        try {
            return {status_code::out_of_memory, "pool: the upstream refused " + what + ": " + failure.describe()};
        } catch (...) {
            return {status_code::out_of_memory, {}};
        }
    }
    [[gnu::cold, gnu::noinline]] static error commitment_refused(bool commit, std::uint64_t bytes,
                                                                 const error& failure) noexcept {
        try {
            return upstream_refused(std::string(commit ? "a commit of " : "a decommit of ") + std::to_string(bytes) +
                                        " bytes",
                                    failure);
        } catch (...) {
            return {status_code::out_of_memory, {}};
        }
    }
    static std::string to_hex(std::uint64_t value) {
        static constexpr char digits[] = "0123456789abcdef";
        std::string text;
        do {
            text.insert(text.begin(), digits[value & 15]);
            value >>= 4;
        } while (value != 0);
        return text;
    }

    using slab_directory = pool_detail::stable_directory<pool_detail::slab, directory_leaves>;
    using span_directory = pool_detail::stable_directory<span_type, directory_leaves>;
    using chunk_directory = pool_detail::stable_directory<chunk_type, directory_leaves>;
    // 8 bytes a granule of the arena's extent, in leaves of 8,192 (64 KiB): at most 2^24
    // granules (64 GiB of arena at 4 KiB pages).
    using granule_directory = pool_detail::stable_directory<pool_detail::arena_granule, 2048, 13>;

    // Declared first, destroyed last: the records below describe its memory.
    Upstream upstream_;
    pool_options options_;
    device_id device_;
    backing_type backing_;
    std::optional<allocation<device_type>> reservation_;
    std::uint64_t granule_ = 0;
    std::uint64_t chunk_bytes_ = 0;
    std::uint32_t slabs_per_chunk_ = 0;
    std::uint64_t pass_through_bytes_ = 0;
    std::uint64_t chunk_limit_ = std::numeric_limits<std::uint64_t>::max();

    mutable std::array<pool_detail::shard, pool_detail::shard_count> shards_;

    // The pool's own lists, behind pool_mutex_ (never held across an upstream call; taken after
    // a shard lock, never before one).
    mutable std::mutex pool_mutex_;
    pool_detail::lease_gate lease_gate_; // lease(): trim gives nothing back while one is held
    slab_directory slabs_;
    span_directory spans_;
    chunk_directory chunks_;
    std::uint32_t free_slabs_ = pool_detail::none;
    std::uint32_t free_chunks_ = pool_detail::none;
    std::uint32_t free_spans_ = pool_detail::none;
    std::uint64_t next_chunk_ = 0;
    std::uint64_t next_span_ = 0;

    // The span pieces' records, free lists by bin and figures, behind span_lock_ (taken before
    // pool_mutex_, never after; never held across an upstream call).
    static constexpr std::uint32_t free_bin_words = pool_classes::bin_count / 64;
    mutable nxmem::detail::spin_lock span_lock_;
    std::array<std::uint32_t, pool_classes::bin_count> free_pieces_ = all_none<pool_classes::bin_count>();
    std::array<std::uint64_t, free_bin_words> free_bins_{}; // bit b: free_pieces_[b] lists a piece
    std::uint64_t span_live_allocations_ = 0;
    std::uint64_t span_in_use_bytes_ = 0;     // requested
    std::uint64_t span_handed_out_bytes_ = 0; // whole pieces
    std::atomic<std::uint64_t> free_piece_bytes_{0}; // committed; read unlocked by the retention check

    // The span arena (growth by commit): the upper half of the reservation, from arena_base_ (a
    // wire address, arena_offset_ into the reservation) for at most arena_limit_ bytes (0: no
    // arena). Pieces partition its first arena_end_ bytes; arena_top_ is the highest. Those two
    // and the granules' starting pieces are behind span_lock_; a granule's committed flag also
    // changes under the busy piece's owner.
    std::uint64_t arena_offset_ = 0;
    std::uint64_t arena_base_ = 0;
    std::uint64_t arena_limit_ = 0;
    std::uint64_t arena_end_ = 0;
    std::uint32_t arena_top_ = pool_detail::none;
    granule_directory granules_;

    // Each shard's parked span pieces (pool/detail/span_cache.hpp): a cache's lock is taken with
    // no other lock held, or in usage()'s cut, all of them before span_lock_.
    mutable std::array<pool_detail::span_cache, pool_detail::shard_count> span_caches_;

    std::map<std::uint64_t, mapped_range> ranges_;
    mutable std::array<padded_lock, pool_detail::shard_count> readers_;

    std::atomic<std::uint64_t> mechanism_id_{0};
    std::atomic<bool> mechanism_known_{false};
    std::atomic<std::uint64_t> held_bytes_{0};
    std::atomic<std::uint64_t> free_slab_bytes_{0};
    std::atomic<std::uint64_t> upstream_allocations_{0};
    std::atomic<std::uint64_t> upstream_releases_{0};
    std::atomic<std::uint64_t> upstream_commits_{0};
    std::atomic<std::uint64_t> upstream_decommits_{0};
};

namespace pool_detail {
// Stand-ins for any upstream of a device type, to assert that a pool over one is itself a
// DeviceAllocator (declared only: never called).
template <Device D> struct upstream_archetype {
    using device_type = D;
    device_id device() const noexcept;
    result<allocation<D>> allocate(std::uint64_t size, std::uint64_t alignment);
    result<release_report> release(const allocation<D>& live);
};
} // namespace pool_detail

static_assert(assert_device_allocator<pool_allocator<pool_detail::upstream_archetype<cpu_device>>>());
static_assert(assert_device_allocator<pool_allocator<pool_detail::upstream_archetype<cuda_device>>>());
static_assert(assert_device_allocator<pool_allocator<pool_allocator<pool_detail::upstream_archetype<cuda_device>>>>(),
              "pools compose");

} // namespace nxmem
