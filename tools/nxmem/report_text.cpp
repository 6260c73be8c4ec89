#include "report_text.hpp"

#include "names.hpp"
#include "text_table.hpp"


#include <cstddef>
#include <string>

namespace nxmem::tool {

namespace {

// "1.1", or "1.1 (read as 1.0)" when the host clamped a newer table to the negotiated minor.
std::string minor_cell(std::uint32_t major, std::uint32_t declared, std::uint32_t effective) {
    std::string cell = version_label(major, declared);
    if (declared != effective) {
        cell += " (read as " + version_label(major, effective) + ")";
    }
    return cell;
}

// Each capability table with the level it declares, e.g. "virtual-backing 1.0".
std::string tables_cell(std::uint32_t major, const allocator_probe& probe) {
    std::vector<std::string> tables;
    for (const host::capability_table_level& table : probe.capability_tables) {
        tables.push_back(std::string(table.name) + " " +
                         minor_cell(major, table.declared_minor, table.effective_minor));
    }
    return join(tables, ", ", "none");
}

// A labelled line: "  label     text".
void print_field(std::ostream& out, const std::string& label, const std::string& text) {
    constexpr std::size_t label_width = 11;
    out << "  " << label << std::string(label.size() < label_width ? label_width - label.size() : 1, ' ')
        << text << '\n';
}

// What minor 2 adds per opened mechanism: the commit granularity and the usage query's answer on
// the freshly opened allocator.
void print_mechanism_details(std::ostream& out, const plugin_report& report) {
    for (const factory_report& entry : report.factories) {
        if (!entry.probe || entry.probe->refused) {
            continue;
        }
        const allocator_probe& probe = *entry.probe;
        std::vector<std::string> details;
        if (probe.virtual_backing_view) {
            details.push_back("commit granularity " + std::to_string(probe.commit_granularity) + " B");
        }
        if (probe.usage) {
            details.push_back("usage " + std::to_string(probe.usage->live_allocations) + " live, " +
                              std::to_string(probe.usage->reserved_bytes) + " B reserved, " +
                              std::to_string(probe.usage->mapped_bytes) + " B mapped, " +
                              std::to_string(probe.usage->shared_prefix_bytes) + " B in prefixes, " +
                              std::to_string(probe.usage->quarantined_bytes) + " B quarantined, " +
                              std::to_string(probe.usage->live_imports) + " imports of " +
                              std::to_string(probe.usage->imported_bytes) + " B");
        } else if (probe.usage_failed) {
            details.push_back("usage query failed: " + probe.usage_failed->describe());
        }
        details.push_back("host bookkeeping " + std::to_string(probe.host_bookkeeping_bytes) +
                          " B with nothing live");
        if (!details.empty()) {
            out << "    " << entry.factory.name << ": " << join(details, "; ", "") << '\n';
        }
    }
}

void print_mechanisms(std::ostream& out, const plugin_report& report) {
    std::size_t opened = 0;
    std::size_t refused = 0;
    for (const factory_report& entry : report.factories) {
        if (entry.probe && entry.probe->refused) {
            ++refused;
        } else if (entry.probe) {
            ++opened;
        }
    }
    print_field(out, "mechanisms", std::to_string(report.factories.size()) + " (" +
                                       std::to_string(opened) + " opened, " +
                                       std::to_string(refused) + " refused)");
    if (report.factories.empty()) {
        return;
    }
    using align = text_table::align;
    text_table table({{"NAME", align::left},
                      {"ID", align::right},
                      {"DEVICES", align::left},
                      {"FACTORY", align::left},
                      {"OPENED ON", align::left},
                      {"ALLOCATOR", align::left},
                      {"CAPABILITIES", align::left},
                      {"CAPABILITY TABLES", align::left}});
    for (const factory_report& entry : report.factories) {
        const host::factory_info& factory = entry.factory;
        std::vector<std::string> row{factory.name, std::to_string(factory.mechanism_id),
                                     join(device_type_names(factory.device_types), " ", "none"),
                                     minor_cell(report.version.major, factory.declared_minor, factory.effective_minor)};
        if (!entry.probe) {
            row.emplace_back("not opened: serves no device type nxmem has a tag for");
        } else if (entry.probe->refused) {
            row.push_back(device_type_label(entry.probe->device_type));
            row.push_back("refused: " + entry.probe->refused->describe());
        } else {
            const allocator_probe& probe = *entry.probe;
            row.push_back(device_type_label(probe.device_type));
            row.push_back(minor_cell(report.version.major, probe.declared_minor, probe.effective_minor));
            row.push_back(join(capability_names(probe.capabilities), " ", "none"));
            row.push_back(tables_cell(report.version.major, probe));
        }
        table.add_row(std::move(row));
    }
    table.print(out, "    ");
    out << "    (FACTORY, ALLOCATOR, CAPABILITY TABLES: the ABI version each table declares)\n";
    print_mechanism_details(out, report);
}

void print_unload(std::ostream& out, const unload_report& unload) {
    if (unload.readiness) {
        print_field(out, "readiness", unload.readiness->ready() ? "ready" : "not ready");
        print_field(out, "  plugin", unload.readiness->plugin.describe());
        print_field(out, "  host", unload.readiness->host.describe());
    } else if (unload.readiness_failed) {
        print_field(out, "readiness", "query failed: " + unload.readiness_failed->describe());
    }
    if (unload.unload_refused) {
        print_field(out, "unload", "refused: " + unload.unload_refused->describe());
    } else if (unload.still_mapped) {
        print_field(out, "unload", "unloaded, but the library is STILL MAPPED (dlclose kept it; "
                                   "was it built without -fno-gnu-unique?)");
    } else if (unload.unloaded) {
        print_field(out, "unload", "unloaded; the library is no longer mapped");
    }
}

} // namespace

void print_text(std::ostream& out, const plugin_report& report) {
    out << report.path << '\n';
    if (!report.loaded()) {
        print_field(out, "refused", report.refused->describe());
        return;
    }
    print_field(out, "version", version_label(report.version) + " negotiated; host " +
                                    report.host_range.describe() + ", plugin " +
                                    report.plugin_range.describe());
    if (report.clamped()) {
        print_field(out, "clamped", "the plugin speaks up to " +
                                        version_label(report.plugin_range.major,
                                                      report.plugin_range.max_minor) +
                                        "; its tables are read as " +
                                        version_label(report.version) + " at most");
    }
    print_mechanisms(out, report);
    print_unload(out, report.unload);
}

} // namespace nxmem::tool
