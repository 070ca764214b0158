"""The simulator's runners: a vectorized placeholder, and the wrapper that forces the trace's
replies and advances the simulated clock.

`HashRunner` checks what `model.engine.placeholder_runner.PlaceholderRunner` checks (the state in
a slot sits at the row's start and hashes the same prefix as the KV its block table exposes; a
cached shared block holds the row's own tokens; captures are states at the right positions),
with NumPy instead of a Python loop per token: its KV holds, per position, the rolling hash of
the prefix ending there, so the check at a row's start is one lookup. Its state is the
placeholder's `PlaceholderState` (position, hash, nbytes); the hash is a polynomial over the
tokens modulo 2**64 (`_roll` below), so its values differ from the placeholder's, but every
decision the engine makes is the same (tests/test_traces.py runs both).

`SimulatedRunner` wraps either: it advances a `SimClock` by the cost model's time for every
forward, save (`read_state`) and restore (`write_state`), and replaces each row's logits by a
the token the trace says comes next (`next_token`, given as `BatchOutput.next_tokens`), so
replies are the trace's and later prompts that contain them share their blocks.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from experiments.traces.cost import ShapeCost
from model.batch import BatchOutput, SequenceChunk
from model.engine.placeholder_runner import PlaceholderState

_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_P_INT = int(_P)
_MASK = (1 << 64) - 1
_NO_LOGITS = torch.zeros(1)


class Powers:
    """P**k modulo 2**64 and the inverse powers, grown on demand."""

    def __init__(self):
        self.up = np.ones(1, np.uint64)
        self.down = np.ones(1, np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n + 1:
            size = max(n + 1, 2 * len(self.up))
            with np.errstate(over="ignore"):
                f = np.full(size, _P, np.uint64)
                f[0] = 1
                self.up = np.cumprod(f, dtype=np.uint64)
                g = np.full(size, np.uint64(pow(_P_INT, -1, 1 << 64)), np.uint64)
                g[0] = 1
                self.down = np.cumprod(g, dtype=np.uint64)
        return self.up, self.down


def prefix_hashes_from(h0: int, tokens: np.ndarray, powers: Powers) -> np.ndarray:
    """Rolling hashes after each token: h_{i+1} = h_i * P + token_i + 1 (mod 2**64), from h0."""
    n = len(tokens)
    up, down = powers.get(n)
    with np.errstate(over="ignore"):
        # h_i = P**(i+1) * (h0 + sum_{j<=i} (t_j + 1) * P**-(j+1))
        terms = (tokens.astype(np.uint64) + np.uint64(1)) * down[1:n + 1]
        return up[1:n + 1] * (np.uint64(h0) + np.cumsum(terms, dtype=np.uint64))


class HashRunner:
    """A model-free runner with the placeholder's checks, vectorized (module docstring)."""

    def __init__(self, num_slots: int, num_blocks: int, block_size: int, vocab_size: int = 64,
                 snapshot_nbytes: int = 1 << 20, emit_logits: bool = True):
        """`emit_logits=False`: give each row's token as `BatchOutput.next_tokens` instead of a one-hot
        (no vocab-sized tensor per row: the simulator's decode rows are its hot path)."""
        self.emit_logits = emit_logits
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.snapshot_nbytes = snapshot_nbytes
        self.slots = [PlaceholderState(0, 0, snapshot_nbytes) for _ in range(num_slots)]
        self.kv = np.zeros((num_blocks, block_size), np.uint64)
        self.written = np.zeros((num_blocks, block_size), bool)
        self.tokens_run = 0
        self.powers = Powers()

    def read_state(self, slot: int) -> PlaceholderState:
        s = self.slots[slot]
        return PlaceholderState(s.position, s.hash, s.nbytes)

    def write_state(self, slot: int, state: PlaceholderState) -> None:
        self.slots[slot] = PlaceholderState(state.position, state.hash, state.nbytes)

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        logits, captured = [], []
        for row in rows:
            h, row_captured = self._run_row(row)
            logits.append(h)
            captured.append(row_captured)
        # A vocab-sized one-hot per row costs more than the rest of a decode row: give the tokens.
        if not self.emit_logits:
            return BatchOutput([_NO_LOGITS] * len(rows), captured, [h % self.vocab_size for h in logits])
        return BatchOutput([self._one_hot(h % self.vocab_size) for h in logits], captured)

    def _one_hot(self, token: int) -> torch.Tensor:
        out = torch.zeros(self.vocab_size)
        out[token] = 1.0
        return out

    def _run_row(self, row: SequenceChunk) -> tuple[int, list[PlaceholderState]]:
        bs, start, table = self.block_size, row.start_pos, row.block_table
        tokens = row.token_ids.numpy()  # a view; tensor indexing costs 6 us a call, numpy's 0.1
        n = len(tokens)
        state = PlaceholderState(0, 0, self.snapshot_nbytes) if start == 0 else self.slots[row.state_slot]
        if state.position != start:
            raise AssertionError(f"slot {row.state_slot} holds position {state.position}, row starts at {start}")
        if len(table) * bs < start + n:
            raise AssertionError("block table too short for the row")
        if start:
            b, o = table[(start - 1) // bs], (start - 1) % bs
            if not self.written[b, o]:
                raise AssertionError(f"KV position {start - 1} was never written")
            if int(self.kv[b, o]) != state.hash:
                raise AssertionError(f"KV prefix and SSM state disagree at position {start}")
        if n == 1:  # a decode row: no arrays
            h = (state.hash * _P_INT + int(tokens[0]) + 1) & _MASK
            self._store(table[start // bs], start % bs, start, row.kv_cached_len, h)
            self.slots[row.state_slot] = PlaceholderState(start + 1, h, self.snapshot_nbytes)
            self.tokens_run += 1
            return h, []
        hashes = prefix_hashes_from(state.hash, tokens, self.powers)
        pos = np.arange(start, start + n)
        blocks = np.asarray(table[start // bs:(start + n - 1) // bs + 1], dtype=np.int64)[pos // bs - start // bs]
        offs = pos % bs
        cached = pos < row.kv_cached_len
        if cached.any():
            cb, co = blocks[cached], offs[cached]
            if not self.written[cb, co].all() or not np.array_equal(self.kv[cb, co], hashes[cached]):
                raise AssertionError(f"cached KV below {row.kv_cached_len} holds another prefix")
        fresh = ~cached
        self.kv[blocks[fresh], offs[fresh]] = hashes[fresh]
        self.written[blocks[fresh], offs[fresh]] = True
        row_captured = [PlaceholderState(start + o, int(hashes[o - 1]), self.snapshot_nbytes)
                        for o in row.capture_offsets]
        h = int(hashes[-1])
        self.slots[row.state_slot] = PlaceholderState(start + n, h, self.snapshot_nbytes)
        self.tokens_run += n
        return h, row_captured

    def _store(self, block: int, offset: int, pos: int, cached_len: int, h: int) -> None:
        if pos < cached_len:
            if not self.written[block, offset] or int(self.kv[block, offset]) != h:
                raise AssertionError(f"cached KV at position {pos} holds another prefix")
            return
        self.kv[block, offset] = h
        self.written[block, offset] = True


class SimClock:
    """Simulated seconds; the engine's `clock`."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class SimulatedRunner:
    """Wraps a runner: advances the clock by the cost model and forces the trace's next tokens."""

    def __init__(self, inner: Any, cost: ShapeCost, clock: SimClock,
                 next_tokens: Callable[[Sequence[SequenceChunk]], list[int | None]] | None = None):
        """`next_tokens(rows)`: per row, the token the trace puts right after it (None: the inner
        runner's)."""
        self.inner, self.cost, self.clock = inner, cost, clock
        self.next_tokens = next_tokens
        self.forwards = 0
        self.busy_s = 0.0

    def _spend(self, seconds: float) -> None:
        self.clock.now += seconds
        self.busy_s += seconds

    def read_state(self, slot: int) -> Any:
        self._spend(self.cost.copy_s)
        return self.inner.read_state(slot)

    def write_state(self, slot: int, state: Any) -> None:
        self._spend(self.cost.copy_s)
        self.inner.write_state(slot, state)

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        out = self.inner.forward(rows)
        captures = sum(len(r.capture_offsets) for r in rows)
        spans = [(r.start_pos, r.token_ids.numel()) for r in rows]
        self._spend(self.cost.forward_s(spans) + captures * self.cost.capture_s)
        self.forwards += 1
        if self.next_tokens is not None:
            inner = out.next_tokens or [None] * len(rows)
            out.next_tokens = [t if t is not None else i for t, i in zip(self.next_tokens(rows), inner)]
        return out
