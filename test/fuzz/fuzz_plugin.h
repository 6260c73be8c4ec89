/* The test-only exports of the scripted fuzz plugin (fuzz_plugin.c), beside the three entry points
 * of the contract. The whole-host harness loads the plugin once per process, hands it each fuzzer
 * input with nxmem_fuzz_begin, draws its own operations from the same byte stream with
 * nxmem_fuzz_draw (so plugin answers and host calls interleave deterministically), and asks
 * nxmem_fuzz_audit at the end whether the host kept every obligation the contract gives it. */
#ifndef NXMEM_FUZZ_PLUGIN_H
#define NXMEM_FUZZ_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts a run: forgets every object of the previous run and reads answers from `data`. Once the
 * bytes run out every answer is the honest one (each drawn value 0 means "behave"). */
typedef void (*NxmemFuzzBeginFn)(const uint8_t *data, size_t size);
/* Takes up to `count` bytes from the same stream into `out` (zeros past the end). */
typedef void (*NxmemFuzzDrawFn)(void *out, size_t count);
/* After the host has let go of everything: 0 when the host kept its obligations, else -1 with a
 * message naming the broken one. `*outstanding` is set when the plugin legitimately still holds
 * something (a table the host could not release, a release it never drained), so the module may
 * rightly refuse to unload. */
typedef int (*NxmemFuzzAuditFn)(int *outstanding, char *message, size_t capacity);

/* How many releases the plugin holds queued, over all its allocators. */
typedef uint64_t (*NxmemFuzzQueuedFn)(void);

#define NXMEM_FUZZ_BEGIN "nxmem_fuzz_begin"
#define NXMEM_FUZZ_DRAW "nxmem_fuzz_draw"
#define NXMEM_FUZZ_AUDIT "nxmem_fuzz_audit"
#define NXMEM_FUZZ_QUEUED "nxmem_fuzz_queued"

#ifdef __cplusplus
}
#endif

#endif
