"""Runs an unmodified PyTorch script on an nxmem plugin (docs/TORCH.md, "From the environment").

Put this directory first on PYTHONPATH and set NXMEM_TORCH_PLUGIN (the plugin);
NXMEM_TORCH_LIBRARY (the path of nxmem_torch.so; by default the one installed beside this
directory, LIBDIR/nxmem/torch/nxmem_torch.so), NXMEM_TORCH_MECHANISM, NXMEM_TORCH_OPTIONS and
NXMEM_TORCH_POOLED are optional. Python imports this file at start-up; it imports torch and loads
nxmem_torch.so, whose load reads the variables and installs the allocator before the script runs.
Without NXMEM_TORCH_PLUGIN it does nothing (torch is not even imported).
"""
import os
import sys

if os.environ.get("NXMEM_TORCH_PLUGIN"):
    import torch

    _library = os.environ.get("NXMEM_TORCH_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), os.pardir, "nxmem_torch.so")
    if os.path.isfile(_library):
        torch.ops.load_library(_library)
    else:
        # Not an exception: it would stop the interpreter before the script; say why instead.
        print(f"nxmem sitecustomize: {_library} not found (set NXMEM_TORCH_LIBRARY); "
              "PyTorch's allocator kept", file=sys.stderr)
