"""Test session setup.

Triton picks the interpreter or the GPU JIT when `@triton.jit` runs, at import, so the
choice is made here before any kernel module is imported: on a machine without CUDA the
kernels run through the interpreter (TRITON_INTERPRET=1) on CPU tensors.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

# Two cores here and in CI: more threads than cores only adds contention.
torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# The launchers' device-reading checks (host syncs a model step skips, `kernels.checks`) run
# throughout the suite; tests/test_step_host_syncs.py turns them off to count the production path.
from kernels.checks import set_debug_checks  # noqa: E402  (after TRITON_INTERPRET is set)

set_debug_checks(True)
