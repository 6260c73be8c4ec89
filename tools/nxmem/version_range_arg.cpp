#include "version_range_arg.hpp"

#include <charconv>
#include <optional>
#include <string>

namespace nxmem::tool {

namespace {

struct version_point {
    std::uint32_t major = 0;
    std::uint32_t minor = 0;
};

std::optional<std::uint32_t> parse_number(std::string_view digits) {
    std::uint32_t value = 0;
    const char* end = digits.data() + digits.size();
    const auto [stop, failure] = std::from_chars(digits.data(), end, value);
    if (digits.empty() || failure != std::errc{} || stop != end) {
        return std::nullopt;
    }
    return value;
}

// "MAJOR.MINOR"
std::optional<version_point> parse_point(std::string_view text) {
    const std::size_t dot = text.find('.');
    if (dot == std::string_view::npos) {
        return std::nullopt;
    }
    const std::optional<std::uint32_t> major = parse_number(text.substr(0, dot));
    const std::optional<std::uint32_t> minor = parse_number(text.substr(dot + 1));
    if (!major || !minor) {
        return std::nullopt;
    }
    return version_point{*major, *minor};
}

} // namespace

result<abi::version_range> parse_version_range(std::string_view text) {
    const std::string quoted = "'" + std::string(text) + "'";
    const std::size_t dash = text.find('-');
    const std::optional<version_point> low =
        dash == std::string_view::npos ? std::nullopt : parse_point(text.substr(0, dash));
    const std::optional<version_point> high =
        dash == std::string_view::npos ? std::nullopt : parse_point(text.substr(dash + 1));
    if (!low || !high) {
        return fail(status_code::invalid_argument,
                    quoted + " is not a range of the form MAJOR.MIN-MAJOR.MAX (e.g. 1.0-1.1)");
    }
    if (low->major != high->major) {
        return fail(status_code::invalid_argument,
                    quoted + " spans majors " + std::to_string(low->major) + " and " +
                        std::to_string(high->major) + "; a range names one major");
    }
    const abi::version_range range{low->major, low->minor, high->minor};
    if (result<void> usable = abi::check_range(range, "the host"); !usable) {
        return fail(status_code::invalid_argument, quoted + ": " + usable.error().message);
    }
    return range;
}

} // namespace nxmem::tool
