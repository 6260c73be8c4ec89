// A mechanism's live shared prefixes by id (posix-lazy's memfds, cuda-vmm's chunk sets), the checks
// every commit_shared_prefix makes before mapping one, and owned_fd, a descriptor a prefix owns:
// a Prefix holding one closes it when the last shared_ptr to it goes (taken out of the table, and
// let go by every mapping that held it), so no path forgets a close. The table lock is held only
// for a lookup, an insert or an erase; what a prefix holds is released outside the lock.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/detail/hex.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <unistd.h>
#include <utility>

namespace nxmem::plugin {

// A file descriptor with one owner: closed when the owner goes, moved never copied.
class owned_fd {
public:
    owned_fd() = default;
    explicit owned_fd(int fd) noexcept : fd_(fd) {}
    owned_fd(owned_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    owned_fd& operator=(owned_fd&& other) noexcept {
        if (this != &other) {
            reset(std::exchange(other.fd_, -1));
        }
        return *this;
    }
    owned_fd(const owned_fd&) = delete;
    owned_fd& operator=(const owned_fd&) = delete;
    ~owned_fd() { reset(); }

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    // Gives the descriptor up to the caller (who then closes it).
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset(int fd = -1) noexcept {
        if (fd_ >= 0) {
            ::close(fd_);
        }
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

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

    // Takes every prefix out (an allocator's teardown): each is freed, its descriptors closed, as
    // its last holder lets go. Returns how many there were.
    std::size_t take_all() {
        std::unordered_map<std::uint64_t, std::shared_ptr<Prefix>> gone;
        {
            std::lock_guard lock(mutex_);
            gone.swap(prefixes_);
        }
        return gone.size(); // freed here, outside the lock
    }

    std::size_t size() const {
        std::lock_guard lock(mutex_);
        return prefixes_.size();
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

} // namespace nxmem::plugin
