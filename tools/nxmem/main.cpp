// The nxmem command: parses the command line and runs the one subcommand given. Each subcommand
// lives in its own file and registers itself through an add_* function (see subcommand.hpp).
#include "bench.hpp"
#include "conform.hpp"
#include "inspect.hpp"
#include "plugin_paths.hpp"
#include "subcommand.hpp"
#ifdef NXMEM_TOOL_TRANSFER
#include "transfer.hpp"
#endif

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
    using namespace nxmem::tool;

    CLI::App app{"nxmem: inspect and check memory-allocator plugins built against the nxmem C ABI.",
                 "nxmem"};
    app.set_version_flag("--version", version_text(), "Print the nxmem version and the plugin C ABI range it speaks");
    app.footer(default_plugins_help() +
               "\nExit status: 0 on success, 1 when a plugin was refused, 2 on bad usage.\n"
               "Run 'nxmem SUBCOMMAND --help' for a subcommand's options.");
    // At most one; none is reported below with the help text, and an unknown word is reported by
    // CLI11 as an unexpected argument rather than as a missing subcommand.
    app.require_subcommand(0, 1);

    const std::vector<subcommand> subcommands{
        add_inspect(app),
        add_conform(app),
        add_bench(app),
#ifdef NXMEM_TOOL_TRANSFER // only where UCX was found
        add_transfer(app),
#endif
    };

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& failure) {
        // Help is a success (status 0); every other parse error is a usage error (status 2).
        const int status = app.exit(failure);
        return status == static_cast<int>(CLI::ExitCodes::Success) ? exit_ok : exit_usage;
    }

    try {
        for (const subcommand& command : subcommands) {
            if (command.app->parsed()) {
                return command.run();
            }
        }
    } catch (const std::exception& failure) {
        std::cerr << "nxmem: internal error: " << failure.what() << '\n';
        return exit_refused;
    }
    std::cerr << "nxmem: no subcommand given\n\n" << app.help();
    return exit_usage;
}
