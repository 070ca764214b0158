"""The dtypes the ops take, and the one tensor check the SSM contracts share."""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.checks import require

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(name: str, t, shape: Sequence[int | None], dtypes=FLOAT_DTYPES, device=None) -> None:
    """`t` is a tensor of `shape` (None matches any size), one of `dtypes`, on `device` (if given).

    Runs on every op call (a dozen times a layer), so the messages that cost to format (about 3 us a
    call if all were built) are built only in their failing branch.
    """
    require(isinstance(t, torch.Tensor), name, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = tuple("*" if s is None else s for s in shape)
        require(False, name, f"expected shape {want}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        require(False, name, f"dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        require(False, name, f"must be on {device}, got {t.device}")
