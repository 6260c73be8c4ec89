// The conformance suite a plugin author runs against a plugin (also `nxmem conform`): every rule
// of the contract, checked from outside, as a host meets the plugin.
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/suite.hpp>
