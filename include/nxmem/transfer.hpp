// The transfer layer (docs/TRANSFER.md): nxmem memory registered with UCX, described to remote
// agents and read and written between processes and machines. Only code that has UCX includes
// it (Meson: nxmem_transfer_dep, the `ucx` feature).
#pragma once

#include <nxmem/detail/require_cxx20.hpp>

#include <nxmem/transfer/agent.hpp>
#include <nxmem/transfer/agent_options.hpp>
#include <nxmem/transfer/descriptor.hpp>
#include <nxmem/transfer/peer.hpp>
#include <nxmem/transfer/registration.hpp>
#include <nxmem/transfer/transfer_request.hpp>
#include <nxmem/transfer/wire.hpp>
