// Each capability a mechanism declares, exercised through the host's views and adapters: applicable
// only when the allocator table sets the capability's flag.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/callback_host.hpp>
#include <nxmem/conform/detail/raw_slots.hpp>
#include <nxmem/conform/subject.hpp>
#include <nxmem/detail/page_size.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// Ranges are whole multiples of this, aligned to it: coarse enough for any page size up to 64 KiB.
inline constexpr std::uint64_t range_unit = 64 * 1024;

template <Device D>
std::optional<finding> unless_declared(host::plugin_allocator<D>& allocator, NxmemCapabilities flag,
                                       const char* flag_name) {
    if ((allocator.capabilities() & flag) == 0) {
        return not_applicable(std::string("the mechanism does not declare ") + flag_name);
    }
    return std::nullopt;
}

// The range unit for a virtual backing: range_unit, or the allocator's commit granularity when
// that is coarser (a GPU's 2 MiB chunks; tables older than minor 2 state the page size).
template <Device D> std::uint64_t range_unit_for(const host::virtual_backing_view<D>& backing) {
    return std::max<std::uint64_t>(range_unit, backing.commit_granularity());
}

} // namespace detail

// capability.virtual_backing: commit and decommit by range, mapped bytes accounted exactly.
struct check_capability_virtual_backing {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if (auto absent = detail::unless_declared(allocator, NXMEM_CAP_VIRTUAL_BACKING,
                                                  "NXMEM_CAP_VIRTUAL_BACKING")) {
            return *absent;
        }
        NXMEM_CONFORM_TRY(backing, "the virtual backing view", allocator.virtual_backing());
        const std::uint64_t unit = detail::range_unit_for(backing);
        NXMEM_CONFORM_TRY(live, "a reserved allocation of 4 range units", allocator.allocate(4 * unit, unit));
        struct step {
            const char* what;
            bool commit;
            byte_range range;
            std::uint64_t mapped_after;
        };
        const step steps[] = {
            {"commit [0, 2 units)", true, {0, 2 * unit}, 2 * unit},
            {"commit a committed unit again", true, {unit, unit}, 2 * unit},
            {"commit the last unit", true, {3 * unit, unit}, 3 * unit},
            {"decommit the second unit", false, {unit, unit}, 2 * unit},
            {"decommit the second unit again", false, {unit, unit}, 2 * unit},
        };
        std::string problem;
        std::string expected;
        NXMEM_CONFORM_TRY(initially, "mapped_bytes of a fresh reservation", backing.mapped_bytes(live));
        if (initially != 0) {
            expected = "0 mapped bytes before any commit";
            problem = std::to_string(initially);
        }
        for (const step& next : steps) {
            if (!problem.empty()) {
                break;
            }
            announce_step(next.what);
            result<void> changed = next.commit ? backing.commit(live, next.range)
                                               : backing.decommit(live, next.range);
            if (!changed) {
                expected = std::string(next.what) + " succeeds";
                problem = changed.error().describe();
                break;
            }
            result<std::uint64_t> mapped = backing.mapped_bytes(live);
            if (!mapped || mapped.value() != next.mapped_after) {
                expected = std::to_string(next.mapped_after) + " mapped bytes after " + next.what;
                problem = mapped ? std::to_string(mapped.value()) : mapped.error().describe();
            }
        }
        if (problem.empty()) {
            result<void> outside = backing.commit(live, {5 * unit, unit});
            if (outside || outside.error().code != status_code::invalid_argument) {
                expected = "INVALID_ARGUMENT for a range outside the allocation";
                problem = outside ? "OK" : outside.error().describe();
            }
        }
        result<release_report> released = allocator.release(live);
        if (!problem.empty()) {
            return failed(expected, problem);
        }
        if (!released) {
            return failed("the allocation released", released.error().describe());
        }
        if ((allocator.capabilities() & NXMEM_CAP_STRUCTURED_RELEASE) != 0 &&
            released.value().state == release_state::complete &&
            released.value().unmapped_bytes != 2 * unit) {
            return failed("the release credits the " + std::to_string(2 * unit) + " mapped bytes",
                          std::to_string(released.value().unmapped_bytes));
        }
        return passed();
    }
};

// capability.shared_mapping: prefix references counted; the prefix costed once (ABI.md C8: its
// size, counted by its bytes or by the whole commit granules it holds), freed with the last reference.
struct check_capability_shared_mapping {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        constexpr std::uint64_t unit = detail::range_unit;
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if (auto absent = detail::unless_declared(allocator, NXMEM_CAP_SHARED_MAPPING,
                                                  "NXMEM_CAP_SHARED_MAPPING")) {
            return *absent;
        }
        NXMEM_CONFORM_TRY(mapping, "the shared mapping view", allocator.shared_mapping());
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        NXMEM_CONFORM_TRY(prefix, "a shared prefix of 2 range units", mapping.create_prefix(2 * unit));
        std::uint64_t granule = nxmem::detail::system_page_bytes();
        if ((allocator.capabilities() & NXMEM_CAP_VIRTUAL_BACKING) != 0) {
            if (auto backing = allocator.virtual_backing()) {
                granule = backing.value().commit_granularity();
            }
        }
        const std::uint64_t cost = (2 * unit + granule - 1) / granule * granule;
        std::vector<allocation<D>> sharers;
        std::string expected;
        std::string problem;
        std::uint64_t newly_mapped = 0;
        for (std::uint64_t i = 1; i <= 3 && problem.empty(); ++i) {
            result<allocation<D>> made = allocator.allocate(4 * unit, unit);
            if (!made) {
                expected = "an allocation to share the prefix";
                problem = made.error().describe();
                break;
            }
            sharers.push_back(made.value());
            result<prefix_commit> commit = mapping.commit_prefix(made.value(), prefix);
            if (!commit || commit.value().sharers != i || commit.value().shared_bytes != 2 * unit) {
                expected = std::to_string(i) + " sharers of " + std::to_string(2 * unit) + " bytes";
                problem = commit ? std::to_string(commit.value().sharers) + " sharers of " +
                                       std::to_string(commit.value().shared_bytes) + " bytes"
                                 : commit.error().describe();
                break;
            }
            newly_mapped += commit.value().newly_mapped_bytes;
        }
        if (problem.empty() && newly_mapped != cost && newly_mapped != 2 * unit) {
            expected = "the prefix of " + std::to_string(2 * unit) + " B costed once (C8): " +
                       std::to_string(2 * unit) + " newly mapped bytes counted by its bytes, or " +
                       std::to_string(cost) + " in whole granules of " + std::to_string(granule);
            problem = std::to_string(newly_mapped) + " newly mapped bytes over its three mappings";
        }
        auto counts_are = [&](std::uint64_t prefixes, std::uint64_t views, const char* when) {
            result<host::plugin_counts> now = opened.plugin_counts();
            if (problem.empty() && (!now || now.value().shared_prefixes != before.shared_prefixes + prefixes ||
                                    now.value().views != before.views + views)) {
                expected = std::to_string(prefixes) + " more shared prefixes and " +
                           std::to_string(views) + " more views " + when;
                problem = now ? now.value().describe() : now.error().describe();
            }
        };
        counts_are(1, sharers.size(), "while the prefix is mapped");
        for (auto step : {0, 1, 2}) {
            if (!problem.empty()) {
                break;
            }
            result<void> changed = step == 0 ? mapping.retain_prefix(prefix) : mapping.release_prefix(prefix);
            if (!changed) {
                expected = step == 0 ? "retain_prefix succeeds" : "release_prefix succeeds";
                problem = changed.error().describe();
            }
        }
        counts_are(1, sharers.size(), "after the creator's reference is dropped (the mappings hold it)");
        for (const allocation<D>& made : sharers) {
            result<release_report> released = allocator.release(made);
            if (!released && problem.empty()) {
                expected = "every sharer released";
                problem = released.error().describe();
            }
        }
        counts_are(0, 0, "after the last sharer is released");
        if (problem.empty()) {
            result<void> stale = mapping.retain_prefix(prefix);
            if (stale) {
                expected = "a refusal to retain a freed prefix";
                problem = "OK";
                (void)mapping.release_prefix(prefix);
            }
        }
        return problem.empty() ? passed() : failed(expected, problem);
    }
};

// capability.deferred_release: queued releases retire, single-threaded, in enqueue order.
struct check_capability_deferred_release {
    template <Device D> static finding run(const subject& target, const suite_options& options) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if (auto absent = detail::unless_declared(allocator, NXMEM_CAP_DEFERRED_RELEASE,
                                                  "NXMEM_CAP_DEFERRED_RELEASE")) {
            return *absent;
        }
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        std::vector<std::uint64_t> tickets;
        for (int i = 0; i < 5; ++i) {
            announce_step("allocate 4096 B and enqueue its release");
            NXMEM_CONFORM_TRY(made, "an allocation to release later", allocator.allocate(4096, 64));
            NXMEM_CONFORM_TRY(ticket, "enqueue_release succeeds", allocator.enqueue_release(made));
            tickets.push_back(ticket);
        }
        NXMEM_CONFORM_TRY(queued, "the plugin reports its readiness", opened.plugin_counts());
        // A plugin may retire a ticket inside enqueue_release (D7): the host hears of it at the next
        // drain, and the plugin no longer counts it as queued.
        if (queued.queued_releases < before.queued_releases ||
            queued.queued_releases > before.queued_releases + tickets.size()) {
            return failed("the plugin reports at most " + std::to_string(tickets.size()) +
                              " queued releases (fewer when it retired some inside enqueue_release, D7)",
                          queued.describe());
        }
        std::vector<std::uint64_t> retired;
        for (unsigned attempt = 0; attempt < options.drain_attempts && retired.size() < tickets.size();
             ++attempt) {
            announce_step("drain_releases, attempt " + std::to_string(attempt + 1));
            NXMEM_CONFORM_TRY(completions, "drain_releases succeeds", allocator.drain_releases());
            for (const host::release_completion& completion : completions) {
                retired.push_back(completion.ticket);
            }
        }
        if (retired != tickets) {
            return failed("tickets " + detail::describe_tickets(tickets) + " retired in enqueue order within " +
                              std::to_string(options.drain_attempts) + " drains",
                          "retired " + detail::describe_tickets(retired));
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (after.queued_releases != before.queued_releases || after.allocations != before.allocations) {
            return failed("no queued release or allocation left", after.describe());
        }
        return wide_tickets(target, options);
    }

    // The host library numbers tickets from 1, so the same again with the suite's own callbacks
    // and tickets that cross 2^32: a plugin keeping them in 32 bits retires tickets never issued.
    static finding wide_tickets(const subject& target, const suite_options& options) {
        detail::callback_host callbacks;
        detail::retired_tickets retired;
        retired.listen(callbacks);
        NXMEM_CONFORM_TRY(opened, "the mechanism opens with release_completed offered",
                          detail::callback_allocator::open(target, callbacks.table()));
        if ((opened->capabilities() & NXMEM_CAP_DEFERRED_RELEASE) == 0) {
            return failed("NXMEM_CAP_DEFERRED_RELEASE declared to a host offering release_completed, "
                          "as to the host library's",
                          "not declared");
        }
        const detail::raw_slots slots = opened->slots();
        const std::vector<std::uint64_t> tickets = detail::tickets_across_2_32(5);
        for (std::uint64_t ticket : tickets) {
            announce_step("allocate 4096 B and enqueue its release as ticket " + std::to_string(ticket));
            NXMEM_CONFORM_TRY(made, "an allocation to release later", slots.allocate(4096, 64));
            const detail::slot_reply queued = slots.enqueue_release(made, ticket);
            if (!queued.ok()) {
                (void)slots.deallocate(made);
                return failed("enqueue_release of ticket " + std::to_string(ticket) + " succeeds",
                              queued.describe());
            }
        }
        for (unsigned attempt = 0; attempt < options.drain_attempts && retired.now().size() < tickets.size();
             ++attempt) {
            announce_step("drain_releases of the tickets across 2^32, attempt " + std::to_string(attempt + 1));
            std::uint64_t count = 0;
            const detail::slot_reply drained = slots.drain_releases(count);
            if (!drained.ok()) {
                return failed("drain_releases succeeds", drained.describe());
            }
        }
        if (retired.now() != tickets) {
            return failed_rule("D1 D3",
                               "tickets " + detail::describe_tickets(tickets) +
                                   " (the host's uint64_t, across 2^32) retired as given, in enqueue order, within " +
                                   std::to_string(options.drain_attempts) + " drains (D1, D3)",
                               "retired " + detail::describe_tickets(retired.now()));
        }
        return passed();
    }
};

// capability.structured_release: release_allocation reports COMPLETE or QUARANTINED, consistently.
struct check_capability_structured_release {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        auto& allocator = opened.allocator();
        if (auto absent = detail::unless_declared(allocator, NXMEM_CAP_STRUCTURED_RELEASE,
                                                  "NXMEM_CAP_STRUCTURED_RELEASE")) {
            return *absent;
        }
        const detail::raw_slots slots(allocator);
        for (std::uint64_t size : {1000ull, 65536ull}) {
            NXMEM_CONFORM_TRY(live, "an allocation to release", slots.allocate(size, 64));
            NxmemReleaseOutcome outcome_out{};
            const detail::slot_reply reply = slots.release_allocation(live, outcome_out);
            const std::string what = "release_allocation of " + std::to_string(size) + " bytes";
            if (!reply.ok()) {
                (void)slots.deallocate(live);
                return failed(what + " succeeds", reply.describe());
            }
            switch (outcome_out.state) {
            case NXMEM_RELEASE_COMPLETE:
                if (outcome_out.residual_owned_bytes != 0) {
                    return failed("COMPLETE keeps nothing",
                                  std::to_string(outcome_out.residual_owned_bytes) +
                                      " residual bytes");
                }
                break;
            case NXMEM_RELEASE_QUARANTINED:
                if (outcome_out.residual_owned_bytes == 0) {
                    return failed("QUARANTINED names the bytes it keeps", "0 residual bytes");
                }
                break;
            case NXMEM_RELEASE_FAILED:
                (void)slots.deallocate(live);
                return failed("FAILED only with a non-OK status", "OK with state FAILED");
            default:
                return failed("state COMPLETE or QUARANTINED for " + what,
                              "state " + std::to_string(outcome_out.state));
            }
        }
        return passed();
    }
};

// capability.host_reclaim: a host that refuses to reclaim gets a clean failure, nothing leaked.
struct check_capability_host_reclaim {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        if (auto absent = detail::unless_declared(opened.allocator(), NXMEM_CAP_HOST_RECLAIM,
                                                  "NXMEM_CAP_HOST_RECLAIM")) {
            return *absent;
        }
        opened.close_allocator();
        std::uint64_t asked = 0;
        auto refusing = [&asked](const host::reclaim_request&) -> result<void> {
            ++asked;
            return fail(status_code::out_of_memory, "the conformance host reclaims nothing");
        };
        NXMEM_CONFORM_TRY(before, "the plugin reports its readiness", opened.plugin_counts());
        NXMEM_CONFORM_TRY(refused_host, "the mechanism opens with a refusing reclaim hook",
                          host::open_allocator<D>(opened.module(), target.mechanism,
                                                  target.device.index, target.options, refusing));
        announce_step("allocate 64 KiB with a reclaim hook that refuses");
        result<allocation<D>> made = refused_host.allocate(1 << 16, 64);
        if (made) {
            (void)refused_host.release(made.value());
            return passed(); // it did not need to reclaim
        }
        if (made.error().code != status_code::host_refused &&
            made.error().code != status_code::out_of_memory) {
            return failed("HOST_REFUSED or OUT_OF_MEMORY when the host refuses to reclaim",
                          made.error().describe());
        }
        NXMEM_CONFORM_TRY(after, "the plugin reports its readiness", opened.plugin_counts());
        if (after.allocations != before.allocations) {
            return failed("nothing allocated by a failed allocation", after.describe());
        }
        return passed();
    }
};

} // namespace nxmem::conform
