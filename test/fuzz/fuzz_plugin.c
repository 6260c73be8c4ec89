/* The scripted fuzz plugin: every answer it gives the host (the negotiated range, the factory list,
 * the tables and their capability flags, every status, every output, every callback) is drawn
 * from the fuzzer input the harness hands it through nxmem_fuzz_begin. A drawn 0 is always the
 * honest answer, so a short input is a well-behaved plugin and each non-zero byte is one fault.
 *
 * It keeps the books a real plugin would: how often each factory and allocator was released,
 * which releases are still queued. It aborts at once on a double release (what would be a double
 * free in a real plugin) and reports through nxmem_fuzz_audit anything the host failed to give
 * back. No memory is ever handed out: addresses are numbers the host never dereferences. */
#include "fuzz_plugin.h"

#include "nxmem/nxmem_memory_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FACTORY_POOL 4u
#define ALLOCATOR_POOL 8u
#define QUEUE_CAPACITY 32u

/* ---- the script ---- */

static const uint8_t *script_bytes;
static size_t script_left;

NXMEM_PLUGIN_EXPORT void nxmem_fuzz_draw(void *out, size_t count) {
    const size_t taken = count < script_left ? count : script_left;
    memset(out, 0, count);
    if (taken > 0) { /* an empty script may be a NULL pointer, which must not move */
        memcpy(out, script_bytes, taken);
        script_bytes += taken;
        script_left -= taken;
    }
}

static uint8_t draw8(void) {
    uint8_t value;
    nxmem_fuzz_draw(&value, sizeof value);
    return value;
}
static uint32_t draw32(void) {
    uint32_t value;
    nxmem_fuzz_draw(&value, sizeof value);
    return value;
}
static uint64_t draw64(void) {
    uint64_t value;
    nxmem_fuzz_draw(&value, sizeof value);
    return value;
}
/* A status code: 0 (OK) or any other value, known or not. */
static NxmemStatusCode draw_code(void) {
    const uint8_t value = draw8();
    return value < 16 ? value : 1000u + value;
}

static void die(const char *what) {
    fprintf(stderr, "fuzz plugin: the host broke the contract: %s\n", what);
    abort();
}

/* Writes a message within the caller's struct_size; sometimes one that fills the whole buffer with
 * no terminator (the host must still read it bounded). */
static NxmemStatusCode answer(NxmemStatus *status, NxmemStatusCode code, const char *text) {
    if (status == NULL || status->struct_size < sizeof(NxmemStatus)) {
        return code;
    }
    status->code = code;
    if (draw8() == 0xFF) {
        memset(status->message, 'U', sizeof status->message); /* unterminated */
    } else {
        snprintf(status->message, sizeof status->message, "%s", text);
    }
    return code;
}

/* ---- module state ---- */

static uint32_t negotiated_minor;

typedef struct fuzz_factory {
    NxmemAllocatorFactoryVtable table; /* first: the host hands it back as `self` */
    unsigned index;
    int handed;   /* the host owns it (it was in a list the host accepted to read) */
    int released; /* how often the host released it */
    int excused;  /* its header is broken: the host cannot find its release slot */
} fuzz_factory;

typedef struct queued_release {
    uint64_t ticket;
    uint64_t allocation_id;
} queued_release;

typedef struct fuzz_allocator {
    NxmemAllocatorVtable table; /* first */
    NxmemVirtualBackingVtable backing;
    NxmemSharedMappingVtable mapping;
    int64_t references;
    int excused; /* handed over in a shape whose release slot the host cannot locate */
    const NxmemHostCallbacks *callbacks;
    queued_release queue[QUEUE_CAPACITY];
    unsigned queued;
    uint64_t live_allocations;
    uint64_t prefix_references;
    uint64_t next_address;
} fuzz_allocator;

static fuzz_factory factories[FACTORY_POOL];
static fuzz_allocator allocators[ALLOCATOR_POOL];
static uint64_t next_prefix_id;

static const char *const factory_names[FACTORY_POOL] = {"fuzz-a", "fuzz-b", "fuzz-c", "fuzz-d"};
/* A name of exactly 128 bytes and no NUL: one byte over the limit, and unterminated. */
static const char unterminated_name[128] = {
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x',
    'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'};

static fuzz_allocator *allocator_of(NxmemAllocatorVtable *self) {
    return (fuzz_allocator *)(void *)self;
}

/* ---- virtual backing ---- */

static NxmemStatusCode vb_commit(NxmemAllocatorVtable *allocator, const NxmemRangeRequest *request,
                                 NxmemStatus *status) {
    (void)allocator;
    (void)request;
    return answer(status, draw_code(), "commit refused by the script");
}
static NxmemStatusCode vb_decommit(NxmemAllocatorVtable *allocator,
                                   const NxmemRangeRequest *request, NxmemStatus *status) {
    (void)allocator;
    (void)request;
    return answer(status, draw_code(), "decommit refused by the script");
}
static NxmemStatusCode vb_mapped_bytes(NxmemAllocatorVtable *allocator,
                                       const NxmemAllocation *allocation, uint64_t *mapped_bytes,
                                       NxmemStatus *status) {
    (void)allocator;
    (void)allocation;
    *mapped_bytes = draw64();
    return answer(status, draw_code(), "mapped_bytes refused by the script");
}

/* ---- shared mapping ---- */

static NxmemStatusCode sm_create(NxmemAllocatorVtable *self, const NxmemSharedPrefixRequest *request,
                                 NxmemSharedPrefixHandle *prefix, NxmemStatus *status) {
    fuzz_allocator *allocator = allocator_of(self);
    const NxmemStatusCode code = draw_code();
    if (code != NXMEM_STATUS_OK) {
        return answer(status, code, "create_shared_prefix refused by the script");
    }
    prefix->mechanism_id = allocator->table.mechanism_id ^ draw64(); /* 0: its own mechanism */
    prefix->device = allocator->table.device;
    prefix->device.index ^= (int32_t)draw8();
    prefix->prefix_id = ++next_prefix_id;
    prefix->size = request->size;
    allocator->prefix_references++;
    return NXMEM_STATUS_OK;
}
static NxmemStatusCode sm_retain(NxmemAllocatorVtable *self, const NxmemSharedPrefixHandle *prefix,
                                 NxmemStatus *status) {
    (void)prefix;
    const NxmemStatusCode code = draw_code();
    if (code == NXMEM_STATUS_OK) {
        allocator_of(self)->prefix_references++;
    }
    return answer(status, code, "retain_shared_prefix refused by the script");
}
static NxmemStatusCode sm_release(NxmemAllocatorVtable *self, const NxmemSharedPrefixHandle *prefix,
                                  NxmemStatus *status) {
    (void)prefix;
    fuzz_allocator *allocator = allocator_of(self);
    const NxmemStatusCode code = draw_code();
    if (code == NXMEM_STATUS_OK && allocator->prefix_references > 0) {
        allocator->prefix_references--;
    }
    return answer(status, code, "release_shared_prefix refused by the script");
}
static NxmemStatusCode sm_commit(NxmemAllocatorVtable *allocator,
                                 const NxmemSharedPrefixCommitRequest *request,
                                 NxmemSharedPrefixCommitInfo *info, NxmemStatus *status) {
    (void)allocator;
    info->shared_bytes = request->prefix.size ^ draw64();
    info->newly_mapped_bytes = draw64();
    info->sharers = draw64();
    return answer(status, draw_code(), "commit_shared_prefix refused by the script");
}

/* ---- allocator ---- */

static void retire(fuzz_allocator *allocator, uint64_t ticket, uint64_t allocation_id) {
    NxmemReleaseCompletion completion;
    memset(&completion, 0, sizeof completion);
    completion.struct_size = sizeof completion;
    completion.ticket = ticket ^ draw64();
    completion.mechanism_id = allocator->table.mechanism_id;
    completion.allocation_id = allocation_id;
    completion.outcome.struct_size = sizeof completion.outcome;
    completion.outcome.state = NXMEM_RELEASE_COMPLETE + draw8();
    completion.outcome.unmapped_bytes = draw64();
    completion.outcome.residual_owned_bytes = draw64();
    if (draw8() == 1) {
        completion.struct_size = draw32() % (sizeof completion + 1); /* never past the record */
    }
    if (allocator->live_allocations > 0) {
        allocator->live_allocations--;
    }
    const NxmemHostCallbacks *callbacks = allocator->callbacks;
    if (callbacks != NULL && callbacks->release_completed != NULL) {
        callbacks->release_completed(callbacks->host_context, &completion);
        if (completion.ticket != ticket || completion.struct_size != sizeof completion) {
            /* Then the true one: the host must refuse the first and still retire the release,
             * else it could only keep the allocator pinned for good. */
            completion.ticket = ticket;
            completion.struct_size = sizeof completion;
            callbacks->release_completed(callbacks->host_context, &completion);
        }
    }
}

static NxmemStatusCode al_allocate(NxmemAllocatorVtable *self, const NxmemAllocRequest *request,
                                   NxmemAllocResult *result, NxmemStatus *status) {
    fuzz_allocator *allocator = allocator_of(self);
    const uint8_t reclaim = draw8();
    if (reclaim == 1 && allocator->callbacks != NULL &&
        allocator->callbacks->request_reclaim != NULL) {
        NxmemReclaimRequest ask;
        memset(&ask, 0, sizeof ask);
        ask.struct_size = sizeof ask;
        ask.mechanism_id = allocator->table.mechanism_id;
        ask.device = allocator->table.device;
        ask.bytes_needed = request->size;
        NxmemStatus reply;
        memset(&reply, 0, sizeof reply);
        reply.struct_size = sizeof reply;
        (void)allocator->callbacks->request_reclaim(allocator->callbacks->host_context, &ask, &reply);
    }
    const NxmemStatusCode code = draw_code();
    if (code != NXMEM_STATUS_OK) {
        return answer(status, code, "allocate refused by the script");
    }
    const uint8_t lie = draw8();
    if (lie == 0) {
        /* Honest: refuse what the contract refuses, else a fresh aligned number. */
        const uint64_t alignment = request->alignment;
        if (request->size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 ||
            alignment > ((uint64_t)1 << 40) || request->size > ((uint64_t)1 << 48)) {
            return answer(status, NXMEM_STATUS_INVALID_ARGUMENT, "size or alignment out of range");
        }
        const uint64_t base = allocator->next_address + ((uint64_t)1 << 44);
        result->address = (base + alignment - 1) & ~(alignment - 1);
        result->size = request->size;
        allocator->next_address += request->size + alignment;
    } else {
        result->address = draw64();
        result->size = draw64();
    }
    result->mapped_bytes = draw64();
    allocator->live_allocations++;
    return NXMEM_STATUS_OK;
}

static NxmemStatusCode al_deallocate(NxmemAllocatorVtable *self, const NxmemAllocation *allocation,
                                     NxmemStatus *status) {
    (void)allocation;
    fuzz_allocator *allocator = allocator_of(self);
    const NxmemStatusCode code = draw_code();
    if (code == NXMEM_STATUS_OK && allocator->live_allocations > 0) {
        allocator->live_allocations--;
    }
    return answer(status, code, "deallocate refused by the script");
}

static void al_retain(NxmemAllocatorVtable *self) {
    fuzz_allocator *allocator = allocator_of(self);
    if (allocator->references <= 0) {
        die("retain of an allocator the host had already released");
    }
    allocator->references++;
}

static void al_release(NxmemAllocatorVtable *self) {
    fuzz_allocator *allocator = allocator_of(self);
    if (allocator->references <= 0) {
        die("an allocator released more often than it was created and retained");
    }
    if (--allocator->references == 0) {
        /* The last release frees whatever is left (contract O9). */
        allocator->live_allocations = 0;
        allocator->prefix_references = 0;
        allocator->queued = 0;
    }
}

static NxmemStatusCode al_enqueue(NxmemAllocatorVtable *self, const NxmemAllocation *allocation,
                                  uint64_t ticket, NxmemStatus *status) {
    fuzz_allocator *allocator = allocator_of(self);
    const uint8_t mode = draw8();
    switch (mode % 4) {
    case 0: /* honest: queue it */
        if (allocator->queued == QUEUE_CAPACITY) {
            return answer(status, NXMEM_STATUS_OUT_OF_MEMORY, "release queue full");
        }
        allocator->queue[allocator->queued].ticket = ticket;
        allocator->queue[allocator->queued].allocation_id = allocation->allocation_id;
        allocator->queued++;
        return NXMEM_STATUS_OK;
    case 1: /* retires it at once, outside any drain, and says OK */
        retire(allocator, ticket, allocation->allocation_id);
        return NXMEM_STATUS_OK;
    case 2: /* retires it at once, then reports an error */
        retire(allocator, ticket, allocation->allocation_id);
        return answer(status, draw_code() | 1u, "enqueue failed after retiring");
    default: /* refuses: nothing changed */
        return answer(status, draw_code() | 1u, "enqueue refused by the script");
    }
}

static NxmemStatusCode al_drain(NxmemAllocatorVtable *self, uint64_t *retired, NxmemStatus *status) {
    fuzz_allocator *allocator = allocator_of(self);
    const uint8_t keep = draw8(); /* how many to leave queued (0: retire all) */
    unsigned count = 0;
    while (allocator->queued > keep) {
        const queued_release first = allocator->queue[0];
        memmove(&allocator->queue[0], &allocator->queue[1],
                (allocator->queued - 1) * sizeof allocator->queue[0]);
        allocator->queued--;
        retire(allocator, first.ticket, first.allocation_id);
        count++;
    }
    *retired = count + draw8();
    return answer(status, draw_code(), "drain_releases failed by the script");
}

static NxmemStatusCode al_release_allocation(NxmemAllocatorVtable *self,
                                             const NxmemAllocation *allocation,
                                             NxmemReleaseOutcome *outcome, NxmemStatus *status) {
    fuzz_allocator *allocator = allocator_of(self);
    const NxmemStatusCode code = draw_code();
    outcome->state = NXMEM_RELEASE_COMPLETE + draw8();
    outcome->unmapped_bytes = allocation->size ^ draw64();
    outcome->residual_owned_bytes = draw64();
    if (code == NXMEM_STATUS_OK && outcome->state != NXMEM_RELEASE_FAILED &&
        allocator->live_allocations > 0) {
        allocator->live_allocations--;
    }
    return answer(status, code, "release_allocation refused by the script");
}

static NxmemStatusCode al_query_usage(NxmemAllocatorVtable *self, NxmemAllocatorUsage *usage,
                                      NxmemStatus *status) {
    (void)self;
    if (usage->struct_size >= sizeof *usage) {
        usage->live_allocations = draw64();
        usage->reserved_bytes = draw64();
        usage->mapped_bytes = draw64();
        usage->shared_prefix_bytes = draw64();
        usage->quarantined_bytes = draw64();
    }
    return answer(status, draw_code(), "query_usage refused by the script");
}

/* Fills a well-formed table at the negotiated minor with the capabilities drawn, then breaks at
 * most one thing if the script says so. Returns whether the host can still locate `release`. */
static int build_allocator(fuzz_allocator *allocator, const NxmemOpenRequest *request,
                           uint64_t mechanism_id) {
    NxmemAllocatorVtable *table = &allocator->table;
    memset(table, 0, sizeof *table);
    table->struct_size = sizeof *table;
    table->abi_minor = negotiated_minor;
    table->type_tag = NXMEM_TYPE_TAG_ALLOCATOR;
    table->mechanism_id = mechanism_id;
    table->device = request->device;
    table->allocate = al_allocate;
    table->deallocate = al_deallocate;
    table->retain = al_retain;
    table->release = al_release;
    const NxmemCapabilities wanted = (NxmemCapabilities)draw8() & NXMEM_CAPS_AT_MINOR(negotiated_minor);
    table->capabilities = wanted;
    if (wanted & NXMEM_CAP_VIRTUAL_BACKING) {
        NxmemVirtualBackingVtable *backing = &allocator->backing;
        memset(backing, 0, sizeof *backing);
        backing->struct_size = sizeof *backing;
        backing->abi_minor = negotiated_minor;
        backing->type_tag = NXMEM_TYPE_TAG_VIRTUAL_BACKING;
        backing->commit = vb_commit;
        backing->decommit = vb_decommit;
        backing->mapped_bytes = vb_mapped_bytes;
        backing->commit_granularity = (uint64_t)4096 << (draw8() % 4);
        table->virtual_backing = backing;
    }
    if (wanted & NXMEM_CAP_SHARED_MAPPING) {
        NxmemSharedMappingVtable *mapping = &allocator->mapping;
        memset(mapping, 0, sizeof *mapping);
        mapping->struct_size = sizeof *mapping;
        mapping->abi_minor = negotiated_minor;
        mapping->type_tag = NXMEM_TYPE_TAG_SHARED_MAPPING;
        mapping->create_shared_prefix = sm_create;
        mapping->retain_shared_prefix = sm_retain;
        mapping->release_shared_prefix = sm_release;
        mapping->commit_shared_prefix = sm_commit;
        table->shared_mapping = mapping;
    }
    if (wanted & NXMEM_CAP_DEFERRED_RELEASE) {
        table->enqueue_release = al_enqueue;
        table->drain_releases = al_drain;
    }
    if (wanted & NXMEM_CAP_STRUCTURED_RELEASE) {
        table->release_allocation = al_release_allocation;
    }
    if (wanted & NXMEM_CAP_USAGE_QUERY) {
        table->query_usage = al_query_usage;
    }
    /* One fault, or none. */
    const uint8_t fault = draw8();
    switch (fault) {
    case 0: return 1;
    case 1: table->struct_size = draw32(); break;
    case 2: table->type_tag = draw32(); break;
    case 3: table->abi_minor = draw32(); break;
    case 4: table->capabilities = draw64(); break;
    case 5: table->capabilities ^= (NxmemCapabilities)1 << (draw8() % 64); break;
    case 6: table->allocate = NULL; break;
    case 7: table->deallocate = NULL; break;
    case 8: table->retain = NULL; break;
    case 9: table->release = NULL; break;
    case 10: table->mechanism_id ^= draw64() | 1u; break;
    case 11: table->device.index ^= (int32_t)(draw8() | 1u); break;
    case 12: allocator->backing.struct_size = draw32(); break;
    case 13: allocator->backing.commit_granularity = draw64(); break;
    case 14: allocator->backing.type_tag = draw32(); break;
    case 15: allocator->mapping.struct_size = draw32(); break;
    case 16: allocator->mapping.commit_shared_prefix = NULL; break;
    case 17: allocator->backing.decommit = NULL; break;
    default: break;
    }
    /* What the host's defensive re-read (locate_release_slot) will find. */
    return table->struct_size >= offsetof(NxmemAllocatorVtable, release) + sizeof(NxmemReleaseFn) &&
           table->struct_size <= NXMEM_MAX_STRUCT_SIZE &&
           table->type_tag == NXMEM_TYPE_TAG_ALLOCATOR && table->release != NULL;
}

/* ---- factories ---- */

static NxmemStatusCode factory_open(NxmemAllocatorFactoryVtable *self, const NxmemOpenRequest *request,
                                    NxmemAllocatorVtable **allocator, NxmemStatus *status) {
    const NxmemStatusCode code = draw_code();
    if (code != NXMEM_STATUS_OK) {
        return answer(status, code, "open_allocator refused by the script");
    }
    fuzz_allocator *chosen = NULL;
    for (unsigned i = 0; i < ALLOCATOR_POOL && chosen == NULL; ++i) {
        if (allocators[i].references == 0 && allocators[i].queued == 0 && !allocators[i].excused) {
            chosen = &allocators[i];
        }
    }
    if (chosen == NULL) {
        return answer(status, NXMEM_STATUS_OUT_OF_MEMORY, "every allocator of the pool is in use");
    }
    memset(chosen, 0, sizeof *chosen);
    chosen->callbacks = request->callbacks;
    chosen->references = 1;
    chosen->next_address = 0;
    const int releasable = build_allocator(chosen, request, self->mechanism_id);
    chosen->excused = !releasable;
    if (draw8() == 1) {
        *allocator = NULL; /* OK with no table */
        chosen->references = 0;
        chosen->excused = 0;
        return NXMEM_STATUS_OK;
    }
    *allocator = &chosen->table;
    return NXMEM_STATUS_OK;
}

static void factory_release(NxmemAllocatorFactoryVtable *self) {
    fuzz_factory *factory = (fuzz_factory *)(void *)self;
    if (!factory->handed) {
        die("release of a factory the host never owned");
    }
    if (factory->released++ > 0) {
        die("a factory released twice");
    }
}

static void build_factory(fuzz_factory *factory, unsigned index) {
    NxmemAllocatorFactoryVtable *table = &factory->table;
    memset(factory, 0, sizeof *factory);
    factory->index = index;
    table->struct_size = sizeof *table;
    table->abi_minor = negotiated_minor;
    table->type_tag = NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
    table->name = factory_names[index];
    table->mechanism_id = 0xF0 + index;
    table->device_types = ((uint64_t)1 << NXMEM_DEVICE_CPU) | ((uint64_t)1 << NXMEM_DEVICE_CUDA);
    table->open_allocator = factory_open;
    table->release = factory_release;
    const uint8_t fault = draw8();
    switch (fault) {
    case 0: break;
    case 1: table->struct_size = draw32(); break;
    case 2: table->type_tag = draw32(); break;
    case 3: table->abi_minor = draw32(); break;
    case 4: table->name = NULL; break;
    case 5: table->name = ""; break;
    case 6: table->name = unterminated_name; break;
    case 7: table->name = factory_names[draw8() % FACTORY_POOL]; break;
    case 8: table->mechanism_id = draw8() % 2 == 0 ? 0 : 0xF0 + draw8() % FACTORY_POOL; break;
    case 9: table->open_allocator = NULL; break;
    case 10: table->release = NULL; break;
    case 11: table->device_types = draw64(); break;
    default: break;
    }
    /* Whether the host's read of the table (read_prefix) fails before it finds `release`. */
    factory->excused = table->release == NULL || table->struct_size < sizeof *table ||
                       table->struct_size > NXMEM_MAX_STRUCT_SIZE ||
                       table->type_tag != NXMEM_TYPE_TAG_ALLOCATOR_FACTORY;
}

/* ---- the three exports ---- */

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemNegotiate(const NxmemNegotiateRequest *request,
                                                   NxmemNegotiateResponse *response,
                                                   NxmemStatus *status) {
    const uint8_t mode = draw8();
    const NxmemVersionRange host = request->host_range;
    uint32_t low = 0, high = NXMEM_ABI_MINOR;
    if (mode == 1) { /* an honest plugin of another range, perhaps with nothing in common */
        low = draw8() % 4;
        high = low + draw8() % 3;
    }
    if (mode <= 1) {
        if (host.major != NXMEM_ABI_MAJOR || host.max_minor < low || high < host.min_minor) {
            return answer(status, NXMEM_STATUS_VERSION_MISMATCH, "no common minor");
        }
        negotiated_minor = host.max_minor < high ? host.max_minor : high;
        response->major = NXMEM_ABI_MAJOR;
        response->minor = negotiated_minor;
        response->plugin_range.struct_size = sizeof response->plugin_range;
        response->plugin_range.major = NXMEM_ABI_MAJOR;
        response->plugin_range.min_minor = low;
        response->plugin_range.max_minor = high;
        return NXMEM_STATUS_OK;
    }
    /* Anything at all. */
    response->major = draw8();
    response->minor = draw8();
    response->plugin_range.major = draw8();
    response->plugin_range.min_minor = draw8();
    response->plugin_range.max_minor = draw8();
    negotiated_minor = response->minor;
    return answer(status, draw_code(), "negotiation refused by the script");
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemCreateAllocatorFactories(
    NxmemAllocatorFactoryVtable **list, uint32_t capacity, uint32_t *count, NxmemStatus *status) {
    const uint8_t shape = draw8();
    const unsigned wanted = shape == 0 ? 2u : shape % (FACTORY_POOL + 1);
    for (unsigned i = 0; i < FACTORY_POOL; ++i) {
        build_factory(&factories[i], i);
    }
    const NxmemStatusCode code = draw_code();
    if (code != NXMEM_STATUS_OK) {
        *count = draw32() % 8;
        return answer(status, code, "creating factories refused by the script");
    }
    if (wanted > capacity) {
        *count = wanted;
        return answer(status, NXMEM_STATUS_INVALID_ARGUMENT, "more factories than capacity");
    }
    const uint8_t listing = draw8();
    for (unsigned i = 0; i < wanted; ++i) {
        /* listing 1: any factory of the pool at each place, repeats included */
        list[i] = &factories[listing == 1 ? draw8() % FACTORY_POOL : i].table;
    }
    *count = wanted;
    if (listing == 2) {
        list[draw8() % (wanted + 1)] = NULL;
    } else if (listing == 3) {
        *count = draw32(); /* perhaps fewer than listed, or more than the capacity */
    }
    /* The host owns what the count covers, unless the count is beyond the capacity. */
    for (unsigned i = 0; *count <= capacity && i < *count; ++i) {
        if (list[i] != NULL) {
            ((fuzz_factory *)(void *)list[i])->handed = 1;
        }
    }
    return NXMEM_STATUS_OK;
}

NXMEM_PLUGIN_EXPORT NxmemStatusCode NxmemQueryUnloadReadiness(NxmemUnloadReport *report,
                                                              NxmemStatus *status) {
    NxmemUnloadReport honest;
    memset(&honest, 0, sizeof honest);
    for (unsigned i = 0; i < ALLOCATOR_POOL; ++i) {
        honest.live_allocators += allocators[i].references > 0;
        honest.live_allocations += allocators[i].live_allocations;
        honest.live_shared_prefixes += allocators[i].prefix_references;
        honest.queued_releases += allocators[i].queued;
    }
    honest.live_allocators += draw8() == 1;
    report->live_allocators = honest.live_allocators;
    report->live_allocations = honest.live_allocations;
    report->live_views = 0;
    report->live_shared_prefixes = honest.live_shared_prefixes;
    report->queued_releases = honest.queued_releases;
    return answer(status, draw_code(), "readiness report refused by the script");
}

/* ---- test-only controls ---- */

NXMEM_PLUGIN_EXPORT uint64_t nxmem_fuzz_queued(void) {
    uint64_t queued = 0;
    for (unsigned i = 0; i < ALLOCATOR_POOL; ++i) {
        queued += allocators[i].queued;
    }
    return queued;
}

NXMEM_PLUGIN_EXPORT void nxmem_fuzz_begin(const uint8_t *data, size_t size) {
    script_bytes = data;
    script_left = size;
    negotiated_minor = 0;
    next_prefix_id = 0;
    memset(factories, 0, sizeof factories);
    memset(allocators, 0, sizeof allocators);
}

NXMEM_PLUGIN_EXPORT int nxmem_fuzz_audit(int *outstanding, char *message, size_t capacity) {
    *outstanding = 0;
    /* Allocators first: one the host still holds keeps the module, and so its factories, alive. */
    for (unsigned i = 0; i < ALLOCATOR_POOL; ++i) {
        const fuzz_allocator *allocator = &allocators[i];
        if (allocator->references > 0) {
            if (!allocator->excused && allocator->queued == 0) {
                snprintf(message, capacity,
                         "allocator %u still holds %lld reference(s) though nothing of it is queued",
                         i, (long long)allocator->references);
                return -1;
            }
            *outstanding = 1;
        }
    }
    for (unsigned i = 0; i < FACTORY_POOL; ++i) {
        const fuzz_factory *factory = &factories[i];
        if (factory->handed && factory->released == 0) {
            if (!factory->excused && !*outstanding) {
                snprintf(message, capacity, "factory %u was handed over but never released", i);
                return -1;
            }
            *outstanding = 1;
        }
    }
    return 0;
}
