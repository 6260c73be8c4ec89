// The --host-range argument: "MAJOR.MIN-MAJOR.MAX", e.g. "1.0-1.1".
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/abi/version.hpp>

#include <string_view>

namespace nxmem::tool {

// The range, or why `text` is not one (malformed, majors differ, inverted, major 0).
result<abi::version_range> parse_version_range(std::string_view text);

} // namespace nxmem::tool
