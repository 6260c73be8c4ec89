// The open options both posix mechanisms understand, taken from the open request:
//   huge_pages=BOOL   MADV_HUGEPAGE on mappings of 2 MiB or more, aligned to 2 MiB
//   populate=BOOL     pre-fault committed memory with MADV_POPULATE_WRITE
//   budget=BYTES      a ceiling on the bytes the allocator costs (suffixes k, M, G)
// The kit refuses any other option, naming it.
#pragma once

#include <nxmem/plugin/options.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace nxmem::posix {

struct settings {
    bool huge_pages = false;
    bool populate = false;
    std::optional<std::uint64_t> budget;

    static result<settings> take(plugin::options& options, const char* mechanism) {
        settings taken;
        NXMEM_TRY(huge_pages, options.take_flag("huge_pages"));
        NXMEM_TRY(populate, options.take_flag("populate"));
        NXMEM_TRY(budget, options.take_bytes("budget"));
        taken.huge_pages = huge_pages.value_or(false);
        taken.populate = populate.value_or(false);
        if (budget && *budget == 0) {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": option 'budget' must be at least one byte");
        }
        taken.budget = budget;
        return taken;
    }
};

} // namespace nxmem::posix
