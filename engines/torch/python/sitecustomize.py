"""Runs an unmodified PyTorch script on an nxmem plugin (docs/TORCH.md, "From the environment").

Put this directory first on PYTHONPATH and set NXMEM_TORCH_LIBRARY (the path of nxmem_torch.so)
and NXMEM_TORCH_PLUGIN (the plugin); NXMEM_TORCH_MECHANISM, NXMEM_TORCH_OPTIONS and
NXMEM_TORCH_POOLED are optional. Python imports this file at start-up; it imports torch and loads
nxmem_torch.so, whose load reads the variables and installs the allocator before the script runs.
Without NXMEM_TORCH_PLUGIN it does nothing (torch is not even imported).
"""
import os

if os.environ.get("NXMEM_TORCH_PLUGIN"):
    import torch

    torch.ops.load_library(os.environ["NXMEM_TORCH_LIBRARY"])
