// residency_tags: an engine's resident pools by tag (weights, KV cache, graph buffers), slept and
// woken together, as vLLM's sleep(level) / wake_up(tags) and torch_memory_saver's pause(tag) /
// resume(tag) do. It holds the pools weakly: a pool the engine destroyed is forgotten.
//
// Each pool's sleep or wake is all or nothing; a group's is not: pools are taken in the order
// they were added, those done stay done, and the first failure ends the call, naming its pool
// (the pools after it are not tried). An unknown tag is refused before anything moves.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/residency/resident_memory.hpp>
#include <nxmem/residency/residency_state.hpp>
#include <nxmem/residency/sleep_policy.hpp>

#include <algorithm>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace nxmem {

class residency_tags {
public:
    // Several pools may share a tag.
    void add(const std::shared_ptr<resident_memory>& pool) {
        std::lock_guard lock(mutex_);
        pools_.push_back(pool);
    }

    // The pools under `tags` (every pool when empty), each put to sleep per `policy`.
    result<residency_report> sleep(std::span<const std::string> tags, const sleep_policy& policy) {
        return for_each_tagged(tags, [&](resident_memory& pool) { return pool.sleep(policy); });
    }
    result<residency_report> wake(std::span<const std::string> tags) {
        return for_each_tagged(tags, [](resident_memory& pool) { return pool.wake(); });
    }

    std::vector<residency_usage> usage() const {
        std::vector<residency_usage> figures;
        for (const auto& pool : live_pools()) {
            figures.push_back(pool->residency());
        }
        return figures;
    }
    std::vector<std::string> tags() const {
        std::vector<std::string> names;
        for (const auto& pool : live_pools()) {
            if (std::find(names.begin(), names.end(), pool->tag()) == names.end()) {
                names.push_back(pool->tag());
            }
        }
        return names;
    }

private:
    // The live pools, held strongly for the call (no lock is held while they run).
    std::vector<std::shared_ptr<resident_memory>> live_pools() const {
        std::lock_guard lock(mutex_);
        std::vector<std::shared_ptr<resident_memory>> live;
        for (const auto& weak : pools_) {
            if (auto pool = weak.lock()) {
                live.push_back(std::move(pool));
            }
        }
        std::erase_if(pools_, [](const std::weak_ptr<resident_memory>& weak) { return weak.expired(); });
        return live;
    }

    template <class Change> result<residency_report> for_each_tagged(std::span<const std::string> tags, Change&& change) {
        std::vector<std::shared_ptr<resident_memory>> chosen = live_pools();
        if (!tags.empty()) {
            for (const std::string& tag : tags) {
                if (std::none_of(chosen.begin(), chosen.end(), [&](const auto& pool) { return pool->tag() == tag; })) {
                    return fail(status_code::invalid_argument, "no resident pool has the tag '" + tag + "'");
                }
            }
            std::erase_if(chosen, [&](const auto& pool) {
                return std::find(tags.begin(), tags.end(), pool->tag()) == tags.end();
            });
        }
        residency_report total;
        for (const auto& pool : chosen) {
            auto done = change(*pool);
            if (!done.has_value()) {
                return std::move(done).error();
            }
            const residency_report& one = done.value();
            total.pools += one.pools;
            total.unchanged_pools += one.unchanged_pools;
            total.ranges += one.ranges;
            total.bytes += one.bytes;
            total.backed_up_bytes += one.backed_up_bytes;
            total.still_resident_bytes += one.still_resident_bytes;
        }
        return total;
    }

    mutable std::mutex mutex_;
    mutable std::vector<std::weak_ptr<resident_memory>> pools_;
};

} // namespace nxmem
