// Everything a plugin author writing in C++ needs: the guard, the mechanism concepts, the kit that
// builds the C tables, NXMEM_EXPORT_PLUGIN, and the blocks mechanisms are built from (options, the
// host's callbacks, pages and aligned mmap, the budget loop, a table of shared prefixes that owns
// their descriptors, memfd sharing and the opaque bytes and replay protection of imports).
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/nxmem_memory_abi.h>
#include <nxmem/plugin/budget.hpp>
#include <nxmem/plugin/committed_granules.hpp>
#include <nxmem/plugin/device_indices.hpp>
#include <nxmem/plugin/exports.hpp>
#include <nxmem/plugin/failures.hpp>
#include <nxmem/plugin/guard.hpp>
#include <nxmem/plugin/host_link.hpp>
#include <nxmem/plugin/import_guard.hpp>
#include <nxmem/plugin/mechanism.hpp>
#include <nxmem/plugin/memfd_share.hpp>
#include <nxmem/plugin/options.hpp>
#include <nxmem/plugin/pages.hpp>
#include <nxmem/plugin/prefix_table.hpp>
#include <nxmem/plugin/thread_tally.hpp>
#include <nxmem/usage.hpp>
