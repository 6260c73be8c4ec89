// A mechanism's live shared prefixes by id (posix-lazy's memfds, cuda-vmm's chunk sets), and the
// checks every commit_shared_prefix makes before mapping one. The table lock is held only for a
// lookup, an insert or an erase; what a prefix holds is released by its owner outside the lock.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace nxmem::posix {

template <class Prefix> class prefix_table {
public:
    // An id for a prefix about to be made; ids are never reused.
    std::uint64_t next_id() noexcept { return next_id_.fetch_add(1, std::memory_order_relaxed); }

    void insert(std::uint64_t prefix_id, std::shared_ptr<Prefix> prefix) {
        std::lock_guard lock(mutex_);
        prefixes_.emplace(prefix_id, std::move(prefix));
    }

    // The live prefix `prefix_id`; INVALID_ARGUMENT naming it when there is none.
    result<std::shared_ptr<Prefix>> find(std::uint64_t prefix_id, const char* mechanism) const {
        std::lock_guard lock(mutex_);
        auto found = prefixes_.find(prefix_id);
        if (found == prefixes_.end()) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": no live shared prefix " + std::to_string(prefix_id));
        }
        return found->second;
    }

    // Removes and returns the prefix; nullptr when there is none.
    std::shared_ptr<Prefix> take(std::uint64_t prefix_id) {
        std::lock_guard lock(mutex_);
        auto found = prefixes_.find(prefix_id);
        if (found == prefixes_.end()) {
            return nullptr;
        }
        std::shared_ptr<Prefix> gone = std::move(found->second);
        prefixes_.erase(found);
        return gone;
    }

    // Calls `visit(const Prefix&)` for each live prefix, under the table lock.
    template <class Visit> void for_each(Visit&& visit) const {
        std::lock_guard lock(mutex_);
        for (const auto& [prefix_id, prefix] : prefixes_) {
            visit(*prefix);
        }
    }

private:
    mutable std::mutex mutex_;
    std::unordered_map<std::uint64_t, std::shared_ptr<Prefix>> prefixes_;
    std::atomic<std::uint64_t> next_id_{1};
};

// INVALID_ARGUMENT unless the allocation at `address` (`size` bytes, mapping the prefix
// `mapped_id` already, or none when 0) can map a prefix of `prefix_size` bytes: one prefix per
// allocation, no larger than the allocation.
inline result<void> check_prefix_fits(const char* mechanism, std::uint64_t address, std::uint64_t size,
                                      std::uint64_t mapped_id, std::uint64_t prefix_size) {
    if (mapped_id != 0) {
        return fail(status_code::invalid_argument,
                    std::string(mechanism) + ": the allocation at 0x" + nxmem::detail::to_hex(address) +
                        " already maps shared prefix " + std::to_string(mapped_id) +
                        "; one prefix per allocation");
    }
    if (prefix_size > size) {
        return fail(status_code::invalid_argument,
                    std::string(mechanism) + ": a prefix of " + std::to_string(prefix_size) +
                        " bytes does not fit an allocation of " + std::to_string(size));
    }
    return boost::outcome_v2::success();
}

} // namespace nxmem::posix
