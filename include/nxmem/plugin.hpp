// Everything a plugin author writing in C++ needs: the guard, the mechanism concepts, the kit that
// builds the C tables, and NXMEM_EXPORT_PLUGIN.
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/nxmem_memory_abi.h>
#include <nxmem/plugin/committed_granules.hpp>
#include <nxmem/plugin/device_indices.hpp>
#include <nxmem/plugin/exports.hpp>
#include <nxmem/plugin/failures.hpp>
#include <nxmem/plugin/guard.hpp>
#include <nxmem/plugin/mechanism.hpp>
#include <nxmem/plugin/thread_tally.hpp>
#include <nxmem/usage.hpp>
