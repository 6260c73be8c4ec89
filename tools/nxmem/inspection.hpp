// Inspecting one plugin: load it, list its factories, open each mechanism once, check the unload
// gate, unload it and confirm the library is gone. The result is plain data, formatted elsewhere
// (report_text.hpp, report_json.hpp).
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/abi/version.hpp>
#include <nxmem/host/capability_table_level.hpp>
#include <nxmem/host/factory_info.hpp>
#include <nxmem/host/load_options.hpp>
#include <nxmem/host/tally.hpp>
#include <nxmem/usage.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace nxmem::tool {

// One mechanism opened on device 0 of the first device type it serves that the tool has a tag for.
struct allocator_probe {
    NxmemDeviceType device_type = 0;
    std::optional<error> refused; // why the open (or the host's check of the table) failed
    // The rest is set only when the open succeeded.
    std::uint32_t declared_minor = 0;
    std::uint32_t effective_minor = 0;
    NxmemCapabilities capabilities = 0;
    bool virtual_backing_view = false;
    bool shared_mapping_view = false;
    std::vector<host::capability_table_level> capability_tables;
    std::uint64_t commit_granularity = 0;        // 0 without virtual backing
    std::optional<allocator_usage> usage;        // the usage query's answer, when offered (minor 2)
    std::optional<error> usage_failed;           // offered, but the query failed
    std::size_t host_bookkeeping_bytes = 0;      // what the host keeps for the open allocator
};

struct factory_report {
    host::factory_info factory;
    std::optional<allocator_probe> probe; // empty: it serves no device type the tool can open
};

// The unload gate after probing, then the unload itself.
struct unload_report {
    std::optional<host::unload_readiness> readiness;
    std::optional<error> readiness_failed; // the readiness query itself failed
    std::optional<error> unload_refused;   // try_unload() refused, with both tallies in its message
    bool unloaded = false;
    bool still_mapped = false; // unloaded, but dlopen(RTLD_NOLOAD) still finds the library
};

struct plugin_report {
    std::string path;             // as given
    std::optional<error> refused; // the load failed; nothing below is set
    abi::negotiated_version version{};
    abi::version_range host_range{};
    abi::version_range plugin_range{};
    std::vector<factory_report> factories;
    unload_report unload;

    bool loaded() const noexcept { return !refused.has_value(); }
    // A newer plugin under an older host: the plugin speaks minors above the negotiated one.
    bool clamped() const noexcept { return loaded() && plugin_range.max_minor > version.minor; }
};

// Never throws for anything the plugin does; every failure is recorded in the report.
plugin_report inspect_plugin(const std::filesystem::path& path, const host::load_options& options);

} // namespace nxmem::tool
