// Reading a conformance run's results in the suite's own tests: which checks failed, and a text
// of each failure for the test's log.
#pragma once

#include <nxmem/conform/check.hpp>

#include <set>
#include <sstream>
#include <string>
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

} // namespace nxmem::test
