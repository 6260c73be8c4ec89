/*
 * minimal_plugin.c: the smallest conforming nxmem plugin, in C11, against nothing but
 * nxmem_memory_abi.h and its helpers, nxmem_plugin_helpers.h. Copy it to start a plugin of your
 * own.
 *
 * It publishes one factory, "minimal-c", for CPU memory. Its allocator is eager (aligned_alloc),
 * speaks ABI minor 0 and offers no optional capability: every optional slot is NULL and the
 * capability flags are 0, which the host reports as UNSUPPORTED_CAPABILITY when asked.
 *
 * Rules this file follows, each because the contract (docs/ABI.md) requires it:
 *  - every request is checked before anything is touched: struct_size at least the baseline,
 *    any bytes beyond what we know all zero, mechanism and device ours;
 *  - outputs are written only within the struct_size the host set;
 *  - deallocate compares the host's description with our own record and refuses a mismatch;
 *  - nothing but plain C crosses the boundary, and messages go into the inline status buffer.
 */
#include "nxmem/nxmem_memory_abi.h"
#include "nxmem/nxmem_plugin_helpers.h" /* status writer, request and output checks */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The versions this plugin speaks: major 1, minors 0 to 0 (it fills no minor-1 slot). */
static const NxmemVersionRange plugin_range = {sizeof(NxmemVersionRange), NXMEM_ABI_MAJOR,
                                               NXMEM_ABI_MINOR_BASELINE, 0u};
/* Live allocations one allocator can track; a real plugin would use a hash table. */
#define MINIMAL_MAX_LIVE 256u

/* Module-wide tallies for NxmemQueryUnloadReadiness: the host unloads us only when both are 0. */
static atomic_uint_least64_t live_allocators;
static atomic_uint_least64_t live_allocations;

/* ---- the allocator ----------------------------------------------------------------------- */

typedef struct LiveAllocation {
    void *address;
    uint64_t allocation_id;
    uint64_t size;
    uint64_t alignment;
} LiveAllocation;

typedef struct MinimalAllocator {
    NxmemAllocatorVtable vtable; /* first member: the host's table pointer is our object */
    atomic_uint_least32_t references;
    pthread_mutex_t lock; /* guards live[]; never held across a call into the host */
    size_t live_count;
    LiveAllocation live[MINIMAL_MAX_LIVE];
} MinimalAllocator;

static NxmemStatusCode minimal_allocate(NxmemAllocatorVtable *self,
                                        const NxmemAllocRequest *request, NxmemAllocResult *result,
                                        NxmemStatus *status) {
    MinimalAllocator *allocator = (MinimalAllocator *)self;
    NxmemStatusCode code = NXMEM_CHECK_REQUEST(NxmemAllocRequest, alignment, request, status);
    if (code == NXMEM_STATUS_OK) {
        code = NXMEM_CHECK_OUTPUT(NxmemAllocResult, mapped_bytes, result, status);
    }
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    if (request->mechanism_id != self->mechanism_id) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_MECHANISM,
                            "allocate: not mechanism minimal-c");
    }
    if (!nxmem_same_device(&request->device, &self->device)) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_DEVICE,
                            "allocate: not this allocator's device");
    }
    if (request->flags != 0) { /* major 1 defines no flags: refuse what we cannot honour */
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT, "allocate: unknown flags 0x%x",
                            (unsigned)request->flags);
    }
    const uint64_t alignment = request->alignment;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "allocate: alignment %llu is not a power of two",
                            (unsigned long long)alignment);
    }
    if (request->size == 0 || request->size > SIZE_MAX - alignment) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "allocate: size %llu is unusable", (unsigned long long)request->size);
    }
    /* aligned_alloc wants a size that is a multiple of the alignment, and some C libraries an
     * alignment of at least a pointer. */
    const size_t used_alignment = alignment < sizeof(void *) ? sizeof(void *) : (size_t)alignment;
    const size_t rounded = ((size_t)request->size + used_alignment - 1) & ~(used_alignment - 1);
    void *memory = aligned_alloc(used_alignment, rounded);
    if (memory == NULL) {
        return nxmem_report(status, NXMEM_STATUS_OUT_OF_MEMORY, "allocate: %zu bytes unavailable",
                            rounded);
    }

    pthread_mutex_lock(&allocator->lock);
    const bool full = allocator->live_count == MINIMAL_MAX_LIVE;
    if (!full) {
        allocator->live[allocator->live_count++] =
            (LiveAllocation){memory, request->allocation_id, request->size, request->alignment};
    }
    pthread_mutex_unlock(&allocator->lock);
    if (full) {
        free(memory); /* nothing may leak from a failed call */
        return nxmem_report(status, NXMEM_STATUS_OUT_OF_MEMORY,
                            "allocate: table of live allocations full");
    }
    atomic_fetch_add(&live_allocations, 1);

    NxmemAllocResult out = {0};
    out.address = (uint64_t)(uintptr_t)memory;
    out.size = request->size;
    out.mapped_bytes = request->size; /* eager: it costs its size from the start */
    nxmem_copy_output(result, &out, sizeof out);
    return NXMEM_STATUS_OK;
}

static NxmemStatusCode minimal_deallocate(NxmemAllocatorVtable *self,
                                          const NxmemAllocation *allocation, NxmemStatus *status) {
    MinimalAllocator *allocator = (MinimalAllocator *)self;
    NxmemStatusCode code = NXMEM_CHECK_REQUEST(NxmemAllocation, alignment, allocation, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    if (allocation->mechanism_id != self->mechanism_id) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_MECHANISM,
                            "deallocate: not mechanism minimal-c");
    }
    if (!nxmem_same_device(&allocation->device, &self->device)) {
        return nxmem_report(status, NXMEM_STATUS_WRONG_DEVICE,
                            "deallocate: not this allocator's device");
    }
    /* Find our record and check the host's description against it before freeing anything. */
    void *memory = NULL;
    const char *refusal = NULL;
    pthread_mutex_lock(&allocator->lock);
    size_t at = 0;
    while (at < allocator->live_count &&
           (uint64_t)(uintptr_t)allocator->live[at].address != allocation->address) {
        ++at;
    }
    if (at == allocator->live_count) {
        code = NXMEM_STATUS_UNKNOWN_ALLOCATION;
        refusal = "no live allocation at this address";
    } else if (allocator->live[at].allocation_id != allocation->allocation_id ||
               allocator->live[at].size != allocation->size ||
               allocator->live[at].alignment != allocation->alignment) {
        code = NXMEM_STATUS_INVALID_ARGUMENT; /* the address is ours, the rest is not */
        refusal = "misdescribed: id, size or alignment differs from the record";
    } else {
        memory = allocator->live[at].address;
        allocator->live[at] = allocator->live[--allocator->live_count]; /* order does not matter */
    }
    pthread_mutex_unlock(
        &allocator->lock); /* nxmem_report() after unlocking: hold no lock needlessly */
    if (refusal != NULL) {
        return nxmem_report(status, code, "deallocate 0x%llx: %s; nothing was freed",
                            (unsigned long long)allocation->address, refusal);
    }
    free(memory);
    atomic_fetch_sub(&live_allocations, 1);
    return NXMEM_STATUS_OK;
}

static void minimal_retain(NxmemAllocatorVtable *self) {
    atomic_fetch_add(&((MinimalAllocator *)self)->references, 1);
}

static void minimal_release(NxmemAllocatorVtable *self) {
    MinimalAllocator *allocator = (MinimalAllocator *)self;
    if (atomic_fetch_sub(&allocator->references, 1) != 1) {
        return;
    }
    /* The last reference. The host releases its allocations first; whatever it leaked is freed
     * here so the process does not leak too, and no longer counts against unloading. */
    for (size_t at = 0; at < allocator->live_count; ++at) {
        free(allocator->live[at].address);
        atomic_fetch_sub(&live_allocations, 1);
    }
    pthread_mutex_destroy(&allocator->lock);
    free(allocator);
    atomic_fetch_sub(&live_allocators, 1);
}

/* ---- the factory ------------------------------------------------------------------------- */

static NxmemStatusCode minimal_open_allocator(NxmemAllocatorFactoryVtable *self,
                                              const NxmemOpenRequest *request,
                                              NxmemAllocatorVtable **allocator_out,
                                              NxmemStatus *status) {
    NxmemStatusCode code = NXMEM_CHECK_REQUEST(NxmemOpenRequest, options_length, request, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    if (allocator_out == NULL) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT, "open_allocator: NULL output");
    }
    /* Host memory: one device, cpu:0 (ABI.md Q16). */
    code = nxmem_check_device(&request->device, 1u << NXMEM_DEVICE_CPU, 1, "minimal-c", status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    if (request->device.index < 0) { /* names no device (ABI Q16) */
        return nxmem_report(status, NXMEM_STATUS_WRONG_DEVICE,
                            "open_allocator: minimal-c cannot open device index %d",
                            (int)request->device.index);
    }
    /* Options by the grammar of ABI.md X9: empty entries (";", blank lines) are no options. */
    code = nxmem_option_check(request->options, request->options_length, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    const char *cursor = request->options;
    NxmemOptionEntry entry;
    if (request->options_length != 0 &&
        nxmem_option_next(&cursor, request->options + request->options_length, &entry, status) == 1) {
        /* A mechanism refuses what it does not understand; this one understands no option. */
        /* The key named, escaped: the host's bytes are not ours to echo raw (ABI.md E13). */
        char shown[96];
        nxmem_printable(shown, sizeof shown, entry.key, entry.key_length > 64 ? 64u : entry.key_length);
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "open_allocator: minimal-c takes no options, got '%s'", shown);
    }

    MinimalAllocator *allocator = calloc(1, sizeof *allocator);
    if (allocator == NULL || pthread_mutex_init(&allocator->lock, NULL) != 0) {
        free(allocator);
        return nxmem_report(status, NXMEM_STATUS_OUT_OF_MEMORY, "open_allocator: no memory");
    }
    allocator->vtable = (NxmemAllocatorVtable){
        .struct_size = sizeof(NxmemAllocatorVtable),
        .abi_minor = 0, /* we fill no minor-1 slot */
        .type_tag = NXMEM_TYPE_TAG_ALLOCATOR,
        .capabilities = 0, /* hence every optional slot below stays NULL */
        .mechanism_id = self->mechanism_id,
        .device = request->device,
        .allocate = minimal_allocate,
        .deallocate = minimal_deallocate,
        .retain = minimal_retain,
        .release = minimal_release,
    };
    atomic_init(&allocator->references, 1); /* the host's reference */
    atomic_fetch_add(&live_allocators, 1);
    *allocator_out = &allocator->vtable;
    return NXMEM_STATUS_OK;
}

/* The factory is a static object: the host releases it once, but there is nothing to free, so
 * release is idempotent by construction and a buggy second release cannot crash. */
static void minimal_release_factory(NxmemAllocatorFactoryVtable *self) {
    (void)self;
}

static NxmemAllocatorFactoryVtable minimal_factory = {
    .struct_size = sizeof(NxmemAllocatorFactoryVtable),
    .abi_minor = 0,
    .type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY,
    .name = "minimal-c",
    .mechanism_id = UINT64_C(0x434C414D494E494D), /* non-zero, unique in the module: "MINIMALC" */
    .device_types = UINT64_C(1) << NXMEM_DEVICE_CPU,
    .open_allocator = minimal_open_allocator,
    .release = minimal_release_factory,
};

/* ---- the three exports ------------------------------------------------------------------- */

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    NxmemStatusCode code = NXMEM_CHECK_REQUEST(NxmemNegotiateRequest, host_range, request, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    const NxmemVersionRange host = request->host_range;
    if (host.major == 0 || host.min_minor > host.max_minor) { /* ABI.md V6 */
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "negotiate: host range %u.%u-%u.%u is invalid (major 0, or inverted)",
                            (unsigned)host.major, (unsigned)host.min_minor, (unsigned)host.major,
                            (unsigned)host.max_minor);
    }
    code = NXMEM_CHECK_OUTPUT(NxmemNegotiateResponse, plugin_range, response, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    /* The common minors are [highest minimum, lowest maximum]; we agree to the top one. */
    const NxmemVersionRange ours = plugin_range;
    const uint32_t low = host.min_minor > ours.min_minor ? host.min_minor : ours.min_minor;
    const uint32_t high = host.max_minor < ours.max_minor ? host.max_minor : ours.max_minor;
    const bool overlap = host.major == ours.major && low <= high;
    NxmemNegotiateResponse out = {.major = overlap ? ours.major : 0,
                                  .minor = overlap ? high : 0,
                                  .plugin_range = ours}; /* sent even on a mismatch, to explain */
    nxmem_copy_output(response, &out, sizeof out);
    if (overlap) {
        return NXMEM_STATUS_OK;
    }
    return nxmem_report(status, NXMEM_STATUS_VERSION_MISMATCH,
                        "negotiate: host speaks %u.%u-%u.%u, minimal-c speaks %u.%u-%u.%u",
                        (unsigned)host.major, (unsigned)host.min_minor, (unsigned)host.major,
                        (unsigned)host.max_minor, (unsigned)ours.major, (unsigned)ours.min_minor,
                        (unsigned)ours.major, (unsigned)ours.max_minor);
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode
NxmemCreateAllocatorFactories(NxmemAllocatorFactoryVtable **factories, uint32_t capacity,
                              uint32_t *count, NxmemStatus *status) {
    if (count == NULL || (factories == NULL && capacity != 0)) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT, "create factories: NULL output");
    }
    *count = 1;
    if (capacity < 1) {
        return nxmem_report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                            "create factories: capacity 0, minimal-c needs 1");
    }
    factories[0] = &minimal_factory;
    return NXMEM_STATUS_OK;
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport *report_out,
                                                              NxmemStatus *status) {
    NxmemUnloadReport out = {0};
    out.live_allocators = atomic_load(&live_allocators);
    out.live_allocations = atomic_load(&live_allocations);
    /* No views, shared prefixes or queued releases: this plugin has none of those capabilities. */
    const NxmemStatusCode code =
        NXMEM_CHECK_OUTPUT(NxmemUnloadReport, queued_releases, report_out, status);
    if (code == NXMEM_STATUS_OK) {
        nxmem_copy_output(report_out, &out, sizeof out);
    }
    return code;
}

/* The header declares no functions, so prove here that each export has the contract's type. */
_Static_assert(_Generic(&NxmemNegotiate, NxmemNegotiateFn : 1, default : 0), "NxmemNegotiate");
_Static_assert(_Generic(&NxmemCreateAllocatorFactories, NxmemCreateAllocatorFactoriesFn : 1,
                        default : 0),
               "NxmemCreateAllocatorFactories");
_Static_assert(_Generic(&NxmemQueryUnloadReadiness, NxmemQueryUnloadReadinessFn : 1, default : 0),
               "NxmemQueryUnloadReadiness");
