// open_allocator<D>: opens a plugin mechanism on a device of type D.
#pragma once

#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/plugin_allocator.hpp>
#include <nxmem/host/reclaim.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace nxmem::host {

namespace detail {
template <Device D>
result<plugin_allocator<D>> open_by_name(const std::shared_ptr<plugin_module>& module,
                                         std::string_view factory_name, std::int32_t index,
                                         std::string_view options, reclaim_function reclaim) {
    const factory_info* factory = module->find_factory(factory_name);
    if (factory == nullptr) {
        return contain("open", [&]() -> result<plugin_allocator<D>> {
            return fail(status_code::invalid_argument, module->path().string() +
                                                           " has no mechanism called '" +
                                                           std::string(factory_name) + "'");
        });
    }
    NXMEM_TRY(core, allocator_core::open(module, *factory, device_id{D::type, index}, options,
                                         std::move(reclaim)));
    return plugin_allocator<D>(std::move(core));
}
} // namespace detail

// Opens the mechanism called `factory_name` on device `index` of type D, passing `options`
// (key=value text) to the mechanism. Without a reclaim hook the host offers no request_reclaim.
template <Device D>
result<plugin_allocator<D>> open_allocator(const std::shared_ptr<plugin_module>& module,
                                           std::string_view factory_name, std::int32_t index = 0,
                                           std::string_view options = {}) {
    return detail::open_by_name<D>(module, factory_name, index, options, reclaim_function{});
}

// The same, with the engine's reclaim hook serving the plugin's request_reclaim.
template <Device D, ReclaimHook Hook>
result<plugin_allocator<D>> open_allocator(const std::shared_ptr<plugin_module>& module,
                                           std::string_view factory_name, std::int32_t index,
                                           std::string_view options, Hook hook) {
    return detail::open_by_name<D>(module, factory_name, index, options,
                                   reclaim_function(std::move(hook)));
}

} // namespace nxmem::host
