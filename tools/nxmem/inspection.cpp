// host.hpp comes before inspection.hpp on purpose: nxmem/host/callback_guard.hpp says
// `using detail::guard_status;` inside nxmem::host, which picks nxmem::host::detail (and fails)
// once tally.hpp (included by inspection.hpp) has declared that namespace.
#include <nxmem/host.hpp>

#include "inspection.hpp"

#include <nxmem/device.hpp>

#include <dlfcn.h>

#include <memory>
#include <system_error>
#include <utility>

namespace nxmem::tool {

namespace {

// Opens `factory` on device 0 of D, reads what the host accepted, and closes it again: the
// allocator and any view are gone when this returns.
template <Device D>
allocator_probe probe_on(const std::shared_ptr<host::plugin_module>& module,
                         const host::factory_info& factory) {
    allocator_probe probe;
    probe.device_type = D::type;
    result<host::plugin_allocator<D>> opened = host::open_allocator<D>(module, factory.name, 0);
    if (!opened) {
        probe.refused = opened.error();
        return probe;
    }
    const host::plugin_allocator<D>& allocator = opened.value();
    probe.declared_minor = allocator.declared_minor();
    probe.effective_minor = allocator.effective_minor();
    probe.capabilities = allocator.capabilities();
    if (auto backing = allocator.virtual_backing()) {
        probe.virtual_backing_view = true;
        probe.commit_granularity = backing.value().commit_granularity();
    }
    if ((probe.capabilities & NXMEM_CAP_USAGE_QUERY) != 0) {
        result<allocator_usage> usage = allocator.query_usage();
        if (usage) {
            probe.usage = usage.value();
        } else {
            probe.usage_failed = usage.error();
        }
    }
    probe.shared_mapping_view = allocator.shared_mapping().has_value();
    probe.capability_tables = allocator.capability_tables();
    probe.host_bookkeeping_bytes = allocator.bookkeeping_bytes();
    return probe;
}

// The first device type `factory` serves that the tool has a device tag for, probed with that tag.
std::optional<allocator_probe> probe_factory(const std::shared_ptr<host::plugin_module>& module,
                                             const host::factory_info& factory) {
    for (NxmemDeviceType type = 0; type < 64; ++type) {
        if (!factory.serves(type)) {
            continue;
        }
        switch (type) {
        case cpu_device::type: return probe_on<cpu_device>(module, factory);
        case cuda_device::type: return probe_on<cuda_device>(module, factory);
        case hip_device::type: return probe_on<hip_device>(module, factory);
        default: break; // no tag for this type: try the next one
        }
    }
    return std::nullopt;
}

// Whether the dynamic loader still has `path` mapped. RTLD_NOLOAD never maps anything; when it
// finds the library it takes a reference, which is dropped again at once.
bool still_mapped(const std::filesystem::path& path) {
    std::error_code ignored;
    std::filesystem::path absolute = std::filesystem::absolute(path, ignored);
    if (absolute.empty()) {
        absolute = path;
    }
    void* handle = ::dlopen(absolute.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
        ::dlerror(); // leave no stale loader message behind for the next load's report
        return false;
    }
    ::dlclose(handle);
    return true;
}

} // namespace

plugin_report inspect_plugin(const std::filesystem::path& path, const host::load_options& options) {
    plugin_report report;
    report.path = path.string();
    report.host_range = options.host_range;

    result<std::shared_ptr<host::plugin_module>> loaded = host::plugin_module::load(path, options);
    if (!loaded) {
        report.refused = loaded.error();
        return report;
    }
    std::shared_ptr<host::plugin_module> module = std::move(loaded).value();
    report.version = module->version();
    report.host_range = module->host_range();
    report.plugin_range = module->plugin_range();

    for (const host::factory_info& factory : module->factories()) {
        report.factories.push_back({factory, probe_factory(module, factory)});
    }

    result<host::unload_readiness> readiness = module->readiness();
    if (readiness) {
        report.unload.readiness = readiness.value();
    } else {
        report.unload.readiness_failed = readiness.error();
    }

    result<void> unloaded = module->try_unload();
    if (!unloaded) {
        report.unload.unload_refused = unloaded.error();
        return report; // the module unloads when `module` goes; the report says it was refused
    }
    report.unload.unloaded = true;
    module.reset();
    report.unload.still_mapped = still_mapped(path);
    return report;
}

} // namespace nxmem::tool
