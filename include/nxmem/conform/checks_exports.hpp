// Exports and negotiation, checked by calling the plugin's exports directly (dlopen/dlsym), so
// the answers are the plugin's own and not the host's reading of them.
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/subject.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace nxmem::conform {

namespace detail {

// The plugin's range, learned from its answer to everything this host speaks, or why not.
inline result<abi::version_range> plugin_range_of(const raw_library& library) {
    negotiation_reply reply = negotiate(library.negotiate(), abi::supported_range);
    if (reply.code != NXMEM_STATUS_OK) {
        return fail(status_code::version_mismatch,
                    "the plugin refused the host range " + abi::supported_range.describe() + ": " +
                        reply.describe());
    }
    return abi::version_range::from_wire(reply.response.plugin_range);
}

inline result<raw_library> open_with_exports(const subject& target) {
    NXMEM_TRY(library, raw_library::open(target.path));
    if (library.negotiate() == nullptr || library.create_factories() == nullptr ||
        library.query_unload_readiness() == nullptr) {
        return fail(status_code::contract_violation, "the plugin lacks one of the three exports");
    }
    return library;
}

// A refusal the contract asks for: VERSION_MISMATCH.
inline finding expect_refusal(const negotiation_reply& reply, const abi::version_range& host) {
    if (reply.code != NXMEM_STATUS_VERSION_MISMATCH) {
        return failed("VERSION_MISMATCH for host range " + host.describe(), reply.describe());
    }
    return passed();
}

} // namespace detail

// exports.present
struct check_exports_present {
    static finding run(const subject& target, const suite_options&) {
        result<detail::raw_library> library = detail::raw_library::open(target.path);
        if (!library) {
            return failed("the library loads", library.error().message);
        }
        std::vector<std::string> missing;
        for (const char* name : {NXMEM_EXPORT_NEGOTIATE, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES,
                                 NXMEM_EXPORT_QUERY_UNLOAD_READINESS}) {
            if (library.value().symbol(name) == nullptr) {
                missing.emplace_back(name);
            }
        }
        if (!missing.empty()) {
            std::string names;
            for (const std::string& name : missing) {
                names += (names.empty() ? "" : ", ") + name;
            }
            return failed("NxmemNegotiate, NxmemCreateAllocatorFactories and "
                          "NxmemQueryUnloadReadiness exported",
                          "missing " + names);
        }
        return passed();
    }
};

// negotiation.overlap
struct check_negotiation_overlap {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        const NxmemNegotiateFn negotiate_fn = library.negotiate();
        // Every host range this build can offer that overlaps the plugin's: the answer is the
        // highest common minor, and the reply must satisfy the host's own checks.
        result<abi::version_range> plugin = detail::plugin_range_of(library);
        if (!plugin) {
            return failed("OK for the host range " + abi::supported_range.describe(),
                          plugin.error().message);
        }
        if (plugin.value().major != NXMEM_ABI_MAJOR) {
            return failed("the plugin range names major " + std::to_string(NXMEM_ABI_MAJOR),
                          "plugin range " + plugin.value().describe());
        }
        for (std::uint32_t low = 0; low <= NXMEM_ABI_MINOR; ++low) {
            for (std::uint32_t high = low; high <= NXMEM_ABI_MINOR; ++high) {
                const abi::version_range host{NXMEM_ABI_MAJOR, low, high};
                const std::uint32_t common_low = std::max(low, plugin.value().min_minor);
                const std::uint32_t common_high = std::min(high, plugin.value().max_minor);
                if (common_low > common_high) {
                    continue; // no overlap: negotiation.above / .below cover these
                }
                detail::negotiation_reply reply = detail::negotiate(negotiate_fn, host);
                const std::string expected = "OK 1." + std::to_string(common_high) +
                                             " for host range " + host.describe();
                if (reply.code != NXMEM_STATUS_OK) {
                    return failed(expected, reply.describe());
                }
                result<abi::negotiated_version> agreed =
                    abi::check_negotiation_reply(host, reply.response);
                if (!agreed) {
                    return failed(expected, agreed.error().describe());
                }
                if (agreed.value().minor != common_high) {
                    return failed(expected, reply.describe());
                }
            }
        }
        return passed();
    }
};

// negotiation.above: a host range wholly above the plugin's.
struct check_negotiation_above {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        NXMEM_CONFORM_TRY(plugin, "the plugin accepts the whole host range", detail::plugin_range_of(library));
        const abi::version_range host{plugin.major, plugin.max_minor + 1, plugin.max_minor + 5};
        return detail::expect_refusal(detail::negotiate(library.negotiate(), host), host);
    }
};

// negotiation.below: a host range wholly below the plugin's (only if the plugin's starts above 0).
struct check_negotiation_below {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        NXMEM_CONFORM_TRY(plugin, "the plugin accepts the whole host range", detail::plugin_range_of(library));
        if (plugin.min_minor == 0) {
            return not_applicable("the plugin speaks " + plugin.describe() +
                                  ", from minor 0; no host range lies below it");
        }
        const abi::version_range host{plugin.major, 0, plugin.min_minor - 1};
        return detail::expect_refusal(detail::negotiate(library.negotiate(), host), host);
    }
};

// negotiation.major: another major, overlapping minors or not, is refused.
struct check_negotiation_major {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        for (const abi::version_range host :
             {abi::version_range{NXMEM_ABI_MAJOR + 1, 0, NXMEM_ABI_MINOR},
              abi::version_range{NXMEM_ABI_MAJOR + 1, 0, 100}}) {
            finding found = detail::expect_refusal(detail::negotiate(library.negotiate(), host), host);
            if (found.verdict != outcome::pass) {
                return found;
            }
        }
        return passed();
    }
};

// negotiation.repeatable: the same range gets the same answer, whatever was asked in between.
struct check_negotiation_repeatable {
    static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(library, "the plugin loads with its three exports", detail::open_with_exports(target));
        const NxmemNegotiateFn negotiate_fn = library.negotiate();
        const detail::negotiation_reply first = detail::negotiate(negotiate_fn, abi::supported_range);
        for (const abi::version_range between :
             {abi::version_range{NXMEM_ABI_MAJOR + 1, 0, 3}, abi::version_range{NXMEM_ABI_MAJOR, 0, 0},
              abi::supported_range}) {
            (void)detail::negotiate(negotiate_fn, between);
            const detail::negotiation_reply again = detail::negotiate(negotiate_fn, abi::supported_range);
            if (again.code != first.code || again.response.major != first.response.major ||
                again.response.minor != first.response.minor ||
                again.response.plugin_range.min_minor != first.response.plugin_range.min_minor ||
                again.response.plugin_range.max_minor != first.response.plugin_range.max_minor) {
                return failed("the same answer to " + abi::supported_range.describe() +
                                  " every time: " + first.describe(),
                              again.describe() + " after negotiating " + between.describe());
            }
        }
        return passed();
    }
};

} // namespace nxmem::conform
