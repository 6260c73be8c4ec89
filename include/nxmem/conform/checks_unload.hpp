// Unload: the plugin's report is non-zero while objects are live and zero after; an idle plugin
// unloads; and after unload the library is really unmapped (RTLD_NOLOAD finds nothing).
#pragma once

#include <nxmem/conform/check.hpp>
#include <nxmem/conform/detail/raw_library.hpp>
#include <nxmem/conform/subject.hpp>

#include <string>

namespace nxmem::conform {

// unload.refused_while_live
struct check_unload_refused_while_live {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the mechanism opens", session<D>::open(target));
        NXMEM_CONFORM_TRY(live, "a live allocation", opened.allocator().allocate(4096, 64));
        NXMEM_CONFORM_TRY(counts, "the plugin reports its readiness", opened.plugin_counts());
        announce_step("try_unload with an allocation live");
        result<void> unloaded = opened.module()->try_unload();
        const bool refused = !unloaded && unloaded.error().code == status_code::busy;
        (void)opened.allocator().release(live);
        if (counts.allocators == 0 || counts.allocations == 0) {
            return failed("the plugin reports its live allocator and allocation", counts.describe());
        }
        if (!refused) {
            return failed("BUSY while an allocation is live",
                          unloaded ? "unloaded" : unloaded.error().describe());
        }
        return passed();
    }
};

// unload.idle: after use, everything given back, the report is all zero and the plugin unloads.
struct check_unload_idle {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        NXMEM_CONFORM_TRY(opened, "the host loads the plugin", session<D>::load(target));
        if (opened.open_allocator(target)) { // a refused open must leave nothing behind either
            result<allocation<D>> made = opened.allocator().allocate(4096, 64);
            if (made) {
                (void)opened.allocator().release(made.value());
            }
            opened.close_allocator();
        }
        NXMEM_CONFORM_TRY(counts, "the plugin reports its readiness", opened.plugin_counts());
        if (!counts.idle()) {
            return failed("an all-zero unload report once everything is given back", counts.describe());
        }
        result<void> unloaded = opened.close();
        if (!unloaded) {
            return failed("an idle plugin unloads", unloaded.error().describe());
        }
        return passed();
    }
};

// unload.unmapped
struct check_unload_unmapped {
    template <Device D> static finding run(const subject& target, const suite_options&) {
        {
            NXMEM_CONFORM_TRY(opened, "the host loads the plugin", session<D>::load(target));
            if (opened.open_allocator(target)) {
                result<allocation<D>> made = opened.allocator().allocate(4096, 64);
                if (made) {
                    (void)opened.allocator().release(made.value());
                }
            }
            result<void> unloaded = opened.close();
            if (!unloaded) {
                return failed("the plugin unloads", unloaded.error().describe());
            }
        }
        if (detail::is_mapped(target.path)) {
            return failed("the library unmapped after unload (dlopen RTLD_NOLOAD finds nothing)",
                          "still mapped: build the plugin with -fno-gnu-unique and keep no "
                          "thread or atexit handler of its own alive");
        }
        return passed();
    }
};

} // namespace nxmem::conform
