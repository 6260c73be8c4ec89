// The engine's reclaim hook: how a plugin's request_reclaim reaches the engine's governor.
#pragma once

#include <nxmem/abi/result.hpp>
#include <nxmem/device.hpp>

#include <concepts>
#include <cstdint>
#include <functional>

namespace nxmem::host {

// A plugin's request to free memory on its behalf.
struct reclaim_request {
    std::uint64_t mechanism_id = 0;
    device_id device{};
    std::uint64_t bytes_needed = 0;
};

// A reclaim hook frees what it can and returns success (the plugin retries) or a failure (the
// plugin's request is refused with HOST_REFUSED). It may call back into the same allocator on the
// same thread; no host lock is held while it runs.
template <class H>
concept ReclaimHook = std::copy_constructible<H> &&
    requires(H& hook, const reclaim_request& request) {
        { hook(request) } -> std::same_as<result<void>>;
    };

using reclaim_function = std::function<result<void>(const reclaim_request&)>;

} // namespace nxmem::host
