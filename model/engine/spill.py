"""Snapshots spilled to disk for real: one safetensors file per state, read back with a checksum.

`FileSpill(folder)` is a `planner.snapshot_tiers.Spill`: the snapshot store hands it a state when it
demotes the snapshot to the disk tier, and asks for it back (checked) when a request would restore
it. A state is the model's `SSMState` (per Mamba layer its conv and SSM tensors; written as
`conv.<i>` / `ssm.<i>`) or the placeholder runner's `PlaceholderState` (its three integers, as
tensors). The handle keeps the file's sha256: a missing, truncated or altered file raises
`SpillError`, the store drops the snapshot with one log line, and the request recomputes: a wrong
state is never restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from model.cache import SSMState
from model.engine.placeholder_runner import PlaceholderState
from planner.snapshot_tiers import SpillError


@dataclasses.dataclass(frozen=True)
class SpilledState:
    """Where a state was written and what its bytes hashed to."""

    path: Path
    sha256: str
    nbytes: int  # the state's, as the store counts it


def to_tensors(state: Any) -> dict[str, torch.Tensor]:
    if isinstance(state, SSMState):
        return {**{f"conv.{i}": t.contiguous().cpu() for i, t in enumerate(state.conv)},
                **{f"ssm.{i}": t.contiguous().cpu() for i, t in enumerate(state.ssm)}}
    if isinstance(state, PlaceholderState):
        return {"placeholder": torch.tensor([state.position, state.hash, state.nbytes], dtype=torch.int64)}
    raise TypeError(f"cannot spill a {type(state).__name__}")


def from_tensors(tensors: dict[str, torch.Tensor], device: torch.device | str) -> Any:
    if "placeholder" in tensors:
        position, hash_, nbytes = (int(x) for x in tensors["placeholder"])
        return PlaceholderState(position, hash_, nbytes)
    layers = len([k for k in tensors if k.startswith("conv.")])
    return SSMState([tensors[f"conv.{i}"].to(device) for i in range(layers)],
                    [tensors[f"ssm.{i}"].to(device) for i in range(layers)])


class FileSpill:
    """A folder of spilled snapshot states (`Spill`); `device`: where read-back tensors go."""

    def __init__(self, folder: Path | str, device: torch.device | str = "cpu"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.device = device
        self._ids = itertools.count()

    def put(self, state: Any) -> SpilledState:
        data = save_tensors(to_tensors(state))
        path = self.folder / f"snapshot-{os.getpid()}-{next(self._ids)}.safetensors"
        path.write_bytes(data)
        return SpilledState(path, hashlib.sha256(data).hexdigest(), int(state.nbytes))

    def get(self, handle: SpilledState) -> Any:
        try:
            data = handle.path.read_bytes()
        except OSError as e:
            raise SpillError(f"{handle.path}: {e.strerror or e}") from None
        if hashlib.sha256(data).hexdigest() != handle.sha256:
            raise SpillError(f"{handle.path}: checksum mismatch ({len(data)} bytes)")
        return from_tensors(load_tensors(data), self.device)

    def drop(self, handle: SpilledState) -> None:
        handle.path.unlink(missing_ok=True)
