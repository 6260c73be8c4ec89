// What an agent is started with (agent_options), what a transfer reports (transfer_status), and a
// notification a peer sent (docs/TRANSFER.md, "The API").
#pragma once

#include <nxmem/transfer/detail/records.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace nxmem::transfer {

// How reads and writes travel to a peer (docs/TRANSFER.md, "Two paths").
enum class transfer_path { automatic, messages, rma };

struct agent_options {
    std::string name = "nxmem";
    // UCX transports as UCX_TLS names them ("tcp", "sm", "posix,cma,self", ...); empty: UCX's
    // own choice (or UCX_TLS from the environment).
    std::string transports;
    // true: the agent progresses UCX in a thread of its own (sleeping on the worker's event fd);
    // false: the caller does, through transfer_request::poll / wait and agent::progress.
    bool progress_thread = false;
    // How reads and writes travel (docs/TRANSFER.md, "Two paths"): `messages`, as batch messages
    // of about 1 MiB of blocks each, which the target checks entry by entry (their bytes packed,
    // or by rendezvous straight between the blocks where the endpoint can: shared memory's cma);
    // `rma`, as one UCX get or put per block; `automatic`, messages wherever UCX would emulate the
    // gets and puts on the engine's memory with active messages (tcp, which has no RMA lane;
    // shared memory, whose RMA lanes reach only segments UCX allocated), gets and puts otherwise.
    transfer_path path = transfer_path::automatic;
};

// A notification a peer sent when a transfer completed: who sent it and the bytes it attached.
struct notification {
    agent_id sender{};
    std::string sender_name; // the name of the connected peer with that id, if any
    std::vector<std::byte> message;
};

enum class transfer_status { in_progress, done, failed };

} // namespace nxmem::transfer
