// The posix plugin: production host memory for the cpu device type.
//   posix-eager  heap or mmap memory, usable and costed at once
//   posix-lazy   reserved address space, committed by page ranges, with memfd shared prefixes
// Options, costs, accounting rules and limits: docs/plugins/posix.md.
#include "eager.hpp"
#include "lazy.hpp"

#include <nxmem/plugin.hpp>

NXMEM_EXPORT_PLUGIN(nxmem::posix::eager_mechanism, nxmem::posix::lazy_mechanism);
