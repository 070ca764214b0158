"""The runner contract: what the engine asks of whatever executes its rows (the hybrid model,
or the model-free placeholder)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import torch


@dataclasses.dataclass
class RunRow:
    """One row of a forward pass, in the terms a runner needs."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    state_slot: int
    kv_cached_len: int
    capture_offsets: tuple[int, ...] = ()


@dataclasses.dataclass
class RunnerOutput:
    logits: list[torch.Tensor]  # per row: (vocab,) logits of its last token
    captured: list[list[Any]]  # per row: one state per capture offset


class Runner(Protocol):
    def forward(self, rows: Sequence[RunRow]) -> RunnerOutput: ...

    def read_state(self, slot: int) -> Any: ...  # a detached copy with .nbytes

    def write_state(self, slot: int, state: Any) -> None: ...
