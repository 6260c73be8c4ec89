/*
 * c_host.c: a host written in plain C11 against one frozen snapshot of the header, the way an
 * engine that is not C++ (C, Rust, Python ctypes) drives a plugin. Compiled once per snapshot;
 * it follows strictly the rules of the minor its header describes (NXMEM_ABI_MINOR) and knows
 * nothing newer.
 *
 *     c_host PLUGIN MECHANISM...
 *
 * With no C++ runtime in the process (checked before dlopen) it negotiates with its own range,
 * creates the factories, opens each named mechanism on CPU 0, reads every table only through a
 * bounded copy of struct_size bytes (docs/ABI.md, "How to read a table (C)"), allocates, queries
 * usage where its minor and the table have it, writes, commits and decommits where the table
 * offers virtual backing, releases, releases the factories, checks that NxmemQueryUnloadReadiness
 * reports all zero, dlcloses the plugin, and requires that it is no longer mapped:
 * dlopen(PLUGIN, RTLD_NOLOAD) returns NULL. Exit status 0 when all holds, 1 with the reason on
 * stderr otherwise.
 */
#define _GNU_SOURCE /* dl_iterate_phdr */
#include <nxmem/nxmem_memory_abi.h>

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define TABLE_HEADER_BYTES 12u /* struct_size, abi_minor, type_tag */

/* The bytes a table of `level` (at most NXMEM_ABI_MINOR) must provide: the end of the level's
 * last field, not sizeof (docs/ABI.md L6). A new minor adds its line here. */
static size_t factory_level_end(uint32_t level) {
    (void)level; /* no minor has grown the factory table */
    return FIELD_END(NxmemAllocatorFactoryVtable, release);
}

static size_t allocator_level_end(uint32_t level) {
#if NXMEM_ABI_MINOR >= 4
    if (level >= 4) {
        return FIELD_END(NxmemAllocatorVtable, copy);
    }
#endif
#if NXMEM_ABI_MINOR >= 3
    if (level >= 3) {
        return FIELD_END(NxmemAllocatorVtable, ipc);
    }
#endif
#if NXMEM_ABI_MINOR >= 2
    if (level >= 2) {
        return FIELD_END(NxmemAllocatorVtable, query_usage);
    }
#endif
#if NXMEM_ABI_MINOR >= 1
    if (level >= 1) {
        return FIELD_END(NxmemAllocatorVtable, release_allocation);
    }
#endif
    (void)level;
    return FIELD_END(NxmemAllocatorVtable, drain_releases);
}

static size_t virtual_backing_level_end(uint32_t level) {
#if NXMEM_ABI_MINOR >= 2
    if (level >= 2) {
        return FIELD_END(NxmemVirtualBackingVtable, commit_granularity);
    }
#endif
    (void)level;
    return FIELD_END(NxmemVirtualBackingVtable, mapped_bytes);
}

/* The capability flags defined at or below `minor`, as far as this header knows them. */
static uint64_t flags_at_minor(uint32_t minor) {
#ifdef NXMEM_CAPS_AT_MINOR
    return NXMEM_CAPS_AT_MINOR(minor);
#else
    uint64_t flags = NXMEM_CAP_ALL_V1;
    (void)minor; /* the minor-0 header knows one level only */
#ifdef NXMEM_CAP_STRUCTURED_RELEASE
    if (minor < 1) {
        flags &= ~NXMEM_CAP_STRUCTURED_RELEASE;
    }
#endif
    return flags;
#endif
}

static const char *plugin_path = "";

static _Noreturn void fail(const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    fprintf(stderr, "c host (minor %u), %s: ", (unsigned)NXMEM_ABI_MINOR, plugin_path);
    vfprintf(stderr, format, arguments);
    fputc('\n', stderr);
    va_end(arguments);
    exit(1);
}

static NxmemStatus fresh_status(void) {
    NxmemStatus status;
    memset(&status, 0, sizeof status);
    status.struct_size = sizeof status;
    return status;
}

static void expect_ok(NxmemStatusCode code, const NxmemStatus *status, const char *what) {
    if (code != NXMEM_STATUS_OK) {
        fail("%s returned %u: %.*s", what, (unsigned)code, (int)NXMEM_STATUS_MESSAGE_BYTES,
             status->message);
    }
}

/* ---- no C++ runtime before the plugin ------------------------------------------------------ */

typedef struct LoadedScan {
    bool cxx_runtime;
    bool sanitizer_runtime;
} LoadedScan;

static int scan_loaded_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    LoadedScan *scan = data;
    if (strstr(info->dlpi_name, "libstdc++") != NULL || strstr(info->dlpi_name, "libc++") != NULL) {
        scan->cxx_runtime = true;
    }
    if (strstr(info->dlpi_name, "san.so") != NULL) { /* libasan, libubsan, libtsan */
        scan->sanitizer_runtime = true;
    }
    return 0;
}

/* The point of this host: nothing in the process but C until the plugin brings its own runtime.
 * GCC's UBSan runtime links libstdc++; under it the check is reported and waived. */
static void require_no_cxx_runtime(void) {
    LoadedScan scan = {false, false};
    dl_iterate_phdr(scan_loaded_object, &scan);
    if (scan.cxx_runtime && !scan.sanitizer_runtime) {
        fail("a C++ runtime is loaded before the plugin: this host must be linked as C only");
    }
    if (scan.cxx_runtime) {
        fprintf(stderr, "c host: note: a sanitizer runtime loaded libstdc++; the no-C++ check is waived\n");
    }
}

/* ---- bounded table reads (docs/ABI.md, "How to read a table (C)") -------------------------- */

typedef struct TableHeader {
    uint32_t struct_size;
    uint32_t declared_minor;
} TableHeader;

/* Reads the header of the growable table at `untrusted`, refusing a NULL or misaligned pointer, a
 * struct_size below the table header or above the cap, and a wrong type tag. */
static TableHeader read_table_header(const void *untrusted, uint32_t tag, const char *what) {
    if (untrusted == NULL || (uintptr_t)untrusted % 8 != 0) {
        fail("%s table pointer %p is NULL or misaligned", what, untrusted);
    }
    TableHeader header = {0, 0};
    memcpy(&header.struct_size, untrusted, sizeof header.struct_size); /* first, and alone */
    if (header.struct_size < TABLE_HEADER_BYTES || header.struct_size > NXMEM_MAX_STRUCT_SIZE) {
        fail("%s table struct_size %u is outside [%u, %u]", what, (unsigned)header.struct_size,
             TABLE_HEADER_BYTES, (unsigned)NXMEM_MAX_STRUCT_SIZE);
    }
    uint32_t found_tag = 0;
    memcpy(&header.declared_minor, (const unsigned char *)untrusted + 4, sizeof header.declared_minor);
    memcpy(&found_tag, (const unsigned char *)untrusted + 8, sizeof found_tag);
    if (found_tag != tag) {
        fail("%s table carries type tag 0x%08x, not 0x%08x", what, (unsigned)found_tag, (unsigned)tag);
    }
    return header;
}

/* Copies min(struct_size, local_size) bytes into the zeroed `local`: never a byte past
 * struct_size, and never a write to the plugin's table. */
static void copy_table(void *local, size_t local_size, const void *untrusted, uint32_t struct_size) {
    memset(local, 0, local_size);
    memcpy(local, untrusted, struct_size < local_size ? struct_size : local_size);
}

static uint32_t least(uint32_t a, uint32_t b) { return a < b ? a : b; }

typedef struct TableRead {
    uint32_t declared; /* the minor the table claims */
    uint32_t effective; /* min(declared, negotiated, known): the level it is read at */
} TableRead;

/* Copies the table at `untrusted` into `local` after checking its header and that its
 * struct_size covers the level it declares (a newer minor than known: everything known). */
static TableRead read_table(const void *untrusted, uint32_t tag, size_t (*level_end)(uint32_t),
                            uint32_t negotiated, void *local, size_t local_size, const char *what) {
    const TableHeader header = read_table_header(untrusted, tag, what);
    const uint32_t known_level = least(header.declared_minor, NXMEM_ABI_MINOR);
    if (header.struct_size < level_end(known_level)) {
        fail("%s table declares minor %u but struct_size %u is below the %zu bytes it needs", what,
             (unsigned)header.declared_minor, (unsigned)header.struct_size, level_end(known_level));
    }
    copy_table(local, local_size, untrusted, header.struct_size);
    const TableRead read = {header.declared_minor, least(known_level, negotiated)};
    return read;
}

static NxmemAllocatorFactoryVtable read_factory(const void *untrusted, uint32_t negotiated) {
    NxmemAllocatorFactoryVtable copy;
    copy.abi_minor = read_table(untrusted, NXMEM_TYPE_TAG_ALLOCATOR_FACTORY, factory_level_end,
                                negotiated, &copy, sizeof copy, "factory").effective;
    if (copy.open_allocator == NULL || copy.release == NULL || copy.name == NULL) {
        fail("factory table lacks open_allocator, release or name");
    }
    return copy;
}

/* An allocator table, read at min(declared, negotiated, known): slots above that level read
 * NULL; flags of a minor newer than this header are cleared, flags no minor this header knows
 * defines are refused, flags above the effective level are cleared with their slots. */
static NxmemAllocatorVtable read_allocator(const void *untrusted, uint32_t negotiated) {
    NxmemAllocatorVtable copy;
    const TableRead read = read_table(untrusted, NXMEM_TYPE_TAG_ALLOCATOR, allocator_level_end,
                                      negotiated, &copy, sizeof copy, "allocator");
    const uint32_t effective = read.effective;
    copy.abi_minor = effective;
    if (read.declared > NXMEM_ABI_MINOR) {
        copy.capabilities &= NXMEM_CAP_ALL_V1; /* a newer minor's flags: unknown here, cleared */
    } else if ((copy.capabilities & ~flags_at_minor(read.declared)) != 0) {
        fail("allocator table declaring minor %u sets capability bits 0x%llx that no minor up to "
             "it defines",
             (unsigned)read.declared,
             (unsigned long long)(copy.capabilities & ~flags_at_minor(read.declared)));
    }
    copy.capabilities &= flags_at_minor(effective);
#if NXMEM_ABI_MINOR >= 1
    if (effective < 1) {
        copy.release_allocation = NULL;
    }
#endif
#if NXMEM_ABI_MINOR >= 2
    if (effective < 2) {
        copy.query_usage = NULL;
    }
#endif
#if NXMEM_ABI_MINOR >= 3
    if (effective < 3) {
        copy.ipc = NULL;
    }
#endif
#if NXMEM_ABI_MINOR >= 4
    if (effective < 4) {
        copy.fenced_release = NULL;
        copy.copy = NULL;
    }
#endif
    if (copy.allocate == NULL || copy.deallocate == NULL || copy.retain == NULL ||
        copy.release == NULL) {
        fail("allocator table lacks a required slot");
    }
    if (((copy.capabilities & NXMEM_CAP_VIRTUAL_BACKING) != 0) != (copy.virtual_backing != NULL)) {
        fail("NXMEM_CAP_VIRTUAL_BACKING and the virtual_backing table disagree");
    }
#if NXMEM_ABI_MINOR >= 1
    if (((copy.capabilities & NXMEM_CAP_STRUCTURED_RELEASE) != 0) != (copy.release_allocation != NULL)) {
        fail("NXMEM_CAP_STRUCTURED_RELEASE and the release_allocation slot disagree");
    }
#endif
#if NXMEM_ABI_MINOR >= 2
    if (((copy.capabilities & NXMEM_CAP_USAGE_QUERY) != 0) != (copy.query_usage != NULL)) {
        fail("NXMEM_CAP_USAGE_QUERY and the query_usage slot disagree");
    }
#endif
#if NXMEM_ABI_MINOR >= 3
    if (((copy.capabilities & NXMEM_CAP_IPC) != 0) != (copy.ipc != NULL)) {
        fail("NXMEM_CAP_IPC and the ipc table disagree");
    }
#endif
#if NXMEM_ABI_MINOR >= 4
    if (((copy.capabilities & NXMEM_CAP_FENCED_RELEASE) != 0) != (copy.fenced_release != NULL)) {
        fail("NXMEM_CAP_FENCED_RELEASE and the fenced_release table disagree");
    }
    if ((copy.capabilities & NXMEM_CAP_FENCED_RELEASE) != 0 &&
        (copy.capabilities & NXMEM_CAP_DEFERRED_RELEASE) == 0) {
        fail("NXMEM_CAP_FENCED_RELEASE is set without NXMEM_CAP_DEFERRED_RELEASE");
    }
    if (((copy.capabilities & NXMEM_CAP_COPY) != 0) != (copy.copy != NULL)) {
        fail("NXMEM_CAP_COPY and the copy table disagree");
    }
#endif
    return copy;
}

static NxmemVirtualBackingVtable read_virtual_backing(const void *untrusted, uint32_t negotiated) {
    NxmemVirtualBackingVtable copy;
    copy.abi_minor = read_table(untrusted, NXMEM_TYPE_TAG_VIRTUAL_BACKING, virtual_backing_level_end,
                                negotiated, &copy, sizeof copy, "virtual backing").effective;
#if NXMEM_ABI_MINOR >= 2
    if (copy.abi_minor < 2) {
        copy.commit_granularity = 0; /* a field above the level read does not exist */
    }
#endif
    if (copy.commit == NULL || copy.decommit == NULL || copy.mapped_bytes == NULL) {
        fail("virtual backing table lacks a slot");
    }
    return copy;
}

/* ---- driving one mechanism ------------------------------------------------------------------ */

static uint64_t next_allocation_id = 1; /* host-assigned, monotonic, never an address */

static NxmemAllocation describe(const NxmemAllocatorVtable *table, const NxmemAllocRequest *request,
                                const NxmemAllocResult *result) {
    NxmemAllocation allocation;
    memset(&allocation, 0, sizeof allocation);
    allocation.struct_size = sizeof allocation;
    allocation.mechanism_id = table->mechanism_id;
    allocation.device = request->device;
    allocation.allocation_id = request->allocation_id;
    allocation.address = result->address;
    allocation.size = request->size; /* the size asked for (docs/ABI.md Q12) */
    allocation.alignment = request->alignment;
    return allocation;
}

static uint64_t mapped_bytes_of(const NxmemVirtualBackingVtable *backing, NxmemAllocatorVtable *self,
                                const NxmemAllocation *allocation) {
    NxmemStatus status = fresh_status();
    uint64_t mapped = UINT64_MAX;
    expect_ok(backing->mapped_bytes(self, allocation, &mapped, &status), &status, "mapped_bytes");
    return mapped;
}

static void change_range(NxmemCommitFn slot, NxmemAllocatorVtable *self,
                         const NxmemAllocation *allocation, uint64_t length, const char *what) {
    NxmemRangeRequest range;
    memset(&range, 0, sizeof range);
    range.struct_size = sizeof range;
    range.allocation = *allocation;
    range.range.struct_size = sizeof range.range;
    range.range.offset = 0;
    range.range.length = length;
    NxmemStatus status = fresh_status();
    expect_ok(slot(self, &range, &status), &status, what);
}

/* Commits the first `granule`s of the allocation, writes them, reads back the mapped bytes, and
 * decommits them again. */
static void exercise_virtual_backing(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self,
                                     uint32_t negotiated, const NxmemAllocation *allocation) {
    const NxmemVirtualBackingVtable backing = read_virtual_backing(table->virtual_backing, negotiated);
    uint64_t granule = (uint64_t)sysconf(_SC_PAGESIZE);
#if NXMEM_ABI_MINOR >= 2
    if (backing.abi_minor >= 2 && backing.commit_granularity != 0) {
        granule = backing.commit_granularity;
    }
#endif
    const uint64_t length = allocation->size < 2 * granule ? allocation->size : 2 * granule;
    if (mapped_bytes_of(&backing, self, allocation) != 0) {
        fail("a fresh virtual-backing allocation already has mapped bytes");
    }
    change_range(backing.commit, self, allocation, length, "commit");
    memset((void *)(uintptr_t)allocation->address, 0xA5, (size_t)length);
    const uint64_t mapped = mapped_bytes_of(&backing, self, allocation);
    if (mapped < length) {
        fail("after committing %llu bytes mapped_bytes is %llu", (unsigned long long)length,
             (unsigned long long)mapped);
    }
    change_range(backing.decommit, self, allocation, length, "decommit");
    if (mapped_bytes_of(&backing, self, allocation) != 0) {
        fail("after decommitting everything mapped_bytes is not 0");
    }
}

#if NXMEM_ABI_MINOR >= 3
static size_t ipc_level_end(uint32_t level) {
    (void)level;
    return FIELD_END(NxmemIpcVtable, close_import);
}

static size_t shared_mapping_level_end(uint32_t level) {
    (void)level; /* no minor has grown the shared-mapping table */
    return FIELD_END(NxmemSharedMappingVtable, commit_shared_prefix);
}

static NxmemSharedMappingVtable read_shared_mapping(const void *untrusted, uint32_t negotiated) {
    NxmemSharedMappingVtable copy;
    copy.abi_minor = read_table(untrusted, NXMEM_TYPE_TAG_SHARED_MAPPING, shared_mapping_level_end, negotiated,
                                &copy, sizeof copy, "shared mapping").effective;
    if (copy.create_shared_prefix == NULL || copy.release_shared_prefix == NULL) {
        fail("shared mapping table lacks a slot");
    }
    return copy;
}

/* Minor 3: a prefix exported read-only and imported back (this process stands in for the other
 * one: the record and its descriptor are what would travel), its bytes counted apart as imported
 * bytes, the import closed, the descriptor closed, the prefix released. */
static void exercise_ipc(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self,
                         uint32_t negotiated) {
    NxmemIpcVtable ipc;
    read_table(table->ipc, NXMEM_TYPE_TAG_IPC, ipc_level_end, negotiated, &ipc, sizeof ipc, "ipc");
    if (ipc.export_handle == NULL || ipc.import_handle == NULL || ipc.close_import == NULL) {
        fail("ipc table lacks a slot");
    }
    if (table->shared_mapping == NULL) {
        return; /* nothing of this mechanism's that this host knows how to export */
    }
    const NxmemSharedMappingVtable mapping = read_shared_mapping(table->shared_mapping, negotiated);
    NxmemSharedPrefixRequest create;
    memset(&create, 0, sizeof create);
    create.struct_size = sizeof create;
    create.mechanism_id = table->mechanism_id;
    create.device = table->device;
    create.size = 8192;
    NxmemSharedPrefixHandle prefix;
    memset(&prefix, 0, sizeof prefix);
    prefix.struct_size = sizeof prefix;
    NxmemStatus status = fresh_status();
    expect_ok(mapping.create_shared_prefix(self, &create, &prefix, &status), &status,
              "create_shared_prefix");

    NxmemExportRequest request;
    memset(&request, 0, sizeof request);
    request.struct_size = sizeof request;
    request.kind = NXMEM_IPC_PREFIX;
    request.access = NXMEM_IPC_READ_ONLY;
    request.prefix = prefix;
    NxmemIpcHandle handle;
    memset(&handle, 0, sizeof handle);
    handle.struct_size = sizeof handle;
    status = fresh_status();
    expect_ok(ipc.export_handle(self, &request, &handle, &status), &status, "export_handle");
    if (handle.kind != NXMEM_IPC_PREFIX || handle.size != create.size || handle.fd_count > NXMEM_IPC_MAX_FDS) {
        fail("export_handle wrote kind %u size %llu with %u descriptors", (unsigned)handle.kind,
             (unsigned long long)handle.size, (unsigned)handle.fd_count);
    }

    NxmemImportRequest import;
    memset(&import, 0, sizeof import);
    import.struct_size = sizeof import;
    import.access = NXMEM_IPC_READ_ONLY;
    import.mechanism_id = table->mechanism_id;
    import.device = table->device;
    import.import_id = next_allocation_id++;
    import.handle = &handle;
    NxmemImport imported;
    memset(&imported, 0, sizeof imported);
    imported.struct_size = sizeof imported;
    status = fresh_status();
    expect_ok(ipc.import_handle(self, &import, &imported, &status), &status, "import_handle");
    for (uint32_t index = 0; index < handle.fd_count; ++index) {
        close(handle.fds[index]); /* borrowed by the import: the plugin kept its own */
    }
    if (table->query_usage != NULL) {
        NxmemAllocatorUsage usage;
        memset(&usage, 0, sizeof usage);
        usage.struct_size = sizeof usage;
        status = fresh_status();
        expect_ok(table->query_usage(self, &usage, &status), &status, "query_usage");
        if (usage.live_imports != 1 || usage.imported_bytes < create.size) {
            fail("query_usage reports %llu imports of %llu bytes; one of %llu is live",
                 (unsigned long long)usage.live_imports, (unsigned long long)usage.imported_bytes,
                 (unsigned long long)create.size);
        }
    }
    status = fresh_status();
    expect_ok(ipc.close_import(self, &imported, &status), &status, "close_import");
    status = fresh_status();
    expect_ok(mapping.release_shared_prefix(self, &prefix, &status), &status, "release_shared_prefix");
    printf("c host (minor 3): exported a prefix read-only with %u descriptor(s), imported it, "
           "closed it\n", (unsigned)handle.fd_count);
}
#endif

#if NXMEM_ABI_MINOR >= 4
static size_t fenced_release_level_end(uint32_t level) {
    (void)level;
    return FIELD_END(NxmemFencedReleaseVtable, fence_kinds);
}

static size_t copy_level_end(uint32_t level) {
    (void)level;
    return FIELD_END(NxmemCopyVtable, stream_kinds);
}

static void copy_once(const NxmemCopyVtable *copier, NxmemAllocatorVtable *self,
                      const NxmemAllocation *allocation, NxmemCopyDirection direction,
                      uint64_t offset, void *buffer, uint64_t length) {
    NxmemCopyRequest request;
    memset(&request, 0, sizeof request);
    request.struct_size = sizeof request;
    request.direction = direction;
    request.target = NXMEM_COPY_ALLOCATION;
    request.allocation = *allocation;
    request.offset = offset;
    request.length = length;
    request.host_buffer = buffer;
    NxmemStatus status = fresh_status();
    expect_ok(copier->copy(self, &request, &status), &status, "copy");
}

/* Minor 4: a synchronous copy into the allocation and back out (a virtual-backing allocation's
 * first page committed for it, and decommitted after). */
static void exercise_copy(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self,
                          uint32_t negotiated, const NxmemAllocation *allocation) {
    NxmemCopyVtable copier;
    read_table(table->copy, NXMEM_TYPE_TAG_COPY, copy_level_end, negotiated, &copier, sizeof copier,
               "copy");
    if (copier.copy == NULL) {
        fail("copy table lacks its slot");
    }
    NxmemVirtualBackingVtable backing;
    memset(&backing, 0, sizeof backing);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (table->virtual_backing != NULL) {
        backing = read_virtual_backing(table->virtual_backing, negotiated);
        change_range(backing.commit, self, allocation, page, "commit");
    }
    unsigned char in[64];
    unsigned char out[64];
    for (size_t at = 0; at < sizeof in; ++at) {
        in[at] = (unsigned char)(at * 7u + 3u);
    }
    memset(out, 0, sizeof out);
    copy_once(&copier, self, allocation, NXMEM_COPY_FROM_HOST, 100, in, sizeof in);
    copy_once(&copier, self, allocation, NXMEM_COPY_TO_HOST, 100, out, sizeof out);
    if (memcmp(in, out, sizeof in) != 0) {
        fail("the bytes copied out of the allocation are not those copied in");
    }
    if (table->virtual_backing != NULL) {
        change_range(backing.decommit, self, allocation, page, "decommit");
    }
    printf("c host (minor 4): copied %zu bytes into an allocation and back\n", sizeof in);
}

/* What release_completed reported (this host offers it from minor 4 on). */
static uint64_t completed_tickets[8];
static unsigned completed_count = 0;

static void on_release_completed(void *host_context, const NxmemReleaseCompletion *completion) {
    (void)host_context;
    if (completion != NULL && completed_count < 8) {
        completed_tickets[completed_count++] = completion->ticket;
    }
}

static uint64_t drain(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self) {
    uint64_t retired = UINT64_MAX;
    NxmemStatus status = fresh_status();
    expect_ok(table->drain_releases(self, &retired, &status), &status, "drain_releases");
    return retired;
}

/* Minor 4: a release fenced on a host timeline counter does not retire while the counter is
 * below the fence's value, and retires at the first drain after it reaches it. */
static void exercise_fenced_release(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self,
                                    uint32_t negotiated, NxmemAllocRequest request) {
    NxmemFencedReleaseVtable fenced;
    read_table(table->fenced_release, NXMEM_TYPE_TAG_FENCED_RELEASE, fenced_release_level_end,
               negotiated, &fenced, sizeof fenced, "fenced release");
    if (fenced.enqueue_fenced_release == NULL || table->drain_releases == NULL) {
        fail("fenced release without its slot or drain_releases");
    }
    if ((fenced.fence_kinds & (1ull << NXMEM_FENCE_HOST_TIMELINE)) == 0) {
        return; /* waits on device work only: nothing this host can signal */
    }
    request.allocation_id = next_allocation_id++;
    NxmemAllocResult result;
    memset(&result, 0, sizeof result);
    result.struct_size = sizeof result;
    NxmemStatus status = fresh_status();
    expect_ok(table->allocate(self, &request, &result, &status), &status, "allocate");
    const NxmemAllocation allocation = describe(table, &request, &result);

    static _Alignas(8) _Atomic uint64_t counter = 0;
    atomic_store(&counter, 0);
    NxmemFence fence;
    memset(&fence, 0, sizeof fence);
    fence.struct_size = sizeof fence;
    fence.kind = NXMEM_FENCE_HOST_TIMELINE;
    fence.device = request.device;
    fence.handle = (uint64_t)(uintptr_t)&counter;
    fence.value = 2;
    NxmemFencedReleaseRequest release;
    memset(&release, 0, sizeof release);
    release.struct_size = sizeof release;
    release.fence_count = 1;
    release.allocation = allocation;
    release.ticket = 4242;
    release.fences = &fence;
    release.fence_stride = sizeof fence;
    completed_count = 0;
    status = fresh_status();
    expect_ok(fenced.enqueue_fenced_release(self, &release, &status), &status,
              "enqueue_fenced_release");
    atomic_store(&counter, 1);
    if (drain(table, self) != 0 || completed_count != 0) {
        fail("a release fenced on a counter at 1 of 2 retired");
    }
    atomic_store(&counter, 2);
    if (drain(table, self) != 1 || completed_count != 1 || completed_tickets[0] != 4242) {
        fail("a release whose fence completed did not retire at the next drain (%u completions)",
             completed_count);
    }
    printf("c host (minor 4): a release fenced on a host timeline retired only once it was reached\n");
}
#endif

static void release_allocation(const NxmemAllocatorVtable *table, NxmemAllocatorVtable *self,
                               const NxmemAllocation *allocation) {
    NxmemStatus status = fresh_status();
#if NXMEM_ABI_MINOR >= 1
    if (table->release_allocation != NULL) {
        NxmemReleaseOutcome outcome;
        memset(&outcome, 0, sizeof outcome);
        outcome.struct_size = sizeof outcome;
        expect_ok(table->release_allocation(self, allocation, &outcome, &status), &status,
                  "release_allocation");
        if (outcome.state != NXMEM_RELEASE_COMPLETE) {
            fail("release_allocation reported state %u, not COMPLETE", (unsigned)outcome.state);
        }
        return;
    }
#endif
    expect_ok(table->deallocate(self, allocation, &status), &status, "deallocate");
}

static void drive_mechanism(NxmemAllocatorFactoryVtable *factory_original,
                            const NxmemAllocatorFactoryVtable *factory, uint32_t negotiated) {
    NxmemOpenRequest open;
    memset(&open, 0, sizeof open);
    open.struct_size = sizeof open;
    open.device.struct_size = sizeof open.device;
    open.device.device_type = NXMEM_DEVICE_CPU;
    open.device.index = 0;
#if NXMEM_ABI_MINOR >= 4
    /* From minor 4 on this host offers release_completed, so queued releases can be driven. */
    static NxmemHostCallbacks callbacks;
    memset(&callbacks, 0, sizeof callbacks);
    callbacks.struct_size = sizeof callbacks;
    callbacks.abi_minor = NXMEM_ABI_MINOR;
    callbacks.type_tag = NXMEM_TYPE_TAG_HOST_CALLBACKS;
    callbacks.release_completed = on_release_completed;
    open.callbacks = &callbacks;
#endif
    NxmemAllocatorVtable *self = NULL;
    NxmemStatus status = fresh_status();
    expect_ok(factory->open_allocator(factory_original, &open, &self, &status), &status,
              "open_allocator");
    const NxmemAllocatorVtable table = read_allocator(self, negotiated);
    if (table.mechanism_id != factory->mechanism_id || table.device.device_type != NXMEM_DEVICE_CPU) {
        fail("the allocator table names another mechanism or device than was opened");
    }

    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    NxmemAllocRequest request;
    memset(&request, 0, sizeof request);
    request.struct_size = sizeof request;
    request.mechanism_id = table.mechanism_id;
    request.device = open.device;
    request.allocation_id = next_allocation_id++;
    request.size = 3 * page + 100;
    request.alignment = 64;
    NxmemAllocResult result;
    memset(&result, 0, sizeof result);
    result.struct_size = sizeof result;
    status = fresh_status();
    expect_ok(table.allocate(self, &request, &result, &status), &status, "allocate");
    if (result.address == 0 || result.address % request.alignment != 0 || result.size < request.size) {
        fail("allocate returned address 0x%llx size %llu for %llu bytes aligned to %llu",
             (unsigned long long)result.address, (unsigned long long)result.size,
             (unsigned long long)request.size, (unsigned long long)request.alignment);
    }
    const NxmemAllocation allocation = describe(&table, &request, &result);
#if NXMEM_ABI_MINOR >= 2
    if (table.query_usage != NULL) { /* read at minor 2 with NXMEM_CAP_USAGE_QUERY */
        NxmemAllocatorUsage usage;
        memset(&usage, 0, sizeof usage);
        usage.struct_size = sizeof usage;
        status = fresh_status();
        expect_ok(table.query_usage(self, &usage, &status), &status, "query_usage");
        if (usage.live_allocations != 1 || usage.reserved_bytes < request.size) {
            fail("query_usage reports %llu live allocations of %llu bytes; one of %llu is live",
                 (unsigned long long)usage.live_allocations,
                 (unsigned long long)usage.reserved_bytes, (unsigned long long)request.size);
        }
    }
#endif
    if (table.capabilities & NXMEM_CAP_VIRTUAL_BACKING) {
        exercise_virtual_backing(&table, self, negotiated, &allocation);
    } else {
        memset((void *)(uintptr_t)allocation.address, 0x5A, (size_t)allocation.size);
    }
#if NXMEM_ABI_MINOR >= 3
    if (table.ipc != NULL) {
        exercise_ipc(&table, self, negotiated);
    }
#endif
#if NXMEM_ABI_MINOR >= 4
    if (table.copy != NULL) {
        exercise_copy(&table, self, negotiated, &allocation);
    }
    if (table.fenced_release != NULL) {
        exercise_fenced_release(&table, self, negotiated, request);
    }
#endif
    release_allocation(&table, self, &allocation);
    table.release(self);
    printf("c host (minor %u): %.*s at minor %u (capabilities 0x%llx): allocate, write%s, release\n",
           (unsigned)NXMEM_ABI_MINOR, (int)NXMEM_MAX_FACTORY_NAME_BYTES, factory->name,
           (unsigned)table.abi_minor,
           (unsigned long long)table.capabilities,
           (table.capabilities & NXMEM_CAP_VIRTUAL_BACKING) ? ", commit, decommit" : "");
}

/* ---- the whole life of a plugin in this host ------------------------------------------------ */

/* Looks up `name` into the function pointer at `function` (POSIX guarantees that dlsym's object
 * pointer converts to a function pointer; memcpy says so without a cast C forbids). */
static void required_symbol(void *library, const char *name, void *function) {
    void *symbol = dlsym(library, name);
    if (symbol == NULL) {
        fail("export %s is missing", name);
    }
    memcpy(function, &symbol, sizeof symbol);
}

static uint32_t negotiate(NxmemNegotiateFn negotiate_export) {
    NxmemNegotiateRequest request;
    memset(&request, 0, sizeof request);
    request.struct_size = sizeof request;
    request.host_range = (NxmemVersionRange){sizeof(NxmemVersionRange), NXMEM_ABI_MAJOR,
                                             NXMEM_ABI_MINOR_BASELINE, NXMEM_ABI_MINOR};
    NxmemNegotiateResponse response;
    memset(&response, 0, sizeof response);
    response.struct_size = sizeof response;
    NxmemStatus status = fresh_status();
    expect_ok(negotiate_export(&request, &response, &status), &status, "NxmemNegotiate");
    const NxmemVersionRange plugin = response.plugin_range;
    if (response.major != NXMEM_ABI_MAJOR || response.minor > NXMEM_ABI_MINOR ||
        plugin.major != NXMEM_ABI_MAJOR || response.minor < plugin.min_minor ||
        response.minor > plugin.max_minor) {
        fail("NxmemNegotiate answered %u.%u (plugin range %u.%u-%u.%u) to a host of 1.0-1.%u",
             (unsigned)response.major, (unsigned)response.minor, (unsigned)plugin.major,
             (unsigned)plugin.min_minor, (unsigned)plugin.major, (unsigned)plugin.max_minor,
             (unsigned)NXMEM_ABI_MINOR);
    }
    return response.minor;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PLUGIN MECHANISM...\n", argv[0]);
        return 2;
    }
    plugin_path = argv[1];
    require_no_cxx_runtime();

    void *library = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fail("dlopen: %s", dlerror());
    }
    NxmemNegotiateFn negotiate_export;
    NxmemCreateAllocatorFactoriesFn create_factories;
    NxmemQueryUnloadReadinessFn query_unload_readiness;
    required_symbol(library, NXMEM_EXPORT_NEGOTIATE, &negotiate_export);
    required_symbol(library, NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES, &create_factories);
    required_symbol(library, NXMEM_EXPORT_QUERY_UNLOAD_READINESS, &query_unload_readiness);

    const uint32_t negotiated = negotiate(negotiate_export);
    NxmemAllocatorFactoryVtable *factories[NXMEM_MAX_FACTORIES];
    uint32_t count = 0;
    NxmemStatus status = fresh_status();
    expect_ok(create_factories(factories, NXMEM_MAX_FACTORIES, &count, &status), &status,
              "NxmemCreateAllocatorFactories");
    if (count > NXMEM_MAX_FACTORIES) {
        fail("NxmemCreateAllocatorFactories reported %u factories", (unsigned)count);
    }

    for (int wanted = 2; wanted < argc; ++wanted) {
        bool found = false;
        for (uint32_t at = 0; at < count && !found; ++at) {
            const NxmemAllocatorFactoryVtable factory = read_factory(factories[at], negotiated);
            if (strncmp(factory.name, argv[wanted], NXMEM_MAX_FACTORY_NAME_BYTES + 1) == 0) {
                drive_mechanism(factories[at], &factory, negotiated);
                found = true;
            }
        }
        if (!found) {
            fail("no factory is named %s", argv[wanted]);
        }
    }
    for (uint32_t at = 0; at < count; ++at) {
        const NxmemAllocatorFactoryVtable factory = read_factory(factories[at], negotiated);
        factory.release(factories[at]); /* exactly once */
    }

    NxmemUnloadReport report;
    memset(&report, 0, sizeof report);
    report.struct_size = sizeof report;
    status = fresh_status();
    expect_ok(query_unload_readiness(&report, &status), &status, "NxmemQueryUnloadReadiness");
#if NXMEM_ABI_MINOR >= 3
    if (report.live_imports != 0) {
        fail("after closing every import the plugin still reports %llu", (unsigned long long)report.live_imports);
    }
#endif
    if (report.live_allocators != 0 || report.live_allocations != 0 || report.live_views != 0 ||
        report.live_shared_prefixes != 0 || report.queued_releases != 0) {
        fail("after releasing everything the plugin still reports allocators %llu, allocations "
             "%llu, views %llu, shared prefixes %llu, queued releases %llu",
             (unsigned long long)report.live_allocators, (unsigned long long)report.live_allocations,
             (unsigned long long)report.live_views, (unsigned long long)report.live_shared_prefixes,
             (unsigned long long)report.queued_releases);
    }

    if (dlclose(library) != 0) {
        fail("dlclose: %s", dlerror());
    }
    void *still = dlopen(plugin_path, RTLD_NOW | RTLD_NOLOAD);
    if (still != NULL) {
        dlclose(still);
        fail("still mapped after dlclose: something in the process holds the plugin "
             "(an exported symbol bound by another library, or an STB_GNU_UNIQUE symbol)");
    }
    printf("c host (minor %u): negotiated 1.%u, %u factories released, unload report all zero, "
           "unmapped after dlclose\n",
           (unsigned)NXMEM_ABI_MINOR, (unsigned)negotiated, (unsigned)count);
    return 0;
}
