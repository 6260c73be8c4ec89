// Reading a conformance run's results in the suite's own tests: which checks failed, a text of
// each failure for the test's log, and one check's result by id.
#pragma once

#include <nxmem/conform/check.hpp>

#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace nxmem::test {

inline std::string failures_of(const std::vector<conform::check_result>& results) {
    std::ostringstream text;
    for (const conform::check_result& result : results) {
        if (result.failed()) {
            text << result.id << ": expected " << result.expected << ", got " << result.actual << '\n';
        }
    }
    return text.str();
}

inline std::set<std::string> failed_ids(const std::vector<conform::check_result>& results) {
    std::set<std::string> ids;
    for (const conform::check_result& result : results) {
        if (result.failed()) {
            ids.insert(result.id);
        }
    }
    return ids;
}

// The result of check `id`; the test fails when the run has none.
inline const conform::check_result& result_of(const std::vector<conform::check_result>& results,
                                              std::string_view id) {
    for (const conform::check_result& result : results) {
        if (result.id == id) {
            return result;
        }
    }
    FAIL("no result for " << id);
    throw std::logic_error("unreachable"); // FAIL throws
}

} // namespace nxmem::test
