// Fuzzes negotiation from both sides: the plugin's choose_version and the host's
// check_negotiation_reply on arbitrary ranges and replies. Input: the host's range (3 x u32), the
// plugin's range (3 x u32), then a reply (major, minor, the plugin range it reports: 5 x u32).
#include "fuzz_support.hpp"

#include <nxmem/abi/version.hpp>

// Inside nxmem::fuzz, `abi` is nxmem::abi (the global `abi` of <cxxabi.h> would clash).
namespace nxmem::fuzz {
namespace {

bool contains(const abi::version_range& range, std::uint32_t major, std::uint32_t minor) {
    return range.major == major && range.min_minor <= minor && minor <= range.max_minor;
}

bool usable(const abi::version_range& range) {
    return range.major != 0 && range.min_minor <= range.max_minor;
}

abi::version_range take_range(input_reader& in) {
    abi::version_range range;
    range.major = in.u32();
    range.min_minor = in.u32();
    range.max_minor = in.u32();
    return range;
}

} // namespace

int run_one(const std::uint8_t* data, std::size_t size) {
    input_reader in(data, size);
    const abi::version_range host = take_range(in);
    const abi::version_range plugin = take_range(in);

    NXMEM_FUZZ_CHECK(abi::check_range(host, "host").has_value() == usable(host));

    // The plugin's side: the highest common minor, or a reason.
    const auto chosen = abi::choose_version(host, plugin);
    if (chosen) {
        const auto agreed = chosen.value();
        NXMEM_FUZZ_CHECK(usable(host) && usable(plugin));
        NXMEM_FUZZ_CHECK(contains(host, agreed.major, agreed.minor));
        NXMEM_FUZZ_CHECK(contains(plugin, agreed.major, agreed.minor));
        NXMEM_FUZZ_CHECK(agreed.minor == host.max_minor || agreed.minor == plugin.max_minor);
        // What an honest plugin answers, the host accepts, with the same result.
        NxmemNegotiateResponse reply = abi::make_struct<NxmemNegotiateResponse>();
        reply.major = agreed.major;
        reply.minor = agreed.minor;
        reply.plugin_range = plugin.to_wire();
        const auto accepted = abi::check_negotiation_reply(host, reply);
        NXMEM_FUZZ_CHECK(accepted && accepted.value() == agreed);
    } else {
        const status_code code = chosen.error().code;
        NXMEM_FUZZ_CHECK(code == status_code::invalid_argument || code == status_code::version_mismatch);
        NXMEM_FUZZ_CHECK((code == status_code::invalid_argument) == (!usable(host) || !usable(plugin)));
        if (code == status_code::version_mismatch && host.major == plugin.major) {
            // No common minor, really.
            NXMEM_FUZZ_CHECK(host.max_minor < plugin.min_minor || plugin.max_minor < host.min_minor);
        }
    }

    // The host's side, on whatever a plugin might answer.
    NxmemNegotiateResponse reply = abi::make_struct<NxmemNegotiateResponse>();
    reply.major = in.u32();
    reply.minor = in.u32();
    reply.plugin_range = take_range(in).to_wire();
    reply.plugin_range.struct_size = in.u32();
    const abi::version_range reported = abi::version_range::from_wire(reply.plugin_range);
    const auto accepted = abi::check_negotiation_reply(host, reply);
    if (accepted) {
        NXMEM_FUZZ_CHECK(usable(host) && usable(reported));
        NXMEM_FUZZ_CHECK(accepted.value().major == reply.major && accepted.value().minor == reply.minor);
        NXMEM_FUZZ_CHECK(contains(host, reply.major, reply.minor));
        NXMEM_FUZZ_CHECK(contains(reported, reply.major, reply.minor));
    } else {
        const status_code code = accepted.error().code;
        NXMEM_FUZZ_CHECK(code == status_code::invalid_argument ||
                         code == status_code::version_mismatch ||
                         code == status_code::contract_violation);
        NXMEM_FUZZ_CHECK(!accepted.error().message.empty());
    }
    return 0;
}

} // namespace nxmem::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return nxmem::fuzz::run_one(data, size);
}
