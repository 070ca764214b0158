"""Snapshots stored in a smaller dtype than the state's own: bf16 (a plain cast) or fp8 e4m3 with a
per-tensor scale, so a snapshot budget holds ~2x / ~4x more of them (the engine's SSM states are fp32).

The engine encodes a state when it saves it and decodes it when it restores it
(`EngineConfig.snapshot_dtype`; default "float32", under which `encode` returns the state itself:
nothing is converted, a restore writes the saved state bit for bit, as before the option existed).
Per tensor of an `SSMState` (each state layer's conv state and recurrent state: Mamba-2 SSD
(H, P, N), Gated DeltaNet (HV, K, V)):
* a tensor no wider than the snapshot dtype is kept as it is (bf16 snapshots of a bf16 model's conv
  state: unchanged; "float32" keeps everything);
* bfloat16: round to nearest even, |x - x'| <= 2^-8 |x| (8 significand bits; bf16 has fp32's
  exponent range, so nothing overflows);
* float8_e4m3fn: scale s = amax / 448 (448: the largest e4m3fn value; s = 1 for an all-zero tensor),
  stored q = e4m3(x / s) beside s (fp32, 4 bytes); restored q * s. |x - x'| <= max(2^-4 |x|, 2^-10 s):
  4 significand bits for a normal |x / s| >= 2^-6, the subnormal step 2^-9 (half of it) below.
  One scale per tensor and not per snapshot: a layer whose state is 100x smaller than another's keeps
  its own relative precision.

A stored snapshot counts its bytes as stored (`QuantizedState.nbytes`: the tensors at their stored
size plus 4 per scale), so the store's budget, its eviction and the tiers' transfers see the smaller
size. `snapshot_bytes` is the same count from element counts, for a model-free runner (the trace
simulator sizes its placeholder states with it: `experiments.traces.cost.ShapeCost.snapshot_bytes`);
the placeholder runner's states pass through `encode` unchanged (they carry the bytes they stand for).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import torch

from kernels.checks import require
from model.cache import SSMState

SNAPSHOT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}
DEFAULT_SNAPSHOT_DTYPE = "float32"  # the state's own (every state tensor is fp32 or narrower): no conversion
SCALED = ("float8_e4m3fn",)  # stored with a per-tensor scale
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_BYTES = 4  # an fp32 scale per scaled tensor


def check_snapshot_dtype(name: Any) -> str:
    require(name in SNAPSHOT_DTYPES, "snapshot_dtype", f"must be one of {tuple(SNAPSHOT_DTYPES)}, got {name!r}")
    return name


def stored_itemsize(own_itemsize: int, snapshot_dtype: str) -> int:
    """Bytes an element of a tensor of `own_itemsize` takes in a snapshot of `snapshot_dtype`."""
    return min(own_itemsize, SNAPSHOT_DTYPES[snapshot_dtype].itemsize)


def tensor_bytes(numel: int, own_itemsize: int, snapshot_dtype: str) -> int:
    """A tensor's bytes in a snapshot: its elements at the stored size, plus its scale when it is scaled."""
    narrower = SNAPSHOT_DTYPES[snapshot_dtype].itemsize < own_itemsize
    return numel * stored_itemsize(own_itemsize, snapshot_dtype) + (SCALE_BYTES if narrower and snapshot_dtype in SCALED else 0)


def snapshot_bytes(tensors: Iterable[tuple[int, int]], snapshot_dtype: str) -> int:
    """A snapshot's bytes from its tensors' (numel, own itemsize): what `encode`'s result counts."""
    check_snapshot_dtype(snapshot_dtype)
    return sum(tensor_bytes(n, size, snapshot_dtype) for n, size in tensors)


@dataclasses.dataclass
class QuantizedState:
    """An `SSMState` as stored: per state layer its conv and recurrent tensor in their stored dtype, and
    each one's fp32 scale (a 0-d tensor; None: a plain cast or kept as it was)."""

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]
    conv_scale: list[torch.Tensor | None]
    ssm_scale: list[torch.Tensor | None]

    @property
    def nbytes(self) -> int:
        tensors = sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm))
        return tensors + SCALE_BYTES * sum(s is not None for s in (*self.conv_scale, *self.ssm_scale))


def _encode_tensor(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    if dtype.itemsize >= t.element_size():
        return t, None  # no narrower: kept (a saved state is the engine's own copy)
    if dtype != torch.float8_e4m3fn:
        return t.to(dtype), None
    x = t.float()
    amax = x.abs().amax()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # on the device: no host sync
    # clamp: x / s can round a hair above 448, which older torch casts to NaN instead of saturating
    return (x / scale).clamp_(-FP8_MAX, FP8_MAX).to(dtype), scale


def _decode_tensor(t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 for a scaled tensor (the slot's `copy_` rounds it to the pool's dtype), else as stored."""
    return t if scale is None else t.float() * scale


@dataclasses.dataclass(frozen=True)
class SnapshotCodec:
    """Encode a state on save, decode it on restore, under one snapshot dtype (module docstring)."""

    snapshot_dtype: str = DEFAULT_SNAPSHOT_DTYPE

    def __post_init__(self):
        check_snapshot_dtype(self.snapshot_dtype)

    @property
    def is_identity(self) -> bool:
        return self.snapshot_dtype == DEFAULT_SNAPSHOT_DTYPE

    def encode(self, state: Any) -> Any:
        """The snapshot to store for `state`: a `QuantizedState` for a model state under a narrower
        dtype; the state itself under "float32", or when it is not a model state (the placeholder's)."""
        if self.is_identity or not isinstance(state, SSMState):
            return state
        dtype = SNAPSHOT_DTYPES[self.snapshot_dtype]
        conv = [_encode_tensor(t, dtype) for t in state.conv]
        ssm = [_encode_tensor(t, dtype) for t in state.ssm]
        return QuantizedState([t for t, _ in conv], [t for t, _ in ssm], [s for _, s in conv], [s for _, s in ssm])

    @staticmethod
    def decode(state: Any) -> Any:
        """The state to write into a slot: a `QuantizedState` dequantised (whatever dtype stored it, so a
        disk tier written under another setting still restores correctly), anything else as it is."""
        if not isinstance(state, QuantizedState):
            return state
        return SSMState([_decode_tensor(t, s) for t, s in zip(state.conv, state.conv_scale)],
                        [_decode_tensor(t, s) for t, s in zip(state.ssm, state.ssm_scale)])
