// Version ranges and negotiation. Negotiation fixes a ceiling, not an assignment: each table then
// declares its own abi_minor, clamped by read_prefix to that ceiling.
#pragma once

#include <nxmem/abi/request.hpp>
#include <nxmem/abi/result.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace nxmem::abi {

struct version_range {
    std::uint32_t major = NXMEM_ABI_MAJOR;
    std::uint32_t min_minor = NXMEM_ABI_MINOR_BASELINE;
    std::uint32_t max_minor = NXMEM_ABI_MINOR;

    friend bool operator==(const version_range&, const version_range&) = default;

    NxmemVersionRange to_wire() const noexcept {
        auto wire = make_struct<NxmemVersionRange>();
        wire.major = major;
        wire.min_minor = min_minor;
        wire.max_minor = max_minor;
        return wire;
    }
    static version_range from_wire(const NxmemVersionRange& wire) noexcept {
        return {wire.major, wire.min_minor, wire.max_minor};
    }
    std::string describe() const {
        return std::to_string(major) + "." + std::to_string(min_minor) + "-" +
               std::to_string(major) + "." + std::to_string(max_minor);
    }
};

// Everything this header speaks: major 1, minors 0 to 4.
inline constexpr version_range supported_range{};

// The agreed version: a major and the highest minor any table may use.
struct negotiated_version {
    std::uint32_t major = 0;
    std::uint32_t minor = 0;
    friend bool operator==(const negotiated_version&, const negotiated_version&) = default;
};

// A range is usable when it names a major and its minors are not inverted.
inline result<void> check_range(const version_range& range, std::string_view whose) {
    if (range.major == 0) {
        return fail(status_code::invalid_argument, std::string(whose) + " range names major 0");
    }
    if (range.min_minor > range.max_minor) {
        return fail(status_code::invalid_argument,
                    std::string(whose) + " range " + range.describe() + " is inverted");
    }
    return boost::outcome_v2::success();
}

// The plugin's side: the highest minor both ranges contain, or why there is none.
inline result<negotiated_version> choose_version(const version_range& host,
                                                 const version_range& plugin) {
    NXMEM_TRY_VOID(check_range(host, "host"));
    NXMEM_TRY_VOID(check_range(plugin, "plugin"));
    if (host.major != plugin.major) {
        return fail(status_code::version_mismatch,
                    "host speaks major " + std::to_string(host.major) + ", plugin speaks major " +
                        std::to_string(plugin.major));
    }
    if (host.max_minor < plugin.min_minor || plugin.max_minor < host.min_minor) {
        return fail(status_code::version_mismatch,
                    "no common minor: host " + host.describe() + ", plugin " + plugin.describe());
    }
    return negotiated_version{host.major, std::min(host.max_minor, plugin.max_minor)};
}

// The host's side: accept a plugin's reply only if it is consistent with both ranges.
inline result<negotiated_version> check_negotiation_reply(const version_range& host,
                                                          const NxmemNegotiateResponse& reply) {
    NXMEM_TRY_VOID(check_range(host, "host"));
    const version_range plugin = version_range::from_wire(reply.plugin_range);
    if (reply.major != host.major) {
        return fail(status_code::version_mismatch,
                    "plugin agreed to major " + std::to_string(reply.major) +
                        ", host speaks major " + std::to_string(host.major));
    }
    if (check_range(plugin, "plugin").has_error() || plugin.major != reply.major) {
        return fail(status_code::contract_violation,
                    "plugin reported an invalid range " + plugin.describe() + " for major " +
                        std::to_string(reply.major));
    }
    if (reply.minor < host.min_minor || reply.minor > host.max_minor) {
        return fail(status_code::contract_violation,
                    "plugin agreed to minor " + std::to_string(reply.minor) +
                        ", outside the host's range " + host.describe());
    }
    if (reply.minor < plugin.min_minor || reply.minor > plugin.max_minor) {
        return fail(status_code::contract_violation,
                    "plugin agreed to minor " + std::to_string(reply.minor) +
                        ", outside its own range " + plugin.describe());
    }
    return negotiated_version{reply.major, reply.minor};
}

} // namespace nxmem::abi
