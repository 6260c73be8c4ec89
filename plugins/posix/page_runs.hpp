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
public:
    // The committed runs within [first, end), clipped to it.
    std::vector<page_run> committed_within(std::uint64_t first, std::uint64_t end) const {
        std::vector<page_run> found;
        for (auto it = first_touching(first); it != runs_.end() && it->first < end; ++it) {
            found.emplace_back(std::max(it->first, first), std::min(it->second, end));
        }
        return found;
    }

    // The uncommitted runs (gaps) within [first, end).
    std::vector<page_run> uncommitted_within(std::uint64_t first, std::uint64_t end) const {
        std::vector<page_run> gaps;
        std::uint64_t cursor = first;
        for (const page_run& run : committed_within(first, end)) {
            if (run.first > cursor) {
                gaps.emplace_back(cursor, run.first);
            }
            cursor = run.second;
        }
        if (cursor < end) {
            gaps.emplace_back(cursor, end);
        }
        return gaps;
    }

    // Marks [first, end) committed, merging with neighbours.
    void insert(std::uint64_t first, std::uint64_t end) {
        if (first >= end) {
            return;
        }
        auto it = runs_.lower_bound(first);
        if (it != runs_.begin() && std::prev(it)->second >= first) {
            --it;
        }
        while (it != runs_.end() && it->first <= end) {
            first = std::min(first, it->first);
            end = std::max(end, it->second);
            it = runs_.erase(it);
        }
        runs_.emplace(first, end);
    }

    // Marks [first, end) uncommitted, splitting runs that straddle its edges.
    void erase(std::uint64_t first, std::uint64_t end) {
        if (first >= end) {
            return;
        }
        std::vector<page_run> keep;
        auto it = first_touching(first);
        while (it != runs_.end() && it->first < end) {
            if (it->first < first) {
                keep.emplace_back(it->first, first);
            }
            if (it->second > end) {
                keep.emplace_back(end, it->second);
            }
            it = runs_.erase(it);
        }
        for (const page_run& run : keep) {
            runs_.emplace(run.first, run.second);
        }
    }

    bool empty() const noexcept { return runs_.empty(); }

private:
    // The first run that ends after `first`.
    std::map<std::uint64_t, std::uint64_t>::const_iterator first_touching(std::uint64_t first) const {
        auto it = runs_.upper_bound(first);
        if (it != runs_.begin() && std::prev(it)->second > first) {
            --it;
        }
        return it;
    }
    std::map<std::uint64_t, std::uint64_t>::iterator first_touching(std::uint64_t first) {
        auto it = runs_.upper_bound(first);
        if (it != runs_.begin() && std::prev(it)->second > first) {
            --it;
        }
        return it;
    }

    std::map<std::uint64_t, std::uint64_t> runs_;
};

} // namespace nxmem::posix
