// A lease on a pool's regions: while one is held the pool gives nothing back to its upstream and
// decommits nothing (trim, the retention limit and reclaim give back 0 bytes), so every region
// for_each_region listed keeps its address and its memory; the pool may still grow. What a
// transfer engine needs while the regions are registered with it (docs/HOST.md "Pools").
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

namespace nxmem {

namespace pool_detail {
// The count of leases and of give-backs in flight, as two counters each side sets before it
// reads the other's (sequentially consistent), so a give-back that started before a lease ends
// before the lease is granted, and none starts while one is held.
class lease_gate {
public:
    std::uint64_t leases() const noexcept { return leases_.load(); }

    // A give-back may proceed (true; end it with end_give_back) unless a lease is held.
    bool begin_give_back() noexcept {
        in_flight_.fetch_add(1);
        if (leases_.load() != 0) {
            in_flight_.fetch_sub(1);
            return false;
        }
        return true;
    }
    void end_give_back() noexcept { in_flight_.fetch_sub(1); }

    // Waits for the give-backs in flight (each a bounded walk of the pool's idle memory) to end.
    void acquire() noexcept {
        leases_.fetch_add(1);
        while (in_flight_.load() != 0) {
            std::this_thread::yield();
        }
    }
    void release() noexcept { leases_.fetch_sub(1); }

private:
    std::atomic<std::uint64_t> leases_{0};
    std::atomic<std::uint64_t> in_flight_{0};
};
} // namespace pool_detail

// Move-only; ends at destruction or reset(). Must end before its pool is destroyed, and must not
// be taken from inside a reclaim hook or an upstream call the pool is making (it would wait for
// the give-back that is calling it).
class pool_lease {
public:
    pool_lease() noexcept = default;
    explicit pool_lease(pool_detail::lease_gate& gate) noexcept : gate_(&gate) { gate_->acquire(); }
    pool_lease(pool_lease&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}
    pool_lease& operator=(pool_lease&& other) noexcept {
        if (this != &other) {
            reset();
            gate_ = std::exchange(other.gate_, nullptr);
        }
        return *this;
    }
    pool_lease(const pool_lease&) = delete;
    pool_lease& operator=(const pool_lease&) = delete;
    ~pool_lease() { reset(); }

    void reset() noexcept {
        if (gate_ != nullptr) {
            std::exchange(gate_, nullptr)->release();
        }
    }
    bool held() const noexcept { return gate_ != nullptr; }

private:
    pool_detail::lease_gate* gate_ = nullptr;
};

} // namespace nxmem
