// What the conformance tests ask of a list of check results.
#pragma once

#include <nxmem/conform/check.hpp>

#include <set>
#include <string>
#include <vector>

namespace nxmem::test {

// The ids of the checks that failed.
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
