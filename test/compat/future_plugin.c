/*
 * future_plugin.c: a plugin of the next minor, which no header has yet. Its mechanism
 * "future-c" publishes an allocator table that declares minor NXMEM_ABI_MINOR + 1 whatever was
 * negotiated (a table may declare more than the ceiling; the reader clamps), appends one
 * slot after everything this header's table has, and sets one capability bit that no minor of
 * this header defines (the lowest bit above NXMEM_CAP_ALL_V1); its plugin range reaches
 * 1.(NXMEM_ABI_MINOR + 1). A host of this header must read the table at its own minor, clear the
 * unknown bit in its copy rather than refuse it (docs/ABI.md, flags are versioned like slots), and
 * drive the allocator. The allocator itself is the C example's, behind forwarding slots.
 */
#include "fixture_plugin.h"

#define FUTURE_MINOR (NXMEM_ABI_MINOR + 1u)
/* The lowest capability bit this header does not define: the next minor's new flag. */
#define FUTURE_CAPABILITY (((uint64_t)NXMEM_CAP_ALL_V1 + 1u) & ~(uint64_t)NXMEM_CAP_ALL_V1)

/* The next minor's allocator table: this header's, then the slot the next minor appends. */
typedef struct FutureAllocatorTable {
    NxmemAllocatorVtable known;
    NxmemStatusCode (*next_minor_slot)(NxmemAllocatorVtable *self, NxmemStatus *status);
} FutureAllocatorTable;

typedef struct FutureAllocator {
    FutureAllocatorTable table; /* first member: the host's table pointer is our object */
    atomic_uint_least32_t references;
    NxmemAllocatorVtable *inner; /* the C example's allocator, holding one reference */
} FutureAllocator;

static NxmemAllocatorVtable *inner_of(NxmemAllocatorVtable *self) {
    return ((FutureAllocator *)self)->inner;
}

static NxmemStatusCode future_allocate(NxmemAllocatorVtable *self, const NxmemAllocRequest *request,
                                       NxmemAllocResult *result, NxmemStatus *status) {
    return minimal_allocate(inner_of(self), request, result, status);
}

static NxmemStatusCode future_deallocate(NxmemAllocatorVtable *self,
                                         const NxmemAllocation *allocation, NxmemStatus *status) {
    return minimal_deallocate(inner_of(self), allocation, status);
}

static void future_retain(NxmemAllocatorVtable *self) {
    atomic_fetch_add(&((FutureAllocator *)self)->references, 1);
}

static void future_release(NxmemAllocatorVtable *self) {
    FutureAllocator *allocator = (FutureAllocator *)self;
    if (atomic_fetch_sub(&allocator->references, 1) == 1) {
        minimal_release(allocator->inner);
        free(allocator);
    }
}

/* What the next minor's slot does is unknown to this header; a host of this header never calls it. */
static NxmemStatusCode future_next_minor_slot(NxmemAllocatorVtable *self, NxmemStatus *status) {
    (void)self;
    return nxmem_report(status, NXMEM_STATUS_INTERNAL_ERROR, "a slot of the next minor was called");
}

static NxmemStatusCode future_open_allocator(NxmemAllocatorFactoryVtable *self,
                                             const NxmemOpenRequest *request,
                                             NxmemAllocatorVtable **allocator_out,
                                             NxmemStatus *status) {
    FutureAllocator *allocator = calloc(1, sizeof *allocator);
    if (allocator == NULL) {
        return nxmem_report(status, NXMEM_STATUS_OUT_OF_MEMORY, "open_allocator: no memory");
    }
    const NxmemStatusCode code = minimal_open_allocator(self, request, &allocator->inner, status);
    if (code != NXMEM_STATUS_OK) {
        free(allocator);
        return code;
    }
    allocator->table.known = *allocator->inner; /* identity: mechanism and device */
    allocator->table.known.struct_size = sizeof(FutureAllocatorTable);
    allocator->table.known.allocate = future_allocate;
    allocator->table.known.deallocate = future_deallocate;
    allocator->table.known.retain = future_retain;
    allocator->table.known.release = future_release;
    /* Whatever was negotiated: a reader must cope with a table newer than it knows (R7). */
    allocator->table.known.abi_minor = FUTURE_MINOR;
    allocator->table.known.capabilities = FUTURE_CAPABILITY; /* its slot is next_minor_slot */
    allocator->table.next_minor_slot = future_next_minor_slot;
    atomic_init(&allocator->references, 1);
    *allocator_out = &allocator->table.known;
    return NXMEM_STATUS_OK;
}

static NxmemAllocatorFactoryVtable future_factory = {
    .struct_size = sizeof(NxmemAllocatorFactoryVtable),
    .abi_minor = 0,
    .type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY,
    .name = "future-c",
    .mechanism_id = UINT64_C(0x4345525554554646), /* "FFUTUREC" */
    .device_types = UINT64_C(1) << NXMEM_DEVICE_CPU,
    .open_allocator = future_open_allocator,
    .release = minimal_release_factory,
};

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    return fixture_negotiate(request, response, status, FUTURE_MINOR, future_factory.name);
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode
NxmemCreateAllocatorFactories(NxmemAllocatorFactoryVtable **factories, uint32_t capacity,
                              uint32_t *count, NxmemStatus *status) {
    return fixture_create_factories(factories, capacity, count, status, &future_factory);
}
