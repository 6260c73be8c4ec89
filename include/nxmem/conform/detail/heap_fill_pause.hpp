// glibc's MALLOC_PERTURB_ (a debugging aid that `meson test` sets at random for every test) makes
// malloc and free fill each block they hand out or take back. edges.sizes asks the plugin for
// 2^32 + 4096 bytes, which a malloc-backed plugin serves lazily by mmap: with the fill on, those
// 4 GiB are written twice, some 13 s and 4 GiB of memory per mechanism, for a probe that only
// reads the result. While a pause lives the fill is off in this process; it is set back from the
// environment (glibc offers no way to read the current value) when the pause ends. Elsewhere
// than glibc it does nothing.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdlib>

namespace nxmem::conform::detail {

class heap_fill_pause {
public:
    heap_fill_pause() noexcept {
#if defined(__GLIBC__) && defined(M_PERTURB)
        ::mallopt(M_PERTURB, 0);
#endif
    }
    heap_fill_pause(const heap_fill_pause&) = delete;
    heap_fill_pause& operator=(const heap_fill_pause&) = delete;
    ~heap_fill_pause() {
#if defined(__GLIBC__) && defined(M_PERTURB)
        if (const char* fill = std::getenv("MALLOC_PERTURB_"); fill != nullptr) {
            ::mallopt(M_PERTURB, std::atoi(fill));
        }
#endif
    }
};

} // namespace nxmem::conform::detail
