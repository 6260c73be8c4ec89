/* One well-formed nxmem plugin (one mechanism, "malformed", CPU) that each build variant breaks in
 * exactly one way, chosen with a single -DMALFORMED_<VARIANT> switch (test/malformed/meson.build;
 * README.md lists every variant, its fault and the code the host refuses it with).
 *
 * The plugin keeps the host's side of ownership under watch: it aborts on a second release of a
 * factory or allocator, and when the library is unmapped (its destructor) it aborts if the host
 * kept a factory or allocator it could have released. It owns no heap memory, so whatever
 * LeakSanitizer finds in the loading process is the host's. */
#include "nxmem/nxmem_memory_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each variant leaves some of the plain plugin's parts unused. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#pragma GCC diagnostic ignored "-Wunused-variable"

#define MECHANISM_ID 0x4D41u

static void host_broke_contract(const char *what) {
    fprintf(stderr, "malformed plugin: the host broke the contract: %s\n", what);
    abort();
}

/* ---- negotiation ---- */

static uint32_t negotiated_minor = NXMEM_ABI_MINOR;

/* The plugin's range, unless a variant speaks another one. */
#if defined(MALFORMED_NO_COMMON_MINOR) || defined(MALFORMED_CLAIMS_OK_WITHOUT_COMMON_MINOR)
static const uint32_t plugin_min_minor = NXMEM_ABI_MINOR + 1u;
static const uint32_t plugin_max_minor = NXMEM_ABI_MINOR + 2u;
#else
static const uint32_t plugin_min_minor = 0u;
static const uint32_t plugin_max_minor = NXMEM_ABI_MINOR;
#endif

/* A message that fills the whole inline buffer and is not terminated. */
static NxmemStatusCode unterminated_status(NxmemStatus *status, NxmemStatusCode code) {
    status->code = code;
    memset(status->message, 'Z', sizeof status->message);
    return code;
}

static NxmemStatusCode status_text(NxmemStatus *status, NxmemStatusCode code, const char *text) {
    status->code = code;
    snprintf(status->message, sizeof status->message, "%s", text);
    return code;
}

static NxmemStatusCode negotiate(const NxmemNegotiateRequest *request,
                                 NxmemNegotiateResponse *response, NxmemStatus *status) {
    const NxmemVersionRange host = request->host_range;
    (void)host;
#if defined(MALFORMED_NEGOTIATE_UNKNOWN_CODE)
    return status_text(status, 77u, "a status code no minor defines");
#elif defined(MALFORMED_NEGOTIATE_UNTERMINATED_STATUS)
    return unterminated_status(status, NXMEM_STATUS_INVALID_ARGUMENT);
#elif defined(MALFORMED_NEGOTIATE_STATUS_DISAGREES)
    status_text(status, NXMEM_STATUS_OK, "the status says OK, the returned code does not");
    return NXMEM_STATUS_VERSION_MISMATCH;
#elif defined(MALFORMED_EMPTY_RESPONSE)
    (void)response;
    (void)status;
    return NXMEM_STATUS_OK; /* agrees to nothing at all */
#else
    if (host.major != NXMEM_ABI_MAJOR || host.max_minor < plugin_min_minor ||
        plugin_max_minor < host.min_minor) {
#if !defined(MALFORMED_CLAIMS_OK_WITHOUT_COMMON_MINOR)
        return status_text(status, NXMEM_STATUS_VERSION_MISMATCH, "no common minor with the host");
#endif
    }
    negotiated_minor = host.max_minor < plugin_max_minor ? host.max_minor : plugin_max_minor;
#if defined(MALFORMED_CLAIMS_OK_WITHOUT_COMMON_MINOR)
    negotiated_minor = plugin_min_minor;
#endif
    response->major = NXMEM_ABI_MAJOR;
    response->minor = negotiated_minor;
    response->plugin_range.struct_size = sizeof response->plugin_range;
    response->plugin_range.major = NXMEM_ABI_MAJOR;
    response->plugin_range.min_minor = plugin_min_minor;
    response->plugin_range.max_minor = plugin_max_minor;
#if defined(MALFORMED_INVERTED_RANGE)
    response->plugin_range.min_minor = 2u;
    response->plugin_range.max_minor = 0u;
    response->minor = negotiated_minor = 1u;
#elif defined(MALFORMED_WRONG_MAJOR)
    response->major = NXMEM_ABI_MAJOR + 1u;
    response->plugin_range.major = NXMEM_ABI_MAJOR + 1u;
#elif defined(MALFORMED_RANGE_MAJOR_ZERO)
    response->plugin_range.major = 0u;
#elif defined(MALFORMED_RANGE_OTHER_MAJOR)
    response->plugin_range.major = NXMEM_ABI_MAJOR + 1u;
#elif defined(MALFORMED_MINOR_OUTSIDE_OWN_RANGE)
    response->plugin_range.max_minor = 0u;
    response->minor = negotiated_minor = 1u;
#endif
    (void)status;
    return NXMEM_STATUS_OK;
#endif
}

/* ---- the allocator ---- */

typedef struct plugin_allocator {
    NxmemAllocatorVtable table; /* first: the host hands it back as `self` */
    NxmemVirtualBackingVtable backing;
    NxmemSharedMappingVtable mapping;
    int references;
    int handed; /* open_allocator returned it with OK */
} plugin_allocator;

static plugin_allocator the_allocator;
static uint64_t live_allocations;
static uint64_t next_address = (uint64_t)1 << 40;

static NxmemStatusCode allocate(NxmemAllocatorVtable *self, const NxmemAllocRequest *request,
                                NxmemAllocResult *result, NxmemStatus *status) {
    (void)self;
    if (request->size == 0 || request->alignment == 0 ||
        (request->alignment & (request->alignment - 1)) != 0) {
        return status_text(status, NXMEM_STATUS_INVALID_ARGUMENT, "size or alignment");
    }
#if defined(MALFORMED_ALLOCATE_UNKNOWN_CODE)
    (void)result;
    return status_text(status, 1234u, "a status code no minor defines");
#elif defined(MALFORMED_ALLOCATE_UNTERMINATED_STATUS)
    (void)result;
    return unterminated_status(status, NXMEM_STATUS_OUT_OF_MEMORY);
#else
    const uint64_t alignment = request->alignment;
    result->address = (next_address + alignment - 1) & ~(alignment - 1);
    result->size = request->size;
    result->mapped_bytes = request->size;
    next_address = result->address + request->size;
#if defined(MALFORMED_ALLOCATE_NULL_ADDRESS)
    result->address = 0;
#elif defined(MALFORMED_ALLOCATE_MISALIGNED)
    result->address += 1;
#elif defined(MALFORMED_ALLOCATE_SHORT)
    result->size = request->size - 1;
#endif
    live_allocations++;
    return NXMEM_STATUS_OK;
#endif
}

static NxmemStatusCode deallocate(NxmemAllocatorVtable *self, const NxmemAllocation *allocation,
                                  NxmemStatus *status) {
    (void)self;
    (void)allocation;
    if (live_allocations == 0) {
        return status_text(status, NXMEM_STATUS_UNKNOWN_ALLOCATION, "no live allocation");
    }
    live_allocations--;
    return NXMEM_STATUS_OK;
}

static void retain(NxmemAllocatorVtable *self) {
    plugin_allocator *allocator = (plugin_allocator *)(void *)self;
    if (allocator->references <= 0) {
        host_broke_contract("retain of a released allocator");
    }
    allocator->references++;
}

static void release(NxmemAllocatorVtable *self) {
    plugin_allocator *allocator = (plugin_allocator *)(void *)self;
    if (allocator->references <= 0) {
        host_broke_contract("an allocator released more often than created and retained");
    }
    allocator->references--;
}

static NxmemStatusCode enqueue_release(NxmemAllocatorVtable *self, const NxmemAllocation *allocation,
                                       uint64_t ticket, NxmemStatus *status) {
    (void)self;
    (void)allocation;
    (void)ticket;
    return status_text(status, NXMEM_STATUS_INTERNAL_ERROR, "never reached");
}

static NxmemStatusCode drain_releases(NxmemAllocatorVtable *self, uint64_t *retired,
                                      NxmemStatus *status) {
    (void)self;
    (void)status;
    *retired = 0;
    return NXMEM_STATUS_OK;
}

static NxmemStatusCode release_allocation(NxmemAllocatorVtable *self,
                                          const NxmemAllocation *allocation,
                                          NxmemReleaseOutcome *outcome, NxmemStatus *status) {
    const NxmemStatusCode code = deallocate(self, allocation, status);
    outcome->state = code == NXMEM_STATUS_OK ? NXMEM_RELEASE_COMPLETE : NXMEM_RELEASE_FAILED;
    outcome->unmapped_bytes = code == NXMEM_STATUS_OK ? allocation->size : 0;
    return code;
}

static NxmemStatusCode range_change(NxmemAllocatorVtable *allocator, const NxmemRangeRequest *request,
                                    NxmemStatus *status) {
    (void)allocator;
    (void)request;
    return status_text(status, NXMEM_STATUS_INTERNAL_ERROR, "never reached");
}

static NxmemStatusCode mapped_bytes(NxmemAllocatorVtable *allocator, const NxmemAllocation *allocation,
                                    uint64_t *bytes, NxmemStatus *status) {
    (void)allocator;
    (void)allocation;
    (void)status;
    *bytes = 0;
    return NXMEM_STATUS_OK;
}

static NxmemStatusCode create_prefix(NxmemAllocatorVtable *allocator,
                                     const NxmemSharedPrefixRequest *request,
                                     NxmemSharedPrefixHandle *prefix, NxmemStatus *status) {
    (void)allocator;
    (void)request;
    (void)prefix;
    return status_text(status, NXMEM_STATUS_INTERNAL_ERROR, "never reached");
}

static NxmemStatusCode prefix_reference(NxmemAllocatorVtable *allocator,
                                        const NxmemSharedPrefixHandle *prefix, NxmemStatus *status) {
    (void)allocator;
    (void)prefix;
    return status_text(status, NXMEM_STATUS_INTERNAL_ERROR, "never reached");
}

static NxmemStatusCode commit_prefix(NxmemAllocatorVtable *allocator,
                                     const NxmemSharedPrefixCommitRequest *request,
                                     NxmemSharedPrefixCommitInfo *info, NxmemStatus *status) {
    (void)allocator;
    (void)request;
    (void)info;
    return status_text(status, NXMEM_STATUS_INTERNAL_ERROR, "never reached");
}

/* The table the plain plugin hands over (minor as negotiated, structured release), then the one
 * fault of the variant. */
static void build_allocator(plugin_allocator *allocator, const NxmemOpenRequest *request) {
    NxmemAllocatorVtable *table = &allocator->table;
    memset(allocator, 0, sizeof *allocator);
    table->struct_size = sizeof *table;
    table->abi_minor = negotiated_minor;
    table->type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
    table->capabilities = NXMEM_CAP_STRUCTURED_RELEASE;
    table->mechanism_id = MECHANISM_ID;
    table->device = request->device;
    table->allocate = allocate;
    table->deallocate = deallocate;
    table->retain = retain;
    table->release = release;
    table->release_allocation = release_allocation;

    NxmemVirtualBackingVtable *backing = &allocator->backing;
    backing->struct_size = sizeof *backing;
    backing->abi_minor = negotiated_minor;
    backing->type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
    backing->commit = range_change;
    backing->decommit = range_change;
    backing->mapped_bytes = mapped_bytes;
    backing->commit_granularity = 4096u;

    NxmemSharedMappingVtable *mapping = &allocator->mapping;
    mapping->struct_size = sizeof *mapping;
    mapping->abi_minor = negotiated_minor;
    mapping->type_tag = NXMEM_TYPE_TAG_SHARED_MAPPING;
    mapping->create_shared_prefix = create_prefix;
    mapping->retain_shared_prefix = prefix_reference;
    mapping->release_shared_prefix = prefix_reference;
    mapping->commit_shared_prefix = commit_prefix;

#if defined(MALFORMED_ALLOCATOR_STRUCT_SIZE_BELOW_HEADER)
    table->struct_size = 8u;
#elif defined(MALFORMED_ALLOCATOR_STRUCT_SIZE_OVER_CAP)
    table->struct_size = 2u * NXMEM_MAX_STRUCT_SIZE;
#elif defined(MALFORMED_ALLOCATOR_LEVEL_BEYOND_SIZE)
    table->abi_minor = 2u; /* minor 2 ends at 128 bytes; the table says 112 (minor 0's end) */
    table->struct_size = 112u;
#elif defined(MALFORMED_ALLOCATOR_WRONG_TYPE_TAG)
    table->type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
#elif defined(MALFORMED_ALLOCATOR_NULL_ALLOCATE)
    table->allocate = NULL;
#elif defined(MALFORMED_ALLOCATOR_NULL_DEALLOCATE)
    table->deallocate = NULL;
#elif defined(MALFORMED_ALLOCATOR_NULL_RETAIN)
    table->retain = NULL;
#elif defined(MALFORMED_ALLOCATOR_NULL_RELEASE)
    table->release = NULL;
#elif defined(MALFORMED_FLAG_WITHOUT_SLOT)
    table->capabilities |= NXMEM_CAP_VIRTUAL_BACKING; /* no table behind it */
#elif defined(MALFORMED_SLOT_WITHOUT_FLAG)
    table->enqueue_release = enqueue_release; /* NXMEM_CAP_DEFERRED_RELEASE clear */
    table->drain_releases = drain_releases;
#elif defined(MALFORMED_HALF_DEFERRED_RELEASE)
    table->capabilities |= NXMEM_CAP_DEFERRED_RELEASE;
    table->enqueue_release = enqueue_release; /* drain_releases NULL */
#elif defined(MALFORMED_UNKNOWN_CAPABILITY_BIT)
    table->capabilities |= (NxmemCapabilities)1 << 40;
#elif defined(MALFORMED_FLAG_NEWER_THAN_TABLE)
    table->abi_minor = 0u; /* NXMEM_CAP_STRUCTURED_RELEASE belongs to minor 1 */
#elif defined(MALFORMED_ALLOCATOR_WRONG_MECHANISM)
    table->mechanism_id = MECHANISM_ID + 1u;
#elif defined(MALFORMED_ALLOCATOR_WRONG_DEVICE)
    table->device.index += 1;
#elif defined(MALFORMED_BACKING_NULL_COMMIT)
    table->capabilities |= NXMEM_CAP_VIRTUAL_BACKING;
    table->virtual_backing = backing;
    backing->commit = NULL;
#elif defined(MALFORMED_BACKING_BAD_GRANULARITY)
    table->capabilities |= NXMEM_CAP_VIRTUAL_BACKING;
    table->virtual_backing = backing;
    backing->commit_granularity = 3000u;
#elif defined(MALFORMED_MAPPING_WRONG_TYPE_TAG)
    table->capabilities |= NXMEM_CAP_SHARED_MAPPING;
    table->shared_mapping = mapping;
    mapping->type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
#endif
}

/* Whether the host, refusing the table, can still find its release slot (rule O7). */
static int release_locatable(const NxmemAllocatorVtable *table) {
    return table->struct_size >= offsetof(NxmemAllocatorVtable, release) + sizeof(NxmemReleaseFn) &&
           table->struct_size <= NXMEM_MAX_STRUCT_SIZE && table->type_tag == NXMEM_TYPE_TAG_ALLOCATOR &&
           table->release != NULL;
}

/* ---- the factory ---- */

typedef struct plugin_factory {
    NxmemAllocatorFactoryVtable table; /* first */
    int handed;   /* the host owns it */
    int released; /* how often the host released it */
} plugin_factory;

/* Two factories: the plain list holds the first; some variants list the second as well. */
static plugin_factory factories[2];
static plugin_factory *factory_at(unsigned index) { return &factories[index]; }
#if defined(MALFORMED_FACTORY_MISALIGNED)
/* A byte copy of the first factory's table, 4 bytes past an 8-byte boundary. */
static _Alignas(16) unsigned char misaligned_copy[sizeof(NxmemAllocatorFactoryVtable) + 4];
#endif

/* A name of exactly 128 bytes without a terminating NUL: one over the limit, and unterminated. */
static const char unterminated_name[NXMEM_MAX_FACTORY_NAME_BYTES + 1] = {
#define X8 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u'
    X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8, X8
#undef X8
};
static const char long_name[] =
    "a-factory-name-of-two-hundred-bytes-"
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

static NxmemStatusCode open_allocator(NxmemAllocatorFactoryVtable *self, const NxmemOpenRequest *request,
                                      NxmemAllocatorVtable **allocator, NxmemStatus *status) {
    (void)self;
#if defined(MALFORMED_OPEN_FAILS)
    (void)request;
    (void)allocator;
    return status_text(status, NXMEM_STATUS_OUT_OF_MEMORY, "the device is full");
#else
    (void)status;
    if (the_allocator.references > 0) {
        return status_text(status, NXMEM_STATUS_BUSY, "one allocator at a time");
    }
    build_allocator(&the_allocator, request);
    the_allocator.references = 1;
    the_allocator.handed = release_locatable(&the_allocator.table);
#if defined(MALFORMED_OPEN_RETURNS_NULL_TABLE)
    the_allocator.references = 0;
    the_allocator.handed = 0;
    *allocator = NULL;
#else
    *allocator = &the_allocator.table;
#endif
    return NXMEM_STATUS_OK;
#endif
}

static void release_factory(NxmemAllocatorFactoryVtable *self) {
    plugin_factory *factory = (plugin_factory *)(void *)self;
    if (!factory->handed) {
        host_broke_contract("release of a factory the host never owned");
    }
    if (factory->released++ > 0) {
        host_broke_contract("a factory released twice");
    }
}

static void build_factory(plugin_factory *factory, const char *name, uint64_t mechanism_id) {
    NxmemAllocatorFactoryVtable *table = &factory->table;
    memset(factory, 0, sizeof *factory);
    table->struct_size = sizeof *table;
    table->abi_minor = negotiated_minor;
    table->type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
    table->name = name;
    table->mechanism_id = mechanism_id;
    table->device_types = (uint64_t)1 << NXMEM_DEVICE_CPU;
    table->open_allocator = open_allocator;
    table->release = release_factory;
}

static NxmemStatusCode create_factories(NxmemAllocatorFactoryVtable **factories, uint32_t capacity,
                                        uint32_t *count, NxmemStatus *status) {
    build_factory(factory_at(0), "malformed", MECHANISM_ID);
    build_factory(factory_at(1), "malformed-second", MECHANISM_ID + 1u);
    NxmemAllocatorFactoryVtable *first = &factory_at(0)->table;
    factories[0] = first;
    *count = 1;
#if defined(MALFORMED_CREATE_FACTORIES_FAILS)
    factories[0] = NULL;
    *count = 0;
    return status_text(status, NXMEM_STATUS_OUT_OF_MEMORY, "no memory for factories");
#elif defined(MALFORMED_CREATE_FACTORIES_UNKNOWN_CODE)
    factories[0] = NULL;
    *count = 0;
    return status_text(status, 99u, "a status code no minor defines");
#elif defined(MALFORMED_FACTORY_COUNT_OVER_CAPACITY)
    *count = capacity + 1u; /* and returns OK: the contract says INVALID_ARGUMENT, creating none */
    return NXMEM_STATUS_OK;
#elif defined(MALFORMED_FACTORY_COUNT_MAX)
    *count = UINT32_MAX;
    return NXMEM_STATUS_OK;
#elif defined(MALFORMED_FACTORY_LIST_NULL_ENTRY)
    factories[0] = NULL;
#elif defined(MALFORMED_FACTORY_COUNT_BEYOND_LIST)
    *count = 2; /* one factory written, two counted: the second entry is the host's NULL */
#elif defined(MALFORMED_DUPLICATE_FACTORY_POINTER)
    factories[1] = first;
    *count = 2;
#elif defined(MALFORMED_DUPLICATE_FACTORY_NAME)
    factory_at(1)->table.name = "malformed";
    factories[1] = &factory_at(1)->table;
    *count = 2;
#elif defined(MALFORMED_DUPLICATE_MECHANISM_ID)
    factory_at(1)->table.mechanism_id = MECHANISM_ID;
    factories[1] = &factory_at(1)->table;
    *count = 2;
#elif defined(MALFORMED_FACTORY_NAME_NULL)
    first->name = NULL;
#elif defined(MALFORMED_FACTORY_NAME_EMPTY)
    first->name = "";
#elif defined(MALFORMED_FACTORY_NAME_UNTERMINATED)
    first->name = unterminated_name;
#elif defined(MALFORMED_FACTORY_NAME_TOO_LONG)
    first->name = long_name;
#elif defined(MALFORMED_FACTORY_NAME_NON_PRINTABLE)
    first->name = "mal\x01\x7f" "formed";
#elif defined(MALFORMED_FACTORY_MECHANISM_ID_ZERO)
    first->mechanism_id = 0;
#elif defined(MALFORMED_FACTORY_STRUCT_SIZE_BELOW_HEADER)
    first->struct_size = 8u;
#elif defined(MALFORMED_FACTORY_STRUCT_SIZE_OVER_CAP)
    first->struct_size = 2u * NXMEM_MAX_STRUCT_SIZE;
#elif defined(MALFORMED_FACTORY_STRUCT_SIZE_BELOW_LEVEL)
    first->struct_size = 40u; /* minor 0 ends at 56 bytes */
#elif defined(MALFORMED_FACTORY_WRONG_TYPE_TAG)
    first->type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
#elif defined(MALFORMED_FACTORY_NULL_OPEN_ALLOCATOR)
    first->open_allocator = NULL;
#elif defined(MALFORMED_FACTORY_NULL_RELEASE)
    first->release = NULL;
#elif defined(MALFORMED_FACTORY_MISALIGNED)
    memcpy(misaligned_copy + 4, first, sizeof *first);
    factories[0] = (NxmemAllocatorFactoryVtable *)(void *)(misaligned_copy + 4);
#endif
    (void)capacity;
    (void)status;
    /* The host owns each listed factory (unless it refuses the count outright). */
    for (uint32_t i = 0; *count <= capacity && i < *count; ++i) {
        for (unsigned j = 0; j < 2; ++j) {
            if (factories[i] == &factory_at(j)->table) {
                factory_at(j)->handed = 1;
            }
        }
    }
    return NXMEM_STATUS_OK;
}

/* ---- the exports: functions, unless a variant exports one of them as data ---- */

#if defined(MALFORMED_MISSING_NEGOTIATE) || defined(MALFORMED_MISSING_ALL_EXPORTS)
#elif defined(MALFORMED_NEGOTIATE_IS_DATA)
/* A function pointer exported under the function's name: dlsym finds it, but it is no code. */
NXMEM_PLUGIN_EXPORT const NxmemNegotiateFn NxmemNegotiate = negotiate;
#else
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    return negotiate(request, response, status);
}
#endif

#if defined(MALFORMED_MISSING_CREATE_FACTORIES) || defined(MALFORMED_MISSING_ALL_EXPORTS)
#else
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(
    NxmemAllocatorFactoryVtable **factories, uint32_t capacity, uint32_t *count, NxmemStatus *status) {
    return create_factories(factories, capacity, count, status);
}
#endif

/* A table the host cannot release was never really handed over (rule O8: a plugin publishing a
 * malformed table keeps no state for it), so it does not count. */
static NxmemStatusCode query_unload_readiness(NxmemUnloadReport *report, NxmemStatus *status) {
    (void)status;
    report->live_allocators = the_allocator.handed && the_allocator.references > 0 ? 1u : 0u;
    report->live_allocations = live_allocations;
    return NXMEM_STATUS_OK;
}

#if defined(MALFORMED_MISSING_QUERY_UNLOAD_READINESS) || defined(MALFORMED_MISSING_ALL_EXPORTS)
#elif defined(MALFORMED_QUERY_UNLOAD_READINESS_IS_DATA)
NXMEM_PLUGIN_EXPORT const NxmemQueryUnloadReadinessFn NxmemQueryUnloadReadiness = query_unload_readiness;
#else
NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport *report,
                                                              NxmemStatus *status) {
    return query_unload_readiness(report, status);
}
#endif

/* ---- when the library is unmapped: did the host give back what it owned? ---- */

__attribute__((destructor)) static void audit_host(void) {
    for (unsigned i = 0; i < 2; ++i) {
        const plugin_factory *factory = factory_at(i);
        if (factory->handed && factory->released == 0 && factory->table.release != NULL &&
            factory->table.struct_size >= sizeof factory->table &&
            factory->table.struct_size <= NXMEM_MAX_STRUCT_SIZE &&
            factory->table.type_tag == NXMEM_TYPE_TAG_ALLOCATOR_FACTORY) {
            host_broke_contract("the library is unmapped but a factory the host owned was never released");
        }
    }
    if (the_allocator.handed && the_allocator.references > 0) {
        host_broke_contract("the library is unmapped but an allocator the host holds was never released");
    }
}
