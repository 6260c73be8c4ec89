// The contract around the host's callbacks and the allocator's own lifetime: retain/release
// reference counting; callbacks that re-enter the plugin (release_completed and request_reclaim,
// each first from another thread, then on the calling thread, all under a watchdog); reclaim under
// a real budget, honoured and refused; a queued allocation no longer released directly; and
// negotiation refusing malformed ranges. The allocators here are opened by the suite itself
// (detail::callback_allocator), so the callbacks are the suite's.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/checks_exports.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/subject.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace nxmem::conform {

namespace detail {

inline std::chrono::milliseconds reentry_wait(const suite_options& options) {
    return std::chrono::milliseconds(options.reentry_wait_ms);
}

// How long a whole callback check may run before it counts as hung: the re-entering calls' own
// limits, and time for the allocations around them.
inline std::chrono::milliseconds check_deadline(const suite_options& options) {
    return reentry_wait(options) * 4 + std::chrono::seconds(30);
}

// Check::run_watched on a thread of its own, under the check's deadline (within_deadline). The
// subject and options are copied: an abandoned check keeps using them.
template <class Check> finding run_watched(const subject& target, const suite_options& options) {
    return within_deadline(check_deadline(options), [target, options](step_log& steps) {
        return Check::run_watched(target, options, steps);
    });
}

// What a callback found while re-entering the plugin; the first problem wins.
class reentry_report {
public:
    void problem(std::string expected, std::string actual) {
        std::lock_guard lock(mutex_);
        if (expected_.empty()) {
            expected_ = std::move(expected);
            actual_ = std::move(actual);
        }
    }
    bool clean() const {
        std::lock_guard lock(mutex_);
        return expected_.empty();
    }
    finding verdict() const {
        std::lock_guard lock(mutex_);
        return expected_.empty() ? passed() : failed(expected_, actual_);
    }

private:
    mutable std::mutex mutex_;
    std::string expected_;
    std::string actual_;
};

// A small allocation made and released, as a re-entering caller would; the failure, if any.
// Under pressure (`tight`) running out of memory is an answer, not a failure.
inline std::optional<std::string> allocate_and_release(const raw_slots& slots, bool tight = false) {
    result<NxmemAllocation> made = slots.allocate(64, 8);
    if (!made && tight &&
        (made.error().code == status_code::out_of_memory || made.error().code == status_code::host_refused)) {
        return std::nullopt;
    }
    if (!made) {
        return "allocate: " + made.error().describe();
    }
    const slot_reply released = slots.deallocate(made.value());
    if (!released.ok()) {
        return "deallocate: " + released.describe();
    }
    return std::nullopt;
}

// Re-enters the plugin from inside one of its callbacks named `callback`: first `call` from
// another thread (kept in `pending` until the plugin's outer call returns), which a plugin holding
// its own lock across the callback blocks; then, if that returned, `call` on this thread (H4).
inline void reenter(const char* callback, const std::function<std::optional<std::string>()>& call,
                    std::vector<std::unique_ptr<side_call>>& pending, reentry_report& report,
                    std::chrono::milliseconds limit) {
    if (!report.clean()) {
        return; // already blocked once: do not wait again for every later callback
    }
    auto outcome = std::make_shared<std::optional<std::string>>();
    pending.push_back(std::make_unique<side_call>([call, outcome] { *outcome = call(); }));
    if (!pending.back()->returned_within(limit)) {
        report.problem(std::string("a call from another thread returns while the plugin is in ") +
                           callback + " (no plugin lock held across a host callback, T2)",
                       "blocked for " + std::to_string(limit.count()) + " ms: the plugin holds a " +
                           "lock across " + callback);
        return;
    }
    if (*outcome) {
        report.problem(std::string("a call from another thread during ") + callback + " succeeds",
                       **outcome);
        return;
    }
    if (std::optional<std::string> failure = call()) {
        report.problem(std::string("a call re-entering the plugin on the same thread from ") +
                           callback + " succeeds (H4)",
                       *failure);
    }
}

// Joins the side calls once the plugin's outer call has returned.
inline void finish_all(std::vector<std::unique_ptr<side_call>>& pending) {
    for (auto& call : pending) {
        call->finish();
    }
    pending.clear();
}

// The allocator a deferred-release check drives, opened with the suite's callbacks
// (release_completed offered), or the verdict to return instead: a failure when it does not open,
// not applicable when it does not declare deferred release.
using deferred_release_allocator = std::variant<std::unique_ptr<callback_allocator>, finding>;
inline deferred_release_allocator open_with_deferred_release(const subject& target,
                                                             callback_host& callbacks) {
    result<std::unique_ptr<callback_allocator>> opened = callback_allocator::open(target, callbacks.table());
    if (!opened) {
        return failed("the mechanism opens with release_completed offered", opened.error().describe());
    }
    if ((opened.value()->capabilities() & NXMEM_CAP_DEFERRED_RELEASE) == 0) {
        return not_applicable("the mechanism does not declare NXMEM_CAP_DEFERRED_RELEASE");
    }
    return std::move(opened).value();
}

} // namespace detail

// callbacks.retain_release: each retain keeps the allocator alive through one more release; the
// last release frees it.
struct check_callbacks_retain_release {
    static finding run(const subject& target, const suite_options&) {
        detail::callback_host callbacks; // a host offering both, as the host library does
        callbacks.on_reclaim = [](const NxmemReclaimRequest&, NxmemStatus*) { return NXMEM_STATUS_OK; };
        callbacks.on_completed = [](const NxmemReleaseCompletion&) {};
        NXMEM_CONFORM_TRY(opened, "the mechanism opens",
                          detail::callback_allocator::open(target, callbacks.table()));
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened->counts());
        const std::uint64_t baseline = before.allocators - 1; // the one just opened
        opened->retain();
        opened->retain();
        for (int drop = 1; drop <= 2; ++drop) {
            opened->release_reference();
            NXMEM_CONFORM_TRY(now, "the plugin reports its readiness", opened->counts());
            if (now.allocators != baseline + 1) {
                opened->forget_references(); // it is gone: no reference left to drop
                return failed("the allocator alive after release " + std::to_string(drop) +
                                  " of 3 (opened once, retained twice)",
                              now.describe());
            }
            if (std::optional<std::string> failure = detail::allocate_and_release(opened->slots())) {
                return failed("a retained allocator still allocates after release " +
                                  std::to_string(drop) + " of 3",
                              *failure);
            }
        }
        opened->release_reference();
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened->counts());
        if (after.allocators != baseline) {
            return failed("the allocator freed by the last of 3 releases", after.describe());
        }
        return passed();
    }
};

// callbacks.completion_reentry: release_completed may re-enter the plugin: another thread's
// allocate and drain_releases return meanwhile (a concurrent drain returns OK at once, D11), and
// so do the same calls on the calling thread; tickets still retire once each, in enqueue order.
struct check_callbacks_completion_reentry {
    static finding run(const subject& target, const suite_options& options) {
        return detail::run_watched<check_callbacks_completion_reentry>(target, options);
    }

    static finding run_watched(const subject& target, const suite_options& options,
                               detail::step_log& steps) {
        detail::callback_host callbacks;
        detail::reentry_report report;
        std::vector<std::unique_ptr<detail::side_call>> pending;
        std::mutex retired_mutex; // a concurrent drain may deliver on the side thread
        std::vector<std::uint64_t> retired;
        std::optional<detail::raw_slots> slots;
        std::atomic<bool> inside{false};
        std::atomic<bool> draining{false}; // inside the suite's own drain_releases call
        std::optional<std::uint64_t> twice; // a ticket retired a second time
        callbacks.on_completed = [&](const NxmemReleaseCompletion& completion) {
            {
                std::lock_guard lock(retired_mutex);
                if (std::find(retired.begin(), retired.end(), completion.ticket) != retired.end() && !twice) {
                    twice = completion.ticket;
                }
                retired.push_back(completion.ticket);
            }
            if (!draining) {
                return; // delivered outside a drain (inside enqueue_release, D7): only counted
            }
            if (inside.exchange(true)) {
                return; // a completion delivered by a re-entering call: only counted
            }
            steps.at("release_completed for ticket " + std::to_string(completion.ticket) +
                     " re-entering allocate and drain_releases");
            auto drain_again = [&]() -> std::optional<std::string> {
                if (std::optional<std::string> failure = detail::allocate_and_release(*slots)) {
                    return failure;
                }
                std::uint64_t count = 0;
                const detail::slot_reply drained = slots->drain_releases(count);
                if (!drained.ok()) {
                    return "drain_releases: " + drained.describe();
                }
                if (count != 0) {
                    return "drain_releases retired " + std::to_string(count) +
                           " while another drain was running (D11: OK with 0 retired)";
                }
                return std::nullopt;
            };
            detail::reenter("release_completed", drain_again, pending, report,
                            detail::reentry_wait(options));
            inside = false;
        };
        steps.at("opening the mechanism");
        detail::deferred_release_allocator opening = detail::open_with_deferred_release(target, callbacks);
        if (const finding* verdict = std::get_if<finding>(&opening)) {
            return *verdict;
        }
        const std::unique_ptr<detail::callback_allocator>& opened = std::get<0>(opening);
        slots.emplace(opened->slots());
        std::vector<std::uint64_t> tickets;
        for (std::uint64_t ticket = 101; ticket <= 103; ++ticket) {
            steps.at("enqueue_release of ticket " + std::to_string(ticket));
            NXMEM_CONFORM_TRY(made, "an allocation to release later", slots->allocate(4096, 64));
            const detail::slot_reply queued = slots->enqueue_release(made, ticket);
            if (!queued.ok()) {
                (void)slots->deallocate(made);
                return failed("enqueue_release succeeds", queued.describe());
            }
            tickets.push_back(ticket);
        }
        for (unsigned attempt = 0; attempt < options.drain_attempts && retired.size() < tickets.size();
             ++attempt) {
            steps.at("drain_releases (attempt " + std::to_string(attempt + 1) + ")");
            std::uint64_t count = 0;
            draining = true;
            const detail::slot_reply drained = slots->drain_releases(count);
            draining = false;
            finish_all(pending);
            if (!drained.ok()) {
                return failed("drain_releases succeeds", drained.describe());
            }
            if (!report.clean() || twice) {
                break;
            }
        }
        if (twice) { // blamed before any re-entry finding: the drain that re-entered was sound
            return failed("each ticket retired once",
                          "ticket " + std::to_string(*twice) +
                              " retired twice: release_completed was called for it again after "
                              "it had retired (D3, D7)");
        }
        if (!report.clean()) {
            return report.verdict();
        }
        if (retired != tickets) {
            return failed("tickets 101 102 103 retired once each, in enqueue order",
                          "retired " + detail::describe_tickets(retired));
        }
        return passed();
    }
};

// callbacks.completion_enqueues: release_completed enqueues one more release on the calling
// thread. Every ticket retires exactly once, within the drains allowed, in enqueue order overall:
// the three queued before it first, then the one enqueued from the callback (D3, H5), which the
// running drain or a later one retires. A ticket the plugin retires inside its own
// enqueue_release is D7's and not held to the order.
struct check_callbacks_completion_enqueues {
    static finding run(const subject& target, const suite_options& options) {
        return detail::run_watched<check_callbacks_completion_enqueues>(target, options);
    }

    static finding run_watched(const subject& target, const suite_options& options,
                               detail::step_log& steps) {
        detail::callback_host callbacks;
        std::mutex retired_mutex; // D7: a completion may come from the plugin's own thread
        std::vector<std::uint64_t> retired;
        std::vector<std::uint64_t> retired_in_enqueue; // D7: outside any drain, inside its own enqueue
        std::optional<detail::raw_slots> slots;
        std::atomic<bool> draining{false};
        std::atomic<bool> enqueued_inside{false};
        std::optional<std::uint64_t> enqueuing; // the ticket whose enqueue_release is running
        std::optional<std::string> problem;
        const std::vector<std::uint64_t> tickets = detail::tickets_across_2_32(4);
        callbacks.on_completed = [&](const NxmemReleaseCompletion& completion) {
            {
                const std::lock_guard lock(retired_mutex);
                retired.push_back(completion.ticket);
                if (enqueuing == completion.ticket) {
                    retired_in_enqueue.push_back(completion.ticket);
                }
            }
            if (!draining || enqueued_inside.exchange(true)) {
                return; // one enqueue, from the first completion a drain delivers
            }
            steps.at("release_completed for ticket " + std::to_string(completion.ticket) +
                     " enqueuing ticket " + std::to_string(tickets.back()));
            result<NxmemAllocation> made = slots->allocate(4096, 64);
            if (!made) {
                const std::lock_guard lock(retired_mutex);
                problem = "allocate inside release_completed: " + made.error().describe();
                return;
            }
            {
                const std::lock_guard lock(retired_mutex);
                enqueuing = tickets.back();
            }
            const detail::slot_reply queued = slots->enqueue_release(made.value(), tickets.back());
            if (!queued.ok()) {
                (void)slots->deallocate(made.value());
            }
            const std::lock_guard lock(retired_mutex);
            enqueuing.reset();
            if (!queued.ok()) {
                problem = "enqueue_release inside release_completed: " + queued.describe();
            }
        };
        steps.at("opening the mechanism");
        detail::deferred_release_allocator opening = detail::open_with_deferred_release(target, callbacks);
        if (const finding* verdict = std::get_if<finding>(&opening)) {
            return *verdict;
        }
        const std::unique_ptr<detail::callback_allocator>& opened = std::get<0>(opening);
        slots.emplace(opened->slots());
        for (std::size_t index = 0; index + 1 < tickets.size(); ++index) {
            steps.at("enqueue_release of ticket " + std::to_string(tickets[index]));
            NXMEM_CONFORM_TRY(made, "an allocation to release later", slots->allocate(4096, 64));
            {
                const std::lock_guard lock(retired_mutex);
                enqueuing = tickets[index];
            }
            const detail::slot_reply queued = slots->enqueue_release(made, tickets[index]);
            {
                const std::lock_guard lock(retired_mutex);
                enqueuing.reset();
            }
            if (!queued.ok()) {
                (void)slots->deallocate(made);
                return failed("enqueue_release succeeds", queued.describe());
            }
        }
        auto retired_now = [&] {
            const std::lock_guard lock(retired_mutex);
            return retired;
        };
        auto problem_now = [&] {
            const std::lock_guard lock(retired_mutex);
            return problem;
        };
        for (unsigned attempt = 0; attempt < options.drain_attempts && !problem_now() &&
                                   (retired_now().size() < tickets.size() || !enqueued_inside);
             ++attempt) {
            steps.at("drain_releases (attempt " + std::to_string(attempt + 1) + ")");
            std::uint64_t count = 0;
            draining = true;
            const detail::slot_reply drained = slots->drain_releases(count);
            draining = false;
            if (!drained.ok()) {
                return failed("drain_releases succeeds", drained.describe());
            }
        }
        if (const std::optional<std::string> failure = problem_now()) {
            return failed_rule("T5",
                               "a call re-entering the plugin on the same thread from release_completed "
                               "succeeds (T5, H4)",
                               *failure);
        }
        if (!enqueued_inside) {
            return not_applicable("no drain delivered a completion (every ticket retired inside enqueue_release, D7)");
        }
        const std::lock_guard lock(retired_mutex); // a late completion from the plugin's thread waits
        // In enqueue order, leaving out what retired inside its own enqueue_release (D7).
        auto drained_only = [&](const std::vector<std::uint64_t>& all) {
            std::vector<std::uint64_t> kept;
            std::copy_if(all.begin(), all.end(), std::back_inserter(kept), [&](std::uint64_t ticket) {
                return std::find(retired_in_enqueue.begin(), retired_in_enqueue.end(), ticket) ==
                       retired_in_enqueue.end();
            });
            return kept;
        };
        const std::vector<std::uint64_t> seen = retired;
        const std::vector<std::uint64_t> in_order = drained_only(seen);
        const std::vector<std::uint64_t> expected_order = drained_only(tickets);
        std::vector<std::uint64_t> sorted = seen;
        std::sort(sorted.begin(), sorted.end());
        if (sorted != tickets || in_order != expected_order) {
            return failed_rule("D3 H5",
                               "tickets " + detail::describe_tickets(tickets) + " retired once each within " +
                                   std::to_string(options.drain_attempts) +
                                   " drains, in enqueue order, the last enqueued from inside the first "
                                   "completion (D3, H5)",
                               "retired " + detail::describe_tickets(seen));
        }
        return passed();
    }
};

// callbacks.reclaim_pressure: allocations under the mechanism's budget (set with
// `nxmem conform --options`) until it calls request_reclaim; the suite honours the request by
// releasing an allocation from inside the callback (re-entering the plugin) and the allocation
// succeeds; then it refuses, and the allocation fails cleanly (OUT_OF_MEMORY or HOST_REFUSED,
// nothing left allocated); a host without the hook gets OUT_OF_MEMORY once over budget (H6).
struct check_callbacks_reclaim_pressure {
    static constexpr std::uint64_t block_bytes = 64 * 1024;
    static constexpr unsigned max_blocks = 1024; // 64 MiB: a budget beyond that is not pressure

    static finding run(const subject& target, const suite_options& options) {
        return detail::run_watched<check_callbacks_reclaim_pressure>(target, options);
    }

    static finding run_watched(const subject& target, const suite_options& options,
                               detail::step_log& steps) {
        enum class answer { honour, refuse };
        detail::callback_host callbacks;
        detail::reentry_report report;
        std::vector<std::unique_ptr<detail::side_call>> pending;
        std::optional<detail::raw_slots> slots;
        std::deque<NxmemAllocation> held;
        std::atomic<bool> inside{false};
        answer mode = answer::honour;
        unsigned asked = 0;
        callbacks.on_reclaim = [&](const NxmemReclaimRequest&, NxmemStatus* status) -> NxmemStatusCode {
            if (inside.exchange(true)) {
                return NXMEM_STATUS_OK; // a re-entering call's own request: nothing more to free
            }
            ++asked;
            steps.at("request_reclaim re-entering allocate");
            detail::reenter("request_reclaim",
                            [&] { return detail::allocate_and_release(*slots, true); }, pending, report,
                            detail::reentry_wait(options));
            NxmemStatusCode code = NXMEM_STATUS_OK;
            if (mode == answer::refuse) {
                code = abi::write_status(status, NXMEM_STATUS_HOST_REFUSED,
                                         "the conformance host refuses to reclaim");
            } else if (!held.empty() && report.clean()) {
                steps.at("request_reclaim releasing an allocation on the calling thread");
                const detail::slot_reply released = slots->deallocate(held.front());
                if (!released.ok()) {
                    report.problem("deallocate re-entered from request_reclaim succeeds (H4)",
                                   released.describe());
                }
                held.pop_front();
            }
            inside = false;
            return code;
        };
        callbacks.on_completed = [](const NxmemReleaseCompletion&) {};
        steps.at("opening the mechanism with options '" + target.options + "'");
        NXMEM_CONFORM_TRY(opened, "the mechanism opens with request_reclaim offered",
                          detail::callback_allocator::open(target, callbacks.table()));
        if ((opened->capabilities() & NXMEM_CAP_HOST_RECLAIM) == 0) {
            return not_applicable("the mechanism does not declare NXMEM_CAP_HOST_RECLAIM");
        }
        slots.emplace(opened->slots());
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened->counts());
        auto release_held = [&] {
            for (const NxmemAllocation& live : held) {
                (void)slots->deallocate(live);
            }
            held.clear();
        };
        // Honoured: the allocation that asked succeeds.
        unsigned made_before_asking = 0;
        while (asked == 0 && made_before_asking < max_blocks) {
            steps.at("allocation " + std::to_string(made_before_asking + 1) + " of " +
                     std::to_string(block_bytes) + " bytes");
            result<NxmemAllocation> made = slots->allocate(block_bytes, 64);
            finish_all(pending);
            if (!report.clean()) {
                release_held();
                return report.verdict();
            }
            if (!made) {
                release_held();
                return failed("allocation " + std::to_string(made_before_asking + 1) +
                                  (asked == 0 ? " succeeds or asks the host to reclaim"
                                              : " succeeds once the host reclaimed"),
                              made.error().describe());
            }
            held.push_back(made.value());
            ++made_before_asking;
        }
        if (asked == 0) {
            release_held();
            return not_applicable("request_reclaim was never called in " + std::to_string(max_blocks) +
                                  " allocations of " + std::to_string(block_bytes) +
                                  " bytes with options '" + target.options +
                                  "': to apply, it needs a limit it reaches on allocate "
                                  "(--options; posix eager: budget=1M)");
        }
        // The block released inside the callback is gone and the honoured allocation counted once.
        NXMEM_CONFORM_TRY(honoured, "the plugin reports its readiness", opened->counts());
        if (honoured.allocations != before.allocations + held.size()) {
            release_held();
            return failed_rule("U1 H7",
                               std::to_string(held.size()) + " live allocations after the honoured reclaim: "
                                   "the block released inside request_reclaim gone, the allocation that "
                                   "asked counted once (U1, H7)",
                               honoured.describe());
        }
        // Refused: the allocation fails cleanly and leaves nothing allocated.
        mode = answer::refuse;
        const unsigned asked_before_refusal = asked;
        NXMEM_CONFORM_TRY(ready, "the plugin reports its readiness", opened->counts());
        std::optional<finding> refusal_problem;
        for (unsigned attempt = 0; attempt < max_blocks && !refusal_problem; ++attempt) {
            steps.at("an allocation the host refuses to make room for");
            result<NxmemAllocation> made = slots->allocate(block_bytes, 64);
            finish_all(pending);
            const bool was_asked = asked != asked_before_refusal;
            if (made) {
                held.push_back(made.value());
                ++ready.allocations;
                if (!was_asked) {
                    continue;
                }
                refusal_problem = failed("the allocation fails when the host refuses to reclaim (H3)",
                                         "OK");
            } else if (!was_asked) {
                refusal_problem = failed("request_reclaim called before an allocation over the "
                                         "budget fails (H3)",
                                         made.error().describe());
            } else if (made.error().code != status_code::out_of_memory &&
                       made.error().code != status_code::host_refused) {
                refusal_problem = failed("OUT_OF_MEMORY or HOST_REFUSED when the host refuses to "
                                         "reclaim (H3)",
                                         made.error().describe());
            } else {
                refusal_problem = passed();
            }
        }
        NXMEM_CONFORM_TRY(refused, "the plugin reports its readiness", opened->counts());
        release_held();
        if (!report.clean()) {
            return report.verdict();
        }
        if (!refusal_problem) {
            return failed("request_reclaim called again once the budget is full",
                          "not called in " + std::to_string(max_blocks) + " more allocations");
        }
        if (refusal_problem->verdict != outcome::pass) {
            return *refusal_problem;
        }
        if (refused.allocations != ready.allocations) {
            return failed("nothing allocated by the refused allocation (H3)", refused.describe());
        }
        if (std::optional<finding> short_budget = refill(*slots, made_before_asking - 1, asked, pending, steps)) {
            return *short_budget;
        }
        if (!report.clean()) {
            return report.verdict();
        }
        opened.reset();
        return without_hook(target, made_before_asking, before, steps);
    }

    // Everything released, the budget is whole: as many blocks fit again before the mechanism asks
    // (the host still refusing) as fitted at first. A charge kept from the attempt that asked, or
    // a block freed inside request_reclaim never credited, leaves fewer (E12, H7).
    static std::optional<finding> refill(const detail::raw_slots& slots, unsigned fitted, const unsigned& asked,
                                         std::vector<std::unique_ptr<detail::side_call>>& pending,
                                         detail::step_log& steps) {
        const unsigned asked_before = asked;
        std::vector<NxmemAllocation> held;
        unsigned fitted_again = 0;
        while (asked == asked_before && fitted_again < max_blocks) {
            steps.at("allocation " + std::to_string(fitted_again + 1) + " once everything was released");
            result<NxmemAllocation> made = slots.allocate(block_bytes, 64);
            finish_all(pending);
            if (!made) {
                break;
            }
            held.push_back(made.value());
            fitted_again += asked == asked_before ? 1 : 0;
        }
        for (const NxmemAllocation& live : held) {
            (void)slots.deallocate(live);
        }
        if (fitted_again < fitted) {
            return failed_rule("E12 H7",
                               std::to_string(fitted) + " blocks of " + std::to_string(block_bytes) +
                                   " bytes fit again before request_reclaim once everything was released, "
                                   "as at first: the budget whole (E12, H7)",
                               std::to_string(fitted_again) +
                                   ": the budget kept a charge (the allocation that asked charged twice, "
                                   "or the block released inside request_reclaim never credited)");
        }
        return std::nullopt;
    }

    // No reclaim hook: once over budget the allocation fails with OUT_OF_MEMORY (H6); a mechanism
    // that needs the hook for every call fails its first with UNSUPPORTED_CAPABILITY (H2).
    static finding without_hook(const subject& target, unsigned fitted,
                                const host::plugin_counts& before, detail::step_log& steps) {
        detail::callback_host callbacks;
        callbacks.on_completed = [](const NxmemReleaseCompletion&) {};
        steps.at("opening the mechanism without request_reclaim");
        NXMEM_CONFORM_TRY(opened, "the mechanism opens without request_reclaim",
                          detail::callback_allocator::open(target, callbacks.table()));
        const detail::raw_slots slots = opened->slots();
        std::vector<NxmemAllocation> held;
        finding found = failed("an allocation over the budget fails with OUT_OF_MEMORY (H6)",
                               std::to_string(fitted + 1) + " allocations all succeeded");
        for (unsigned index = 0; index <= fitted; ++index) {
            steps.at("allocation " + std::to_string(index + 1) + " without a reclaim hook");
            result<NxmemAllocation> made = slots.allocate(block_bytes, 64);
            if (made) {
                held.push_back(made.value());
                continue;
            }
            const bool needs_hook_always =
                index == 0 && made.error().code == status_code::unsupported_capability;
            found = made.error().code == status_code::out_of_memory || needs_hook_always
                        ? passed()
                        : failed("OUT_OF_MEMORY for an allocation over the budget without a "
                                 "reclaim hook (H6)",
                                 made.error().describe());
            break;
        }
        for (const NxmemAllocation& live : held) {
            (void)slots.deallocate(live);
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened->counts());
        if (found.verdict == outcome::pass && after.allocations != before.allocations) {
            return failed("no allocation left after all were released", after.describe());
        }
        return found;
    }
};

// misuse.queued_release: once enqueued, an allocation is no longer released directly: deallocate
// and release_allocation are refused with UNKNOWN_ALLOCATION (D9), and it still retires.
struct check_misuse_queued_release {
    static finding run(const subject& target, const suite_options& options) {
        detail::callback_host callbacks;
        std::vector<std::uint64_t> retired;
        callbacks.on_completed = [&](const NxmemReleaseCompletion& completion) {
            retired.push_back(completion.ticket);
        };
        detail::deferred_release_allocator opening = detail::open_with_deferred_release(target, callbacks);
        if (const finding* verdict = std::get_if<finding>(&opening)) {
            return *verdict;
        }
        const std::unique_ptr<detail::callback_allocator>& opened = std::get<0>(opening);
        const detail::raw_slots slots = opened->slots();
        NXMEM_CONFORM_TRY(made, "an allocation to queue", slots.allocate(4096, 64));
        constexpr std::uint64_t ticket = 7;
        const detail::slot_reply queued = slots.enqueue_release(made, ticket);
        if (!queued.ok()) {
            (void)slots.deallocate(made);
            return failed("enqueue_release succeeds", queued.describe());
        }
        finding found = passed();
        const detail::slot_reply direct = slots.deallocate(made);
        if (direct.code != NXMEM_STATUS_UNKNOWN_ALLOCATION) {
            found = failed("UNKNOWN_ALLOCATION for deallocate of a queued allocation (D9)",
                           direct.ok() ? "OK: the plugin released it" : direct.describe());
        }
        if (found.verdict == outcome::pass && slots.table().release_allocation != nullptr) {
            NxmemReleaseOutcome outcome_out{};
            const detail::slot_reply structured = slots.release_allocation(made, outcome_out);
            if (structured.code != NXMEM_STATUS_UNKNOWN_ALLOCATION) {
                found = failed("UNKNOWN_ALLOCATION for release_allocation of a queued allocation (D9)",
                               structured.ok() ? "OK: the plugin released it" : structured.describe());
            }
        }
        for (unsigned attempt = 0; attempt < options.drain_attempts && retired.empty(); ++attempt) {
            std::uint64_t count = 0;
            const detail::slot_reply drained = slots.drain_releases(count);
            if (!drained.ok()) {
                return found.verdict == outcome::pass ? failed("drain_releases succeeds", drained.describe())
                                                      : found;
            }
        }
        if (found.verdict == outcome::pass && retired != std::vector<std::uint64_t>{ticket}) {
            return failed("the queued allocation retires once, as ticket 7",
                          std::to_string(retired.size()) + " completions");
        }
        return found;
    }
};

// negotiation.invalid_ranges: an inverted range (min_minor above max_minor) and the empty, all-zero
// range are INVALID_ARGUMENT, not a version the plugin then speaks (V6).
struct check_negotiation_invalid_ranges {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        for (const abi::version_range host :
             {abi::version_range{NXMEM_ABI_MAJOR, 1, 0}, abi::version_range{NXMEM_ABI_MAJOR, 2, 1},
              abi::version_range{NXMEM_ABI_MAJOR, NXMEM_ABI_MINOR, 0}, abi::version_range{0, 0, 0}}) {
            const detail::negotiation_reply reply = detail::negotiate(library.negotiate(), host);
            if (reply.code != NXMEM_STATUS_INVALID_ARGUMENT) {
                return failed("INVALID_ARGUMENT for the host range " + host.describe() + " (V6)",
                              reply.describe());
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
