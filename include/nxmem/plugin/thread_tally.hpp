// Counts that every call changes and few read: one cache-line cell per thread, summed when asked.
// A call writes only its own thread's cell, with a plain load and store (no locked instruction,
// no cache line shared with other threads); a reader sums every cell. Finding the cell takes no
// thread_local (see this_thread_identity).
#pragma once

#include <array>
#include <bit>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace nxmem::plugin {

namespace detail {

// The first threads of a module that count own a cell each (up to owned_tally_cells of them); a
// thread that finds no free cell near its home uses the last one, which its users change with
// atomic read-modify-writes. A power of two owned: a thread's home cell is a shift of its hash.
inline constexpr std::size_t owned_tally_cells = 64;
inline constexpr std::size_t tally_cells = owned_tally_cells + 1;
inline constexpr std::size_t shared_tally_cell = owned_tally_cells;
// How far from its home cell a thread looks for one to own.
inline constexpr std::size_t tally_probe_limit = 8;

// Names the calling thread, without a thread_local: a dlopen'ed module reaches its own
// thread_locals through __tls_get_addr (a call, on every count), and an initial-exec one would
// take static TLS space that a reloaded module may not get back. The thread pointer is unique
// among live threads; a new thread may get a dead one's, and with it the dead thread's cell,
// which no one else then writes.
inline std::uintptr_t this_thread_identity() noexcept {
#if defined(__x86_64__) && defined(__linux__)
    std::uintptr_t self = 0;
    asm("mov %%fs:0, %0" : "=r"(self)); // glibc's and musl's TCB start with a pointer to itself
    return self;
#elif defined(__aarch64__)
    return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
#else
    static thread_local const char marker = 0; // trivially destructible: the module still unloads
    return reinterpret_cast<std::uintptr_t>(&marker);
#endif
}

// Which thread owns each cell of this module's tallies (0: none yet). Written once per cell, when
// a thread first counts; read by every count, which writes nothing here.
inline std::array<std::atomic<std::uintptr_t>, owned_tally_cells>& tally_cell_owners() noexcept {
    static std::array<std::atomic<std::uintptr_t>, owned_tally_cells> owners{};
    return owners;
}

// Fibonacci hashing: thread pointers differ in their high bits (one stack apart).
inline std::size_t tally_home(std::uintptr_t thread) noexcept {
    static_assert(std::has_single_bit(owned_tally_cells));
    constexpr int home_bits = std::countr_zero(owned_tally_cells);
    return static_cast<std::size_t>((static_cast<std::uint64_t>(thread) * 0x9E3779B97F4A7C15ull) >>
                                    (64 - home_bits));
}

// A thread not in its home cell: finds the cell it owns near home or claims a free one, else
// shares the last one.
[[gnu::noinline]] inline std::size_t find_tally_cell(std::uintptr_t thread, std::size_t home) noexcept {
    auto& owners = tally_cell_owners();
    for (std::size_t probed = 0, at = home; probed < tally_probe_limit;
         ++probed, at = (at + 1) % owned_tally_cells) {
        std::uintptr_t owner = owners[at].load(std::memory_order_relaxed);
        if (owner == 0 &&
            owners[at].compare_exchange_strong(owner, thread, std::memory_order_relaxed)) {
            return at;
        }
        if (owner == thread) {
            return at;
        }
    }
    return shared_tally_cell;
}

// This thread's cell, the same in every tally of this module: a compare against the owner of
// its home cell in the common case.
inline std::size_t this_thread_tally_cell() noexcept {
    const std::uintptr_t thread = this_thread_identity();
    const std::size_t home = tally_home(thread);
    if (tally_cell_owners()[home].load(std::memory_order_relaxed) == thread) [[likely]] {
        return home;
    }
    return find_tally_cell(thread, home);
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
