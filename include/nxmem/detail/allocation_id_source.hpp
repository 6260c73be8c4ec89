// Allocation ids (docs/ABI.md M3): unique across their source (a host module, a heap_allocator),
// never reused, never derived from an address, and increasing in the order each thread allocates.
// A source owns sixteen counters,
// each on its own cache line; counter i issues i + 1, i + 1 + 16, i + 1 + 32, ... so no two
// counters ever issue the same id. A thread always draws from the same counter, and threads alive
// at the same time draw from different ones (up to sixteen of them), so they write no cache line
// they share. The ids live in the module, not
// in a process-wide variable: code that includes the host twice (two shared objects built with
// hidden visibility) still draws one source's ids from one place.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace nxmem::detail {

class allocation_id_source {
public:
    static constexpr std::size_t lanes = 16;
    // The lane that threads beyond the first fifteen alive at once share.
    static constexpr std::size_t shared_lane = lanes - 1;
    static_assert(lanes <= 32, "the lanes held are bits of one 32-bit word");

    allocation_id_source() noexcept {
        for (std::size_t lane = 0; lane < lanes; ++lane) {
            lanes_[lane].next.store(lane + 1, std::memory_order_relaxed);
        }
    }

    std::uint64_t next() noexcept {
        const lane_lease& lease = lease_of_this_thread();
        std::atomic<std::uint64_t>& counter = lanes_[lease.lane()].next;
        if (lease.owned()) [[likely]] {
            // Only this thread writes a lane it holds: a plain add, no locked instruction. The
            // lease's hand-over (release on exit, acquire on take) orders it with the next holder.
            const std::uint64_t id = counter.load(std::memory_order_relaxed);
            counter.store(id + lanes, std::memory_order_relaxed);
            return id;
        }
        return counter.fetch_add(lanes, std::memory_order_relaxed);
    }

private:
    // A thread holds a lane from its first allocation until it exits; a new thread takes the
    // lowest of the first fifteen lanes no live thread holds. Threads beyond fifteen alive at once
    // share the last lane, with atomic read-modify-writes (slower, never wrong), so a held lane
    // has exactly one writer. The lanes held are per program (or per copy of this code).
    class lane_lease {
    public:
        lane_lease() noexcept : lane_(take()), owned_(lane_ < shared_lane) {}
        ~lane_lease() {
            if (owned_) {
                held().fetch_and(~(std::uint32_t{1} << lane_), std::memory_order_release);
            }
        }
        lane_lease(const lane_lease&) = delete;
        lane_lease& operator=(const lane_lease&) = delete;
        std::size_t lane() const noexcept { return lane_; }
        bool owned() const noexcept { return owned_; }

    private:
        // The lowest ownable lane nobody holds, now held; the shared lane when all are.
        static std::size_t take() noexcept {
            std::uint32_t taken = held().load(std::memory_order_relaxed);
            for (;;) {
                const std::uint32_t free = ~taken & ((std::uint32_t{1} << shared_lane) - 1);
                if (free == 0) {
                    return shared_lane;
                }
                const auto lane = static_cast<std::size_t>(std::countr_zero(free));
                if (held().compare_exchange_weak(taken, taken | (std::uint32_t{1} << lane),
                                                 std::memory_order_acquire, std::memory_order_relaxed)) {
                    return lane;
                }
            }
        }
        static std::atomic<std::uint32_t>& held() noexcept {
            static std::atomic<std::uint32_t> lanes_held{0};
            return lanes_held;
        }

        std::size_t lane_;
        bool owned_;
    };

    static const lane_lease& lease_of_this_thread() noexcept {
        thread_local const lane_lease lease;
        return lease;
    }

    struct alignas(64) lane {
        std::atomic<std::uint64_t> next{0};
    };
    std::array<lane, lanes> lanes_;
};

} // namespace nxmem::detail
