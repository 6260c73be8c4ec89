// A map from 64-bit keys to records, split into shards with a lock each, so threads working on
// different keys rarely share a lock and no lock is process-wide. Used by the host (keyed by
// allocation id) and by the plugin kit and plugins (keyed by address). Nothing is called with a
// lock held except the caller's `match`/`change`/`visit`, which must only compare or assign.
//
// Each shard is an open-addressing array of {key, record} slots (Robin Hood linear probing,
// backward-shift deletion, so no tombstones): no heap node per record. A shard owns its cache
// lines (its header and its slot array are cache-line aligned and padded), so two threads on two
// shards never write the same line. Which shard a key goes to is the table's Sharding policy:
// shard_by_hash spreads any keys; shard_by_lane keeps each id lane of an allocation_id_source in
// a shard of its own, so threads (each drawing ids from its own lane) never meet on a shard. A shard grows by about 1.25x
// when it passes 90% full and, after removals leave it under 36% full, shrinks back to 72%; the
// load stays between 0.36 and 0.9 and the memory follows the live count down as well as up.
// Growth allocates (and throws std::bad_alloc with the table unchanged); shrinking is skipped when
// memory is short, so removal never fails and never needs memory.
//
// A record that weighs something (weighted_record: the bytes of an allocation, say) is summed per
// shard beside the count, under the shard's lock that the change holds anyway, so no counter is
// one every thread writes; a total is read with every shard's lock held for a moment.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/spin_lock.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

namespace nxmem::detail {

// Fibonacci hashing: sequential ids and aligned addresses both spread over shards and slots.
constexpr std::uint64_t fibonacci_mix(std::uint64_t key) noexcept {
    return key * 0x9E3779B97F4A7C15ull;
}

// Sharding policies: `shard(key)` picks one of 16 shards, `slot_hash(key)` places the key in its
// shard (its high bits are used, so they must vary among the keys of one shard).

// Any keys: the top four bits of the hash pick the shard, the bits below place the key.
struct shard_by_hash {
    static std::size_t shard(std::uint64_t key) noexcept {
        return static_cast<std::size_t>(fibonacci_mix(key) >> 60);
    }
    static std::uint64_t slot_hash(std::uint64_t key) noexcept { return fibonacci_mix(key) << 4; }
};

// Allocation ids from an allocation_id_source, whose lane i issues i + 1, i + 1 + 16, ...: the
// shard is the id's lane. A thread draws every id from one lane, so it only ever locks and writes
// its own shard; on other keys the policy still works, it only loses that property.
struct shard_by_lane {
    static std::size_t shard(std::uint64_t key) noexcept {
        return static_cast<std::size_t>((key - 1) % 16);
    }
    static std::uint64_t slot_hash(std::uint64_t key) noexcept {
        return fibonacci_mix((key - 1) / 16); // the id's rank within its lane
    }
};

// "the record has a weight the table sums: std::uint64_t weight() const noexcept"
template <class Record>
concept weighted_record = requires(const Record& record) {
    { record.weight() } noexcept -> std::same_as<std::uint64_t>;
};

template <class Record, class Sharding = shard_by_hash> class sharded_table {
    static_assert(std::is_nothrow_default_constructible_v<Record> &&
                      std::is_nothrow_move_constructible_v<Record> &&
                      std::is_nothrow_move_assignable_v<Record>,
                  "records move without throwing: a failed growth must leave the table intact");

    struct slot {
        std::uint64_t key = 0; // empty_key marks a free slot
        Record record{};
    };

public:
    // The bytes one slot takes; a shard holds between 1/0.9 and 1/0.36 slots per record.
    static constexpr std::size_t slot_bytes = sizeof(slot);
    static constexpr std::size_t shard_count = 16;

    // Where visit saw a record: lets erase skip the lookup. Only a hint; a record the shard has
    // moved since (another insert or removal) is looked up again.
    struct position {
        std::size_t slot = ~std::size_t{0};
    };

    sharded_table() = default;
    sharded_table(const sharded_table&) = delete;
    sharded_table& operator=(const sharded_table&) = delete;
    ~sharded_table() {
        for (shard& owner : shards_) {
            free_slots(owner.slots, owner.capacity);
        }
    }

    // Inserts, or replaces the record already at `key`. Throws std::bad_alloc, changing nothing,
    // when the shard must grow and cannot.
    void insert(std::uint64_t key, Record record) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        owner.reserve_one(); // may grow by one record's room needlessly when the key is there
        owner.insert_or_assign(key, std::move(record));
    }

    // Removes and returns the record at `key` if `match(const Record*)` accepts it (it receives
    // nullptr when there is none); otherwise returns match's failure and changes nothing. The
    // room the record took stays free for its return: putting it back never allocates unless
    // other inserts filled the shard meanwhile.
    template <class Match> result<Record> take(std::uint64_t key, Match&& match) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        const std::size_t at = owner.slot_of(key);
        NXMEM_TRY_VOID(match(static_cast<const Record*>(owner.record_at(key, at))));
        return owner.take_found(key, at);
    }

    // take without a result: `match(const Record*)` returns a plain verdict (true accepts), so
    // the success path builds no error; on acceptance the record is moved into `taken`. Returns
    // match's verdict.
    template <class Match> auto take_into(std::uint64_t key, Record& taken, Match&& match) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        const std::size_t at = owner.slot_of(key);
        auto verdict = match(static_cast<const Record*>(owner.record_at(key, at)));
        if (static_cast<bool>(verdict)) [[likely]] {
            taken = owner.take_found(key, at);
        }
        return verdict;
    }

    // Removes the record at `key`, if there is one; never allocates, never fails. `seen`, where
    // visit found the record, spares the lookup while the record is still there.
    bool erase(std::uint64_t key, position seen = {}) noexcept {
        shard& owner = shard_of(key);
        owner.lock.lock();
        // Fast path, with no call in it so the inlined erase saves no registers: the record is
        // where visit saw it, nothing after it needs shifting back and no shrink is due.
        if (seen.slot < owner.capacity && owner.slots[seen.slot].key == key && key != empty_key)
            [[likely]] {
            const std::size_t after = owner.next(seen.slot);
            if ((owner.slots[after].key == empty_key || owner.distance(after) == 0) &&
                !owner.sparse_after_removal()) [[likely]] {
                --owner.count;
                owner.published_count.store(owner.count, std::memory_order_relaxed);
                owner.weigh_out(owner.slots[seen.slot].record);
                owner.slots[seen.slot].key = empty_key;
                owner.slots[seen.slot].record = Record{};
                owner.lock.unlock();
                return true;
            }
        }
        return erase_locked(owner, key, seen);
    }

private:
    // erase's general case, entered with the shard's lock held; drops it.
    [[gnu::noinline]] static bool erase_locked(auto& owner, std::uint64_t key, position seen) noexcept {
        std::lock_guard lock(owner.lock, std::adopt_lock);
        if (key == empty_key) {
            if (!owner.has_empty_key) {
                return false;
            }
            (void)owner.remove(key);
        } else {
            const bool still_there = seen.slot < owner.capacity && owner.slots[seen.slot].key == key;
            const std::size_t at = still_there ? seen.slot : owner.look_up(key);
            if (at == not_found) {
                return false;
            }
            (void)owner.remove_at(at);
        }
        owner.shrink_if_sparse(0);
        return true;
    }

public:
    // A copy of the record at `key`, if `match` accepts it.
    template <class Match> result<Record> find(std::uint64_t key, Match&& match) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        const Record* found = owner.find(key);
        NXMEM_TRY_VOID(match(found));
        return *found;
    }

    // Calls `visit(Record*)` (nullptr when there is no record at `key`) under the shard's lock and
    // returns what it returns: one step to check and change a record without building a result.
    template <class Visit> decltype(auto) visit(std::uint64_t key, Visit&& visit) {
        position ignored;
        return this->visit(key, std::forward<Visit>(visit), ignored);
    }
    // The same, noting where the record is in `seen`.
    template <class Visit> decltype(auto) visit(std::uint64_t key, Visit&& visit, position& seen) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        if (key == empty_key) {
            return visit(owner.find(key));
        }
        seen.slot = owner.index_of(key);
        return visit(seen.slot == not_found ? nullptr : &owner.slots[seen.slot].record);
    }

    // Applies `change(Record&)` to the record at `key`; false when there is none.
    template <class Change> bool update(std::uint64_t key, Change&& change) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        Record* found = owner.find(key);
        if (found == nullptr) {
            return false;
        }
        owner.weigh_out(*found);
        change(*found);
        owner.weigh_in(*found);
        return true;
    }

    // Applies `change(Record&)` to the record at `key` if `match(const Record*)` accepts it, and
    // returns a copy of the changed record; otherwise returns match's failure.
    template <class Match, class Change>
    result<Record> modify(std::uint64_t key, Match&& match, Change&& change) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.lock);
        Record* found = owner.find(key);
        NXMEM_TRY_VOID(match(static_cast<const Record*>(found)));
        owner.weigh_out(*found);
        change(*found);
        owner.weigh_in(*found);
        return *found;
    }

    // Removes the records one at a time and hands each to `each(key, Record&&)` with no lock
    // held; allocates nothing, so destructors can use it.
    template <class Each> void take_each(Each&& each) noexcept {
        for (shard& owner : shards_) {
            std::size_t cursor = 0;
            for (;;) {
                std::uint64_t key = 0;
                Record record{};
                {
                    std::lock_guard lock(owner.lock);
                    if (owner.count == 0) {
                        break;
                    }
                    key = owner.next_key(cursor);
                    record = owner.remove(key);
                }
                each(key, std::move(record));
            }
        }
    }

    // Records held now (a sum of per-shard counts: exact when no call is in flight).
    std::size_t size() const noexcept {
        std::size_t total = 0;
        for (const shard& owner : shards_) {
            total += owner.published_count.load(std::memory_order_relaxed);
        }
        return total;
    }

    // The records' total weight at one instant, for a weighted_record, handed to
    // `with_total(std::uint64_t)` while every shard's lock is still held (taken in shard order;
    // no other path holds two), so the caller can add totals kept under a lock of its own that
    // ranks after the shards'. Summed shard by shard without the locks, a record that left a
    // shard already read for one not yet read would count twice, more than was ever held at once
    // (docs/ABI.md G6).
    // It stops every shard for a moment: for rare readers (a usage query).
    template <class WithTotal>
    auto weight_at_once(WithTotal&& with_total) noexcept(noexcept(with_total(std::uint64_t{})))
        requires weighted_record<Record>
    {
        for (shard& owner : shards_) {
            owner.lock.lock();
        }
        struct unlock_all {
            std::array<shard, shard_count>& shards;
            ~unlock_all() {
                for (shard& owner : shards) {
                    owner.lock.unlock();
                }
            }
        } held{shards_};
        std::uint64_t total = 0;
        for (const shard& owner : shards_) {
            total += owner.published_weight.load(std::memory_order_relaxed);
        }
        return with_total(total);
    }

    // The bytes the table holds: its shards and their slot arrays.
    std::size_t bytes() const noexcept {
        std::size_t total = sizeof(*this);
        for (const shard& owner : shards_) {
            total += array_bytes(owner.published_capacity.load(std::memory_order_relaxed));
        }
        return total;
    }

private:
    static constexpr std::uint64_t empty_key = 0;
    static constexpr std::size_t not_found = ~std::size_t{0};
    static constexpr std::size_t min_capacity = 8;
    static constexpr std::size_t cache_line = 64;

    // A slot array takes whole cache lines of its own: the slots of two shards never share one.
    static constexpr std::size_t array_bytes(std::size_t capacity) noexcept {
        return (capacity * sizeof(slot) + cache_line - 1) / cache_line * cache_line;
    }
    static slot* allocate_slots(std::size_t capacity) {
        auto* array = static_cast<slot*>(
            ::operator new(array_bytes(capacity), std::align_val_t{cache_line}));
        std::uninitialized_value_construct_n(array, capacity);
        return array;
    }
    static void free_slots(slot* array, std::size_t capacity) noexcept {
        if (array != nullptr) {
            std::destroy_n(array, capacity);
            ::operator delete(array, std::align_val_t{cache_line});
        }
    }

    struct unweighed {};

    // A slot array plus the one record whose key is empty_key, kept beside it.
    struct alignas(64) shard {
        spin_lock lock;
        bool has_empty_key = false;
        slot* slots = nullptr;
        std::size_t capacity = 0; // 0 until the first insert
        std::size_t count = 0;    // records in `slots`, plus the empty-key one
        // Copies of count and capacity readable without the lock (size(), bytes()).
        std::atomic<std::size_t> published_count{0};
        std::atomic<std::size_t> published_capacity{0};
        // The weighted records' total, only ever written under the lock (weight_at_once); takes
        // no room in a shard of unweighted records.
        [[no_unique_address]] std::conditional_t<weighted_record<Record>, std::atomic<std::uint64_t>,
                                                 unweighed> published_weight{};
        Record empty_key_record{};

        // A record comes into the shard's total or leaves it (nothing for an unweighted record).
        void weigh_in(const Record& record) noexcept {
            if constexpr (weighted_record<Record>) {
                published_weight.store(published_weight.load(std::memory_order_relaxed) + record.weight(),
                                       std::memory_order_relaxed);
            }
        }
        void weigh_out(const Record& record) noexcept {
            if constexpr (weighted_record<Record>) {
                published_weight.store(published_weight.load(std::memory_order_relaxed) - record.weight(),
                                       std::memory_order_relaxed);
            }
        }

        // The slot a key would sit in with no collision: a multiply-shift of the policy's slot
        // hash, so any capacity works (not only powers of two).
        std::size_t home(std::uint64_t key) const noexcept {
            const std::uint64_t bits = Sharding::slot_hash(key);
            return static_cast<std::size_t>((static_cast<wide>(bits) * capacity) >> 64);
        }
        std::size_t distance(std::size_t at) const noexcept {
            const std::size_t from = home(slots[at].key);
            return at >= from ? at - from : at + capacity - from;
        }
        std::size_t next(std::size_t at) const noexcept { return at + 1 == capacity ? 0 : at + 1; }

        Record* find(std::uint64_t key) noexcept {
            if (key == empty_key) {
                return has_empty_key ? &empty_key_record : nullptr;
            }
            const std::size_t at = index_of(key);
            return at == not_found ? nullptr : &slots[at].record;
        }
        // The slot holding `key` (not empty_key), or not_found.
        std::size_t index_of(std::uint64_t key) const noexcept {
            if (capacity == 0) {
                return not_found;
            }
            std::size_t at = home(key);
            for (std::size_t probed = 0;; ++probed, at = next(at)) {
                if (slots[at].key == key) {
                    return at;
                }
                // Robin Hood order: a record further from its home than this key would be has
                // been passed, so the key is not in the array.
                if (slots[at].key == empty_key || distance(at) < probed) {
                    return not_found;
                }
            }
        }

        // index_of, also for empty_key (not_found when absent; the slot index is unused then).
        std::size_t slot_of(std::uint64_t key) const noexcept {
            if (key == empty_key) {
                return has_empty_key ? 0 : not_found;
            }
            return index_of(key);
        }
        Record* record_at(std::uint64_t key, std::size_t at) noexcept {
            if (at == not_found) {
                return nullptr;
            }
            return key == empty_key ? &empty_key_record : &slots[at].record;
        }
        // Removes the record slot_of found, with no second probe. Whether the shard is sparse is
        // judged with the record still counted and the shrink keeps room for it, so putting it
        // back never allocates (the same sizes as shrinking before the removal).
        Record take_found(std::uint64_t key, std::size_t at) noexcept {
            const bool sparse = capacity > min_capacity && count * 25 < capacity * 9;
            Record taken = key == empty_key ? remove(key) : remove_at(at);
            if (sparse) [[unlikely]] {
                shrink(2); // the removed record and one more, as shrink_if_sparse(1) before it
            }
            return taken;
        }

        // index_of, out of line: for erase, whose caller mostly knows the slot already.
        [[gnu::noinline]] std::size_t look_up(std::uint64_t key) const noexcept { return index_of(key); }

        // Replaces the record at `key`, or places it, in one probe; room is reserved.
        void insert_or_assign(std::uint64_t key, Record&& record) noexcept {
            if (key == empty_key) {
                if (!has_empty_key) {
                    ++count;
                    published_count.store(count, std::memory_order_relaxed);
                } else {
                    weigh_out(empty_key_record);
                }
                has_empty_key = true;
                weigh_in(record);
                empty_key_record = std::move(record);
                return;
            }
            std::size_t at = home(key);
            for (std::size_t probed = 0;; ++probed, at = next(at)) {
                if (slots[at].key == key) {
                    weigh_out(slots[at].record);
                    weigh_in(record);
                    slots[at].record = std::move(record);
                    return;
                }
                // Where a lookup would stop, the key is absent: place it from here.
                if (slots[at].key == empty_key || distance(at) < probed) {
                    ++count;
                    published_count.store(count, std::memory_order_relaxed);
                    weigh_in(record);
                    place_from(slots, at, probed, key, std::move(record));
                    return;
                }
            }
        }

        // Room for one more record; throws std::bad_alloc, changing nothing.
        void reserve_one() {
            if ((count + 1) * 10 > capacity * 9) [[unlikely]] {
                rehash(std::max(min_capacity, (count + 1) * 25 / 18)); // load 0.72 after
            }
        }

        void place_in(slot* array, std::uint64_t key, Record&& record) noexcept {
            place_from(array, home(key), 0, key, std::move(record));
        }
        // Robin Hood insertion of an absent key, starting `probed` slots past its home at `at`.
        void place_from(slot* array, std::size_t at, std::size_t probed, std::uint64_t key,
                        Record&& record) noexcept {
            slot carried{key, std::move(record)};
            for (;; ++probed, at = next(at)) {
                if (array[at].key == empty_key) {
                    array[at] = std::move(carried);
                    return;
                }
                const std::size_t resident = home(array[at].key);
                const std::size_t resident_distance =
                    at >= resident ? at - resident : at + capacity - resident;
                if (resident_distance < probed) { // the richer record moves on
                    std::swap(carried, array[at]);
                    probed = resident_distance;
                }
            }
        }

        // Removes a key that is in the table.
        Record remove(std::uint64_t key) noexcept {
            if (key == empty_key) {
                --count;
                published_count.store(count, std::memory_order_relaxed);
                weigh_out(empty_key_record);
                has_empty_key = false;
                return std::exchange(empty_key_record, Record{});
            }
            std::size_t at = home(key);
            while (slots[at].key != key) {
                at = next(at);
            }
            return remove_at(at);
        }
        // Removes the record in slot `at`; shifts the records after it back one slot, so no
        // tombstone is left for later probes to step over.
        Record remove_at(std::size_t at) noexcept {
            --count;
            published_count.store(count, std::memory_order_relaxed);
            weigh_out(slots[at].record);
            Record taken = std::move(slots[at].record);
            const std::size_t after = next(at);
            if (slots[after].key != empty_key && distance(after) != 0) {
                at = shift_back(at); // out of line: the common removal stays a few instructions
            }
            slots[at].key = empty_key;
            slots[at].record = Record{};
            return taken;
        }
        // Moves the displaced records after `at` back one slot each; returns the slot left empty.
        [[gnu::noinline]] std::size_t shift_back(std::size_t at) noexcept {
            for (std::size_t after = next(at);
                 slots[after].key != empty_key && distance(after) != 0; after = next(after)) {
                slots[at] = std::move(slots[after]);
                at = after;
            }
            return at;
        }

        // A key in the table, scanning on from `cursor` (take_each's position).
        std::uint64_t next_key(std::size_t& cursor) const noexcept {
            if (has_empty_key) {
                return empty_key;
            }
            for (;; cursor = next(cursor)) {
                if (slots[cursor].key != empty_key) {
                    return slots[cursor].key;
                }
            }
        }

        // Gives memory back once the shard is under 36% full, keeping room for `spare` more
        // records; skipped (the shard stays as it is) when the smaller array cannot be had.
        // Whether removing one record leaves the shard sparse enough to shrink.
        bool sparse_after_removal() const noexcept {
            return capacity > min_capacity && (count - 1) * 25 < capacity * 9;
        }
        void shrink_if_sparse(std::size_t spare) noexcept {
            if (capacity <= min_capacity || count * 25 >= capacity * 9) [[likely]] {
                return;
            }
            shrink(spare);
        }
        // Out of line: the hot insert and erase paths stay small enough to inline.
        [[gnu::noinline, gnu::cold]] void shrink(std::size_t spare) noexcept {
            try {
                rehash(std::max(min_capacity, (count + spare) * 25 / 18));
            } catch (const std::bad_alloc&) {
                // Memory is short: keep the larger array, which still holds everything.
            }
        }

        [[gnu::noinline]] void rehash(std::size_t new_capacity) {
            slot* fresh = allocate_slots(new_capacity);
            slot* old = slots;
            const std::size_t old_capacity = capacity;
            capacity = new_capacity;
            for (std::size_t at = 0; at < old_capacity; ++at) {
                if (old[at].key != empty_key) {
                    place_in(fresh, old[at].key, std::move(old[at].record));
                }
            }
            slots = fresh;
            published_capacity.store(capacity, std::memory_order_relaxed);
            free_slots(old, old_capacity);
        }
    };

    __extension__ using wide = unsigned __int128; // for the multiply-shift range reduction
    static_assert(shard_count == 16, "the sharding policies pick one of 16 shards");
    static_assert(sizeof(shard) % cache_line == 0);

    shard& shard_of(std::uint64_t key) noexcept { return shards_[Sharding::shard(key)]; }

    std::array<shard, shard_count> shards_;
};

} // namespace nxmem::detail
