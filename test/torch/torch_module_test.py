#!/usr/bin/python3
"""nxmem_torch.so from Python (issue 22): torch.ops.nxmem.install/usage/trim/owns/uninstall.

Run by meson with /usr/bin/python3 (Debian's torch). Arguments: the module, the posix plugin.
Exits 77 with the reason when torch cannot be imported. Each check that needs a fresh process
(the environment install, interpreter exit with live tensors) runs this file again with a mode.
"""
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError as missing:  # the skip says why; meson counts it as skipped, not passed
    print(f"SKIP: cannot import torch with {sys.executable}: {missing}")
    sys.exit(77)

MODULE, PLUGIN = sys.argv[1], sys.argv[2]
SITECUSTOMIZE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "engines", "torch", "python")
MODE = sys.argv[3] if len(sys.argv) > 3 else "main"
torch.set_num_threads(1)
failures = []


def check(condition, what):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def run_model(steps=3):
    """A small transformer encoder: a forward pass, then SGD steps. Returns (output, losses, weights)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    data = torch.randn(8, 2, 32)
    target = torch.randn(8, 2, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    with torch.no_grad():
        output = model(data)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(struct.pack("f", loss.item()))
    held = [output, data, target] + [p for p in model.parameters()] + \
           [p.grad for p in model.parameters()] + \
           [s["momentum_buffer"] for s in optimizer.state.values()]
    return output, losses, [p.detach().clone() for p in model.parameters()], held


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and \
        bytes(a.contiguous().numpy().tobytes()) == bytes(b.contiguous().numpy().tobytes())


def same_outcome(x, y):
    return same_bits(x[0], y[0]) and x[1] == y[1] and len(x[2]) == len(y[2]) and \
        all(same_bits(a, b) for a, b in zip(x[2], y[2]))


def main():
    reference = run_model()  # PyTorch's own allocator
    before = torch.ones(1000)
    torch.ops.load_library(MODULE)
    nxmem = torch.ops.nxmem
    check(nxmem.usage()["installed"] == 0, "nothing is installed by loading without the environment")

    # A bad install raises with the reason and PyTorch keeps working on its own allocator.
    for plugin, mechanism, reason in [("/nonexistent/plugin.so", "posix-eager", "cannot load"),
                                      (PLUGIN, "no-such-mechanism", "no mechanism called")]:
        try:
            nxmem.install(plugin, mechanism)
            check(False, f"install({plugin!r}, {mechanism!r}) raises")
        except RuntimeError as refused:
            check(reason in str(refused), f"install({plugin!r}, {mechanism!r}) raises: {reason}")
    check(nxmem.usage()["installed"] == 0, "a bad install installs nothing")
    probe = torch.ones(16)
    check(probe.sum().item() == 16 and not nxmem.owns(probe), "PyTorch works on its own allocator")

    for mechanism in ["posix-eager", "posix-lazy"]:
        for pooled in [False, True]:
            name = f"{mechanism} {'pooled' if pooled else 'direct'}"
            nxmem.install(PLUGIN, mechanism, "", pooled)
            usage = nxmem.usage()
            check(usage["installed"] == 1 and usage["pooled"] == int(pooled), f"{name}: installed")
            outcome = run_model()
            held = outcome[3]
            check(all(nxmem.owns(t) for t in held), f"{name}: every tensor of the run is the plugin's")
            check(not nxmem.owns(before), f"{name}: a tensor made before the install is not")
            import numpy
            check(not nxmem.owns(torch.from_numpy(numpy.ones(4))), f"{name}: from_numpy is not")
            # One live allocation per distinct storage the run left alive, none more, none fewer.
            storages = {t.storage().data_ptr() for t in held + outcome[2] if t.storage().nbytes() > 0}
            live = nxmem.usage()["pool_live_allocations" if pooled else "plugin_live_allocations"]
            check(live == len(storages), f"{name}: {live} live allocations for {len(storages)} live storages")
            check(same_outcome(outcome, reference), f"{name}: output, losses and weights bitwise identical")
            del outcome, held
            nxmem.trim()
            usage = nxmem.usage()
            # The pool over posix-lazy keeps one reservation (address space, nothing mapped).
            reservations = 1 if pooled and mechanism == "posix-lazy" else 0
            check(usage["plugin_live_allocations"] == reservations and usage["plugin_mapped_bytes"] == 0
                  and usage.get("pool_held_bytes", 0) == 0,
                  f"{name}: the plugin holds nothing once the tensors died and the pool was trimmed: {dict(usage)}")
            check(usage["failed_releases"] == 0, f"{name}: no release failed")
            nxmem.uninstall()
            check(nxmem.usage()["installed"] == 0, f"{name}: uninstalled")

    # A tensor outlives the uninstall and goes back to its own allocator.
    nxmem.install(PLUGIN, "posix-eager", "", False)
    survivor = torch.full((4096,), 2.0)
    nxmem.uninstall()
    check(nxmem.owns(survivor) and nxmem.usage()["plugin_live_allocations"] == 1, "a survivor is the plugin's")
    del survivor
    check(nxmem.usage()["plugin_live_allocations"] == 0, "the survivor went back to the plugin")

    # From the environment, at load time, as an unmodified script would be run.
    env = dict(os.environ, NXMEM_TORCH_PLUGIN=PLUGIN, NXMEM_TORCH_MECHANISM="posix-lazy")
    child = subprocess.run([sys.executable, __file__, MODULE, PLUGIN, "environment"], env=env,
                           capture_output=True, text=True)
    check(child.returncode == 0, f"installed from the environment: {child.stdout}{child.stderr}")
    # An unmodified script: sitecustomize.py loads the module before the script runs.
    unmodified = ("import torch; x = torch.ones(100); u = torch.ops.nxmem.usage(); "
                  "assert u['installed'] == 1 and torch.ops.nxmem.owns(x), dict(u)")
    child = subprocess.run([sys.executable, "-c", unmodified], capture_output=True, text=True,
                           env=dict(env, NXMEM_TORCH_LIBRARY=MODULE, PYTHONPATH=SITECUSTOMIZE_DIR))
    check(child.returncode == 0, f"an unmodified script runs on the plugin: {child.stdout}{child.stderr}")
    env["NXMEM_TORCH_PLUGIN"] = "/nonexistent/plugin.so"
    child = subprocess.run([sys.executable, __file__, MODULE, PLUGIN, "environment-refused"], env=env,
                           capture_output=True, text=True)
    check(child.returncode == 0 and "not installed, PyTorch's allocator kept" in child.stderr,
          f"a bad environment keeps PyTorch's allocator and says why: {child.stdout}{child.stderr}")
    # Interpreter exit with tensors alive (module globals, a reference cycle, a leaked reference).
    for pooled in ["0", "1"]:
        child = subprocess.run([sys.executable, __file__, MODULE, PLUGIN, "exit-" + pooled],
                               capture_output=True, text=True)
        check(child.returncode == 0 and child.stderr == "",
              f"exit with live tensors (pooled={pooled}): rc {child.returncode} {child.stderr}")


def environment():
    torch.ops.load_library(MODULE)
    usage = torch.ops.nxmem.usage()
    x = torch.ones(100)
    check(usage["installed"] == 1 and usage["pooled"] == 1 and torch.ops.nxmem.owns(x),
          "NXMEM_TORCH_PLUGIN installs at load_library")


def environment_refused():
    torch.ops.load_library(MODULE)
    check(torch.ops.nxmem.usage()["installed"] == 0 and torch.ones(3).sum().item() == 3,
          "nothing installed, PyTorch works")


def exit_with_live_tensors(pooled):
    torch.ops.load_library(MODULE)
    torch.ops.nxmem.install(PLUGIN, "posix-eager", "", pooled)
    global kept, cycle
    kept = [torch.randn(1 << 18) for _ in range(4)]
    cycle = {"tensor": torch.zeros(1 << 16)}
    cycle["self"] = cycle
    leaked = torch.ones(1 << 16)
    sys.modules["__leak__"] = leaked  # lives until the interpreter's last teardown
    os.sys.stdout.flush()


if MODE == "main":
    main()
elif MODE == "environment":
    environment()
elif MODE == "environment-refused":
    environment_refused()
elif MODE.startswith("exit-"):
    exit_with_live_tensors(MODE == "exit-1")
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
