/*
 * nxmem_memory_abi.h: the nxmem memory plugin contract, ABI major 1, minors 0 to 3.
 *
 * This header is the whole contract between a host (an inference engine) and a memory plugin
 * (a shared object loaded at run time). It is C11, has no dependencies beyond <stdint.h> and
 * <stddef.h>, and declares no functions: a plugin author needs nothing else. The normative
 * rules, each with the test that pins it, are in docs/ABI.md.
 *
 * Frozen layout. Every struct begins with `uint32_t struct_size` at offset 0, in every version,
 * forever. Growable tables (the four vtables and the host callback table) carry `uint32_t
 * abi_minor` at offset 4 and a `uint32_t type_tag` at offset 8. Fields and slots are only ever
 * appended; each is annotated with the minor that added it. Offsets below are for 64-bit
 * targets (LP64 and LLP64), the only ones this ABI is defined for.
 *
 * Sealed records. Records embedded by value in other structs (NxmemDeviceId, NxmemAllocation,
 * NxmemByteRange, NxmemReleaseOutcome, NxmemSharedPrefixHandle, NxmemVersionRange) never grow:
 * growing one would move the outer struct's later fields. A new field goes into the outer struct.
 *
 * Reserved fields and flags. A sender sets every `reserved` field and every `flags` field to zero.
 * A receiver ignores `reserved`; it refuses (INVALID_ARGUMENT) a request with a flag bit it does not
 * know. Major 1 defines no flags.
 *
 * Layout annotations. Each struct is preceded by `@layout NAME size=S align=A since=M` and each
 * field is followed by `@field NAME offset=O size=S since=M`. These comments are machine-read:
 * the header-contract tests check them against the compiler, against a C compiler through
 * generated _Static_asserts, and against the frozen golden layout in test/abi/golden_layout.txt.
 *
 * Ownership, in one table (details at each struct):
 *   factory table     created by NxmemCreateAllocatorFactories; released by the host, exactly
 *                     once, through its `release` slot.
 *   allocator table   created by a factory's `open_allocator`; released by the host through
 *                     `release`; `retain` adds a reference.
 *   capability tables (virtual backing, shared mapping) owned by their allocator; the host never
 *                     releases them and never uses them after releasing the allocator.
 *   allocation        released by `deallocate`, `release_allocation` or a retired deferred release.
 *   shared prefix     released by `release_shared_prefix`, once per create or retain.
 *   host callbacks    owned by the host; alive until the last allocator is released and the last
 *                     queued release has retired.
 * Every pointer passed into a call is borrowed for that call only, except
 * NxmemOpenRequest::callbacks (borrowed for the allocator's whole lifetime) and a factory's `name`
 * (owned by the plugin, alive as long as the factory).
 *
 * Errors. Every fallible entry point returns an NxmemStatusCode and receives an NxmemStatus into
 * which it may write a message. The returned code is authoritative. The message buffer is inline,
 * so neither side ever frees memory the other allocated. No exception, and nothing else that is
 * not plain C, ever crosses this boundary.
 *
 * Threads. Every slot may be called concurrently from any thread; a plugin does its own locking.
 * Neither side holds a lock of its own across a call into the other side. In particular a plugin
 * must not hold a lock across `request_reclaim`: the host may re-enter the same plugin, on the
 * same thread, to satisfy it.
 */
#ifndef NXMEM_MEMORY_ABI_H
#define NXMEM_MEMORY_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The offsets below hold for 64-bit targets only. */
#ifdef __cplusplus
static_assert(sizeof(void *) == 8, "the nxmem ABI is defined for 64-bit targets only");
#else
_Static_assert(sizeof(void *) == 8, "the nxmem ABI is defined for 64-bit targets only");
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

/* The major version is a hard gate: a host and a plugin of different majors never talk. */
#define NXMEM_ABI_MAJOR 1u
/* The minor this header describes. Minor 1 appends one slot, release_allocation. Minor 2 appends the
 * virtual-backing commit granularity, the usage query (slot query_usage, flag
 * NXMEM_CAP_USAGE_QUERY) and its output record NxmemAllocatorUsage. Minor 3 appends sharing memory
 * across processes: the ipc table (flag NXMEM_CAP_IPC) with its records NxmemIpcHandle,
 * NxmemExportRequest, NxmemImportRequest and NxmemImport, and the imports' fields of the unload
 * report and the usage query. Minor 4 appends stream-ordered release and copies: the fenced_release
 * table (flag NXMEM_CAP_FENCED_RELEASE) with its records NxmemFence and NxmemFencedReleaseRequest,
 * and the copy table (flag NXMEM_CAP_COPY) with its record NxmemCopyRequest. */
#define NXMEM_ABI_MINOR 4u
/* The oldest minor of major 1. */
#define NXMEM_ABI_MINOR_BASELINE 0u

/* Largest struct_size a receiver accepts for any table: a larger claim is a broken sender. */
#define NXMEM_MAX_STRUCT_SIZE 4096u
/* Bytes in NxmemStatus::message, the terminating NUL included. */
#define NXMEM_STATUS_MESSAGE_BYTES 256u
/* Largest number of factories one plugin may publish. */
#define NXMEM_MAX_FACTORIES 64u
/* Longest factory name, the terminating NUL excluded. */
#define NXMEM_MAX_FACTORY_NAME_BYTES 127u
/* Longest open-options text, in bytes. */
#define NXMEM_MAX_OPTIONS_BYTES 4096u
/* File descriptors one NxmemIpcHandle carries at most (minor 3). */
#define NXMEM_IPC_MAX_FDS 4u
/* Mechanism-defined bytes one NxmemIpcHandle carries at most (minor 3). */
#define NXMEM_IPC_OPAQUE_BYTES 64u
/* Fences one fenced release carries at most (minor 4). */
#define NXMEM_MAX_FENCES 16u

/* ---------------------------------------------------------------------------------------------
 * Codes
 * ------------------------------------------------------------------------------------------- */

/* Status codes. Values are stable forever; new codes are only appended. A receiver that does not
 * know a code treats it as INTERNAL_ERROR. */
typedef uint32_t NxmemStatusCode;
#define NXMEM_STATUS_OK 0u
#define NXMEM_STATUS_INVALID_ARGUMENT 1u       /* a malformed request; nothing was changed */
#define NXMEM_STATUS_OUT_OF_MEMORY 2u          /* the mechanism could not satisfy the size */
#define NXMEM_STATUS_UNSUPPORTED_CAPABILITY 3u /* the capability is absent (a NULL slot) */
#define NXMEM_STATUS_WRONG_MECHANISM 4u        /* an object of another mechanism */
#define NXMEM_STATUS_WRONG_DEVICE 5u           /* an object of another device */
#define NXMEM_STATUS_UNKNOWN_ALLOCATION 6u     /* no live allocation matches */
#define NXMEM_STATUS_VERSION_MISMATCH 7u       /* no common ABI version */
#define NXMEM_STATUS_CONTRACT_VIOLATION 8u     /* the other side broke a rule of this header */
#define NXMEM_STATUS_HOST_REFUSED 9u           /* a host callback declined the request */
#define NXMEM_STATUS_BUSY 10u                  /* live objects prevent the operation (unload) */
#define NXMEM_STATUS_INTERNAL_ERROR 11u        /* a failure inside the callee, e.g. an exception */

/* Device types. 0 is never a valid device type. */
typedef uint32_t NxmemDeviceType;
#define NXMEM_DEVICE_CPU 1u
#define NXMEM_DEVICE_CUDA 2u
#define NXMEM_DEVICE_HIP 3u
#define NXMEM_DEVICE_LEVEL_ZERO 4u

/* Capability flags of an allocator table. Each optional capability is a flag paired with the
 * slots or table that implement it: a set flag with a NULL slot, or a non-NULL slot behind a clear
 * flag, is a contract violation and the table is refused.
 *
 * Flags are versioned like slots: each belongs to the minor that added it (`since` below). A sender
 * sets only flags defined at or below the negotiated minor. A reader that gets a table declaring a
 * minor newer than the reader knows clears, in its copy, the bits it does not know (as it ignores
 * slots it does not know); in a table declaring a minor the reader knows, a bit that no minor up to
 * that one defines is a contract violation. */
typedef uint64_t NxmemCapabilities;
/* `virtual_backing` table: reserve on allocate, commit and decommit byte ranges later. since=0 */
#define NXMEM_CAP_VIRTUAL_BACKING (1ull << 0)
/* `shared_mapping` table: reference-counted shared prefixes mapped into many allocations. since=0 */
#define NXMEM_CAP_SHARED_MAPPING (1ull << 1)
/* `enqueue_release` and `drain_releases` slots: releases that retire later, in order. since=0 */
#define NXMEM_CAP_DEFERRED_RELEASE (1ull << 2)
/* `release_allocation` slot: a release that reports a structured outcome. since=1 */
#define NXMEM_CAP_STRUCTURED_RELEASE (1ull << 3)
/* No slot: the mechanism may call the host's `request_reclaim` when it runs short. since=0 */
#define NXMEM_CAP_HOST_RECLAIM (1ull << 4)
/* `query_usage` slot: the allocator reports what it holds (NxmemAllocatorUsage). since=2 */
#define NXMEM_CAP_USAGE_QUERY (1ull << 5)
/* `ipc` table: export allocations or shared prefixes to other processes, import theirs. since=3 */
#define NXMEM_CAP_IPC (1ull << 6)
/* `fenced_release` table: a queued release that retires only after device work it names (fences)
 * has completed. Requires NXMEM_CAP_DEFERRED_RELEASE. since=4 */
#define NXMEM_CAP_FENCED_RELEASE (1ull << 7)
/* `copy` table: copy bytes between an allocation or a shared prefix and host memory. since=4 */
#define NXMEM_CAP_COPY (1ull << 8)

/* The flags each minor defines, cumulatively. */
#define NXMEM_CAP_ALL_V1_0                                                                      \
    (NXMEM_CAP_VIRTUAL_BACKING | NXMEM_CAP_SHARED_MAPPING | NXMEM_CAP_DEFERRED_RELEASE |        \
     NXMEM_CAP_HOST_RECLAIM)
#define NXMEM_CAP_ALL_V1_1 (NXMEM_CAP_ALL_V1_0 | NXMEM_CAP_STRUCTURED_RELEASE)
#define NXMEM_CAP_ALL_V1_2 (NXMEM_CAP_ALL_V1_1 | NXMEM_CAP_USAGE_QUERY)
#define NXMEM_CAP_ALL_V1_3 (NXMEM_CAP_ALL_V1_2 | NXMEM_CAP_IPC)
#define NXMEM_CAP_ALL_V1_4 (NXMEM_CAP_ALL_V1_3 | NXMEM_CAP_FENCED_RELEASE | NXMEM_CAP_COPY)
/* Every flag this header defines (the newest minor's set). */
#define NXMEM_CAP_ALL_V1 NXMEM_CAP_ALL_V1_4
/* The flags defined at or below minor `minor`: what a sender may set at that negotiated minor. */
#define NXMEM_CAPS_AT_MINOR(minor)                                                              \
    ((minor) >= 4u   ? NXMEM_CAP_ALL_V1_4                                                      \
     : (minor) == 3u ? NXMEM_CAP_ALL_V1_3                                                      \
     : (minor) == 2u ? NXMEM_CAP_ALL_V1_2                                                      \
     : (minor) == 1u ? NXMEM_CAP_ALL_V1_1                                                      \
                     : NXMEM_CAP_ALL_V1_0)

/* Release states of NxmemReleaseOutcome. Any other value is read as QUARANTINED: the only reading
 * that can corrupt neither memory nor accounting. */
typedef uint32_t NxmemReleaseState;
/* Everything was returned: the host credits `unmapped_bytes`. */
#define NXMEM_RELEASE_COMPLETE 1u
/* The plugin keeps `residual_owned_bytes`: the address is never reissued, the residue never
 * refunded. The allocation is gone as far as the host is concerned. */
#define NXMEM_RELEASE_QUARANTINED 2u
/* Nothing changed: the allocation is as live as the caller left it. */
#define NXMEM_RELEASE_FAILED 3u

/* Type tags at offset 8 of every growable table, so a table of the wrong kind is caught. Each is
 * four ASCII letters read as a little-endian uint32_t. */
#define NXMEM_TYPE_TAG_ALLOCATOR_FACTORY 0x46414E58u /* "XNAF" */
#define NXMEM_TYPE_TAG_ALLOCATOR 0x4C414E58u         /* "XNAL" */
#define NXMEM_TYPE_TAG_VIRTUAL_BACKING 0x42564E58u   /* "XNVB" */
#define NXMEM_TYPE_TAG_SHARED_MAPPING 0x4D534E58u    /* "XNSM" */
#define NXMEM_TYPE_TAG_HOST_CALLBACKS 0x42434E58u    /* "XNCB" */
#define NXMEM_TYPE_TAG_IPC 0x50494E58u               /* "XNIP" (minor 3) */
#define NXMEM_TYPE_TAG_FENCED_RELEASE 0x52464E58u    /* "XNFR" (minor 4) */
#define NXMEM_TYPE_TAG_COPY 0x50434E58u              /* "XNCP" (minor 4) */

/* What an NxmemIpcHandle shares (minor 3). */
typedef uint32_t NxmemIpcKind;
#define NXMEM_IPC_ALLOCATION 1u /* a live allocation's memory */
#define NXMEM_IPC_PREFIX 2u     /* a shared prefix's memory */

/* How a process may touch shared memory (minor 3). */
typedef uint32_t NxmemIpcAccess;
#define NXMEM_IPC_READ_WRITE 0u
#define NXMEM_IPC_READ_ONLY 1u /* the descriptors themselves allow no write mapping */

/* Kinds of work a fence names (minor 4). A mechanism says which kinds it waits on (bit 1 << kind
 * of NxmemFencedReleaseVtable::fence_kinds); new kinds are only appended. */
typedef uint32_t NxmemFenceKind;
/* `handle` is the address of a naturally aligned uint64_t counter in the host's memory that the
 * host only ever increases, with atomic stores; the fence has completed once the counter reads
 * `value` or more. The host keeps the counter valid until the release carrying it retires. */
#define NXMEM_FENCE_HOST_TIMELINE 1u
/* `handle` is a CUstream of `device` (0 is the legacy default stream): the work queued on it
 * before the call that carries the fence. `value` is 0. */
#define NXMEM_FENCE_CUDA_STREAM 2u
/* `handle` is a CUevent of `device`, recorded before the call that carries the fence; the fence
 * has completed when the event has. `value` is 0. */
#define NXMEM_FENCE_CUDA_EVENT 3u

/* Which way a copy goes (minor 4). */
typedef uint32_t NxmemCopyDirection;
#define NXMEM_COPY_TO_HOST 1u   /* from the allocation or prefix into host memory */
#define NXMEM_COPY_FROM_HOST 2u /* from host memory into the allocation or prefix */

/* What a copy touches (minor 4). */
typedef uint32_t NxmemCopyTarget;
#define NXMEM_COPY_ALLOCATION 1u /* a range of a live allocation */
#define NXMEM_COPY_PREFIX 2u     /* a range of a live shared prefix */

/* ---------------------------------------------------------------------------------------------
 * Records
 * ------------------------------------------------------------------------------------------- */

/* The error channel of every fallible call. The caller owns it and sets struct_size; the callee
 * may write `code` and a NUL-terminated, truncated UTF-8 `message`. */
/* @layout NxmemStatus size=264 align=4 since=0 */
typedef struct NxmemStatus {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    NxmemStatusCode code;                       /* @field code offset=4 size=4 since=0 */
    char message[NXMEM_STATUS_MESSAGE_BYTES];   /* @field message offset=8 size=256 since=0 */
} NxmemStatus;

/* One device: its type and its index among devices of that type. */
/* @layout NxmemDeviceId size=16 align=4 since=0 */
typedef struct NxmemDeviceId {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    NxmemDeviceType device_type;                /* @field device_type offset=4 size=4 since=0 */
    int32_t index;                              /* @field index offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
} NxmemDeviceId;

/* A live allocation as the host describes it back to the plugin. `allocation_id` is assigned by
 * the host, unique in its module, never reused and never derived from an address: address reuse
 * cannot make one allocation impersonate another. The plugin compares every field with its own record before touching
 * anything, and refuses a description that does not match (WRONG_MECHANISM, WRONG_DEVICE,
 * UNKNOWN_ALLOCATION or INVALID_ARGUMENT). */
/* @layout NxmemAllocation size=64 align=8 since=0 */
typedef struct NxmemAllocation {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=0 */
    uint64_t allocation_id;                     /* @field allocation_id offset=32 size=8 since=0 */
    uint64_t address;                           /* @field address offset=40 size=8 since=0 */
    uint64_t size;                              /* @field size offset=48 size=8 since=0 */
    uint64_t alignment;                         /* @field alignment offset=56 size=8 since=0 */
} NxmemAllocation;

/* Host → plugin: allocate `size` bytes (non-zero) aligned to `alignment` (a power of two); a
 * request for 0 bytes or another alignment is refused with INVALID_ARGUMENT. A power of two the
 * mechanism cannot honour (2^40, say) is a well-formed request it cannot satisfy: OUT_OF_MEMORY.
 * A receiver that
 * gets a larger struct_size than it knows refuses the request if any byte it does not know is
 * non-zero. */
/* @layout NxmemAllocRequest size=56 align=8 since=0 */
typedef struct NxmemAllocRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t flags;                             /* @field flags offset=4 size=4 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=0 */
    uint64_t allocation_id;                     /* @field allocation_id offset=32 size=8 since=0 */
    uint64_t size;                              /* @field size offset=40 size=8 since=0 */
    uint64_t alignment;                         /* @field alignment offset=48 size=8 since=0 */
} NxmemAllocRequest;

/* Plugin → host: where the allocation lives. `size` is the usable size, at least what was asked
 * for; the host describes the allocation back (NxmemAllocation::size) with the size it asked for.
 * `mapped_bytes` is what the allocation costs now:
 * `size` for an eager mechanism, 0 for a virtual-backing one until ranges are committed. Cost is
 * the memory the allocation holds, neither the requested nor the usable size as such: an eager
 * mechanism that takes whole pages counts the whole pages, and a virtual-backing mechanism's
 * mapped_bytes slot reports the same figure right after allocate. The
 * plugin writes only within the struct_size the host set. */
/* @layout NxmemAllocResult size=32 align=8 since=0 */
typedef struct NxmemAllocResult {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t address;                           /* @field address offset=8 size=8 since=0 */
    uint64_t size;                              /* @field size offset=16 size=8 since=0 */
    uint64_t mapped_bytes;                      /* @field mapped_bytes offset=24 size=8 since=0 */
} NxmemAllocResult;

/* A byte range relative to the start of an allocation. */
/* @layout NxmemByteRange size=24 align=8 since=0 */
typedef struct NxmemByteRange {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t offset;                            /* @field offset offset=8 size=8 since=0 */
    uint64_t length;                            /* @field length offset=16 size=8 since=0 */
} NxmemByteRange;

/* Host → plugin: commit or decommit `range` of `allocation`. */
/* @layout NxmemRangeRequest size=96 align=8 since=0 */
typedef struct NxmemRangeRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    NxmemAllocation allocation;                 /* @field allocation offset=8 size=64 since=0 */
    NxmemByteRange range;                       /* @field range offset=72 size=24 since=0 */
} NxmemRangeRequest;

/* Plugin → host: how a release ended. See NXMEM_RELEASE_*. COMPLETE credits in `unmapped_bytes`
 * what the allocation cost just before the release (NxmemAllocResult::mapped_bytes, or the
 * virtual-backing mapped_bytes); QUARANTINED splits that cost between `unmapped_bytes` and
 * `residual_owned_bytes`. A shared prefix the allocation maps is not part of its cost. */
/* @layout NxmemReleaseOutcome size=24 align=8 since=0 */
typedef struct NxmemReleaseOutcome {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    NxmemReleaseState state;                    /* @field state offset=4 size=4 since=0 */
    uint64_t unmapped_bytes;                    /* @field unmapped_bytes offset=8 size=8 since=0 */
    uint64_t residual_owned_bytes;              /* @field residual_owned_bytes offset=16 size=8 since=0 */
} NxmemReleaseOutcome;

/* Plugin → host, through `release_completed`: a queued release has retired. A retired release
 * cannot fail: `outcome.state` is COMPLETE or QUARANTINED, and the host reads any other state,
 * FAILED included, as quarantine of the whole allocation. */
/* @layout NxmemReleaseCompletion size=56 align=8 since=0 */
typedef struct NxmemReleaseCompletion {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t ticket;                            /* @field ticket offset=8 size=8 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=16 size=8 since=0 */
    uint64_t allocation_id;                     /* @field allocation_id offset=24 size=8 since=0 */
    NxmemReleaseOutcome outcome;                /* @field outcome offset=32 size=24 since=0 */
} NxmemReleaseCompletion;

/* Plugin → host, through `request_reclaim`: free at least `bytes_needed` on `device` if you can. */
/* @layout NxmemReclaimRequest size=40 align=8 since=0 */
typedef struct NxmemReclaimRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=0 */
    uint64_t bytes_needed;                      /* @field bytes_needed offset=32 size=8 since=0 */
} NxmemReclaimRequest;

/* Plugin → host, from NxmemQueryUnloadReadiness: what the plugin still holds. The module may be
 * unloaded only when every count is zero. `live_views` counts shared prefixes mapped into
 * allocations (each a view of a prefix that the allocation's release will undo). A quarantined
 * allocation is no longer live and counts nowhere here: its residue is the plugin's to free, at
 * the latest when the allocator that made it goes. `live_imports` (minor 3) counts imports not yet
 * closed (NxmemImport); a plugin that writes a shorter report has none. */
/* @layout NxmemUnloadReport size=56 align=8 since=0 */
typedef struct NxmemUnloadReport {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t live_allocators;                   /* @field live_allocators offset=8 size=8 since=0 */
    uint64_t live_allocations;                  /* @field live_allocations offset=16 size=8 since=0 */
    uint64_t live_views;                        /* @field live_views offset=24 size=8 since=0 */
    uint64_t live_shared_prefixes;              /* @field live_shared_prefixes offset=32 size=8 since=0 */
    uint64_t queued_releases;                   /* @field queued_releases offset=40 size=8 since=0 */
    /* ---- minor 3 ---- */
    uint64_t live_imports;                      /* @field live_imports offset=48 size=8 since=3 */
} NxmemUnloadReport;

/* Plugin → host, from `query_usage` (minor 2): what one allocator holds now, for an engine's memory
 * governor. The plugin writes only within the struct_size the host set.
 *   live_allocations     allocations not yet released, queued releases that have not retired
 *                        included
 *   reserved_bytes       usable bytes (NxmemAllocResult::size) of those allocations: address space
 *   mapped_bytes         bytes of those allocations that cost memory now, shared prefixes excluded
 *                        (an eager allocation counts its usable size)
 *   shared_prefix_bytes  bytes of the live shared prefixes, each counted once however many
 *                        allocations map it
 *   quarantined_bytes    residual bytes the allocator keeps from quarantined releases
 *   live_imports         (minor 3) imports of this allocator not yet closed
 *   imported_bytes       (minor 3) bytes those imports map in this process: memory another
 *                        process exported, reported apart and in no other field, so nothing is
 *                        costed twice (the exporter's usage counts it until the exporter releases) */
/* @layout NxmemAllocatorUsage size=64 align=8 since=2 */
typedef struct NxmemAllocatorUsage {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=2 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=2 */
    uint64_t live_allocations;                  /* @field live_allocations offset=8 size=8 since=2 */
    uint64_t reserved_bytes;                    /* @field reserved_bytes offset=16 size=8 since=2 */
    uint64_t mapped_bytes;                      /* @field mapped_bytes offset=24 size=8 since=2 */
    uint64_t shared_prefix_bytes;               /* @field shared_prefix_bytes offset=32 size=8 since=2 */
    uint64_t quarantined_bytes;                 /* @field quarantined_bytes offset=40 size=8 since=2 */
    /* ---- minor 3 ---- */
    uint64_t live_imports;                      /* @field live_imports offset=48 size=8 since=3 */
    uint64_t imported_bytes;                    /* @field imported_bytes offset=56 size=8 since=3 */
} NxmemAllocatorUsage;

/* A shared prefix, named by the plugin. The host passes it back unchanged. */
/* @layout NxmemSharedPrefixHandle size=48 align=8 since=0 */
typedef struct NxmemSharedPrefixHandle {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=0 */
    uint64_t prefix_id;                         /* @field prefix_id offset=32 size=8 since=0 */
    uint64_t size;                              /* @field size offset=40 size=8 since=0 */
} NxmemSharedPrefixHandle;

/* Host → plugin: create a shared prefix of `size` bytes. */
/* @layout NxmemSharedPrefixRequest size=40 align=8 since=0 */
typedef struct NxmemSharedPrefixRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=0 */
    uint64_t size;                              /* @field size offset=32 size=8 since=0 */
} NxmemSharedPrefixRequest;

/* Host → plugin: map `prefix` at the start of `allocation`. */
/* @layout NxmemSharedPrefixCommitRequest size=120 align=8 since=0 */
typedef struct NxmemSharedPrefixCommitRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    NxmemAllocation allocation;                 /* @field allocation offset=8 size=64 since=0 */
    NxmemSharedPrefixHandle prefix;             /* @field prefix offset=72 size=48 since=0 */
} NxmemSharedPrefixCommitRequest;

/* Plugin → host: what committing the prefix cost. `shared_bytes` is the prefix's size (its
 * handle's `size`), the bytes it covers from the start of the allocation. `newly_mapped_bytes` is
 * non-zero only for the
 * first commit of a prefix: its bytes are costed once however many allocations share it. "First"
 * is first in the prefix's lifetime: a commit after every allocation mapping it has been released
 * is not first again. `sharers` counts the allocations mapping it now. */
/* @layout NxmemSharedPrefixCommitInfo size=32 align=8 since=0 */
typedef struct NxmemSharedPrefixCommitInfo {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    uint64_t shared_bytes;                      /* @field shared_bytes offset=8 size=8 since=0 */
    uint64_t newly_mapped_bytes;                /* @field newly_mapped_bytes offset=16 size=8 since=0 */
    uint64_t sharers;                           /* @field sharers offset=24 size=8 since=0 */
} NxmemSharedPrefixCommitInfo;

/* Memory shared across processes (minor 3), as the exporter wrote it: a record of bytes plus at
 * most NXMEM_IPC_MAX_FDS file descriptors (a memfd; a CUDA VMM shareable handle). Memory is shared
 * only by handing over a descriptor (SCM_RIGHTS over a Unix socket, or any transport of the
 * engine's), never by a name another process could guess or by reading another process's memory.
 *   abi_minor      the minor of the header the exporter wrote it with (3 or more)
 *   mechanism_id, device  the exporting allocator's; an importer of another mechanism or device
 *                  refuses it (WRONG_MECHANISM, WRONG_DEVICE)
 *   kind           NXMEM_IPC_ALLOCATION or NXMEM_IPC_PREFIX; `size` its bytes (the allocation's
 *                  size as the host describes it, the prefix's size)
 *   access         NXMEM_IPC_READ_WRITE or NXMEM_IPC_READ_ONLY (descriptors that allow no write)
 *   fds            `fd_count` descriptors, numbers of the process holding the record: a transport
 *                  carries the descriptors and rewrites the numbers; unused entries are -1
 *   opaque         `opaque_length` bytes only the mechanism reads (its own check of the memory)
 * The record is untrusted input to the importer (ABI.md IP rules). Descriptors written by export
 * belong to the caller, who closes them; descriptors passed to import are borrowed for the call.
 * A receiver of a larger record than it knows refuses it if any unknown byte is non-zero. */
/* @layout NxmemIpcHandle size=136 align=8 since=3 */
typedef struct NxmemIpcHandle {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=3 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=3 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=3 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=3 */
    NxmemIpcKind kind;                          /* @field kind offset=32 size=4 since=3 */
    NxmemIpcAccess access;                      /* @field access offset=36 size=4 since=3 */
    uint64_t size;                              /* @field size offset=40 size=8 since=3 */
    uint32_t fd_count;                          /* @field fd_count offset=48 size=4 since=3 */
    int32_t fds[NXMEM_IPC_MAX_FDS];             /* @field fds offset=52 size=16 since=3 */
    uint32_t opaque_length;                     /* @field opaque_length offset=68 size=4 since=3 */
    uint8_t opaque[NXMEM_IPC_OPAQUE_BYTES];     /* @field opaque offset=72 size=64 since=3 */
} NxmemIpcHandle;

/* Host → plugin (minor 3): export `allocation` (kind NXMEM_IPC_ALLOCATION) or `prefix` (kind
 * NXMEM_IPC_PREFIX) of this allocator with `access`; the other member is zero. */
/* @layout NxmemExportRequest size=128 align=8 since=3 */
typedef struct NxmemExportRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=3 */
    NxmemIpcKind kind;                          /* @field kind offset=4 size=4 since=3 */
    NxmemIpcAccess access;                      /* @field access offset=8 size=4 since=3 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=3 */
    NxmemAllocation allocation;                 /* @field allocation offset=16 size=64 since=3 */
    NxmemSharedPrefixHandle prefix;             /* @field prefix offset=80 size=48 since=3 */
} NxmemExportRequest;

/* Host → plugin (minor 3): import `handle` into this allocator (`mechanism_id`, `device`) with
 * `access` (READ_ONLY imports any handle; READ_WRITE only a READ_WRITE one). `import_id` is the
 * host's, unique in its module like an allocation id. `handle` and its descriptors are borrowed
 * for the call. */
/* @layout NxmemImportRequest size=48 align=8 since=3 */
typedef struct NxmemImportRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=3 */
    NxmemIpcAccess access;                      /* @field access offset=4 size=4 since=3 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=3 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=3 */
    uint64_t import_id;                         /* @field import_id offset=32 size=8 since=3 */
    const NxmemIpcHandle *handle;               /* @field handle offset=40 size=8 since=3 */
} NxmemImportRequest;

/* Plugin → host (minor 3): a live import, output of import_handle; the host passes it back
 * unchanged to close_import. An allocation import is mapped at `address`; a prefix import is the
 * local shared prefix `prefix` (usable with commit_shared_prefix like a created one, holding one
 * reference that close_import drops). `mapped_bytes` is what the import maps in this process,
 * reported apart as imported bytes (NxmemAllocatorUsage::imported_bytes). */
/* @layout NxmemImport size=120 align=8 since=3 */
typedef struct NxmemImport {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=3 */
    NxmemIpcKind kind;                          /* @field kind offset=4 size=4 since=3 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=8 size=8 since=3 */
    NxmemDeviceId device;                       /* @field device offset=16 size=16 since=3 */
    uint64_t import_id;                         /* @field import_id offset=32 size=8 since=3 */
    uint64_t address;                           /* @field address offset=40 size=8 since=3 */
    uint64_t size;                              /* @field size offset=48 size=8 since=3 */
    NxmemIpcAccess access;                      /* @field access offset=56 size=4 since=3 */
    uint32_t reserved;                          /* @field reserved offset=60 size=4 since=3 */
    NxmemSharedPrefixHandle prefix;             /* @field prefix offset=64 size=48 since=3 */
    uint64_t mapped_bytes;                      /* @field mapped_bytes offset=112 size=8 since=3 */
} NxmemImport;

/* Work a release waits for (minor 4): see NXMEM_FENCE_*. A fence is borrowed for the call that
 * carries it; the mechanism copies what it needs (a CUDA_STREAM fence is turned into an event it
 * records on the stream during the call). */
/* @layout NxmemFence size=40 align=8 since=4 */
typedef struct NxmemFence {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=4 */
    NxmemFenceKind kind;                        /* @field kind offset=4 size=4 since=4 */
    NxmemDeviceId device;                       /* @field device offset=8 size=16 since=4 */
    uint64_t handle;                            /* @field handle offset=24 size=8 since=4 */
    uint64_t value;                             /* @field value offset=32 size=8 since=4 */
} NxmemFence;

/* Host → plugin (minor 4): queue the release of `allocation` under the host's `ticket`, to retire
 * only after each of the `fence_count` fences (1 to NXMEM_MAX_FENCES) has completed. `fences`
 * points at the first; each next one starts `fence_stride` bytes further (the sender's
 * sizeof(NxmemFence), at least 40, a multiple of 8), so the array grows with the record. The
 * fences are borrowed for the call. */
/* @layout NxmemFencedReleaseRequest size=96 align=8 since=4 */
typedef struct NxmemFencedReleaseRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=4 */
    uint32_t fence_count;                       /* @field fence_count offset=4 size=4 since=4 */
    NxmemAllocation allocation;                 /* @field allocation offset=8 size=64 since=4 */
    uint64_t ticket;                            /* @field ticket offset=72 size=8 since=4 */
    const NxmemFence *fences;                   /* @field fences offset=80 size=8 since=4 */
    uint32_t fence_stride;                      /* @field fence_stride offset=88 size=4 since=4 */
    uint32_t reserved;                          /* @field reserved offset=92 size=4 since=4 */
} NxmemFencedReleaseRequest;

/* Host → plugin (minor 4): copy `length` bytes between offset `offset` of `allocation` (target
 * NXMEM_COPY_ALLOCATION) or of `prefix` (NXMEM_COPY_PREFIX; the other member is zero) and the host
 * memory at `host_buffer`, in `direction`. With `stream` NULL the copy has completed when the call
 * returns. With `stream` a fence of a kind the table accepts (NxmemCopyVtable::stream_kinds), the
 * copy is queued after the work that fence names and the call returns at once: the host waits on
 * its own stream, and keeps `host_buffer` and the memory alive and untouched until then. */
/* @layout NxmemCopyRequest size=160 align=8 since=4 */
typedef struct NxmemCopyRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=4 */
    NxmemCopyDirection direction;               /* @field direction offset=4 size=4 since=4 */
    NxmemCopyTarget target;                     /* @field target offset=8 size=4 since=4 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=4 */
    NxmemAllocation allocation;                 /* @field allocation offset=16 size=64 since=4 */
    NxmemSharedPrefixHandle prefix;             /* @field prefix offset=80 size=48 since=4 */
    uint64_t offset;                            /* @field offset offset=128 size=8 since=4 */
    uint64_t length;                            /* @field length offset=136 size=8 since=4 */
    void *host_buffer;                          /* @field host_buffer offset=144 size=8 since=4 */
    const NxmemFence *stream;                   /* @field stream offset=152 size=8 since=4 */
} NxmemCopyRequest;

/* A major and an inclusive range of minors. */
/* @layout NxmemVersionRange size=16 align=4 since=0 */
typedef struct NxmemVersionRange {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t major;                             /* @field major offset=4 size=4 since=0 */
    uint32_t min_minor;                         /* @field min_minor offset=8 size=4 since=0 */
    uint32_t max_minor;                         /* @field max_minor offset=12 size=4 since=0 */
} NxmemVersionRange;

/* Host → plugin: the versions the host speaks. */
/* @layout NxmemNegotiateRequest size=24 align=4 since=0 */
typedef struct NxmemNegotiateRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    NxmemVersionRange host_range;               /* @field host_range offset=8 size=16 since=0 */
} NxmemNegotiateRequest;

/* Plugin → host: the agreed ceiling (a major and the highest minor both speak) and the range the
 * plugin speaks. The ceiling is not an assignment: each table still declares its own abi_minor. */
/* @layout NxmemNegotiateResponse size=32 align=4 since=0 */
typedef struct NxmemNegotiateResponse {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t major;                             /* @field major offset=4 size=4 since=0 */
    uint32_t minor;                             /* @field minor offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    NxmemVersionRange plugin_range;             /* @field plugin_range offset=16 size=16 since=0 */
} NxmemNegotiateResponse;

/* ---------------------------------------------------------------------------------------------
 * Host callbacks (host → plugin table, read by the plugin like any growable table)
 * ------------------------------------------------------------------------------------------- */

/* Asks the host to free at least request->bytes_needed. Returns OK when the plugin should retry,
 * HOST_REFUSED when the host declined. May re-enter the calling plugin on the same thread: hold
 * no lock across it. Without this callback an allocation over a budget is OUT_OF_MEMORY, not
 * UNSUPPORTED_CAPABILITY (ABI.md H6). */
typedef NxmemStatusCode (*NxmemRequestReclaimFn)(void *host_context,
                                                 const NxmemReclaimRequest *request,
                                                 NxmemStatus *status);
/* Tells the host that a queued release has retired. Called once per ticket, in enqueue order,
 * with no plugin lock held: the host may re-enter the plugin from it (ABI.md T5, D11). */
typedef void (*NxmemReleaseCompletedFn)(void *host_context,
                                        const NxmemReleaseCompletion *completion);

/* Owned by the host; borrowed by the plugin for the lifetime of the allocator it was opened with
 * and until that allocator's last queued release has retired. A NULL slot means the host does not
 * offer that callback. */
/* @layout NxmemHostCallbacks size=40 align=8 since=0 */
typedef struct NxmemHostCallbacks {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=0 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    void *host_context;                         /* @field host_context offset=16 size=8 since=0 */
    NxmemRequestReclaimFn request_reclaim;      /* @field request_reclaim offset=24 size=8 since=0 */
    NxmemReleaseCompletedFn release_completed;  /* @field release_completed offset=32 size=8 since=0 */
} NxmemHostCallbacks;

/* Host → plugin: open an allocator on `device`.
 * `callbacks` is borrowed for the allocator's lifetime (and until its last queued release has
 * retired); it may be NULL when the host offers no callbacks.
 * `options` is `options_length` bytes of text, not necessarily NUL-terminated, borrowed for the
 * call: entries `key=value` separated by ';' or '\n', at most NXMEM_MAX_OPTIONS_BYTES. Entries,
 * keys and values are trimmed of spaces, tabs and CRs; empty entries are skipped; the value may be
 * empty; an entry without '=', an empty key or a key given twice is INVALID_ARGUMENT (ABI.md X9).
 * A mechanism refuses (INVALID_ARGUMENT, naming it) an option it does not know. */
/* @layout NxmemOpenRequest size=48 align=8 since=0 */
typedef struct NxmemOpenRequest {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=4 size=4 since=0 */
    NxmemDeviceId device;                       /* @field device offset=8 size=16 since=0 */
    const NxmemHostCallbacks *callbacks;        /* @field callbacks offset=24 size=8 since=0 */
    const char *options;                        /* @field options offset=32 size=8 since=0 */
    uint64_t options_length;                    /* @field options_length offset=40 size=8 since=0 */
} NxmemOpenRequest;

/* ---------------------------------------------------------------------------------------------
 * Vtables
 *
 * A plugin publishes each table by pointer. A table is usually the first member of the plugin's
 * own object, and every slot receives that same pointer back as `self`. The host reads a table
 * only through a bounded copy of its first struct_size bytes (read_prefix), so a table may live
 * in read-only memory and may be shorter or longer than this header's struct.
 * ------------------------------------------------------------------------------------------- */

typedef struct NxmemAllocatorFactoryVtable NxmemAllocatorFactoryVtable;
typedef struct NxmemAllocatorVtable NxmemAllocatorVtable;
typedef struct NxmemVirtualBackingVtable NxmemVirtualBackingVtable;
typedef struct NxmemSharedMappingVtable NxmemSharedMappingVtable;
typedef struct NxmemIpcVtable NxmemIpcVtable;
typedef struct NxmemFencedReleaseVtable NxmemFencedReleaseVtable;
typedef struct NxmemCopyVtable NxmemCopyVtable;

/* Virtual backing slots. `allocator` is the owning allocator table's original pointer. */
typedef NxmemStatusCode (*NxmemCommitFn)(NxmemAllocatorVtable *allocator,
                                         const NxmemRangeRequest *request, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemDecommitFn)(NxmemAllocatorVtable *allocator,
                                           const NxmemRangeRequest *request, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemMappedBytesFn)(NxmemAllocatorVtable *allocator,
                                              const NxmemAllocation *allocation,
                                              uint64_t *mapped_bytes, NxmemStatus *status);

/* Owned by its allocator; valid until the allocator's last reference is released.
 * commit: makes `range` of a reserved allocation usable. Committing a committed range is not an
 *         error and costs nothing more.
 * decommit: returns the memory of `range`. Decommitting an uncommitted range is not an error.
 * mapped_bytes: the bytes of `allocation` that are committed now (its cost; a shared prefix it
 *         maps is not counted).
 * commit_granularity (minor 2): the unit of commit and decommit in bytes, a power of two. A legal
 *         range starts at a multiple of it and its length is a multiple of it, except that a range
 *         ending exactly at the allocation's end may end unaligned. Before minor 2 the unit is the
 *         host's page size. The allocation's end is NxmemAllocation::size, the size the host asked
 *         for, not the usable size; a mechanism accepts every legal range within it. */
/* @layout NxmemVirtualBackingVtable size=48 align=8 since=0 */
struct NxmemVirtualBackingVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=0 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    NxmemCommitFn commit;                       /* @field commit offset=16 size=8 since=0 */
    NxmemDecommitFn decommit;                   /* @field decommit offset=24 size=8 since=0 */
    NxmemMappedBytesFn mapped_bytes;            /* @field mapped_bytes offset=32 size=8 since=0 */
    /* ---- minor 2 ---- */
    uint64_t commit_granularity;                /* @field commit_granularity offset=40 size=8 since=2 */
};

/* Shared mapping slots. */
typedef NxmemStatusCode (*NxmemCreateSharedPrefixFn)(NxmemAllocatorVtable *allocator,
                                                     const NxmemSharedPrefixRequest *request,
                                                     NxmemSharedPrefixHandle *prefix,
                                                     NxmemStatus *status);
typedef NxmemStatusCode (*NxmemRetainSharedPrefixFn)(NxmemAllocatorVtable *allocator,
                                                     const NxmemSharedPrefixHandle *prefix,
                                                     NxmemStatus *status);
typedef NxmemStatusCode (*NxmemReleaseSharedPrefixFn)(NxmemAllocatorVtable *allocator,
                                                      const NxmemSharedPrefixHandle *prefix,
                                                      NxmemStatus *status);
typedef NxmemStatusCode (*NxmemCommitSharedPrefixFn)(NxmemAllocatorVtable *allocator,
                                                     const NxmemSharedPrefixCommitRequest *request,
                                                     NxmemSharedPrefixCommitInfo *info,
                                                     NxmemStatus *status);

/* Owned by its allocator; valid until the allocator's last reference is released.
 * create_shared_prefix: a new prefix holding one reference.
 * retain_shared_prefix / release_shared_prefix: add or drop a reference; the last release frees.
 * commit_shared_prefix: maps the prefix over the first prefix->size bytes of an allocation. The
 *         mapping holds its own reference until the allocation is released. The allocation needs
 *         no virtual backing, only that size; a mechanism may refuse (INVALID_ARGUMENT) to map a
 *         second prefix into an allocation that maps one. */
/* @layout NxmemSharedMappingVtable size=48 align=8 since=0 */
struct NxmemSharedMappingVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=0 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    NxmemCreateSharedPrefixFn create_shared_prefix;   /* @field create_shared_prefix offset=16 size=8 since=0 */
    NxmemRetainSharedPrefixFn retain_shared_prefix;   /* @field retain_shared_prefix offset=24 size=8 since=0 */
    NxmemReleaseSharedPrefixFn release_shared_prefix; /* @field release_shared_prefix offset=32 size=8 since=0 */
    NxmemCommitSharedPrefixFn commit_shared_prefix;   /* @field commit_shared_prefix offset=40 size=8 since=0 */
};

/* Sharing across processes (minor 3). */
typedef NxmemStatusCode (*NxmemExportHandleFn)(NxmemAllocatorVtable *allocator,
                                               const NxmemExportRequest *request,
                                               NxmemIpcHandle *handle, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemImportHandleFn)(NxmemAllocatorVtable *allocator,
                                               const NxmemImportRequest *request,
                                               NxmemImport *imported, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemCloseImportFn)(NxmemAllocatorVtable *allocator,
                                              const NxmemImport *imported, NxmemStatus *status);

/* Owned by its allocator; valid until the allocator's last reference is released (minor 3).
 * export_handle: writes a handle for a live allocation or prefix of this allocator; its
 *         descriptors are new and belong to the caller. The exported memory stays valid for every
 *         importer until it closes, whatever the exporter releases meanwhile; the exporter's
 *         accounting drops at its own release. A kind the mechanism cannot share is
 *         UNSUPPORTED_CAPABILITY.
 * import_handle: checks the untrusted handle (its form, mechanism, device, access, each
 *         descriptor's kind and size, and that this allocator has not imported it before) and maps
 *         or wraps its memory; any failure maps nothing and keeps nothing.
 * close_import: ends an import: an allocation import is unmapped; a prefix import drops its
 *         reference (allocations mapping the prefix keep theirs). An import is a live object in
 *         the unload report until closed. */
/* @layout NxmemIpcVtable size=40 align=8 since=3 */
struct NxmemIpcVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=3 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=3 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=3 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=3 */
    NxmemExportHandleFn export_handle;          /* @field export_handle offset=16 size=8 since=3 */
    NxmemImportHandleFn import_handle;          /* @field import_handle offset=24 size=8 since=3 */
    NxmemCloseImportFn close_import;            /* @field close_import offset=32 size=8 since=3 */
};

/* Stream-ordered release (minor 4). */
typedef NxmemStatusCode (*NxmemEnqueueFencedReleaseFn)(NxmemAllocatorVtable *allocator,
                                                       const NxmemFencedReleaseRequest *request,
                                                       NxmemStatus *status);

/* Owned by its allocator; valid until the allocator's last reference is released (minor 4).
 * enqueue_fenced_release: enqueue_release with fences. The allocation is handed over under the
 *         ticket exactly as by enqueue_release (D1, D9) and retires through drain_releases and
 *         release_completed like every queued release, in enqueue order; it retires only once
 *         every fence has completed, and until then the mechanism neither reuses nor unmaps its
 *         memory. A drain never waits for a fence: it retires the queue up to the first release
 *         whose fences are pending. A fence of a kind the mechanism does not wait on (see
 *         fence_kinds), or of another device, is refused (UNSUPPORTED_CAPABILITY, WRONG_DEVICE)
 *         and nothing is queued.
 * fence_kinds: bit (1 << kind) set for each NxmemFenceKind the mechanism waits on. */
/* @layout NxmemFencedReleaseVtable size=32 align=8 since=4 */
struct NxmemFencedReleaseVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=4 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=4 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=4 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=4 */
    NxmemEnqueueFencedReleaseFn enqueue_fenced_release; /* @field enqueue_fenced_release offset=16 size=8 since=4 */
    uint64_t fence_kinds;                       /* @field fence_kinds offset=24 size=8 since=4 */
};

/* Copies between device memory and the host (minor 4). */
typedef NxmemStatusCode (*NxmemCopyFn)(NxmemAllocatorVtable *allocator,
                                       const NxmemCopyRequest *request, NxmemStatus *status);

/* Owned by its allocator; valid until the allocator's last reference is released (minor 4).
 * copy: checks the request like any other (the allocation or prefix is live and this allocator's;
 *         `offset + length` does not wrap and lies within its size, the size the host asked for;
 *         a range of a virtual-backing allocation lies in committed memory; FROM_HOST into memory
 *         this process may only read is refused) and copies; a refused copy touches nothing.
 *         A length of 0 copies nothing and succeeds.
 * stream_kinds: bit (1 << kind) for each NxmemFenceKind the copy accepts as `stream`; 0 when the
 *         mechanism copies synchronously only. */
/* @layout NxmemCopyVtable size=32 align=8 since=4 */
struct NxmemCopyVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=4 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=4 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=4 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=4 */
    NxmemCopyFn copy;                           /* @field copy offset=16 size=8 since=4 */
    uint64_t stream_kinds;                      /* @field stream_kinds offset=24 size=8 since=4 */
};

/* Allocator slots. */
typedef NxmemStatusCode (*NxmemAllocateFn)(NxmemAllocatorVtable *self,
                                           const NxmemAllocRequest *request,
                                           NxmemAllocResult *result, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemDeallocateFn)(NxmemAllocatorVtable *self,
                                             const NxmemAllocation *allocation,
                                             NxmemStatus *status);
typedef void (*NxmemRetainFn)(NxmemAllocatorVtable *self);
typedef void (*NxmemReleaseFn)(NxmemAllocatorVtable *self);
typedef NxmemStatusCode (*NxmemEnqueueReleaseFn)(NxmemAllocatorVtable *self,
                                                 const NxmemAllocation *allocation,
                                                 uint64_t ticket, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemDrainReleasesFn)(NxmemAllocatorVtable *self,
                                                uint64_t *retired, NxmemStatus *status);
typedef NxmemStatusCode (*NxmemReleaseAllocationFn)(NxmemAllocatorVtable *self,
                                                    const NxmemAllocation *allocation,
                                                    NxmemReleaseOutcome *outcome,
                                                    NxmemStatus *status);
typedef NxmemStatusCode (*NxmemQueryUsageFn)(NxmemAllocatorVtable *self, NxmemAllocatorUsage *usage,
                                             NxmemStatus *status);

/* An open allocator for one device. Created by a factory's open_allocator holding one reference;
 * the host releases it with `release` (and each `retain` with one more `release`). The plugin
 * must keep the table and the capability tables it points to valid until the last release.
 *
 * Required at every level: allocate, deallocate, retain, release.
 * Optional (NULL, with the flag clear, when absent):
 *   virtual_backing                     NXMEM_CAP_VIRTUAL_BACKING
 *   shared_mapping                      NXMEM_CAP_SHARED_MAPPING
 *   enqueue_release, drain_releases     NXMEM_CAP_DEFERRED_RELEASE
 *   release_allocation (minor 1)        NXMEM_CAP_STRUCTURED_RELEASE
 *   query_usage (minor 2)               NXMEM_CAP_USAGE_QUERY
 *   ipc (minor 3)                       NXMEM_CAP_IPC
 *   fenced_release (minor 4)            NXMEM_CAP_FENCED_RELEASE (with NXMEM_CAP_DEFERRED_RELEASE)
 *   copy (minor 4)                      NXMEM_CAP_COPY
 *
 * enqueue_release: hands the allocation over; it retires later. `ticket` is the host's. From
 *         then on deallocate and release_allocation of it are UNKNOWN_ALLOCATION (ABI.md D9).
 *         A host that offers no release_completed gets no deferred release: the flag is clear
 *         and both slots NULL (D10).
 * drain_releases: retires what can be retired, calling the host's release_completed once per
 *         ticket in enqueue order, with no plugin lock held; `*retired` receives the count. A
 *         call made while another drain of the allocator runs (another thread, or re-entered
 *         from release_completed) returns OK at once with *retired = 0 and never blocks (D11).
 * release_allocation: releases and reports an NxmemReleaseOutcome. On FAILED nothing changed.
 * query_usage: writes what the allocator holds now into `usage` (see NxmemAllocatorUsage). */
/* @layout NxmemAllocatorVtable size=152 align=8 since=0 */
struct NxmemAllocatorVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=0 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    NxmemCapabilities capabilities;             /* @field capabilities offset=16 size=8 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=24 size=8 since=0 */
    NxmemDeviceId device;                       /* @field device offset=32 size=16 since=0 */
    NxmemAllocateFn allocate;                   /* @field allocate offset=48 size=8 since=0 */
    NxmemDeallocateFn deallocate;               /* @field deallocate offset=56 size=8 since=0 */
    NxmemRetainFn retain;                       /* @field retain offset=64 size=8 since=0 */
    NxmemReleaseFn release;                     /* @field release offset=72 size=8 since=0 */
    const NxmemVirtualBackingVtable *virtual_backing; /* @field virtual_backing offset=80 size=8 since=0 */
    const NxmemSharedMappingVtable *shared_mapping;   /* @field shared_mapping offset=88 size=8 since=0 */
    NxmemEnqueueReleaseFn enqueue_release;      /* @field enqueue_release offset=96 size=8 since=0 */
    NxmemDrainReleasesFn drain_releases;        /* @field drain_releases offset=104 size=8 since=0 */
    /* ---- minor 1 ---- */
    NxmemReleaseAllocationFn release_allocation; /* @field release_allocation offset=112 size=8 since=1 */
    /* ---- minor 2 ---- */
    NxmemQueryUsageFn query_usage;              /* @field query_usage offset=120 size=8 since=2 */
    /* ---- minor 3 ---- */
    const NxmemIpcVtable *ipc;                  /* @field ipc offset=128 size=8 since=3 */
    /* ---- minor 4 ---- */
    const NxmemFencedReleaseVtable *fenced_release; /* @field fenced_release offset=136 size=8 since=4 */
    const NxmemCopyVtable *copy;                /* @field copy offset=144 size=8 since=4 */
};

/* Factory slots. */
typedef NxmemStatusCode (*NxmemOpenAllocatorFn)(NxmemAllocatorFactoryVtable *self,
                                                const NxmemOpenRequest *request,
                                                NxmemAllocatorVtable **allocator,
                                                NxmemStatus *status);
typedef void (*NxmemReleaseFactoryFn)(NxmemAllocatorFactoryVtable *self);

/* One mechanism. `name` is NUL-terminated, at most NXMEM_MAX_FACTORY_NAME_BYTES, free of control
 * bytes (below 0x20, and 0x7f; UTF-8 is fine), unique within the module, and owned by the plugin
 * for the factory's lifetime. `mechanism_id` is non-zero and
 * unique within the module. `device_types` has bit (1 << t) set for each NxmemDeviceType t the
 * mechanism can open. It names types, not indices: a mechanism refuses an index of a served type
 * that it does not serve at open_allocator, with WRONG_DEVICE. */
/* @layout NxmemAllocatorFactoryVtable size=56 align=8 since=0 */
struct NxmemAllocatorFactoryVtable {
    uint32_t struct_size;                       /* @field struct_size offset=0 size=4 since=0 */
    uint32_t abi_minor;                         /* @field abi_minor offset=4 size=4 since=0 */
    uint32_t type_tag;                          /* @field type_tag offset=8 size=4 since=0 */
    uint32_t reserved;                          /* @field reserved offset=12 size=4 since=0 */
    const char *name;                           /* @field name offset=16 size=8 since=0 */
    uint64_t mechanism_id;                      /* @field mechanism_id offset=24 size=8 since=0 */
    uint64_t device_types;                      /* @field device_types offset=32 size=8 since=0 */
    NxmemOpenAllocatorFn open_allocator;        /* @field open_allocator offset=40 size=8 since=0 */
    NxmemReleaseFactoryFn release;              /* @field release offset=48 size=8 since=0 */
};

/* ---------------------------------------------------------------------------------------------
 * Exports: every plugin defines these three symbols with C linkage; a library missing any of them
 * is refused at load and unloaded.
 * ------------------------------------------------------------------------------------------- */

/* Agrees on a version. Called first, once per load. */
typedef NxmemStatusCode (*NxmemNegotiateFn)(const NxmemNegotiateRequest *request,
                                            NxmemNegotiateResponse *response,
                                            NxmemStatus *status);
/* Writes at most `capacity` factory pointers to `factories` and their number to `*count`. Each
 * factory is then owned by the host, which releases it exactly once. A plugin with more than
 * `capacity` factories creates none, writes the number it needs and returns INVALID_ARGUMENT. */
typedef NxmemStatusCode (*NxmemCreateAllocatorFactoriesFn)(NxmemAllocatorFactoryVtable **factories,
                                                           uint32_t capacity, uint32_t *count,
                                                           NxmemStatus *status);
/* Reports what the plugin still holds; the host unloads only when every count is zero. */
typedef NxmemStatusCode (*NxmemQueryUnloadReadinessFn)(NxmemUnloadReport *report,
                                                       NxmemStatus *status);

/* Optional, for tests only: a plugin may also export NxmemTestFactoriesCreated and
 * NxmemTestFactoriesReleased, each a C function taking no argument and returning the uint64_t
 * count of factories created and released since the plugin was loaded. `nxmem conform` then
 * holds it to exact counts; without them it still sees a factory leak, by measuring memory. */

/* Marks the three exports visible in a plugin built with hidden default visibility. */
#if defined(_WIN32)
#define NXMEM_PLUGIN_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define NXMEM_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define NXMEM_PLUGIN_EXPORT
#endif

#define NXMEM_EXPORT_NEGOTIATE "NxmemNegotiate"
#define NXMEM_EXPORT_CREATE_ALLOCATOR_FACTORIES "NxmemCreateAllocatorFactories"
#define NXMEM_EXPORT_QUERY_UNLOAD_READINESS "NxmemQueryUnloadReadiness"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NXMEM_MEMORY_ABI_H */
