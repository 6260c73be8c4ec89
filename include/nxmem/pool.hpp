// Pools: pool_allocator<Upstream> over any DeviceAllocator (docs/HOST.md, "Pools").
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/pool/pool_allocator.hpp>
#include <nxmem/pool/pool_lease.hpp>
#include <nxmem/pool/pool_options.hpp>
#include <nxmem/pool/pool_region.hpp>
#include <nxmem/pool/pool_usage.hpp>
#include <nxmem/pool/shared_upstream.hpp>
#include <nxmem/pool/size_classes.hpp>
#include <nxmem/pool/virtual_upstream.hpp>
