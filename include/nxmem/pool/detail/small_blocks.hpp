// The pool's small-block layer: requests up to 16 KiB are blocks of a size class
// (pool/size_classes.hpp), carved from 64 KiB slabs of chunks the chunk source hands up. It owns
// the thread shards (each a current slab and a list of partly used slabs per class, behind its
// own lock), the slabs and their block records, the free slabs and which chunk each belongs to;
// a release is checked by its id (pool/detail/pooled_id.hpp), which names the slab and block, in
// constant time. A chunk whose slabs are all free goes back through the source.
#pragma once

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/pool/detail/pool_errors.hpp>
#include <nxmem/pool/detail/pool_records.hpp>
#include <nxmem/pool/detail/pooled_id.hpp>
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

// What the blocks handed out add up to (summed over the shards when asked).
struct block_figures {
    std::uint64_t live_allocations = 0;
    std::uint64_t in_use_bytes = 0;     // requested
    std::uint64_t handed_out_bytes = 0; // whole blocks
};

// Source: the chunk source below (take_chunk, give_back_chunk, chunk_bytes, limit_chunks).
template <class Source> class small_blocks {
public:
    using device_type = typename Source::device_type;

    explicit small_blocks(Source& source) noexcept
        : source_(&source), device_(source.device()),
          slabs_per_chunk_(static_cast<std::uint32_t>(source.chunk_bytes() / pool_classes::slab_bytes)) {
        source.limit_chunks(slab_limit / slabs_per_chunk_);
    }
    small_blocks(const small_blocks&) = delete;
    small_blocks& operator=(const small_blocks&) = delete;

    std::uint32_t slabs_per_chunk() const noexcept { return slabs_per_chunk_; }

    // The common case, calling nothing: the thread's shard chosen and its lock free, a free block
    // in its current slab of the class. Returns the slab with `home` locked; null (nothing
    // locked) otherwise.
    slab* lock_current_slab(std::uint32_t size_class, shard*& home) noexcept {
        const std::uint32_t home_index = this_thread_shard_if_chosen();
        if (home_index < shard_count) [[likely]] {
            shard& candidate = shards_[home_index];
            if (candidate.lock.try_lock()) [[likely]] {
                slab* current = candidate.current[size_class];
                if (current != nullptr && current->free_head != none) [[likely]] {
                    home = &candidate;
                    return current;
                }
                candidate.lock.unlock();
            }
        }
        return nullptr;
    }

    // Under home's lock, with a free block in `slab`; drops the lock.
    allocation<device_type> hand_out_block(shard& home, slab& slab, std::uint64_t size, std::uint64_t alignment) noexcept {
        const std::uint32_t block = slab.free_head;
        block_record& record = slab.records[block];
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
                                       block_id(generation, slab_index, block),
                                       mechanism_id_.load(std::memory_order_relaxed), device_};
    }

    // The common release, calling nothing: a block of this layer, named by `live` exactly, its
    // shard's lock free, its slab the shard's current one. false (nothing changed) otherwise.
    bool try_release_current(const allocation<device_type>& live) noexcept {
        if (live.mechanism_id != mechanism_id_.load(std::memory_order_relaxed) || !same_device(live.device, device_)) {
            return false;
        }
        slab* found = slabs_.find(slab_of(live.allocation_id));
        if (found == nullptr) [[unlikely]] {
            return false;
        }
        const std::uint32_t owner_index = found->owner.load(std::memory_order_acquire);
        if (owner_index >= shard_count) [[unlikely]] {
            return false;
        }
        shard& owner = shards_[owner_index];
        if (!owner.lock.try_lock()) [[unlikely]] {
            return false;
        }
        const bool released = release_current_block(owner, owner_index, *found, live);
        owner.lock.unlock();
        return released;
    }

    // A block of class `size_class` for (size, alignment), growing by a chunk when no slab is free.
    [[gnu::noinline]] result<allocation<device_type>> allocate(std::uint32_t size_class, std::uint64_t size,
                                                               std::uint64_t alignment) {
        const std::uint32_t home_index = this_thread_shard();
        shard& home = shards_[home_index];
        for (;;) {
            home.lock.lock();
            slab* current = home.current[size_class];
            bool records_failed = false;
            if (current == nullptr || current->free_head == none) {
                current = next_slab(home, home_index, size_class, records_failed);
            }
            if (records_failed) {
                home.lock.unlock();
                return out_of_memory("the host could not record a slab's blocks");
            }
            if (current != nullptr) {
                return hand_out_block(home, *current, size, alignment);
            }
            home.lock.unlock();
            // No slab anywhere: one more chunk, with no lock held.
            if (auto grown = adopt_chunk(); !grown.has_value()) {
                return std::move(grown).error();
            }
        }
    }

    // A release checked in full (its mechanism and device checked by the caller);
    // `on_slab_freed()` runs, no lock held, when a slab became free (idle memory the retention
    // limit counts grew).
    template <class OnSlabFreed> result<release_report> release(const allocation<device_type>& live, OnSlabFreed&& on_slab_freed) {
        const std::uint64_t id = live.allocation_id;
        slab* found = slabs_.find(slab_of(id));
        if (found == nullptr) [[unlikely]] {
            return refused_as_unknown(live);
        }
        shard* owner = lock_owner(*found);
        if (owner == nullptr) [[unlikely]] {
            return refused_as_unknown(live);
        }
        const std::uint32_t block = block_of(id);
        if (block >= found->block_count || !found->records[block].live ||
            found->records[block].generation != generation_of(id)) [[unlikely]] {
            owner->lock.unlock();
            return refused_as_unknown(live);
        }
        block_record& record = found->records[block];
        if (device_type::to_wire(live.address) != found->base + block * found->block_bytes ||
            live.size != record.size_or_next || live.alignment != std::uint64_t{1} << record.alignment_log2) [[unlikely]] {
            owner->lock.unlock();
            return refused_release(status_code::invalid_argument, live);
        }
        record.live = false;
        owner->live_allocations -= 1;
        owner->in_use_bytes -= live.size;
        owner->handed_out_bytes -= found->block_bytes;
        if (record.generation < generation_limit) [[likely]] {
            record.size_or_next = found->free_head;
            found->free_head = block;
            ++found->free_count;
            if (owner->current[found->class_index] != found) [[unlikely]] {
                if (released_outside_current(*owner, *found)) {
                    on_slab_freed();
                }
                return release_report{release_state::complete, 0, 0};
            }
        } // else its ids are spent: the block is never handed out again (nor its slab given back)
        owner->lock.unlock();
        return release_report{release_state::complete, 0, 0};
    }

    // The live block that starts at `wire`, in chunk `slot` based at `chunk_base`.
    std::optional<allocation<device_type>> find_live(std::uint64_t wire, std::uint32_t slot, std::uint64_t chunk_base) {
        const std::uint64_t slab_index = std::uint64_t{slot} * slabs_per_chunk_ + (wire - chunk_base) / pool_classes::slab_bytes;
        slab* found = slabs_.find(slab_index);
        if (found == nullptr) {
            return std::nullopt;
        }
        shard* owner = lock_owner(*found);
        if (owner == nullptr) {
            return std::nullopt;
        }
        std::optional<allocation<device_type>> live;
        const std::uint64_t offset = wire - found->base;
        if (found->block_bytes != 0 && offset % found->block_bytes == 0 && offset / found->block_bytes < found->block_count) {
            const auto block = static_cast<std::uint32_t>(offset / found->block_bytes);
            const block_record& record = found->records[block];
            if (record.live) {
                live = allocation<device_type>{device_type::from_wire(wire), record.size_or_next,
                                               std::uint64_t{1} << record.alignment_log2,
                                               block_id(record.generation, found->index, block),
                                               mechanism_id_.load(std::memory_order_relaxed), device_};
            }
        }
        owner->lock.unlock();
        return live;
    }

    // Each shard keeps its current slab of a class when its last block comes back (so a thread
    // that allocates and releases one block does not carve a slab each time); trim takes them.
    void retire_idle_current_slabs() noexcept {
        for (shard& each : shards_) {
            std::lock_guard lock(each.lock);
            for (slab*& current : each.current) {
                if (current != nullptr && current->free_count == current->block_count) {
                    slab& idle = *current;
                    current = nullptr;
                    retire_slab(idle);
                }
            }
        }
    }

    // Gives chunks whose slabs are all free back through the source, until `wanted` bytes went;
    // returns the bytes given. A chunk the source keeps (a lease) gets its slabs back.
    std::uint64_t give_back_free_chunks(std::uint64_t wanted) {
        std::uint64_t given = 0;
        std::uint32_t leaving = none; // chunks taken out, linked through next
        {
            std::lock_guard lock(mutex_);
            for (std::uint64_t slot = 0; slot < next_chunk_ && given < wanted; ++slot) {
                chunk_slabs& chunk = chunks_[slot];
                if (chunk.in_use && chunk.free_slabs == slabs_per_chunk_) {
                    chunk.in_use = false;
                    chunk.next = leaving;
                    leaving = static_cast<std::uint32_t>(slot);
                    given += source_->chunk_bytes();
                }
            }
            if (leaving == none) {
                return 0;
            }
            // Their slabs leave the free list (one pass) and drop their records.
            std::uint32_t* link = &free_slabs_;
            while (*link != none) {
                slab& each = slabs_[*link];
                if (!chunks_[each.index / slabs_per_chunk_].in_use) {
                    *link = each.next;
                    each.next = none;
                    each.records.reset();
                    each.record_capacity = 0;
                    chunks_[each.index / slabs_per_chunk_].free_slabs -= 1;
                    free_slab_bytes_.fetch_sub(pool_classes::slab_bytes, std::memory_order_relaxed);
                } else {
                    link = &each.next;
                }
            }
        }
        while (leaving != none) {
            const std::uint32_t slot = leaving;
            leaving = chunks_[slot].next;
            if (!source_->give_back_chunk(slot)) {
                given -= source_->chunk_bytes();
                publish_slabs(slot, chunks_[slot].base);
            }
        }
        return given;
    }

    block_figures figures() const noexcept {
        block_figures totals;
        for (shard& each : shards_) {
            std::lock_guard lock(each.lock);
            totals.live_allocations += each.live_allocations;
            totals.in_use_bytes += each.in_use_bytes;
            totals.handed_out_bytes += each.handed_out_bytes;
        }
        return totals;
    }
    // The bytes of free slabs (read unlocked by the retention check).
    std::uint64_t free_bytes() const noexcept { return free_slab_bytes_.load(std::memory_order_relaxed); }

private:
    // Which slabs of a chunk are free, and whether this layer holds the chunk.
    struct chunk_slabs {
        std::uint64_t base = 0;
        std::uint32_t free_slabs = 0;
        std::uint32_t next = none; // in a give-back's list
        bool in_use = false;
    };
    static constexpr std::size_t directory_leaves = 1024;
    using slab_directory = stable_directory<slab, directory_leaves>;
    using chunk_directory = stable_directory<chunk_slabs, directory_leaves>;

    // Under owner's lock: releases the block `live` names if everything about it is as expected
    // and its slab is its shard's current one; false (nothing changed) otherwise.
    bool release_current_block(shard& owner, std::uint32_t owner_index, slab& slab,
                               const allocation<device_type>& live) noexcept {
        const std::uint32_t block = block_of(live.allocation_id);
        if (slab.owner.load(std::memory_order_relaxed) != owner_index || block >= slab.block_count) {
            return false;
        }
        block_record& record = slab.records[block];
        if (!record.live || record.generation != generation_of(live.allocation_id) ||
            record.generation >= generation_limit ||
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

    // Under the owner's lock, a block of a slab that is not its shard's current one came back:
    // the slab joins the partly used list, or leaves the shard when wholly free. Drops the lock.
    // Returns whether the slab left.
    [[gnu::noinline]] bool released_outside_current(shard& owner, slab& slab) noexcept {
        const bool emptied = slab.free_count == slab.block_count;
        if (emptied) {
            if (slab.listed) {
                unlist(owner, slab);
            }
            retire_slab(slab);
        } else if (!slab.listed) {
            enlist(owner, slab);
        }
        owner.lock.unlock();
        return emptied;
    }

    // Under home's lock: a partly used slab of the class, else a free slab given the class
    // (null when none is free, or when its records could not be made: records_failed).
    slab* next_slab(shard& home, std::uint32_t home_index, std::uint32_t size_class, bool& records_failed) {
        if (const std::uint32_t partial = home.partial[size_class]; partial != none) {
            slab& listed = slabs_[partial];
            unlist(home, listed);
            home.current[size_class] = &listed;
            return &listed;
        }
        slab* fresh = take_free_slab();
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
    static bool carve(slab& slab, std::uint32_t size_class) noexcept {
        const std::uint64_t block_bytes = pool_classes::class_bytes(size_class);
        const auto count = static_cast<std::uint32_t>(pool_classes::slab_bytes / block_bytes);
        if (slab.record_capacity < count) {
            auto* records = new (std::nothrow) block_record[count];
            if (records == nullptr) {
                return false;
            }
            slab.records.reset(records);
            slab.record_capacity = count;
        }
        for (std::uint32_t block = 0; block < count; ++block) {
            slab.records[block] = {slab.generation_floor, block + 1 < count ? block + 1 : none, 0, false};
        }
        slab.class_index = size_class;
        slab.block_bytes = block_bytes;
        slab.block_count = count;
        slab.free_count = count;
        slab.free_head = 0;
        slab.listed = false;
        return true;
    }

    // Locks the shard that owns `slab` now; null when nobody owns it.
    shard* lock_owner(slab& record) noexcept {
        std::uint32_t owner = record.owner.load(std::memory_order_acquire);
        for (;;) {
            if (owner >= shard_count) {
                return nullptr;
            }
            shard& candidate = shards_[owner];
            candidate.lock.lock();
            const std::uint32_t now = record.owner.load(std::memory_order_relaxed);
            if (now == owner) {
                return &candidate;
            }
            candidate.lock.unlock();
            owner = now;
        }
    }

    void enlist(shard& owner, slab& slab) noexcept {
        const std::uint32_t head = owner.partial[slab.class_index];
        slab.previous = none;
        slab.next = head;
        if (head != none) {
            slabs_[head].previous = slab.index;
        }
        owner.partial[slab.class_index] = slab.index;
        slab.listed = true;
    }
    void unlist(shard& owner, slab& slab) noexcept {
        if (slab.previous != none) {
            slabs_[slab.previous].next = slab.next;
        } else {
            owner.partial[slab.class_index] = slab.next;
        }
        if (slab.next != none) {
            slabs_[slab.next].previous = slab.previous;
        }
        slab.previous = slab.next = none;
        slab.listed = false;
    }

    // Under the owner's lock, every block free: the slab goes back to the free slabs.
    void retire_slab(slab& slab) noexcept {
        std::uint32_t floor = slab.generation_floor;
        for (std::uint32_t block = 0; block < slab.block_count; ++block) {
            floor = std::max(floor, slab.records[block].generation);
        }
        slab.generation_floor = floor;
        slab.class_index = pool_classes::not_small;
        slab.block_count = 0;
        slab.free_head = none;
        if (floor >= generation_limit - 1) [[unlikely]] {
            return; // spent: never carved again, its chunk never given back
        }
        std::lock_guard lock(mutex_);
        slab.owner.store(none, std::memory_order_release);
        put_free_slab_locked(slab);
    }

    slab* take_free_slab() noexcept {
        std::lock_guard lock(mutex_);
        if (free_slabs_ == none) {
            return nullptr;
        }
        slab& taken = slabs_[free_slabs_];
        free_slabs_ = taken.next;
        taken.next = none;
        chunks_[taken.index / slabs_per_chunk_].free_slabs -= 1;
        free_slab_bytes_.fetch_sub(pool_classes::slab_bytes, std::memory_order_relaxed);
        return &taken;
    }
    void put_free_slab(slab& slab) noexcept {
        std::lock_guard lock(mutex_);
        put_free_slab_locked(slab);
    }
    void put_free_slab_locked(slab& slab) noexcept {
        slab.next = free_slabs_;
        free_slabs_ = slab.index;
        chunks_[slab.index / slabs_per_chunk_].free_slabs += 1;
        free_slab_bytes_.fetch_add(pool_classes::slab_bytes, std::memory_order_relaxed);
    }

    // One more chunk from the source, its slabs free; no lock held while the source is called.
    result<void> adopt_chunk() {
        auto granted = source_->take_chunk();
        if (!granted.has_value()) {
            return std::move(granted).error();
        }
        const chunk_grant chunk = granted.value();
        if (!make_records_for(chunk.slot)) {
            source_->abandon_chunk(chunk.slot);
            return out_of_memory("the host could not record a chunk's slabs");
        }
        mechanism_id_.store(chunk.mechanism_id, std::memory_order_relaxed);
        publish_slabs(chunk.slot, chunk.base);
        return boost::outcome_v2::success();
    }
    bool make_records_for(std::uint32_t slot) noexcept {
        std::lock_guard lock(mutex_);
        const std::uint64_t first_slab = std::uint64_t{slot} * slabs_per_chunk_;
        if (!chunks_.make_leaves_for(slot, std::uint64_t{slot} + 1) ||
            !slabs_.make_leaves_for(first_slab, first_slab + slabs_per_chunk_)) {
            return false;
        }
        next_chunk_ = std::max<std::uint64_t>(next_chunk_, std::uint64_t{slot} + 1);
        return true;
    }
    // The chunk's slabs join the free slabs.
    void publish_slabs(std::uint32_t slot, std::uint64_t base) noexcept {
        std::lock_guard lock(mutex_);
        chunk_slabs& chunk = chunks_[slot];
        chunk.base = base;
        chunk.in_use = true;
        chunk.free_slabs = 0;
        for (std::uint32_t page = slabs_per_chunk_; page-- > 0;) {
            slab& each = slabs_[std::uint64_t{slot} * slabs_per_chunk_ + page];
            each.index = slot * slabs_per_chunk_ + page;
            each.base = base + std::uint64_t{page} * pool_classes::slab_bytes;
            put_free_slab_locked(each);
        }
    }

    Source* source_;
    device_id device_;
    std::uint32_t slabs_per_chunk_;
    std::atomic<std::uint64_t> mechanism_id_{0};

    mutable std::array<shard, shard_count> shards_;

    // The free slabs and the chunks' slab counts, behind mutex_ (taken after a shard lock, never
    // before one; never held across a call into the source).
    std::mutex mutex_;
    slab_directory slabs_;
    chunk_directory chunks_;
    std::uint32_t free_slabs_ = none;
    std::uint64_t next_chunk_ = 0;
    std::atomic<std::uint64_t> free_slab_bytes_{0};
};

} // namespace nxmem::pool_detail
