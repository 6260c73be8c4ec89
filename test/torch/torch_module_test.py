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


def train(model, data, target, steps, lr):
    """A forward pass without gradients, then SGD steps (MSE loss), all under the profiler.
    Returns (output, losses, weights, held tensors, operator names the profiler saw)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    with torch.autograd.profiler.profile() as profile:
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
    operators = {event.key for event in profile.key_averages()}
    return output, losses, [p.detach().clone() for p in model.parameters()], held, operators


def run_model(steps=3):
    """A small transformer encoder (see train)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return train(model, torch.randn(8, 2, 32), torch.randn(8, 2, 32), steps, lr=1e-3)


def run_convolution(steps=3):
    """A small convolutional network at batch 4 (see train), with PyTorch's defaults: oneDNN
    (mkldnn) on, so its convolutions allocate through c10's raw_allocate/raw_deallocate. The last
    element of the result is whether the convolutions ran on oneDNN."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))
    outcome = train(model, torch.randn(4, 3, 16, 16), torch.randn(4, 10), steps, lr=1e-2)
    return outcome[:4] + ("aten::mkldnn_convolution" in outcome[4],)


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and \
        bytes(a.contiguous().numpy().tobytes()) == bytes(b.contiguous().numpy().tobytes())


def same_outcome(x, y):
    return same_bits(x[0], y[0]) and x[1] == y[1] and len(x[2]) == len(y[2]) and \
        all(same_bits(a, b) for a, b in zip(x[2], y[2]))


def main():
    reference = run_model()  # PyTorch's own allocator
    # PyTorch's defaults, not turned off for reproducibility: oneDNN's convolution is what direct
    # mode used to abort on (raw_allocate's context == data assertion). Compared bit for bit: one
    # PyTorch thread and one OpenBLAS thread fix every reduction's order, and the reference is run
    # twice on PyTorch's own allocator to show the comparison is reproducible here at all.
    check(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled,
          "oneDNN is available and on (PyTorch's default)")
    convolution_reference = run_convolution()
    check(convolution_reference[4], "the convolutions ran on oneDNN (aten::mkldnn_convolution)")
    check(same_outcome(run_convolution(), convolution_reference),
          "the convolutional network is bitwise reproducible on PyTorch's allocator")
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
            convolution = run_convolution()
            check(convolution[4], f"{name}: the convolutions ran on oneDNN")
            check(all(nxmem.owns(t) for t in convolution[3]), f"{name}: every tensor of the convolutions is the plugin's")
            check(same_outcome(convolution, convolution_reference),
                  f"{name}: oneDNN convolutions at batch 4: output, losses and weights bitwise identical")
            del outcome, held, convolution
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
    # NXMEM_TORCH_POOLED reads the usual spellings of false and true, in any case, and refuses
    # anything else naming the variable and the value (it used to read only "0").
    for value, pooled in [("false", 0), ("Off", 0)]:
        child = subprocess.run([sys.executable, __file__, MODULE, PLUGIN, f"environment-pooled-{pooled}"],
                               env=dict(env, NXMEM_TORCH_POOLED=value), capture_output=True, text=True)
        check(child.returncode == 0, f"NXMEM_TORCH_POOLED={value} installs pooled={pooled}: {child.stdout}{child.stderr}")
    child = subprocess.run([sys.executable, __file__, MODULE, PLUGIN, "environment-refused"],
                           env=dict(env, NXMEM_TORCH_POOLED="maybe"), capture_output=True, text=True)
    check(child.returncode == 0 and "not installed, PyTorch's allocator kept: NXMEM_TORCH_POOLED=maybe is neither"
          in child.stderr, f"NXMEM_TORCH_POOLED=maybe is refused, naming the variable and the value: "
          f"{child.stdout}{child.stderr}")
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


def environment(pooled=1):
    torch.ops.load_library(MODULE)
    usage = torch.ops.nxmem.usage()
    x = torch.ones(100)
    check(usage["installed"] == 1 and usage["pooled"] == pooled and torch.ops.nxmem.owns(x),
          f"NXMEM_TORCH_PLUGIN installs at load_library, pooled={pooled}: {dict(usage)}")
    if not pooled:
        convolution = run_convolution(steps=1)  # direct mode under oneDNN, from the environment
        check(convolution[4] and torch.ops.nxmem.owns(convolution[0]), "direct mode runs oneDNN's convolutions")


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
elif MODE.startswith("environment-pooled-"):
    environment(int(MODE[-1]))
elif MODE == "environment-refused":
    environment_refused()
elif MODE.startswith("exit-"):
    exit_with_live_tensors(MODE == "exit-1")
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
