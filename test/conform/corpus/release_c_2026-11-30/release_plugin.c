/*
 * release_plugin.c: a minor-1 C plugin for the compatibility matrix: the C example's allocator
 * (fixture_plugin.h) plus the one slot minor 1 added. Its mechanism "release-c" fills
 * release_allocation behind NXMEM_CAP_STRUCTURED_RELEASE and declares abi_minor 1 when the
 * negotiated minor allows it (a minor-0 host gets a minor-0 table); its plugin range is 1.0-1.1.
 * Built against the 1.1 snapshot and every later one.
 */
#include "fixture_plugin.h"

#if NXMEM_ABI_MINOR < 1
#error "release_plugin.c fills a minor-1 slot: build it against the 1.1 header or later"
#endif

static NxmemStatusCode release_c_release_allocation(NxmemAllocatorVtable *self,
                                                    const NxmemAllocation *allocation,
                                                    NxmemReleaseOutcome *outcome,
                                                    NxmemStatus *status) {
    NxmemStatusCode code = CHECK_OUTPUT(NxmemReleaseOutcome, residual_owned_bytes, outcome, status);
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    code = minimal_deallocate(self, allocation, status); /* checks everything before freeing */
    NxmemReleaseOutcome out = {0};
    out.state = code == NXMEM_STATUS_OK ? NXMEM_RELEASE_COMPLETE : NXMEM_RELEASE_FAILED;
    out.unmapped_bytes = code == NXMEM_STATUS_OK ? allocation->size : 0;
    copy_output(outcome, &out, sizeof out);
    return code;
}

static NxmemStatusCode release_c_open_allocator(NxmemAllocatorFactoryVtable *self,
                                                const NxmemOpenRequest *request,
                                                NxmemAllocatorVtable **allocator_out,
                                                NxmemStatus *status) {
    const NxmemStatusCode code = minimal_open_allocator(self, request, allocator_out, status);
    if (code == NXMEM_STATUS_OK && atomic_load(&fixture_negotiated_minor) >= 1) {
        NxmemAllocatorVtable *table = *allocator_out;
        table->abi_minor = 1;
        table->capabilities = NXMEM_CAP_STRUCTURED_RELEASE;
        table->release_allocation = release_c_release_allocation;
    }
    return code;
}

static NxmemAllocatorFactoryVtable release_c_factory = {
    .struct_size = sizeof(NxmemAllocatorFactoryVtable),
    .abi_minor = 0,
    .type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY,
    .name = "release-c",
    .mechanism_id = UINT64_C(0x4345534145454C52), /* "RLEEASEC" */
    .device_types = UINT64_C(1) << NXMEM_DEVICE_CPU,
    .open_allocator = release_c_open_allocator,
    .release = minimal_release_factory,
};

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    return fixture_negotiate(request, response, status, 1u, release_c_factory.name);
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode
NxmemCreateAllocatorFactories(NxmemAllocatorFactoryVtable **factories, uint32_t capacity,
                              uint32_t *count, NxmemStatus *status) {
    return fixture_create_factories(factories, capacity, count, status, &release_c_factory);
}
