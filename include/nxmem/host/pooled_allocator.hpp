// open_pooled_allocator<D>: a plugin allocator opened already pooled, with a reclaim hook that
// gives the pool's idle memory back first when the plugin asks the host to reclaim (a budget,
// docs/ABI.md rule H), before the engine's own hook is asked and before an allocation fails.
#pragma once

#include <nxmem/host/open_allocator.hpp>
#include <nxmem/pool/pool_allocator.hpp>

#include <memory>
#include <mutex>
#include <string_view>

namespace nxmem::host {

template <Device D> using pooled_plugin_allocator = pool_allocator<plugin_allocator<D>>;

namespace detail {
// What the reclaim hook reaches the pool through. The pool owns the allocator, which owns the
// hook, so the hook holds the pool weakly: no cycle, and a hook called while the pool is being
// destroyed finds nothing to trim.
template <Device D> struct pool_link {
    std::mutex mutex;
    std::weak_ptr<pooled_plugin_allocator<D>> pool;
};
} // namespace detail

// Opens `factory_name` on device `index` with a reclaim hook that trims the pool first (all its
// idle memory: cached spans, free chunks), then calls `engine_hook` if given; the pool owns the
// plugin_allocator. The plugin's request succeeds when the pool's trim gave anything back;
// otherwise it gets the engine hook's answer, or a refusal without one (its allocation then fails
// with OUT_OF_MEMORY, which the pool reports as such).
template <Device D>
result<std::shared_ptr<pooled_plugin_allocator<D>>>
open_pooled_allocator(const std::shared_ptr<plugin_module>& module, std::string_view factory_name,
                      std::int32_t index = 0, std::string_view options = {},
                      pool_options pooling = {}, reclaim_function engine_hook = {}) {
    return detail::contain("open_pooled_allocator", [&]() -> result<std::shared_ptr<pooled_plugin_allocator<D>>> {
        auto link = std::make_shared<detail::pool_link<D>>();
        auto hook = [link, engine_hook = std::move(engine_hook)](const reclaim_request& request) -> result<void> {
            std::shared_ptr<pooled_plugin_allocator<D>> pool;
            {
                std::lock_guard lock(link->mutex);
                pool = link->pool.lock();
            }
            const std::uint64_t given = pool != nullptr ? pool->trim(0) : 0;
            // The engine's hook runs whatever the trim gave; its refusal reaches the plugin only when
            // the pool gave nothing either, so one hook serves an allocator with or without a pool.
            result<void> evicted = engine_hook ? engine_hook(request)
                                               : result<void>(fail(status_code::host_refused,
                                                                   "the pool had no idle memory to give back"));
            if (given > 0) {
                return boost::outcome_v2::success();
            }
            return evicted;
        };
        NXMEM_TRY(allocator, open_allocator<D>(module, factory_name, index, options, std::move(hook)));
        auto pool = std::make_shared<pooled_plugin_allocator<D>>(std::move(allocator), pooling);
        {
            std::lock_guard lock(link->mutex);
            link->pool = pool;
        }
        return pool;
    });
}

} // namespace nxmem::host
