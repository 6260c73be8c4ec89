/* The fake CUDA driver's test controls: configuration, fault injection and counters. The fake
 * (libfake_cuda.so, test-only, never installed) implements the driver entry points the cuda
 * plugin resolves over host memory. Tests point NXMEM_CUDA_DRIVER at it, dlopen the same file
 * (one instance: the dynamic loader shares it with the plugin) and reach these with dlsym.
 *
 * Without a call to fake_cuda_configure the fake starts from the environment:
 *   NXMEM_FAKE_CUDA_DEVICES      devices (default 1; 0: cuInit answers CUDA_ERROR_NO_DEVICE)
 *   NXMEM_FAKE_CUDA_VERSION      what cuDriverGetVersion reports (default 13000)
 *   NXMEM_FAKE_CUDA_GRANULARITY  allocation granularity in bytes (default 2 MiB)
 *   NXMEM_FAKE_CUDA_MEMORY       bytes of memory per device (default 1 GiB)
 *   NXMEM_FAKE_CUDA_VMM          0: devices do not support virtual memory management
 *   NXMEM_FAKE_CUDA_POSIX_FD     0: devices do not export memory as POSIX file descriptors
 *   NXMEM_FAKE_CUDA_SHARING      0: the driver has no cuMemExportToShareableHandle (nor import)
 *
 * Streams run their work later, on a thread each (stream 0 too), in order; a stream can be held
 * (fake_cuda_hold_stream). Memory freed with cuMemFree is handed out again, zeroed, to the next
 * cuMemAlloc of the same size.
 *
 * Sharing across processes is real: a physical allocation is a memfd named
 * "fake-cuda-physical-<device>", cuMemExportToShareableHandle hands out a duplicate of it, and
 * cuMemImportFromShareableHandle in any process accepts only such a memfd, so another process
 * that imports it maps the same pages. */
#ifndef NXMEM_FAKE_CUDA_CONTROL_H
#define NXMEM_FAKE_CUDA_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fake_cuda_config {
    int devices;
    int driver_version;
    uint64_t granularity;
    uint64_t device_memory;
    int vmm_supported;
    int posix_fd_supported; /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    int sharing_entry_points; /* 0: cuGetProcAddress finds no export/import entry point */
};

/* The driver calls a fault can be injected into. */
enum fake_cuda_call {
    FAKE_CUDA_MEM_ALLOC,
    FAKE_CUDA_MEM_FREE,
    FAKE_CUDA_MEM_ADDRESS_RESERVE,
    FAKE_CUDA_MEM_ADDRESS_FREE,
    FAKE_CUDA_MEM_CREATE,
    FAKE_CUDA_MEM_RELEASE,
    FAKE_CUDA_MEM_MAP,
    FAKE_CUDA_MEM_UNMAP,
    FAKE_CUDA_MEM_SET_ACCESS,
    FAKE_CUDA_PRIMARY_CTX_RETAIN,
    FAKE_CUDA_MEM_EXPORT, /* cuMemExportToShareableHandle */
    FAKE_CUDA_MEM_IMPORT, /* cuMemImportFromShareableHandle */
    FAKE_CUDA_CALL_KINDS
};

/* What the fake holds now, and what it saw. */
struct fake_cuda_counts {
    uint64_t device_allocations; /* cuMemAlloc'ed, not freed */
    uint64_t reservations;       /* address ranges reserved, not freed */
    uint64_t handles;            /* physical allocations alive (unreleased or still mapped), imports included */
    uint64_t imported_handles;   /* of those, imported from a descriptor */
    uint64_t mappings;           /* cuMemMap'ed ranges, not unmapped */
    uint64_t device_bytes;       /* memory in use on device 0 (what cuMemGetInfo deducts) */
    uint64_t primary_retains;    /* primary context references held, all devices */
    uint64_t calls_without_context; /* memory calls made with no current context */
    uint64_t calls[FAKE_CUDA_CALL_KINDS]; /* successful calls of each kind since the reset */
    uint64_t streams;             /* created, not destroyed (the legacy stream 0 is not counted) */
    uint64_t events;              /* created, not destroyed */
    uint64_t stream_work_pending; /* queued on any stream (stream 0 too) and not yet run */
};

/* Resets the fake: forgets every fault and count, applies `config` (NULL: the environment's).
 * Only while nothing is allocated. */
void fake_cuda_configure(const struct fake_cuda_config *config);

/* After `successes` more successful calls of `call`, the next `failures` calls fail with `code`
 * (a CUresult). */
void fake_cuda_fail(enum fake_cuda_call call, unsigned successes, unsigned failures, int code);

void fake_cuda_get_counts(struct fake_cuda_counts *counts);

/* Primary contexts pushed and not popped on the calling thread. */
unsigned fake_cuda_context_depth(void);

/* Holds `stream` (0: the legacy default stream) while `hold` is non-zero: work queued on it stays
 * pending, deterministically, until it is let go (fake_cuda_hold_stream(stream, 0)); what already
 * runs finishes. -1 for a stream the fake does not know. Let a stream go before destroying it:
 * cuStreamDestroy waits for the stream's work. */
int fake_cuda_hold_stream(struct CUstream_st *stream, int hold);

#ifdef __cplusplus
}
#endif

#endif
