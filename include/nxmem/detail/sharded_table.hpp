// A map from 64-bit keys to records, split into shards with a lock each, so threads working on
// different keys rarely share a lock and no lock is process-wide. Used by the host (keyed by
// allocation id) and by the plugin kit (keyed by address). Nothing is called with a lock held
// except the caller's `match`, which must only compare.
#pragma once

#include <nxmem/abi/result.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nxmem::detail {

template <class Record> class sharded_table {
public:
    void insert(std::uint64_t key, Record record) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.mutex);
        owner.records.insert_or_assign(key, std::move(record));
    }

    // Removes and returns the record at `key` if `match(const Record*)` accepts it (it receives
    // nullptr when there is none); otherwise returns match's failure and changes nothing.
    template <class Match> result<Record> take(std::uint64_t key, Match&& match) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.mutex);
        auto found = owner.records.find(key);
        NXMEM_TRY_VOID(match(found == owner.records.end() ? nullptr : &found->second));
        Record record = std::move(found->second);
        owner.records.erase(found);
        return record;
    }

    // A copy of the record at `key`, if `match` accepts it.
    template <class Match> result<Record> find(std::uint64_t key, Match&& match) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.mutex);
        auto found = owner.records.find(key);
        NXMEM_TRY_VOID(match(found == owner.records.end() ? nullptr : &found->second));
        return found->second;
    }

    // Applies `change(Record&)` to the record at `key`; false when there is none.
    template <class Change> bool update(std::uint64_t key, Change&& change) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.mutex);
        auto found = owner.records.find(key);
        if (found == owner.records.end()) {
            return false;
        }
        change(found->second);
        return true;
    }

    // Applies `change(Record&)` to the record at `key` if `match(const Record*)` accepts it, and
    // returns a copy of the changed record; otherwise returns match's failure.
    template <class Match, class Change>
    result<Record> modify(std::uint64_t key, Match&& match, Change&& change) {
        shard& owner = shard_of(key);
        std::lock_guard lock(owner.mutex);
        auto found = owner.records.find(key);
        NXMEM_TRY_VOID(match(found == owner.records.end() ? nullptr : &found->second));
        change(found->second);
        return found->second;
    }

    // Removes the records one at a time and hands each to `each(key, Record&&)` with no lock
    // held; allocates nothing, so destructors can use it.
    template <class Each> void take_each(Each&& each) noexcept {
        for (shard& owner : shards_) {
            for (;;) {
                typename decltype(owner.records)::node_type node;
                {
                    std::lock_guard lock(owner.mutex);
                    if (owner.records.empty()) {
                        break;
                    }
                    node = owner.records.extract(owner.records.begin());
                }
                each(node.key(), std::move(node.mapped()));
            }
        }
    }

    // Every record, removed.
    std::vector<std::pair<std::uint64_t, Record>> take_all() {
        std::vector<std::pair<std::uint64_t, Record>> all;
        for (shard& owner : shards_) {
            std::lock_guard lock(owner.mutex);
            for (auto& entry : owner.records) {
                all.emplace_back(entry.first, std::move(entry.second));
            }
            owner.records.clear();
        }
        return all;
    }

private:
    struct shard {
        std::mutex mutex;
        std::unordered_map<std::uint64_t, Record> records;
    };

    // Fibonacci hashing: sequential ids and aligned addresses both spread over the shards.
    shard& shard_of(std::uint64_t key) {
        return shards_[(key * 0x9E3779B97F4A7C15ull) >> (64 - shard_bits)];
    }

    static constexpr unsigned shard_bits = 4;
    std::array<shard, 1u << shard_bits> shards_;
};

} // namespace nxmem::detail
