#include "plugin_args.hpp"

#include <nxmem/nxmem_memory_abi.h>

namespace nxmem::tool {

CLI::Option* add_mechanism_option(CLI::App& command, std::string& mechanism, const std::string& help) {
    return command.add_option("--mechanism", mechanism, help)->type_name("NAME");
}

CLI::Option* add_mechanism_options_option(CLI::App& command, std::string& options, const std::string& help) {
    return command.add_option("--options", options, help)
        ->type_name("TEXT")
        ->check(CLI::Validator(
            [](std::string& text) -> std::string {
                return text.size() <= NXMEM_MAX_OPTIONS_BYTES
                           ? std::string()
                           : "at most " + std::to_string(NXMEM_MAX_OPTIONS_BYTES) + " bytes";
            },
            std::string()));
}

} // namespace nxmem::tool
