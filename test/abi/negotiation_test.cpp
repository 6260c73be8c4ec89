// Version negotiation: the plugin's choice (choose_version) and the host's check of the plugin's
// reply (check_negotiation_reply). Negotiation fixes a ceiling, not an assignment.
#include <nxmem/abi/version.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

using nxmem::status_code;
using nxmem::abi::check_negotiation_reply;
using nxmem::abi::choose_version;
using nxmem::abi::negotiated_version;
using nxmem::abi::version_range;
using Catch::Matchers::Contains;

NxmemNegotiateResponse make_reply(std::uint32_t major, std::uint32_t minor,
                                  const version_range& plugin) {
    auto reply = nxmem::abi::make_struct<NxmemNegotiateResponse>();
    reply.major = major;
    reply.minor = minor;
    reply.plugin_range = plugin.to_wire();
    return reply;
}

// Every range of major 1 whose minors lie in 0..limit, inverted ones included.
std::vector<version_range> small_ranges(std::uint32_t limit) {
    std::vector<version_range> ranges;
    for (std::uint32_t low = 0; low <= limit; ++low) {
        for (std::uint32_t high = 0; high <= limit; ++high) {
            ranges.push_back(version_range{1, low, high});
        }
    }
    return ranges;
}

// The oracle: the highest minor in both ranges, found by counting, or nothing.
std::optional<std::uint32_t> highest_common_minor(const version_range& a, const version_range& b) {
    std::optional<std::uint32_t> best;
    for (std::uint32_t minor = 0; minor <= 16; ++minor) {
        const bool in_a = a.min_minor <= minor && minor <= a.max_minor;
        const bool in_b = b.min_minor <= minor && minor <= b.max_minor;
        if (in_a && in_b) {
            best = minor;
        }
    }
    return best;
}

} // namespace

TEST_CASE("this header speaks major 1, minors 0 to 4", "[negotiation]") {
    STATIC_REQUIRE(nxmem::abi::supported_range.major == 1);
    STATIC_REQUIRE(nxmem::abi::supported_range.min_minor == 0);
    STATIC_REQUIRE(nxmem::abi::supported_range.max_minor == 4);
    STATIC_REQUIRE(nxmem::abi::supported_range == version_range{NXMEM_ABI_MAJOR,
                                                                NXMEM_ABI_MINOR_BASELINE,
                                                                NXMEM_ABI_MINOR});
    STATIC_REQUIRE(sizeof(NxmemVersionRange) == 16);
}

TEST_CASE("a version range survives the wire", "[negotiation]") {
    const version_range range{1, 3, 9};
    const NxmemVersionRange wire = range.to_wire();
    CHECK(wire.struct_size == sizeof(NxmemVersionRange));
    CHECK(wire.major == 1);
    CHECK(wire.min_minor == 3);
    CHECK(wire.max_minor == 9);
    CHECK(version_range::from_wire(wire) == range);
    CHECK(range.describe() == "1.3-1.9");
}

TEST_CASE("overlapping ranges agree on the highest common minor", "[negotiation]") {
    const auto chosen = choose_version({1, 0, 1}, {1, 1, 3});
    REQUIRE(chosen.has_value());
    CHECK(chosen.value() == negotiated_version{1, 1});

    const auto other_way = choose_version({1, 2, 6}, {1, 0, 4});
    REQUIRE(other_way.has_value());
    CHECK(other_way.value() == negotiated_version{1, 4});
}

TEST_CASE("identical ranges agree on their maximum", "[negotiation]") {
    const auto chosen = choose_version(nxmem::abi::supported_range, nxmem::abi::supported_range);
    REQUIRE(chosen.has_value());
    CHECK(chosen.value() == negotiated_version{1, 4});

    const auto single = choose_version({1, 0, 0}, {1, 0, 0});
    REQUIRE(single.has_value());
    CHECK(single.value() == negotiated_version{1, 0});
}

TEST_CASE("ranges touching at one minor agree on it", "[negotiation]") {
    const auto host_lower = choose_version({1, 0, 1}, {1, 1, 2});
    REQUIRE(host_lower.has_value());
    CHECK(host_lower.value() == negotiated_version{1, 1});
    const auto host_upper = choose_version({1, 1, 2}, {1, 0, 1});
    REQUIRE(host_upper.has_value());
    CHECK(host_upper.value() == negotiated_version{1, 1});
}

TEST_CASE("disjoint ranges are a version mismatch", "[negotiation]") {
    SECTION("host above plugin") {
        const auto chosen = choose_version({1, 3, 5}, {1, 0, 2});
        REQUIRE(chosen.has_error());
        CHECK(chosen.error().code == status_code::version_mismatch);
        CHECK_THAT(chosen.error().message, Contains("no common minor"));
        CHECK_THAT(chosen.error().message, Contains("1.3-1.5"));
        CHECK_THAT(chosen.error().message, Contains("1.0-1.2"));
    }
    SECTION("host below plugin") {
        const auto chosen = choose_version({1, 0, 1}, {1, 2, 4});
        REQUIRE(chosen.has_error());
        CHECK(chosen.error().code == status_code::version_mismatch);
        CHECK_THAT(chosen.error().message, Contains("no common minor"));
    }
}

TEST_CASE("different majors never talk", "[negotiation]") {
    const auto chosen = choose_version({1, 0, 1}, {2, 0, 1});
    REQUIRE(chosen.has_error());
    CHECK(chosen.error().code == status_code::version_mismatch);
    CHECK_THAT(chosen.error().message, Contains("major 1"));
    CHECK_THAT(chosen.error().message, Contains("major 2"));

    const auto reverse = choose_version({2, 0, 1}, {1, 0, 1});
    REQUIRE(reverse.has_error());
    CHECK(reverse.error().code == status_code::version_mismatch);
}

TEST_CASE("a newer plugin is clamped to the host's maximum", "[negotiation]") {
    const auto chosen = choose_version(nxmem::abi::supported_range, {1, 0, 5});
    REQUIRE(chosen.has_value());
    CHECK(chosen.value() == negotiated_version{1, 4});
}

TEST_CASE("a newer host is clamped to the plugin's maximum", "[negotiation]") {
    const auto chosen = choose_version({1, 0, 5}, {1, 0, 0});
    REQUIRE(chosen.has_value());
    CHECK(chosen.value() == negotiated_version{1, 0});
}

TEST_CASE("an inverted range on either side is an invalid argument", "[negotiation]") {
    SECTION("host") {
        const auto chosen = choose_version({1, 2, 1}, {1, 0, 5});
        REQUIRE(chosen.has_error());
        CHECK(chosen.error().code == status_code::invalid_argument);
        CHECK_THAT(chosen.error().message, Contains("host"));
        CHECK_THAT(chosen.error().message, Contains("inverted"));
    }
    SECTION("plugin") {
        const auto chosen = choose_version({1, 0, 5}, {1, 4, 3});
        REQUIRE(chosen.has_error());
        CHECK(chosen.error().code == status_code::invalid_argument);
        CHECK_THAT(chosen.error().message, Contains("plugin"));
        CHECK_THAT(chosen.error().message, Contains("inverted"));
    }
    SECTION("an inverted range overlapping the other is still refused") {
        const auto chosen = choose_version({1, 1, 0}, {1, 0, 1});
        REQUIRE(chosen.has_error());
        CHECK(chosen.error().code == status_code::invalid_argument);
    }
}

TEST_CASE("a range naming major 0 is an invalid argument", "[negotiation]") {
    const auto host_zero = choose_version({0, 0, 1}, {0, 0, 1});
    REQUIRE(host_zero.has_error());
    CHECK(host_zero.error().code == status_code::invalid_argument);
    CHECK_THAT(host_zero.error().message, Contains("host"));
    CHECK_THAT(host_zero.error().message, Contains("major 0"));

    const auto plugin_zero = choose_version({1, 0, 1}, {0, 0, 1});
    REQUIRE(plugin_zero.has_error());
    CHECK(plugin_zero.error().code == status_code::invalid_argument);
    CHECK_THAT(plugin_zero.error().message, Contains("plugin"));
}

TEST_CASE("the chosen version is the highest minor both ranges contain, for every small pair",
          "[negotiation]") {
    for (const version_range& host : small_ranges(3)) {
        for (const version_range& plugin : small_ranges(3)) {
            CAPTURE(host.describe(), plugin.describe());
            const auto chosen = choose_version(host, plugin);
            if (host.min_minor > host.max_minor || plugin.min_minor > plugin.max_minor) {
                REQUIRE(chosen.has_error());
                CHECK(chosen.error().code == status_code::invalid_argument);
                continue;
            }
            const std::optional<std::uint32_t> expected = highest_common_minor(host, plugin);
            REQUIRE(chosen.has_value() == expected.has_value());
            if (expected) {
                CHECK(chosen.value() == negotiated_version{1, *expected});
                // Negotiation is symmetric in its outcome.
                const auto swapped = choose_version(plugin, host);
                REQUIRE(swapped.has_value());
                CHECK(swapped.value() == chosen.value());
            } else {
                CHECK(chosen.error().code == status_code::version_mismatch);
            }
        }
    }
}

TEST_CASE("negotiation is repeatable", "[negotiation]") {
    const version_range host{1, 0, 1};
    const version_range plugin{1, 0, 3};
    const auto first = choose_version(host, plugin);
    const auto second = choose_version(host, plugin);
    REQUIRE(first.has_value());
    REQUIRE(second.has_value());
    CHECK(first.value() == second.value());

    const NxmemNegotiateResponse reply = make_reply(1, first.value().minor, plugin);
    const auto checked_once = check_negotiation_reply(host, reply);
    const auto checked_twice = check_negotiation_reply(host, reply);
    REQUIRE(checked_once.has_value());
    REQUIRE(checked_twice.has_value());
    CHECK(checked_once.value() == checked_twice.value());
    CHECK(checked_once.value() == first.value());

    const auto refused_once = choose_version({1, 3, 4}, {1, 0, 1});
    const auto refused_twice = choose_version({1, 3, 4}, {1, 0, 1});
    REQUIRE(refused_once.has_error());
    REQUIRE(refused_twice.has_error());
    CHECK(refused_once.error() == refused_twice.error());
}

TEST_CASE("the host accepts a reply consistent with both ranges", "[negotiation][reply]") {
    const auto checked =
        check_negotiation_reply(nxmem::abi::supported_range, make_reply(1, 1, {1, 0, 1}));
    REQUIRE(checked.has_value());
    CHECK(checked.value() == negotiated_version{1, 1});
}

TEST_CASE("every reply choose_version produces is accepted by the host", "[negotiation][reply]") {
    for (const version_range& host : small_ranges(3)) {
        for (const version_range& plugin : small_ranges(3)) {
            const auto chosen = choose_version(host, plugin);
            if (!chosen) {
                continue;
            }
            CAPTURE(host.describe(), plugin.describe());
            const auto checked = check_negotiation_reply(
                host, make_reply(chosen.value().major, chosen.value().minor, plugin));
            REQUIRE(checked.has_value());
            CHECK(checked.value() == chosen.value());
        }
    }
}

TEST_CASE("a reply choosing a lower common minor than the maximum is accepted as a ceiling",
          "[negotiation][reply]") {
    const auto checked = check_negotiation_reply({1, 0, 3}, make_reply(1, 1, {1, 0, 3}));
    REQUIRE(checked.has_value());
    CHECK(checked.value() == negotiated_version{1, 1});

    const auto baseline = check_negotiation_reply({1, 0, 1}, make_reply(1, 0, {1, 0, 1}));
    REQUIRE(baseline.has_value());
    CHECK(baseline.value() == negotiated_version{1, 0});
}

TEST_CASE("a reply whose minor is outside the host's range is a contract violation",
          "[negotiation][reply]") {
    SECTION("above") {
        const auto checked = check_negotiation_reply({1, 0, 1}, make_reply(1, 2, {1, 0, 2}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
        CHECK_THAT(checked.error().message, Contains("outside the host's range"));
        CHECK_THAT(checked.error().message, Contains("minor 2"));
    }
    SECTION("below") {
        const auto checked = check_negotiation_reply({1, 1, 3}, make_reply(1, 0, {1, 0, 2}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
        CHECK_THAT(checked.error().message, Contains("outside the host's range"));
    }
}

TEST_CASE("a reply whose minor is outside the plugin's own range is a contract violation",
          "[negotiation][reply]") {
    SECTION("above") {
        const auto checked = check_negotiation_reply({1, 0, 3}, make_reply(1, 3, {1, 0, 2}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
        CHECK_THAT(checked.error().message, Contains("outside its own range"));
    }
    SECTION("below") {
        const auto checked = check_negotiation_reply({1, 0, 3}, make_reply(1, 0, {1, 1, 2}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
        CHECK_THAT(checked.error().message, Contains("outside its own range"));
    }
}

TEST_CASE("a reply naming a major the host does not speak is a version mismatch",
          "[negotiation][reply]") {
    for (const std::uint32_t major : {0u, 2u, 0xFFFFFFFFu}) {
        CAPTURE(major);
        const auto checked = check_negotiation_reply({1, 0, 1}, make_reply(major, 1, {major, 0, 1}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::version_mismatch);
        CHECK_THAT(checked.error().message, Contains("major"));
    }
}

TEST_CASE("a reply with an invalid plugin range is a contract violation", "[negotiation][reply]") {
    SECTION("inverted") {
        const auto checked = check_negotiation_reply({1, 0, 1}, make_reply(1, 1, {1, 2, 0}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
        CHECK_THAT(checked.error().message, Contains("invalid range"));
    }
    SECTION("a range of another major than the reply") {
        const auto checked = check_negotiation_reply({1, 0, 1}, make_reply(1, 1, {2, 0, 1}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
    }
    SECTION("a range of major 0") {
        const auto checked = check_negotiation_reply({1, 0, 1}, make_reply(1, 1, {0, 0, 1}));
        REQUIRE(checked.has_error());
        CHECK(checked.error().code == status_code::contract_violation);
    }
}

TEST_CASE("the host refuses to check a reply against its own invalid range", "[negotiation][reply]") {
    const auto inverted = check_negotiation_reply({1, 1, 0}, make_reply(1, 0, {1, 0, 1}));
    REQUIRE(inverted.has_error());
    CHECK(inverted.error().code == status_code::invalid_argument);
    const auto major_zero = check_negotiation_reply({0, 0, 1}, make_reply(0, 0, {0, 0, 1}));
    REQUIRE(major_zero.has_error());
    CHECK(major_zero.error().code == status_code::invalid_argument);
}
