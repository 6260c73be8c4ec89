#include "report_json.hpp"

#include "names.hpp"

namespace nxmem::tool {

namespace {

using json = nlohmann::ordered_json;

// {"code": "CONTRACT_VIOLATION", "message": "...", "description": "CONTRACT_VIOLATION: ..."}
json error_json(const error& failure) {
    return {{"code", std::string(status_code_name(failure.code))},
            {"message", failure.message},
            {"description", failure.describe()}};
}

json range_json(const abi::version_range& range) {
    return {{"major", range.major}, {"min_minor", range.min_minor}, {"max_minor", range.max_minor}};
}

json probe_json(const std::optional<allocator_probe>& probe) {
    if (!probe) {
        return {{"opened", false},
                {"device_type", nullptr},
                {"not_opened_because", "serves no device type nxmem has a tag for"}};
    }
    json out{{"opened", !probe->refused.has_value()},
             {"device_type", device_type_label(probe->device_type)},
             {"device_index", 0}};
    if (probe->refused) {
        out["refused"] = error_json(*probe->refused);
        return out;
    }
    out["declared_minor"] = probe->declared_minor;
    out["effective_minor"] = probe->effective_minor;
    out["capabilities"] = capability_names(probe->capabilities);
    out["capability_bits"] = probe->capabilities;
    out["virtual_backing_view"] = probe->virtual_backing_view;
    out["shared_mapping_view"] = probe->shared_mapping_view;
    json tables = json::array();
    for (const host::capability_table_level& table : probe->capability_tables) {
        tables.push_back({{"name", std::string(table.name)},
                          {"declared_minor", table.declared_minor},
                          {"effective_minor", table.effective_minor}});
    }
    out["capability_tables"] = tables;
    out["host_bookkeeping_bytes"] = probe->host_bookkeeping_bytes;
    if (probe->virtual_backing_view) {
        out["commit_granularity"] = probe->commit_granularity;
    }
    if (probe->usage) {
        out["usage"] = {{"live_allocations", probe->usage->live_allocations},
                        {"reserved_bytes", probe->usage->reserved_bytes},
                        {"mapped_bytes", probe->usage->mapped_bytes},
                        {"shared_prefix_bytes", probe->usage->shared_prefix_bytes},
                        {"quarantined_bytes", probe->usage->quarantined_bytes},
                        {"live_imports", probe->usage->live_imports},
                        {"imported_bytes", probe->usage->imported_bytes}};
    } else if (probe->usage_failed) {
        out["usage_failed"] = error_json(*probe->usage_failed);
    }
    return out;
}

json factory_json(const factory_report& entry) {
    const host::factory_info& factory = entry.factory;
    return {{"name", factory.name},
            {"mechanism_id", factory.mechanism_id},
            {"device_types", device_type_names(factory.device_types)},
            {"device_type_bits", factory.device_types},
            {"declared_minor", factory.declared_minor},
            {"effective_minor", factory.effective_minor},
            {"allocator", probe_json(entry.probe)}};
}

json plugin_counts_json(const host::plugin_counts& counts) {
    return {{"allocators", counts.allocators},
            {"allocations", counts.allocations},
            {"views", counts.views},
            {"shared_prefixes", counts.shared_prefixes},
            {"queued_releases", counts.queued_releases}};
}

json host_counts_json(const host::host_counts& counts) {
    return {{"allocators", counts.allocators},
            {"allocations", counts.allocations},
            {"views", counts.views},
            {"shared_prefixes", counts.shared_prefixes},
            {"queued_releases", counts.queued_releases},
            {"pins", counts.pins}};
}

json unload_json(const unload_report& unload) {
    json readiness = nullptr;
    if (unload.readiness) {
        readiness = {{"ready", unload.readiness->ready()},
                     {"plugin", plugin_counts_json(unload.readiness->plugin)},
                     {"host", host_counts_json(unload.readiness->host)}};
    } else if (unload.readiness_failed) {
        readiness = {{"ready", false}, {"failed", error_json(*unload.readiness_failed)}};
    }
    json out{{"readiness", readiness}, {"unloaded", unload.unloaded}};
    if (unload.unload_refused) {
        out["refused"] = error_json(*unload.unload_refused);
    }
    if (unload.unloaded) {
        out["still_mapped"] = unload.still_mapped;
    }
    return out;
}

} // namespace

nlohmann::ordered_json to_json(const plugin_report& report) {
    json out{{"path", report.path}, {"loaded", report.loaded()}};
    if (!report.loaded()) {
        out["refused"] = error_json(*report.refused);
        out["host_range"] = range_json(report.host_range);
        return out;
    }
    out["negotiated_version"] = {{"major", report.version.major}, {"minor", report.version.minor}};
    out["host_range"] = range_json(report.host_range);
    out["plugin_range"] = range_json(report.plugin_range);
    out["clamped"] = report.clamped();
    json factories = json::array();
    for (const factory_report& entry : report.factories) {
        factories.push_back(factory_json(entry));
    }
    out["factories"] = std::move(factories);
    out["unload"] = unload_json(report.unload);
    return out;
}

} // namespace nxmem::tool
