#!/usr/bin/python3
"""Records the host allocations of one PyTorch transformer forward pass as an alloc/free trace.

The trace is what bench/mixed_trace.hpp replays (nxmem_pool_bench's `mixed_trace/...`), so the
bench needs neither torch nor this script; run it again only to refresh the committed trace:

    /usr/bin/python3 bench/traces/record_transformer_trace.py > bench/traces/transformer_forward.trace

Needs Debian's python3-torch and a C compiler. PyTorch's CPU allocator (c10::alloc_cpu) takes
every tensor's memory with posix_memalign(64) and gives it back with free, with no cache of its
own, so those two calls are the engine's allocation stream. A small interposer, compiled here
and preloaded into a child python, logs them between trace_start() and trace_stop() (called
through ctypes around one forward pass, after a warm-up pass): frees of memory allocated before
the window (the weights) are left out, allocations still live at the end stay live.

Model: nn.TransformerEncoder, 6 layers, d_model 512, 8 heads, feed-forward 2048, batch 8 x 128
tokens, float32, inference (torch.no_grad, eval), one intra-op thread so the order is fixed.

Trace format (text, one event a line, '#' starts a comment):
    a ID SIZE   allocation ID of SIZE bytes (alignment 64)
    f ID        release of allocation ID
"""
import os
import subprocess
import sys
import tempfile

INTERPOSER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { table_slots = 1 << 16, max_events = 1 << 20 };
static struct { void* address; unsigned id; } live[table_slots];
static struct { char kind; unsigned id; size_t size; } events[max_events];
static unsigned event_count, next_id;
static int tracing;

static unsigned slot_of(void* p) { return (unsigned)(((uintptr_t)p >> 6) * 2654435761u) & (table_slots - 1); }

int posix_memalign(void** out, size_t alignment, size_t size) {
    static int (*next)(void**, size_t, size_t);
    if (!next) next = (int (*)(void**, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    int rc = next(out, alignment, size);
    if (tracing && rc == 0 && event_count < max_events) {
        unsigned s = slot_of(*out);
        while (live[s].address) s = (s + 1) & (table_slots - 1);
        live[s].address = *out;
        live[s].id = next_id;
        events[event_count].kind = 'a';
        events[event_count].id = next_id++;
        events[event_count++].size = size;
    }
    return rc;
}

void free(void* p) {
    static void (*next)(void*);
    if (!next) next = (void (*)(void*))dlsym(RTLD_NEXT, "free");
    if (tracing && p && event_count < max_events) {
        unsigned s = slot_of(p);
        while (live[s].address && live[s].address != p) s = (s + 1) & (table_slots - 1);
        if (live[s].address == p) {
            events[event_count].kind = 'f';
            events[event_count++].id = live[s].id;
            /* backward-shift deletion keeps the probe chains whole */
            unsigned hole = s, j = s;
            live[hole].address = 0;
            for (;;) {
                j = (j + 1) & (table_slots - 1);
                if (!live[j].address) break;
                unsigned home = slot_of(live[j].address);
                if (((j - home) & (table_slots - 1)) >= ((j - hole) & (table_slots - 1))) {
                    live[hole] = live[j];
                    live[j].address = 0;
                    hole = j;
                }
            }
        }
    }
    next(p);
}

void trace_start(void) { tracing = 1; }
void trace_stop(const char* path) {
    tracing = 0;
    FILE* out = fopen(path, "w");
    for (unsigned i = 0; i < event_count; ++i) {
        if (events[i].kind == 'a') fprintf(out, "a %u %zu\n", events[i].id, events[i].size);
        else fprintf(out, "f %u\n", events[i].id);
    }
    fclose(out);
}
"""

CHILD = r"""
import ctypes, sys, torch
torch.set_num_threads(1)
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6).eval()
tokens = torch.randn(8, 128, 512)
tracer = ctypes.CDLL(None)
with torch.no_grad():
    model(tokens)  # warm-up: lazily made state is not part of a steady forward pass
    tracer.trace_start()
    out = model(tokens)
    tracer.trace_stop(sys.argv[1].encode())
"""


def main():
    with tempfile.TemporaryDirectory() as work:
        source = os.path.join(work, "interposer.c")
        library = os.path.join(work, "interposer.so")
        events = os.path.join(work, "events")
        with open(source, "w") as f:
            f.write(INTERPOSER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source, "-ldl"], check=True)
        env = dict(os.environ, LD_PRELOAD=library, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, "-c", CHILD, events], check=True, env=env)
        with open(events) as f:
            lines = f.read().splitlines()
    import torch  # only for the version in the header
    allocations = [int(line.split()[2]) for line in lines if line.startswith("a ")]
    print("# host allocations of one forward pass of torch.nn.TransformerEncoder (6 layers, d_model 512,")
    print("# 8 heads, feed-forward 2048), batch 8 x 128, float32, inference, 1 thread; PyTorch %s" % torch.__version__)
    print("# recorded by bench/traces/record_transformer_trace.py; %d allocations, %d bytes in all"
          % (len(allocations), sum(allocations)))
    print("# a ID SIZE: allocate (alignment 64); f ID: release")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
