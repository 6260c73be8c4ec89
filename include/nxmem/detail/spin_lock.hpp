// A lock for critical sections a few dozen instructions long (a hash-table probe): taking and
// dropping it costs two atomic instructions where a std::mutex pair costs about forty, and a
// waiter that spins too long yields its core rather than burning it.
#pragma once

#include <atomic>
#include <thread>

namespace nxmem::detail {

class spin_lock {
public:
    void lock() noexcept {
        if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]] {
            return;
        }
        wait_and_lock();
    }
    bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

private:
    // Out of line: an uncontended lock is one exchange, and its callers stay small.
    [[gnu::noinline]] void wait_and_lock() noexcept {
        for (unsigned spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
            // Wait on a plain load so the cache line stays shared until the holder lets go.
            while (locked_.load(std::memory_order_relaxed)) {
                if (++spins >= spins_before_yield) {
                    spins = 0;
                    std::this_thread::yield(); // the holder may have been preempted
                }
            }
        }
    }

    static constexpr unsigned spins_before_yield = 64;
    std::atomic<bool> locked_{false};
};

} // namespace nxmem::detail
