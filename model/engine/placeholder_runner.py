"""A model-free runner that still checks the engine's bookkeeping.

Its "SSM state" is (position, rolling hash of the tokens consumed) and its "KV cache" stores
token ids in paged blocks. Every row checks that the state in its slot sits at the row's
start position and that the KV its block table exposes for [0, start_pos) hashes to the same
prefix: a wrong restore, a stale slot, an overwritten shared block or a lease missing a block
fails loudly. Logits are a one-hot of the final hash, so identical prefixes give identical
logits and any other prefix does not. The main experiment runs the real model; the planner
tests and `experiments.plan_incident` run this one, in milliseconds.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from model.batch import BatchOutput, SequenceChunk

_MOD = 2_147_483_647  # 2^31 - 1: h * 1_000_003 stays below 2^53, exact in float64


def _roll(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 1) % _MOD


@dataclasses.dataclass
class PlaceholderState:
    """The placeholder's SSM state: the position reached and the hash of the tokens consumed."""

    position: int
    hash: int
    nbytes: int  # what a real snapshot of the modelled layers would take


class PlaceholderRunner:
    """A runner whose state is a token hash: it checks restores, slots and KV without a model."""

    def __init__(self, num_slots: int, num_blocks: int, block_size: int, vocab_size: int = 64,
                 snapshot_nbytes: int = 1 << 20):
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.snapshot_nbytes = snapshot_nbytes
        self.slots = [PlaceholderState(0, 0, snapshot_nbytes) for _ in range(num_slots)]
        self.kv = torch.full((num_blocks, block_size), -1, dtype=torch.long)
        self.tokens_run = 0

    def read_state(self, slot: int) -> PlaceholderState:
        """A copy of the slot's (position, hash): the snapshot to save."""
        return dataclasses.replace(self.slots[slot])

    def write_state(self, slot: int, state: PlaceholderState) -> None:
        """Restore a snapshot into the slot."""
        self.slots[slot] = dataclasses.replace(state)

    def _kv_prefix_hash(self, block_table: Sequence[int], length: int) -> int:
        pos = torch.arange(length)
        tokens = self.kv[torch.tensor(block_table, dtype=torch.long)[pos // self.block_size], pos % self.block_size]
        if length and int(tokens.min()) < 0:
            raise AssertionError(f"KV position {int(torch.argmin(tokens))} was never written")
        h = 0
        for token in tokens.tolist():
            h = _roll(h, token)
        return h

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        """Check each row against its slot and KV, consume its tokens; one-hot logits of the hash."""
        logits, captured = [], []
        for row in rows:
            h, row_captured = self._run_row(row)
            one_hot = torch.zeros(self.vocab_size)
            one_hot[h % self.vocab_size] = 1.0
            logits.append(one_hot)
            captured.append(row_captured)
        return BatchOutput(logits, captured)

    def _run_row(self, row: SequenceChunk) -> tuple[int, list[PlaceholderState]]:
        tokens = row.token_ids.tolist()
        state = PlaceholderState(0, 0, self.snapshot_nbytes) if row.start_pos == 0 else self.slots[row.state_slot]
        if state.position != row.start_pos:
            raise AssertionError(f"slot {row.state_slot} holds position {state.position}, row starts at {row.start_pos}")
        if len(row.block_table) * self.block_size < row.start_pos + len(tokens):
            raise AssertionError("block table too short for the row")
        if self._kv_prefix_hash(row.block_table, row.start_pos) != state.hash:
            raise AssertionError(f"KV prefix and SSM state disagree at position {row.start_pos}")
        h, row_captured = state.hash, []
        for i, token in enumerate(tokens):
            if i in row.capture_offsets:
                row_captured.append(PlaceholderState(row.start_pos + i, h, self.snapshot_nbytes))
            pos = row.start_pos + i
            block, offset = row.block_table[pos // self.block_size], pos % self.block_size
            if pos >= row.kv_cached_len:
                self.kv[block, offset] = token
            elif int(self.kv[block, offset]) != token:
                raise AssertionError(f"cached KV at position {pos} holds another token")
            h = _roll(h, token)
        self.slots[row.state_slot] = PlaceholderState(row.start_pos + len(tokens), h, self.snapshot_nbytes)
        self.tokens_run += len(tokens)
        return h, row_captured
