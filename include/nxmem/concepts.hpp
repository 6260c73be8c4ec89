// The three concepts an engine writes its governor against, whoever implements them.
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/concepts/device_allocator.hpp>
#include <nxmem/concepts/shared_mapping.hpp>
#include <nxmem/concepts/virtual_backing.hpp>
#include <nxmem/device.hpp>
