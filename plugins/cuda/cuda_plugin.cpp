// The cuda plugin: device memory on NVIDIA GPUs through the CUDA driver API, loaded at run time.
//   cuda-eager  cuMemAlloc / cuMemFree: usable and costed at once
//   cuda-vmm    cuMemAddressReserve, committed chunk by chunk with cuMemCreate + cuMemMap +
//               cuMemSetAccess, shared prefixes as one physical allocation mapped many times and
//               shared with other processes as a POSIX file descriptor (sharing.hpp)
// Options, driver calls, failure statuses and figures: docs/plugins/cuda.md.
#include "eager.hpp"
#include "vmm.hpp"

#include <nxmem/plugin.hpp>

NXMEM_EXPORT_PLUGIN(nxmem::cuda::eager_mechanism, nxmem::cuda::vmm_mechanism);
