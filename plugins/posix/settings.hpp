// The open options the posix mechanisms understand, taken from the open request:
//   huge_pages=BOOL        both: MADV_HUGEPAGE on mappings of 2 MiB or more, aligned to 2 MiB
//   populate=BOOL          both: pre-fault committed memory with MADV_POPULATE_WRITE
//   budget=BYTES           both: a ceiling on the bytes the allocator costs (suffixes k, M, G)
//   mmap_threshold=BYTES   posix-eager: requests of this size or more are mmap'd (default 256 KiB)
//   commit=explicit|allocate  posix-lazy: commit by range (default) or the whole allocation at allocate
//   share=private|memfd    posix-lazy: allocations are private anonymous memory (default), or each
//                          is a memfd, so it can be exported to another process (ABI.md IP14)
//   max_imports=N          posix-lazy: at most N imported objects alive (default 1024; ABI.md IP18)
//   max_imported_bytes=BYTES  posix-lazy: at most this many imported bytes (default: the machine's
//                          physical memory)
// The kit refuses any other option, naming it (an eager option given to lazy included).
#pragma once

#include <nxmem/plugin/import_guard.hpp>
#include <nxmem/plugin/options.hpp>

#include <unistd.h>

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

// posix-eager's: the common options and where the C heap stops and mmap starts.
struct eager_settings : settings {
    static constexpr std::uint64_t default_mmap_threshold = 256 * 1024;
    // Requests of this size or more (and any aligned beyond a page) are mmap'd; smaller ones come
    // from the C heap. 0 maps everything.
    std::uint64_t mmap_threshold = default_mmap_threshold;

    static result<eager_settings> take(plugin::options& options, const char* mechanism) {
        eager_settings taken;
        NXMEM_TRY(common, settings::take(options, mechanism));
        static_cast<settings&>(taken) = common;
        NXMEM_TRY(threshold, options.take_bytes("mmap_threshold"));
        taken.mmap_threshold = threshold.value_or(default_mmap_threshold);
        return taken;
    }
};

// posix-lazy's: the common options and when memory is committed.
struct lazy_settings : settings {
    // commit=allocate: allocate maps the whole allocation readable and writable (and charges it),
    // so an engine that uses all of every allocation makes one mmap and one munmap, not also an
    // mprotect per commit. Decommit and commit still work on it as on any allocation.
    bool commit_at_allocate = false;
    // share=memfd: each allocation's memory is a memfd mapped MAP_SHARED, so export_allocation
    // can hand it to another process. Off by default: a page of shmem costs more to fault in and
    // to give back than an anonymous one (bench/ipc_bench.cpp, docs/HOST.md).
    bool share_memfd = false;
    // What another process can make this allocator import (ABI.md IP18): imported objects alive
    // (allocation imports not closed, imported prefixes not destroyed) and their whole pages. By
    // default 1024 and the machine's physical memory: a peer's sparse handles cannot fill this
    // process's address space, and more than the machine holds cannot be memory anyway.
    plugin::import_bounds imports;

    static result<lazy_settings> take(plugin::options& options, const char* mechanism) {
        lazy_settings taken;
        NXMEM_TRY(common, settings::take(options, mechanism));
        static_cast<settings&>(taken) = common;
        const std::optional<std::string> commit = options.take("commit");
        if (commit && *commit != "explicit" && *commit != "allocate") {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": option 'commit' = '" + *commit +
                            "' is neither 'explicit' nor 'allocate'");
        }
        taken.commit_at_allocate = commit && *commit == "allocate";
        const std::optional<std::string> share = options.take("share");
        if (share && *share != "private" && *share != "memfd") {
            return fail(status_code::invalid_argument,
                        std::string(mechanism) + ": option 'share' = '" + *share +
                            "' is neither 'private' nor 'memfd'");
        }
        taken.share_memfd = share && *share == "memfd";
        NXMEM_TRY(imports, plugin::import_bounds::take(options));
        taken.imports = imports;
        return taken;
    }
};

} // namespace nxmem::posix
