// Everything an engine integrator needs: load a plugin, open its mechanisms per device type, use
// them through DeviceAllocator, VirtualBacking and SharedMapping, and unload it when idle.
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/concepts.hpp>
#include <nxmem/heap_allocator.hpp>
#include <nxmem/host/capability_views.hpp>
#include <nxmem/host/handle_transport.hpp>
#include <nxmem/host/ipc_view.hpp>
#include <nxmem/host/module.hpp>
#include <nxmem/host/open_allocator.hpp>
#include <nxmem/host/owned_allocation.hpp>
#include <nxmem/host/owned_prefix.hpp>
#include <nxmem/host/plugin_allocator.hpp>
#include <nxmem/host/pooled_allocator.hpp>
#include <nxmem/host/registration_lease.hpp>
#include <nxmem/usage.hpp>
