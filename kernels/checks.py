"""The project's one argument check: a ValueError that names the argument and what it must be.

It lives in the bottom layer (`kernels/` imports nothing of the project) so the kernels, the
model core, the planner and the experiments all raise the same way: "name: what was wrong".
"""

from __future__ import annotations

import os
import sys


def require(cond: bool, name: str, message: str) -> None:
    """Raise ValueError("name: message") unless cond holds."""
    if not cond:
        raise ValueError(f"{name}: {message}")


# ---- the debug switch: checks that read device tensors on the host ---------------------------
# A launcher given host-built step metadata (a plan) trusts it: the checks that would read its
# device tensors back (a host sync each) run only with this switch on. The test suite turns it on
# (tests/conftest.py); `KERNELS_DEBUG_CHECKS=1` turns it on anywhere else. While a CUDA graph is
# being captured the switch reads as off: PyTorch refuses a host read on a capturing stream, and a
# captured check would not run at replay anyway (model.decode_graph runs each bucket's step once
# eagerly, checks on, before it captures it; tests/test_capture_host_reads.py holds the rule).
_DEBUG = [os.environ.get("KERNELS_DEBUG_CHECKS", "0") not in ("", "0")]


def capturing() -> bool:
    """Whether the current CUDA stream is recording a graph (False without CUDA: nothing to capture)."""
    torch = sys.modules.get("torch")  # not imported, no tensor: the planner imports this file, never torch
    return torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def debug_checks() -> bool:
    """Whether launchers re-check device tensors against their host metadata (host syncs): the
    switch, off inside a CUDA-graph capture."""
    return _DEBUG[0] and not capturing()


def set_debug_checks(on: bool) -> bool:
    """Turn the device-reading checks on or off; returns the previous setting."""
    prev = _DEBUG[0]
    _DEBUG[0] = bool(on)
    return prev
