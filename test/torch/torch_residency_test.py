#!/usr/bin/python3
"""Tagged CPU tensors that sleep and wake (issue 33): torch.ops.nxmem.use_tag/sleep/wake_up.

A model's weights made under the tag "weights" sleep with a file backup: the process's resident
memory drops by their bytes; they wake at the same addresses and the model's output is bitwise
what it was. A "kv" tag sleeps with "discard" and is refilled. Allocating under a sleeping tag
raises; releasing works; unknown tags and policies raise with the library's message.

Run by meson with /usr/bin/python3 (Debian's torch). Arguments: the module, the posix plugin.
Exits 77 with the reason when torch cannot be imported.
"""
import contextlib
import os
import shutil
import sys
import tempfile
import threading

try:
    import torch
except ImportError as missing:  # the skip says why; meson counts it as skipped, not passed
    print(f"SKIP: cannot import torch with {sys.executable}: {missing}")
    sys.exit(77)

MODULE, PLUGIN = sys.argv[1], sys.argv[2]
MIB = 1 << 20
torch.set_num_threads(1)
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def raises(call, text, what):
    try:
        call()
        check(False, f"{what} raises")
    except RuntimeError as refused:
        check(text in str(refused), f"{what} raises: {str(refused).splitlines()[0]}")


def resident_bytes():
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Rss in /proc/self/smaps_rollup")


torch.ops.load_library(MODULE)
nxmem = torch.ops.nxmem


# The context manager of docs/TORCH.md ("Sleep and wake"), as vLLM's use_memory_pool(tag).
@contextlib.contextmanager
def use_memory_pool(tag):
    previous = nxmem.use_tag(tag)
    try:
        yield
    finally:
        nxmem.use_tag(previous)


def main():
    # Tags need an installation that serves them: pooled, on a mechanism with virtual backing.
    raises(lambda: nxmem.use_tag("weights"), "nothing is installed", "use_tag before any install")
    nxmem.install(PLUGIN, "posix-eager")
    raises(lambda: nxmem.use_tag("weights"), "serves no tags", "use_tag on posix-eager")
    check(nxmem.use_tag("") == "", "use_tag('') always works (untagged)")
    nxmem.install(PLUGIN, "posix-lazy")
    check(nxmem.usage()["tags"] == 0 and nxmem.tags() == [], "posix-lazy pooled serves tags, none made yet")

    # Weights under "weights": 5 x Linear(2048, 2048), 80 MiB of float32.
    torch.manual_seed(0)
    with use_memory_pool("weights"):
        model = torch.nn.Sequential(*[layer for _ in range(5) for layer in
                                      (torch.nn.Linear(2048, 2048), torch.nn.ReLU())])
        spare = torch.ones(MIB // 4)  # released while asleep, below
    check(nxmem.use_tag("") == "", "the context manager put the untagged default back")
    parameters = list(model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in parameters)
    check(weight_bytes >= 64 * MIB, f"the weights are {weight_bytes} bytes (at least 64 MiB)")
    check(all(nxmem.owns(p) for p in parameters), "every weight is nxmem's")
    weights = nxmem.residency("weights")
    check(nxmem.tags() == ["weights"] and weights["pool_in_use_bytes"] >= weight_bytes + MIB,
          f"the weights are in the tag's pool: {dict(weights)}")
    addresses = [p.data_ptr() for p in parameters]

    data = torch.randn(16, 2048)  # untagged
    with torch.no_grad():
        reference = model(data)
        check(torch.equal(model(data), reference), "the forward pass is bitwise reproducible")
    untagged_live = nxmem.usage()["pool_live_allocations"]
    check(untagged_live >= 2, f"untagged tensors go to the installation's pool ({untagged_live} live)")

    # A KV cache under "kv": 16 MiB in the reservation and a 300 MiB tensor above the pool's
    # pass-through size (an upstream allocation of its own, outside the reservation).
    source = torch.randn(4 * MIB)
    with use_memory_pool("kv"):
        kv = source.clone()
        large = torch.empty(300 * MIB // 4)
    large[:: MIB].fill_(7.0)
    check(nxmem.owns(kv) and nxmem.owns(large), "the kv tensors are nxmem's")
    kv_live = nxmem.residency("kv")["pool_live_allocations"]
    check(kv_live == 2, f"two live allocations under 'kv' ({kv_live})")

    # Weights asleep, backed up to a file: resident memory drops by the weights' bytes.
    directory = tempfile.mkdtemp(prefix="nxmem-residency-")
    try:
        awake = resident_bytes()
        slept = nxmem.sleep(["weights"], f"file:{directory}")
        asleep = resident_bytes()
        dropped = awake - asleep
        print(f"     resident {awake} B awake, {asleep} B asleep: dropped {dropped} B "
              f"= {100.0 * dropped / weight_bytes:.2f}% of the weights' {weight_bytes} B")
        check(dropped * 100 >= weight_bytes * 95, "resident memory dropped by at least 95% of the weights' bytes")
        check(slept["pools"] == 1 and slept["bytes"] >= weight_bytes and slept["backed_up_bytes"] == slept["bytes"]
              and slept["still_resident_bytes"] == 0, f"sleep's figures: {dict(slept)}")
        weights = nxmem.residency("weights")
        check(weights["state"] == 2 and weights["committed_bytes"] == 0 and weights["asleep_bytes"] == slept["bytes"],
              f"'weights' is asleep, nothing committed: {dict(weights)}")
        check(os.listdir(directory) == [], "the backup file has no name in the directory")
        check(nxmem.residency("kv")["state"] == 0, "'kv' stays awake")

        # Asleep: allocating under the tag raises, releasing works, the rest of PyTorch works.
        def allocate_asleep():
            with use_memory_pool("weights"):
                torch.empty(10)
        raises(allocate_asleep, "the pool is asleep; wake it first", "allocate under a sleeping tag")
        check(nxmem.use_tag("") == "", "the context manager left the thread untagged after the refusal")
        del spare
        check(nxmem.residency("weights")["pool_live_allocations"] == len(parameters),
              "a tensor of the sleeping tag was released")
        check(torch.ones(100).sum().item() == 100, "untagged tensors work while 'weights' sleeps")
        again = nxmem.sleep(["weights"], "discard")
        check(again["pools"] == 0 and again["unchanged_pools"] == 1, "sleeping again changes nothing")

        woken = nxmem.wake_up(["weights"])
        check(woken["pools"] == 1 and woken["bytes"] == slept["bytes"], f"wake_up's figures: {dict(woken)}")
        check([p.data_ptr() for p in parameters] == addresses, "every weight woke at its address")
        with torch.no_grad():
            check(torch.equal(model(data), reference), "the forward pass after wake is bitwise the one before")
        check(os.listdir(directory) == [], "the tag directory is empty after wake")
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    # The KV cache discarded (nothing backed up), woken at its addresses and refilled.
    kv_address, large_address = kv.data_ptr(), large.data_ptr()
    awake = resident_bytes()
    slept = nxmem.sleep(["kv"], "discard")
    dropped = awake - resident_bytes()
    kv_bytes = kv.numel() * kv.element_size()
    check(slept["bytes"] >= kv_bytes + large.numel() * large.element_size() and slept["backed_up_bytes"] == 0,
          f"'kv' slept, discarded: {dict(slept)}")
    check(dropped * 100 >= kv_bytes * 95, f"resident memory dropped by {dropped} B for the {kv_bytes} B kv cache")
    nxmem.wake_up(["kv"])
    check(kv.data_ptr() == kv_address and large.data_ptr() == large_address, "the kv tensors woke at their addresses")
    kv.copy_(source)
    large.fill_(1.0)
    check(torch.equal(kv, source) and large[12345].item() == 1.0, "the kv cache refilled reads what was written")

    # Every tag at once, backed up to host memory.
    slept = nxmem.sleep([], "host")
    check(slept["pools"] == 2 and slept["backed_up_bytes"] == slept["bytes"], f"sleep([]) takes every tag: {dict(slept)}")
    check(nxmem.wake_up([])["pools"] == 2, "wake_up([]) wakes every tag")
    with torch.no_grad():
        check(torch.equal(model(data), reference) and torch.equal(kv, source),
              "weights and kv cache bitwise intact after a host backup")

    # Misuse raises with the library's message and changes nothing.
    raises(lambda: nxmem.sleep(["weights", "nope"], "discard"), "no resident pool has the tag 'nope'",
           "sleep of an unknown tag")
    raises(lambda: nxmem.wake_up(["nope"]), "no resident pool has the tag 'nope'", "wake_up of an unknown tag")
    raises(lambda: nxmem.residency("nope"), "no resident pool has the tag 'nope'", "residency of an unknown tag")
    raises(lambda: nxmem.sleep(["weights"], "sideways"), "none of discard, host, file:DIR", "an unknown policy")
    raises(lambda: nxmem.sleep(["weights"], "file:/nonexistent/nxmem"), "sleep", "a backup directory that does not exist")
    check(nxmem.residency("weights")["state"] == 0, "'weights' is still awake after the refusals")

    # The tag is the calling thread's: another thread allocates untagged meanwhile.
    with use_memory_pool("kv"):
        before = nxmem.residency("kv")["pool_live_allocations"]
        made = []
        worker = threading.Thread(target=lambda: made.append(torch.ones(1000)))
        worker.start()
        worker.join()
        check(nxmem.residency("kv")["pool_live_allocations"] == before, "another thread's tensor is not the tag's")
        del made

    # oneDNN's convolutions under a tag allocate through c10's raw_allocate/raw_deallocate, which
    # find the tag's pool from the data pointer alone.
    torch.manual_seed(0)
    convolution = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                      torch.nn.Conv2d(8, 16, 3, stride=2))
    images = torch.randn(4, 3, 16, 16)
    kv_live = nxmem.residency("kv")["pool_live_allocations"]
    with torch.autograd.profiler.profile() as profile:
        with use_memory_pool("kv"):
            convolution(images).sum().backward()
    check("aten::mkldnn_convolution" in {event.key for event in profile.key_averages()},
          "the convolutions under 'kv' ran on oneDNN")
    check(nxmem.residency("kv")["pool_live_allocations"] == kv_live + 4,
          "only the convolution's gradients stay under 'kv'")
    convolution.zero_grad(set_to_none=True)
    check(nxmem.residency("kv")["pool_live_allocations"] == kv_live, "its gradients went back to 'kv'")

    # The large tensor (outside the reservation) and the rest go back; nothing failed.
    del large, kv
    check(nxmem.residency("kv")["pool_live_allocations"] == 0, "the kv tensors went back, the large one too")
    usage = nxmem.usage()
    check(usage["failed_releases"] == 0 and usage["tag_failed_releases"] == 0 and usage["tags"] == 2,
          f"no release failed: {dict(usage)}")
    del model, parameters
    nxmem.trim()
    check(nxmem.residency("weights")["pool_held_bytes"] == 0, "trim gives an awake tag's idle memory back")


main()
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
