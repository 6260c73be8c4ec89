/* The C entry points of nxmem_torch_cuda.so, in the shape of PyTorch's CUDAPluggableAllocator
 * (docs/TORCH.md, "CUDA tensors through CUDAPluggableAllocator"): device memory from nxmem's cuda
 * plugin, pooled, and reused in stream order (nxmem::stream_ordered_pool), so a tensor freed while
 * kernels that use it are still queued is handed to another stream only after them.
 *
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "nxmem_cuda_malloc", "nxmem_cuda_free")
 *   allocator.allocator().set_record_stream_fn(...)   -> nxmem_cuda_record_stream
 *
 * The plugin is NXMEM_TORCH_CUDA_PLUGIN (a path to nxmem_cuda.so), its mechanism
 * NXMEM_TORCH_CUDA_MECHANISM (default cuda-eager), the driver NXMEM_CUDA_DRIVER (default
 * libcuda.so.1). Every entry point is thread-safe and never throws; a failure is kept for
 * nxmem_cuda_last_error (per thread). */
#ifndef NXMEM_TORCH_CUDA_PLUGGABLE_ALLOCATOR_H
#define NXMEM_TORCH_CUDA_PLUGGABLE_ALLOCATOR_H

#include <cuda.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* `size` bytes on CUDA device `device` for work on `stream` (512-byte aligned, as PyTorch's own);
 * NULL when it cannot (size 0 included; nxmem_cuda_last_error says why). */
void *nxmem_cuda_malloc(ssize_t size, int device, CUstream stream);
/* Releases `ptr` (from nxmem_cuda_malloc, of `size` bytes on `device`) on `stream`, the stream it
 * was allocated on: reused by that stream at once, by others after its work (an event). */
void nxmem_cuda_free(void *ptr, ssize_t size, int device, CUstream stream);
/* `ptr` is used on `stream` too: its release waits for `stream`'s work as well. */
void nxmem_cuda_record_stream(void *ptr, CUstream stream);
/* Gives memory whose streams finished back to the plugin; returns the bytes the pools gave back. */
unsigned long long nxmem_cuda_trim(void);
/* The calling thread's last failure ("" when none). */
const char *nxmem_cuda_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
