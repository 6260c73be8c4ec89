/*
 * fixture_plugin.h: the base of the C fixture plugins of the compatibility matrix. It is the C
 * example (plugins/minimal_c/minimal_plugin.c, included whole: its allocator, checks and unload
 * counts) with its two exports renamed, plus what a fixture needs to speak a higher minor:
 * negotiation up to a minor of its choice, remembering the agreed minor, and publishing its own
 * factory. Each fixture includes this once and defines the two exports with these helpers.
 */
#ifndef NXMEM_COMPAT_FIXTURE_PLUGIN_H
#define NXMEM_COMPAT_FIXTURE_PLUGIN_H

#define NxmemNegotiate minimal_negotiate
#define NxmemCreateAllocatorFactories minimal_create_factories
#include "minimal_plugin.c" /* corpus: the copy of the same day, beside this file */
#undef NxmemNegotiate
#undef NxmemCreateAllocatorFactories

/* The minor negotiation agreed to: a table declares at most this, and sets only its flags. */
static atomic_uint fixture_negotiated_minor;

/* NxmemNegotiate for a plugin speaking 1.0 to 1.`max_minor`: the highest common minor. */
static NxmemStatusCode fixture_negotiate(const NxmemNegotiateRequest *request,
                                         NxmemNegotiateResponse *response, NxmemStatus *status,
                                         uint32_t max_minor, const char *name) {
    NxmemStatusCode code = CHECK_REQUEST(NxmemNegotiateRequest, host_range, request, status);
    if (code == NXMEM_STATUS_OK) {
        code = CHECK_OUTPUT(NxmemNegotiateResponse, plugin_range, response, status);
    }
    if (code != NXMEM_STATUS_OK) {
        return code;
    }
    const NxmemVersionRange host = request->host_range;
    const NxmemVersionRange ours = {sizeof(NxmemVersionRange), NXMEM_ABI_MAJOR, 0u, max_minor};
    if (host.min_minor > host.max_minor) {
        return report(status, NXMEM_STATUS_INVALID_ARGUMENT, "negotiate: host range is inverted");
    }
    const uint32_t high = host.max_minor < ours.max_minor ? host.max_minor : ours.max_minor;
    const bool overlap = host.major == ours.major && host.min_minor <= high;
    NxmemNegotiateResponse out = {.major = overlap ? ours.major : 0,
                                  .minor = overlap ? high : 0,
                                  .plugin_range = ours};
    copy_output(response, &out, sizeof out);
    if (!overlap) {
        return report(status, NXMEM_STATUS_VERSION_MISMATCH,
                      "negotiate: host speaks %u.%u-%u.%u, %s speaks 1.0-1.%u",
                      (unsigned)host.major, (unsigned)host.min_minor, (unsigned)host.major,
                      (unsigned)host.max_minor, name, (unsigned)max_minor);
    }
    atomic_store(&fixture_negotiated_minor, high);
    return NXMEM_STATUS_OK;
}

/* NxmemCreateAllocatorFactories for a plugin with the one `factory`. */
static NxmemStatusCode fixture_create_factories(NxmemAllocatorFactoryVtable **factories,
                                                uint32_t capacity, uint32_t *count,
                                                NxmemStatus *status,
                                                NxmemAllocatorFactoryVtable *factory) {
    if (count == NULL || (factories == NULL && capacity != 0)) {
        return report(status, NXMEM_STATUS_INVALID_ARGUMENT, "create factories: NULL output");
    }
    *count = 1;
    if (capacity < 1) {
        return report(status, NXMEM_STATUS_INVALID_ARGUMENT,
                      "create factories: capacity 0, %s needs 1", factory->name);
    }
    factories[0] = factory;
    return NXMEM_STATUS_OK;
}

#endif /* NXMEM_COMPAT_FIXTURE_PLUGIN_H */
