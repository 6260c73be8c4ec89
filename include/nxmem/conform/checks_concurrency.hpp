// Several threads allocating and releasing at once for a bounded number of iterations (and, when
// the mechanism offers it, enqueueing and draining); host memory is written and verified, so two
// threads handed overlapping memory are caught. Afterwards the plugin's unload report is all zero.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_allocation.hpp>
#include <nxmem/conform/subject.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace nxmem::conform {

struct check_concurrency_threads {
    template <Device D> static finding run(const subject& target, const suite_options& options) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        const bool deferred = (allocator.capabilities() & NXMEM_CAP_DEFERRED_RELEASE) != 0;
        std::mutex mutex;
        std::string first_problem;
        auto report = [&](std::string problem) {
            std::lock_guard lock(mutex);
            if (first_problem.empty()) {
                first_problem = std::move(problem);
            }
        };
        auto worker = [&](unsigned thread) {
            constexpr std::size_t held = 4; // allocations each thread keeps live at once
            std::array<std::optional<allocation<D>>, held> live;
            const auto pattern = static_cast<unsigned char>(0x11 * (thread % 15 + 1));
            auto give_back = [&](const allocation<D>& made, unsigned iteration) {
                if constexpr (std::is_same_v<D, cpu_device>) {
                    const auto* bytes = static_cast<const unsigned char*>(made.address);
                    for (std::uint64_t at = 0; at < made.size; ++at) {
                        if (bytes[at] != pattern) {
                            report("thread " + std::to_string(thread) + " found byte " +
                                   std::to_string(at) + " of its allocation overwritten");
                            break;
                        }
                    }
                }
                if (deferred && iteration % 8 == 0) {
                    result<std::uint64_t> ticket = allocator.enqueue_release(made);
                    if (!ticket) {
                        report("enqueue_release: " + ticket.error().describe());
                    }
                    result<std::vector<host::release_completion>> drained = allocator.drain_releases();
                    if (!drained) {
                        report("drain_releases: " + drained.error().describe());
                    }
                    return;
                }
                result<release_report> released = allocator.release(made);
                if (!released) {
                    report("release: " + released.error().describe());
                }
            };
            for (unsigned iteration = 0; iteration < options.iterations; ++iteration) {
                std::optional<allocation<D>>& slot = live[iteration % held];
                if (slot) {
                    give_back(*slot, iteration);
                    slot.reset();
                }
                const std::uint64_t size = 1 + (iteration * 2654435761u + thread * 97u) % 8192;
                const std::uint64_t alignment = 1ull << ((iteration + thread) % 8);
                result<allocation<D>> made = allocator.allocate(size, alignment);
                if (!made) {
                    report("allocate " + std::to_string(size) + " bytes: " + made.error().describe());
                    break;
                }
                slot = made.value();
                if constexpr (std::is_same_v<D, cpu_device>) {
                    if (result<void> usable = detail::make_usable(allocator, made.value()); !usable) {
                        report("commit of the legal range [0, " + std::to_string(size) +
                               ") refused: " + usable.error().describe());
                        (void)allocator.release(made.value()); // never written: never read back
                        slot.reset();
                        break;
                    }
                    std::memset(made.value().address, pattern, size);
                }
            }
            for (unsigned index = 0; index < held; ++index) {
                if (live[index]) {
                    give_back(*live[index], 1); // released at once, not queued
                }
            }
        };
        std::vector<std::thread> threads;
        for (unsigned thread = 0; thread < options.threads; ++thread) {
            threads.emplace_back(worker, thread);
        }
        for (std::thread& running : threads) {
            running.join();
        }
        if (deferred) {
            for (unsigned attempt = 0; attempt < options.drain_attempts; ++attempt) {
                NXMEM_CONFORM_TRY(readiness, "the plugin reports its readiness", opened.module()->readiness());
                if (readiness.host.queued_releases == 0) {
                    break;
                }
                result<std::vector<host::release_completion>> drained = allocator.drain_releases();
                if (!drained) {
                    report("drain_releases: " + drained.error().describe());
                    break;
                }
            }
        }
        const std::string what = std::to_string(options.threads) + " threads x " +
                                 std::to_string(options.iterations) + " iterations";
        if (!first_problem.empty()) {
            return failed(what + " without a failure", first_problem);
        }
        opened.close_allocator();
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (!after.idle()) {
            return failed("an all-zero unload report after " + what, after.describe());
        }
        return passed();
    }
};

} // namespace nxmem::conform
