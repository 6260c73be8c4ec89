// The committed pages of one reservation, as a set of disjoint, non-adjacent runs
// [first, end) of page indices. Its memory grows with how fragmented the committed set is, not
// with the size of the reservation, so a terabyte reservation costs nothing until committed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

namespace nxmem::posix {

using page_run = std::pair<std::uint64_t, std::uint64_t>; // [first, end)

class page_runs {
    using run_map = std::map<std::uint64_t, std::uint64_t>;

public:
    // Calls `visit(page_run)` for each committed run within [first, end), clipped to it, until
    // it returns false; allocates nothing. `visit` must not change the runs.
    template <class Visit> void for_each_committed(std::uint64_t first, std::uint64_t end, Visit&& visit) const {
        for (auto it = first_touching(first); it != runs_.end() && it->first < end; ++it) {
            if (!visit(page_run{std::max(it->first, first), std::min(it->second, end)})) {
                return;
            }
        }
    }

    // Calls `visit(page_run)` for each uncommitted run (gap) within [first, end), until it
    // returns false; allocates nothing. `visit` must not change the runs.
    template <class Visit> void for_each_gap(std::uint64_t first, std::uint64_t end, Visit&& visit) const {
        std::uint64_t cursor = first;
        bool going = true;
        for_each_committed(first, end, [&](const page_run& run) {
            if (run.first > cursor) {
                going = visit(page_run{cursor, run.first});
            }
            cursor = run.second;
            return going;
        });
        if (going && cursor < end) {
            (void)visit(page_run{cursor, end});
        }
    }

    // The committed runs within [first, end), clipped to it.
    std::vector<page_run> committed_within(std::uint64_t first, std::uint64_t end) const {
        std::vector<page_run> found;
        for_each_committed(first, end, [&](const page_run& run) {
            found.push_back(run);
            return true;
        });
        return found;
    }

    // The uncommitted runs (gaps) within [first, end).
    std::vector<page_run> uncommitted_within(std::uint64_t first, std::uint64_t end) const {
        std::vector<page_run> gaps;
        for_each_gap(first, end, [&](const page_run& gap) {
            gaps.push_back(gap);
            return true;
        });
        return gaps;
    }

    // Marks [first, end) committed, merging with neighbours. Allocates only when the run stands
    // alone and no node is spare.
    void insert(std::uint64_t first, std::uint64_t end) {
        if (first >= end) {
            return;
        }
        auto it = runs_.lower_bound(first);
        if (it != runs_.begin() && std::prev(it)->second >= first) {
            --it;
        }
        if (it == runs_.end() || it->first > end) {
            add(it, first, end); // touches no run
            return;
        }
        // `it` touches [first, end): it grows over the range and every run the range reaches.
        end = std::max(end, it->second);
        auto next = std::next(it);
        while (next != runs_.end() && next->first <= end) {
            end = std::max(end, next->second);
            next = drop(next);
        }
        if (it->first > first) { // starts earlier: the same node under its new key
            auto node = runs_.extract(it);
            node.key() = first;
            node.mapped() = end;
            runs_.insert(next, std::move(node));
        } else {
            it->second = end;
        }
    }

    // Marks [first, end) uncommitted, trimming runs that straddle its edges in place. Allocates
    // only to split one run in two (and not then when a node is spare); a failure to allocate
    // changes nothing.
    void erase(std::uint64_t first, std::uint64_t end) {
        if (first >= end) {
            return;
        }
        auto it = first_touching(first);
        if (it != runs_.end() && it->first < first) { // straddles `first`: its head stays
            if (it->second > end) {                   // and its tail too
                add(std::next(it), end, it->second);
                it->second = first;
                return;
            }
            it->second = first;
            ++it;
        }
        while (it != runs_.end() && it->first < end) {
            if (it->second > end) { // straddles `end`, so it is the last: its tail stays
                auto node = runs_.extract(it);
                node.key() = end;
                runs_.insert(std::move(node));
                return;
            }
            it = drop(it);
        }
    }

    bool empty() const noexcept { return runs_.empty(); }

private:
    // The first run that ends after `first`.
    run_map::const_iterator first_touching(std::uint64_t first) const {
        auto it = runs_.upper_bound(first);
        if (it != runs_.begin() && std::prev(it)->second > first) {
            --it;
        }
        return it;
    }
    run_map::iterator first_touching(std::uint64_t first) {
        auto it = runs_.upper_bound(first);
        if (it != runs_.begin() && std::prev(it)->second > first) {
            --it;
        }
        return it;
    }

    // A run [first, end) before `hint`, in the spare node when there is one.
    void add(run_map::const_iterator hint, std::uint64_t first, std::uint64_t end) {
        if (spare_.empty()) {
            runs_.emplace_hint(hint, first, end);
            return;
        }
        spare_.key() = first;
        spare_.mapped() = end;
        runs_.insert(hint, std::move(spare_)); // keys are unique: it goes in, spare_ is empty
    }

    // Removes a run, keeping its node as the spare when there is none; the run after it.
    run_map::iterator drop(run_map::iterator it) {
        if (!spare_.empty()) {
            return runs_.erase(it);
        }
        auto next = std::next(it);
        spare_ = runs_.extract(it);
        return next;
    }

    run_map runs_;
    // One node kept from the last run removed, so a range committed and decommitted over and
    // over on one reservation allocates nothing after the first time.
    run_map::node_type spare_;
};

} // namespace nxmem::posix
