// Counts that every call changes and few read: one cache-line cell per thread, summed when asked.
// A call writes only its own thread's cell, with a plain load and store (no locked instruction,
// no cache line shared with other threads); a reader sums every cell.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace nxmem::plugin {

namespace detail {

inline constexpr std::size_t tally_cells = 64;
// The first tally_cells - 1 threads of a module that count own a cell each; later threads share
// the last one, which they change with atomic read-modify-writes.
inline constexpr std::size_t shared_tally_cell = tally_cells - 1;

// This thread's cell, the same in every tally of this module. The thread_local is trivially
// destructible on purpose: one with a destructor registers it with glibc, which then keeps the
// module mapped until the thread exits, and a plugin must really unload.
inline std::size_t this_thread_tally_cell() noexcept {
    static std::atomic<std::size_t> next_cell{0};
    static thread_local std::size_t cell = tally_cells;
    if (cell == tally_cells) [[unlikely]] {
        cell = std::min(next_cell.fetch_add(1, std::memory_order_relaxed), shared_tally_cell);
    }
    return cell;
}

} // namespace detail

// `Fields` signed counts. A count may go negative in one cell (allocated on one thread, released
// on another); only the sum means anything.
template <std::size_t Fields> class thread_tally {
    static_assert(Fields >= 1 && Fields * sizeof(std::int64_t) <= 64, "a cell is one cache line");

public:
    // This thread's cell: take it once when a call changes several counts.
    class cell_ref {
    public:
        void add(std::size_t field, std::int64_t delta) noexcept {
            std::atomic<std::int64_t>& count = counts_[field];
            if (shared_) [[unlikely]] {
                count.fetch_add(delta, std::memory_order_relaxed);
            } else { // no other thread writes this cell
                count.store(count.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
            }
        }

    private:
        friend class thread_tally;
        cell_ref(std::array<std::atomic<std::int64_t>, Fields>& counts, bool shared) noexcept
            : counts_(counts), shared_(shared) {}
        std::array<std::atomic<std::int64_t>, Fields>& counts_;
        bool shared_;
    };

    cell_ref this_thread() noexcept {
        const std::size_t at = detail::this_thread_tally_cell();
        return cell_ref(cells_[at].counts, at == detail::shared_tally_cell);
    }

    void add(std::size_t field, std::int64_t delta) noexcept { this_thread().add(field, delta); }

    // Every cell's count of `field`. Exact once the changes it must see happen-before the call
    // (the host's unload query follows the releases it waited for); while other threads count it
    // is one of the values the count passed through or is about to.
    std::int64_t sum(std::size_t field) const noexcept {
        std::int64_t total = 0;
        for (const cell& each : cells_) {
            total += each.counts[field].load(std::memory_order_relaxed);
        }
        return total;
    }

private:
    struct alignas(64) cell {
        std::array<std::atomic<std::int64_t>, Fields> counts{};
    };
    std::array<cell, detail::tally_cells> cells_{};
};

} // namespace nxmem::plugin
