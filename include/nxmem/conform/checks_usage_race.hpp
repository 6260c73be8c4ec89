// A usage query racing allocate and release (ABI.md G6): while worker threads each allocate and
// release one block at a time, the query's totals stay within what could be live at once (no
// count above the workers' blocks, none wrapped below zero), and once they stop the totals are
// those from before. A plugin that computes a total from two counters read one after the other
// (allocations made minus released) reports a wrapped, astronomically large figure under the race.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/detail/state_snapshot.hpp>
#include <nxmem/conform/check_revision.hpp>
#include <nxmem/conform/step.hpp>
#include <nxmem/conform/subject.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace nxmem::conform {

// concurrency.usage_consistent (G6).
struct check_concurrency_usage_consistent {
    static constexpr check_revision revision{"G6", "1.2", "2026-12-04", false,
                                            "the host reads usage only to report it; a governor that acts "
                                            "on a wrapped total is misled, not corrupted"};

    template <Device D> static finding run(const subject& target, const suite_options& options) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        const detail::raw_slots slots(opened.allocator());
        if (slots.table().query_usage == nullptr) {
            return not_applicable("the mechanism offers no usage query");
        }
        constexpr std::uint64_t block = 4096;
        const std::optional<NxmemAllocatorUsage> idle = detail::raw_usage(slots);
        if (!idle) {
            return failed("query_usage answers", "it failed with nothing live");
        }
        // What one block adds, measured alone.
        NXMEM_CONFORM_TRY(one, "a 4096-byte allocation", slots.allocate(block, 64));
        const std::optional<NxmemAllocatorUsage> with_one = detail::raw_usage(slots);
        (void)slots.deallocate(one);
        if (!with_one) {
            return failed("query_usage answers", "it failed with one allocation live");
        }
        const std::uint64_t workers = options.threads < 2 ? 2 : options.threads;
        const std::uint64_t rounds = options.iterations * 10;
        const std::uint64_t reserved_each = with_one->reserved_bytes - idle->reserved_bytes;
        const std::uint64_t mapped_each = with_one->mapped_bytes - idle->mapped_bytes;

        announce_step(std::to_string(workers) + " threads allocate and release 4096 bytes, " + std::to_string(rounds) +
                      " times each at least, while this one queries usage " + std::to_string(rounds) +
                      " times at least");
        // The workers go on until the queries are done, and the queries until the workers have
        // done their rounds: however the threads are scheduled, every query races the workers.
        std::atomic<std::uint64_t> running{workers};
        std::atomic<bool> queried{false};
        std::vector<std::thread> threads;
        for (std::uint64_t worker = 0; worker < workers; ++worker) {
            threads.emplace_back([&] {
                for (std::uint64_t round = 0; round < rounds || !queried.load(); ++round) {
                    result<NxmemAllocation> live = slots.allocate(block, 64);
                    if (live) {
                        (void)slots.deallocate(live.value());
                    }
                    if (round + 1 == rounds) {
                        running.fetch_sub(1);
                    }
                }
            });
        }
        std::string broken;
        std::uint64_t queries = 0;
        while (running.load() != 0 || queries < rounds) {
            if (!broken.empty()) {
                break;
            }
            const std::optional<NxmemAllocatorUsage> now = detail::raw_usage(slots);
            ++queries;
            if (!now) {
                continue;
            }
            auto over = [&](const char* field, std::uint64_t value, std::uint64_t base, std::uint64_t each) {
                const std::uint64_t most = base + workers * each;
                if (broken.empty() && value > most) {
                    broken = std::string("NxmemAllocatorUsage.") + field + " = " + std::to_string(value) +
                             " with at most " + std::to_string(workers) + " blocks live (at most " +
                             std::to_string(most) + ")" + (value > (1ull << 63) ? ": a total wrapped below zero" : "");
                }
            };
            over("live_allocations", now->live_allocations, idle->live_allocations, 1);
            over("reserved_bytes", now->reserved_bytes, idle->reserved_bytes, reserved_each);
            over("mapped_bytes", now->mapped_bytes, idle->mapped_bytes, mapped_each);
        }
        queried.store(true);
        for (std::thread& thread : threads) {
            thread.join();
        }
        if (!broken.empty()) {
            return failed("usage totals a serial order of the racing calls could give (G6)",
                          broken + ", after " + std::to_string(queries) + " queries");
        }
        const std::optional<NxmemAllocatorUsage> after = detail::raw_usage(slots);
        if (!after || after->live_allocations != idle->live_allocations ||
            after->reserved_bytes != idle->reserved_bytes || after->mapped_bytes != idle->mapped_bytes) {
            return failed("the totals of before once every racing call returned (G6)",
                          after ? "live_allocations " + std::to_string(after->live_allocations) + ", reserved_bytes " +
                                      std::to_string(after->reserved_bytes) + ", mapped_bytes " +
                                      std::to_string(after->mapped_bytes)
                                : std::string("query_usage failed"));
        }
        return passed();
    }
};

} // namespace nxmem::conform
