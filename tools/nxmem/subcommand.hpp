// How a subcommand plugs into the nxmem command: each subcommand file offers one `add_*` function
// that registers a CLI11 subcommand on the top-level app and returns it with the code that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace nxmem::tool {

// Exit statuses shared by every subcommand.
inline constexpr int exit_ok = 0;
inline constexpr int exit_refused = 1; // the subcommand ran and found something refused or failed
inline constexpr int exit_usage = 2;   // bad command line

struct subcommand {
    CLI::App* app = nullptr; // owned by the parent app
    std::function<int()> run; // called after parsing when this subcommand was given
};

} // namespace nxmem::tool
