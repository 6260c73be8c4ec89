// Accounting: what a plugin says an allocation costs agrees with itself (the result's mapped_bytes
// with the virtual-backing or usage figures, a structured release's credit with the cost), and
// what it holds goes back: many allocate/release and load/unload cycles, and many factory
// create/release cycles, leave the process's heap, address space and resident memory where they
// were. Leaks are measured, not asked for, so they are visible for any plugin, without test-only
// exports.
#pragma once

#include <nxmem/abi/read_prefix.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/subject.hpp>

#include <unistd.h>

#include <cstddef>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define NXMEM_CONFORM_SANITIZED_HEAP 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NXMEM_CONFORM_SANITIZED_HEAP 1
#endif
#if defined(NXMEM_CONFORM_SANITIZED_HEAP)
// The sanitizers' public interface (sanitizer/allocator_interface.h, which GCC does not always
// install): the bytes the sanitizer's allocator has handed out and not had back.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// What the process holds, as far as it can be measured from inside it.
struct footprint {
    std::optional<std::uint64_t> heap_bytes; // malloc'd bytes in use; none where unmeasurable
    std::uint64_t address_space = 0;         // bytes of all mappings (/proc/self/maps)
    std::uint64_t mappings = 0;              // their number
    std::uint64_t resident = 0;              // resident bytes (/proc/self/statm)
};

#if !defined(NXMEM_CONFORM_SANITIZED_HEAP) && defined(__GLIBC__)
// glibc keeps a few freed small chunks per size in a per-thread cache (tcache: 7 of each size up
// to 1032 bytes by default), and mallinfo2 counts them as in use. That cache fills over the first
// dozens of cycles as sizes come up, tens of kilobytes that read as a leak. Filling every size's
// cache before each measurement makes its share the same at both: each size is allocated more
// times than the cache holds and freed again, and what the cache cannot take goes back to the
// free lists, which mallinfo2 counts as free.
inline void fill_thread_cache() {
    constexpr std::size_t cached_sizes = 64;     // chunk sizes 32 to 1040 bytes, 16 apart
    constexpr std::size_t chunks_per_size = 32;  // above glibc's default of 7 (and common tunings)
    void* held[cached_sizes][chunks_per_size]; // 16 KiB of stack
    for (std::size_t size = 0; size < cached_sizes; ++size) {
        for (void*& chunk : held[size]) {
            chunk = std::malloc(24 + 16 * size); // the largest request with a chunk of 32 + 16 * size
        }
    }
    for (auto& chunks : held) {
        for (void* chunk : chunks) {
            std::free(chunk);
        }
    }
}
#endif

// A sanitizer replaces malloc: its own count is exact; glibc's mallinfo2 counts every arena,
// measured with this thread's cache filled (fill_thread_cache).
inline std::optional<std::uint64_t> heap_bytes_in_use() {
#if defined(NXMEM_CONFORM_SANITIZED_HEAP)
    return static_cast<std::uint64_t>(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    fill_thread_cache();
    const struct mallinfo2 info = ::mallinfo2();
    return static_cast<std::uint64_t>(info.uordblks + info.hblkhd);
#else
    return std::nullopt;
#endif
}

// Whether a sanitizer's allocator runs the heap. It keeps freed memory in quarantine and maps
// fresh memory instead of reusing it: resident memory then says nothing, and address space grows
// with every byte allocated and freed, so the leak checks allow for that churn.
inline constexpr bool sanitized_heap =
#if defined(NXMEM_CONFORM_SANITIZED_HEAP)
    true;
#else
    false;
#endif
inline constexpr bool resident_is_meaningful = !sanitized_heap;

inline footprint measure_footprint() {
    footprint now;
    now.heap_bytes = heap_bytes_in_use();
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        const std::size_t dash = line.find('-');
        const std::size_t space = line.find(' ');
        if (dash == std::string::npos || space == std::string::npos || space < dash) {
            continue;
        }
        const std::uint64_t start = std::stoull(line.substr(0, dash), nullptr, 16);
        const std::uint64_t end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
        now.address_space += end - start;
        ++now.mappings;
    }
    std::ifstream statm("/proc/self/statm");
    std::uint64_t total_pages = 0;
    std::uint64_t resident_pages = 0;
    statm >> total_pages >> resident_pages;
    now.resident = resident_pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    return now;
}

inline std::string signed_bytes(std::uint64_t before, std::uint64_t after) {
    return after >= before ? "+" + std::to_string(after - before) : "-" + std::to_string(before - after);
}

// Growth beyond the limits is a leak; nullopt when none grew too much. `what` names the cycles.
inline std::optional<finding> judge_growth(const footprint& before, const footprint& after,
                                           std::uint64_t heap_limit, std::uint64_t memory_limit,
                                           const std::string& what) {
    const std::string measured =
        "heap " +
        (before.heap_bytes && after.heap_bytes ? signed_bytes(*before.heap_bytes, *after.heap_bytes)
                                               : std::string("not measurable")) +
        " bytes, address space " + signed_bytes(before.address_space, after.address_space) +
        " bytes (" + signed_bytes(before.mappings, after.mappings) + " mappings), resident " +
        signed_bytes(before.resident, after.resident) + " bytes after " + what;
    const bool heap_grew = before.heap_bytes && after.heap_bytes &&
                           *after.heap_bytes > *before.heap_bytes + heap_limit;
    const bool space_grew = after.address_space > before.address_space + memory_limit;
    const bool resident_grew =
        resident_is_meaningful && after.resident > before.resident + memory_limit;
    if (heap_grew || space_grew || resident_grew) {
        return failed("growth of at most " + std::to_string(heap_limit) + " heap bytes and " +
                          std::to_string(memory_limit) + " bytes of address space and resident memory",
                      measured);
    }
    return std::nullopt;
}

// The limits of a leak check, and what its cycles do (for the message).
struct growth_limits {
    std::uint64_t heap_bytes;
    std::uint64_t memory_bytes; // address space, and resident memory where meaningful
    std::string cycles;
};

// Runs `cycle` (std::optional<finding>(), a finding when a step fails) `warm_up` times, measures,
// runs it `measured` times, measures again and judges the growth.
template <class Cycle>
finding leak_over_cycles(Cycle&& cycle, unsigned warm_up, unsigned measured, const growth_limits& limits) {
    for (unsigned i = 0; i < warm_up; ++i) {
        if (std::optional<finding> broken = cycle()) {
            return *broken;
        }
    }
    const footprint before = measure_footprint();
    for (unsigned i = 0; i < measured; ++i) {
        if (std::optional<finding> broken = cycle()) {
            return *broken;
        }
    }
    const footprint after = measure_footprint();
    std::optional<finding> leaked = judge_growth(before, after, limits.heap_bytes, limits.memory_bytes,
                                                 std::to_string(measured) + " cycles of " + limits.cycles);
    return leaked ? *leaked : passed();
}

// The plugin's virtual-backing table, read as the host reads it; its slots take the allocator.
inline std::optional<NxmemVirtualBackingVtable> raw_virtual_backing(const raw_slots& slots) {
    result<abi::table_copy<NxmemVirtualBackingVtable>> copy =
        abi::read_prefix<NxmemVirtualBackingVtable>(slots.table().virtual_backing, NXMEM_ABI_MINOR);
    if (!copy) {
        return std::nullopt;
    }
    return copy.value().table;
}

inline slot_reply raw_commit(NxmemAllocatorVtable* self,
                             const NxmemVirtualBackingVtable& backing, const NxmemAllocation& live,
                             std::uint64_t offset, std::uint64_t length) {
    auto request = abi::make_struct<NxmemRangeRequest>();
    request.allocation = live;
    request.range = abi::make_struct<NxmemByteRange>();
    request.range.offset = offset;
    request.range.length = length;
    NxmemStatus status = abi::make_status();
    slot_reply reply;
    reply.code = backing.commit(self, &request, &status);
    reply.message = abi::read_status_message(status);
    return reply;
}

inline result<std::uint64_t> raw_mapped_bytes(NxmemAllocatorVtable* self,
                                              const NxmemVirtualBackingVtable& backing,
                                              const NxmemAllocation& live) {
    std::uint64_t bytes = 0;
    NxmemStatus status = abi::make_status();
    const NxmemStatusCode code = backing.mapped_bytes(self, &live, &bytes, &status);
    if (code != NXMEM_STATUS_OK) {
        return fail(status_code_from_wire(code), abi::read_status_message(status));
    }
    return bytes;
}

// A structured release's credit against the cost: COMPLETE credits it all; QUARANTINED credits
// part and keeps the rest. Another state is capability.structured_release's to judge.
inline finding judge_credit(const NxmemReleaseOutcome& outcome, std::uint64_t cost,
                            const std::string& what) {
    switch (outcome.state) {
    case NXMEM_RELEASE_COMPLETE:
        if (outcome.unmapped_bytes != cost) {
            return failed("COMPLETE crediting the " + std::to_string(cost) + " bytes " + what + " cost",
                          std::to_string(outcome.unmapped_bytes) + " bytes credited");
        }
        return passed();
    case NXMEM_RELEASE_QUARANTINED:
        if (outcome.unmapped_bytes + outcome.residual_owned_bytes != cost) {
            return failed("QUARANTINED crediting and keeping " + std::to_string(cost) + " bytes in all, what " +
                              what + " cost",
                          std::to_string(outcome.unmapped_bytes) + " credited and " +
                              std::to_string(outcome.residual_owned_bytes) + " kept");
        }
        return passed();
    default:
        return not_applicable("release_allocation reported state " + std::to_string(outcome.state) +
                              " (see capability.structured_release)");
    }
}

} // namespace detail

// accounting.cycles: load, open, allocate and release, close, unload, many times over; the
// process holds no more than before. The limits are a quarter of what the measured cycles
// allocate (address space and resident memory) and 2 KiB per cycle of heap: a mechanism that
// leaks its allocations, its mappings or its allocator's state exceeds them many times over,
// while the noise of the loader and the allocator stays far below.
struct check_accounting_cycles {
    static constexpr unsigned warm_up_cycles = 2;
    static constexpr unsigned measured_cycles = 24;
    static constexpr unsigned allocations_per_cycle = 64;
    static constexpr std::uint64_t allocation_bytes = 64 * 1024;

    template <Device D> static finding run(const subject& target, const suite_options&) {
        std::vector<allocation<D>> live;
        live.reserve(allocations_per_cycle); // the suite's own heap stays put across cycles
        auto cycle = [&]() -> std::optional<finding> {
            NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
            for (unsigned i = 0; i < allocations_per_cycle; ++i) {
                result<allocation<D>> made = opened.allocator().allocate(allocation_bytes, 4096);
                if (!made) {
                    for (const allocation<D>& earlier : live) {
                        (void)opened.allocator().release(earlier);
                    }
                    live.clear();
                    return failed(std::to_string(allocations_per_cycle) + " allocations of " +
                                      std::to_string(allocation_bytes) + " bytes",
                                  made.error().describe());
                }
                live.push_back(made.value());
            }
            for (const allocation<D>& made : live) {
                if (result<release_report> released = opened.allocator().release(made); !released) {
                    live.clear();
                    return failed("every allocation released", released.error().describe());
                }
            }
            live.clear();
            if (result<void> unloaded = opened.close(); !unloaded) {
                return failed("the plugin unloads after each cycle", unloaded.error().describe());
            }
            return std::nullopt;
        };
        constexpr std::uint64_t allocated =
            std::uint64_t{measured_cycles} * allocations_per_cycle * allocation_bytes;
        return detail::leak_over_cycles(cycle, warm_up_cycles, measured_cycles,
                                        {2048 * measured_cycles, allocated / 4,
                                         "load, open, " + std::to_string(allocations_per_cycle) +
                                             " allocations of " + std::to_string(allocation_bytes) +
                                             " bytes released, close and unload"});
    }
};

// accounting.release_credit: a structured release credits what the allocation cost: an eager
// allocation its result's mapped_bytes, a virtual-backing one its mapped_bytes after a commit.
struct check_accounting_release_credit {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if ((allocator.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_STRUCTURED_RELEASE");
        }
        const detail::raw_slots slots(allocator);
        if ((allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) == 0) {
            for (std::uint64_t size : {1000ull, 65537ull}) {
                const NxmemAllocRequest request = slots.request(size, 64);
                NxmemAllocResult out{};
                if (const detail::slot_reply made = slots.allocate(&request, out); !made.ok()) {
                    return failed("an allocation of " + std::to_string(size) + " bytes", made.describe());
                }
                NxmemReleaseOutcome ended{};
                const NxmemAllocation live = detail::raw_slots::describe(request, out);
                if (const detail::slot_reply released = slots.release_allocation(live, ended);
                    !released.ok()) {
                    (void)slots.deallocate(live);
                    return failed("release_allocation of " + std::to_string(size) + " bytes succeeds",
                                  released.describe());
                }
                finding judged = detail::judge_credit(
                    ended, out.mapped_bytes,
                    "an allocation of " + std::to_string(size) + " bytes (its result's mapped_bytes)");
                if (judged.verdict != outcome::pass) {
                    return judged;
                }
            }
            return passed();
        }
        NXMEM_CONFORM_TRY(backing_view, "the virtual backing view", allocator.virtual_backing());
        const std::uint64_t unit = std::max<std::uint64_t>(64 * 1024, backing_view.commit_granularity());
        const std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots);
        if (!backing) {
            return failed("a readable virtual-backing table", "the host cannot read it");
        }
        NXMEM_CONFORM_TRY(live, "a reservation of 4 range units", slots.allocate(4 * unit, unit));
        NxmemAllocatorVtable* self = allocator.raw_table();
        const detail::slot_reply committed = detail::raw_commit(self, *backing, live, 0, unit);
        result<std::uint64_t> cost = detail::raw_mapped_bytes(self, *backing, live);
        if (!committed.ok() || !cost) {
            (void)slots.deallocate(live);
            return failed("commit [0, " + std::to_string(unit) + ") and its mapped_bytes",
                          !committed.ok() ? committed.describe() : cost.error().describe());
        }
        NxmemReleaseOutcome ended{};
        if (const detail::slot_reply released = slots.release_allocation(live, ended); !released.ok()) {
            (void)slots.deallocate(live);
            return failed("release_allocation of a committed reservation succeeds", released.describe());
        }
        return detail::judge_credit(ended, cost.value(),
                                    "the committed reservation (its mapped_bytes)");
    }
};

// accounting.result_mapped: an allocation result's mapped_bytes is what the allocation costs, as
// the virtual-backing table's mapped_bytes (or else the usage query) reports it right after.
struct check_accounting_result_mapped {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        const detail::raw_slots slots(allocator);
        const bool virtual_backing = (allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0;
        const bool usage_query = (allocator.capabilities() & NXMEM_CAP_USAGE_QUERY) != 0;
        if (!virtual_backing && !usage_query) {
            return not_applicable("the mechanism declares neither NXMEM_CAP_VIRTUAL_BACKING nor "
                                  "NXMEM_CAP_USAGE_QUERY: nothing reports a cost to compare");
        }
        std::optional<allocator_usage> usage_before;
        if (!virtual_backing) {
            NXMEM_CONFORM_TRY(usage, "query_usage succeeds", allocator.query_usage());
            usage_before = usage;
        }
        const std::uint64_t size = 3 * 65536 + 1000; // not a multiple of any page size
        const NxmemAllocRequest request = slots.request(size, 4096);
        NxmemAllocResult out{};
        if (const detail::slot_reply made = slots.allocate(&request, out); !made.ok()) {
            return failed("an allocation of " + std::to_string(size) + " bytes", made.describe());
        }
        const NxmemAllocation live = detail::raw_slots::describe(request, out);
        std::uint64_t reported = 0;
        std::string source;
        std::optional<finding> broken;
        if (virtual_backing) {
            const std::optional<NxmemVirtualBackingVtable> backing = detail::raw_virtual_backing(slots);
            result<std::uint64_t> mapped =
                fail(status_code::contract_violation, "the host cannot read the virtual-backing table");
            if (backing) {
                mapped = detail::raw_mapped_bytes(allocator.raw_table(), *backing, live);
            }
            if (!mapped) {
                broken = failed("mapped_bytes of a new allocation", mapped.error().describe());
            } else {
                reported = mapped.value();
                source = "the virtual-backing table's mapped_bytes";
            }
        } else {
            result<allocator_usage> after = allocator.query_usage();
            if (!after) {
                broken = failed("query_usage succeeds", after.error().describe());
            } else {
                reported = after.value().mapped_bytes - usage_before->mapped_bytes;
                source = "the growth of the usage query's mapped_bytes";
            }
        }
        (void)slots.deallocate(live);
        if (broken) {
            return *broken;
        }
        if (reported != out.mapped_bytes) {
            return failed("a result's mapped_bytes equal to " + source + " (" + std::to_string(reported) +
                              ") for " + std::to_string(size) + " bytes",
                          std::to_string(out.mapped_bytes));
        }
        return passed();
    }
};

// accounting.factories: creating and releasing the factories many times over grows nothing.
// The limits: 16 bytes of heap per cycle (a leaked factory table alone is 56) and a quarter of a
// page of address space per cycle (16 KiB under a sanitizer, whose quarantine maps fresh memory
// for what the plugin's factories allocate and free).
struct check_accounting_factories {
    static constexpr unsigned warm_up_cycles = 4;
    static constexpr unsigned measured_cycles = 1024;

    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports",
                          detail::open_with_exports(target));
        auto cycle = [&]() -> std::optional<finding> {
            result<detail::raw_factories> made = detail::raw_factories::create(library);
            if (!made) {
                return failed("NxmemCreateAllocatorFactories succeeds", made.error().describe());
            }
            return std::nullopt; // released here, each through its own release slot
        };
        return detail::leak_over_cycles(
            cycle, warm_up_cycles, measured_cycles,
            {16 * measured_cycles, (detail::sanitized_heap ? 16384 : 1024) * measured_cycles,
             "NxmemCreateAllocatorFactories and each factory's release"});
    }
};

} // namespace nxmem::conform
