// The open options both cuda mechanisms understand, taken from the open request:
//   budget=BYTES   a ceiling on the device memory the allocator holds (suffixes k, M, G)
// The kit refuses any other option, naming it.
#pragma once

#include <nxmem/plugin/options.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace nxmem::cuda {

struct settings {
    std::optional<std::uint64_t> budget;

    static result<settings> take(plugin::options& options, const char* mechanism) {
        NXMEM_TRY(budget, options.take_bytes("budget"));
        if (budget && *budget == 0) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": option 'budget' must be at least one byte");
        }
        return settings{budget};
    }
};

} // namespace nxmem::cuda
