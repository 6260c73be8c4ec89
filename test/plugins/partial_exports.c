/* A library that looks like an nxmem plugin but lacks one export, chosen at build time with
 * -DOMIT_NEGOTIATE, -DOMIT_CREATE_FACTORIES or -DOMIT_QUERY_UNLOAD_READINESS (or all three, for a
 * library that is no plugin at all). The host must refuse it, name what is missing, and unload it. */
#include "nxmem/nxmem_memory_abi.h"

#include <stddef.h>

#ifndef OMIT_NEGOTIATE
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    (void)request;
    (void)response;
    (void)status;
    return NXMEM_STATUS_VERSION_MISMATCH;
}
#endif

#ifndef OMIT_CREATE_FACTORIES
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(
    NxmemAllocatorFactoryVtable **factories, uint32_t capacity, uint32_t *count,
    NxmemStatus *status) {
    (void)factories;
    (void)capacity;
    (void)status;
    *count = 0;
    return NXMEM_STATUS_OK;
}
#endif

#ifndef OMIT_QUERY_UNLOAD_READINESS
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport *report,
                                                              NxmemStatus *status) {
    (void)report;
    (void)status;
    return NXMEM_STATUS_OK;
}
#endif

/* Keeps the translation unit non-empty when every export is omitted. */
NXMEM_PLUGIN_EXPORT int nxmem_partial_exports_marker(void) { return 0; }
