// Residency: pools that sleep and wake at the same addresses, by tag (docs/HOST.md "Residency").
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/residency/resident_memory.hpp>
#include <nxmem/residency/resident_pool.hpp>
#include <nxmem/residency/residency_state.hpp>
#include <nxmem/residency/residency_tags.hpp>
#include <nxmem/residency/sleep_policy.hpp>
