/* A plugin whose factory list breaks one rule of docs/ABI.md (S2, X4, X5), chosen at build time
 * with -DFAULT_<NAME>. The host must refuse the load with CONTRACT_VIOLATION naming the fault,
 * release every factory it was handed whose release slot it can read exactly once (O1), and leave
 * the library unmapped. The factories are static: nothing leaks when one cannot be released.
 * NxmemProbeFactoriesReleased counts the releases. Negotiates minor 0 of major 1. */
#include "nxmem/nxmem_memory_abi.h"

#include <stddef.h>
#include <string.h>

static uint64_t factories_released;

static void release_factory(NxmemAllocatorFactoryVtable *factory) {
    (void)factory;
    ++factories_released;
}

static NxmemStatusCode never_open(NxmemAllocatorFactoryVtable *factory, const NxmemOpenRequest *request,
                                  NxmemAllocatorVtable **out, NxmemStatus *status) {
    (void)factory;
    (void)request;
    (void)out;
    if (status != NULL && status->struct_size >= sizeof *status) {
        status->code = NXMEM_STATUS_INTERNAL_ERROR;
        strcpy(status->message, "a refused plugin is never opened");
    }
    return NXMEM_STATUS_INTERNAL_ERROR;
}

#define TOO_LONG_NAME                                                                              \
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl"   \
    "mnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz" /* 128 bytes */

#define FACTORY(factory_name, id)                                                                  \
    {.struct_size = sizeof(NxmemAllocatorFactoryVtable),                                           \
     .abi_minor = 0,                                                                               \
     .type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY,                                                 \
     .name = factory_name,                                                                         \
     .mechanism_id = id,                                                                           \
     .device_types = 1u << NXMEM_DEVICE_CPU,                                                       \
     .open_allocator = never_open,                                                                 \
     .release = release_factory}

static NxmemAllocatorFactoryVtable factories[] = {
    FACTORY("first", 1),
#if defined(FAULT_DUPLICATE_NAME)
    FACTORY("first", 2),
#elif defined(FAULT_DUPLICATE_ID)
    FACTORY("second", 1),
#elif defined(FAULT_ZERO_ID)
    FACTORY("second", 0),
#elif defined(FAULT_NULL_NAME)
    FACTORY(NULL, 2),
#elif defined(FAULT_EMPTY_NAME)
    FACTORY("", 2),
#elif defined(FAULT_LONG_NAME)
    FACTORY(TOO_LONG_NAME, 2),
#else
    FACTORY("second", 2),
#endif
};

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    (void)status;
    if (request == NULL || response == NULL || response->struct_size < sizeof *response ||
        request->host_range.major != 1 || request->host_range.min_minor != 0) {
        return NXMEM_STATUS_VERSION_MISMATCH;
    }
    response->major = 1;
    response->minor = 0;
    response->plugin_range.struct_size = sizeof response->plugin_range;
    response->plugin_range.major = 1;
    response->plugin_range.min_minor = 0;
    response->plugin_range.max_minor = 0;
    return NXMEM_STATUS_OK;
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(NxmemAllocatorFactoryVtable **out,
                                                                  uint32_t capacity,
                                                                  uint32_t *count,
                                                                  NxmemStatus *status) {
    (void)status;
    const uint32_t made = sizeof factories / sizeof factories[0];
    if (capacity < made) {
        *count = made;
        return NXMEM_STATUS_INVALID_ARGUMENT;
    }
#if defined(FAULT_NULL_OPEN)
    factories[1].open_allocator = NULL;
#elif defined(FAULT_NULL_RELEASE)
    factories[1].release = NULL;
#endif
    for (uint32_t i = 0; i < made; ++i) {
        out[i] = &factories[i];
    }
#if defined(FAULT_COUNT_ABOVE_CAPACITY)
    *count = capacity + 1; /* wrote `made`, claims more than there was room for */
#else
    *count = made;
#endif
    return NXMEM_STATUS_OK;
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport *report,
                                                              NxmemStatus *status) {
    (void)status;
    if (report == NULL || report->struct_size < sizeof *report) {
        return NXMEM_STATUS_INVALID_ARGUMENT;
    }
    const uint32_t size = report->struct_size;
    memset(report, 0, sizeof *report);
    report->struct_size = size;
    return NXMEM_STATUS_OK;
}

NXMEM_PLUGIN_EXPORT uint64_t NxmemProbeFactoriesReleased(void) { return factories_released; }
