"""The model-free runner: it checks the engine's bookkeeping without a model.

Its "SSM state" is (position, rolling hash of the tokens consumed), h' = (h * 1_000_003 + token
+ 1) mod (2^31 - 1) from h = 0, and its "KV cache" holds, per paged position, the token written
there and the hash of the prefix ending there. Every row checks that the state in its slot sits at
the row's start position and hashes the same prefix as the KV its block table exposes, and that
the cached positions it skips hold its own prefix: a wrong restore, a stale slot, an overwritten
shared block or a lease missing a block fails loudly. Logits are a one-hot of the final hash mod
the vocabulary, so identical prefixes give identical logits and any other prefix does not.

The tokens of a row are hashed with NumPy in one go (`prefix_hashes`: the closed form of the
recurrence, exact in int64), so a prefill chunk costs a few array operations and a decode row a
few scalar ones. How much of the prefix below a row is checked is the one setting:

* ``check_whole_prefix=True`` (the default): every position below the row start is re-hashed from
  the tokens the KV holds there, so a shared block overwritten anywhere under the row fails; O(context)
  per row. The planner tests, `Engine.for_placeholder` and `experiments.plan_incident.study` run this.
* ``check_whole_prefix=False``: the position just below the row start (it holds the hash of the
  whole prefix written through it) and the cached positions the row skips; O(row) per row. The
  trace simulator's runner (`experiments.traces.simulate`): its 4 million decode rows over contexts
  of 10k+ tokens make the whole-prefix check quadratic. `tests/test_traces.py` runs a trace slice
  both ways and gets the same records.

Nothing here knows a token the engine should emit: a driver that fixes a request's output (the
trace simulator forcing a trace's replies) gives it to `Engine.add_request(forced_output_ids=...)`,
which works over any runner.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Sequence

import numpy as np
import torch

from model.batch import BatchOutput, SequenceChunk

_BASE = 1_000_003
_MOD = 2_147_483_647  # 2^31 - 1, prime: every product of two residues stays below 2^62, exact in int64
_BASE_INV = pow(_BASE, -1, _MOD)


def _roll(h: int, token: int) -> int:
    """One step of the rolling hash: the state after `token` from the state `h`."""
    return (h * _BASE + token + 1) % _MOD


def _powers(base: int, size: int) -> np.ndarray:
    """base**k mod _MOD for k in [0, size), by doubling (each product of two residues < 2^62)."""
    out = np.ones(size, np.int64)
    filled = 1
    while filled < size:
        k = min(filled, size - filled)
        out[filled:filled + k] = out[:k] * pow(base, filled, _MOD) % _MOD
        filled += k
    return out


class _Powers:
    """_BASE**k and _BASE**-k mod _MOD, grown on demand."""

    def __init__(self):
        self.up = self.down = np.ones(1, np.int64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n + 1:
            size = max(n + 1, 2 * len(self.up))
            self.up, self.down = _powers(_BASE, size), _powers(_BASE_INV, size)
        return self.up, self.down


_POWERS = _Powers()


def prefix_hashes(h0: int, tokens: np.ndarray) -> np.ndarray:
    """The state after each token of `tokens` from the state `h0`: `_roll` applied in turn.

    h_i = B^(i+1) * (h0 + sum_{j<=i} (t_j + 1) * B^-(j+1)) mod p, every term reduced below p first."""
    n = len(tokens)
    up, down = _POWERS.get(n)
    terms = (tokens.astype(np.int64) + 1) % _MOD * down[1:n + 1] % _MOD
    return up[1:n + 1] * ((np.cumsum(terms) + h0) % _MOD) % _MOD


@dataclasses.dataclass
class PlaceholderState:
    """The placeholder's SSM state: the position reached and the hash of the tokens consumed."""

    position: int
    hash: int
    nbytes: int  # what a real snapshot of the modelled layers would take


class PlaceholderRunner:
    """A runner whose state is a token hash: it checks restores, slots and KV without a model."""

    def __init__(self, num_slots: int, num_blocks: int, block_size: int, vocab_size: int = 64,
                 snapshot_nbytes: int = 1 << 20, check_whole_prefix: bool = True):
        """`check_whole_prefix`: re-hash the whole KV prefix under every row (module docstring)."""
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.snapshot_nbytes = snapshot_nbytes
        self.check_whole_prefix = check_whole_prefix
        self.slots = [PlaceholderState(0, 0, snapshot_nbytes) for _ in range(num_slots)]
        # the token at each position (-1: never written) and the hash of the prefix ending there, as
        # (block, offset) arrays over flat `array`s: a chunk writes the arrays, a decode row reads and
        # writes the `array`s by flat index (a Python int, ~4x cheaper than a NumPy item)
        self._kv_flat = array("q", [-1]) * (num_blocks * block_size)
        self._kv_hash_flat = array("q", [-1]) * (num_blocks * block_size)
        self.kv = np.frombuffer(self._kv_flat, np.int64).reshape(num_blocks, block_size)
        self.kv_hash = np.frombuffer(self._kv_hash_flat, np.int64).reshape(num_blocks, block_size)
        self.tokens_run = 0
        self._one_hots: dict[int, torch.Tensor] = {}

    def read_state(self, slot: int) -> PlaceholderState:
        """A copy of the slot's (position, hash): the snapshot to save."""
        s = self.slots[slot]
        return PlaceholderState(s.position, s.hash, s.nbytes)

    def write_state(self, slot: int, state: PlaceholderState) -> None:
        """Restore a snapshot into the slot."""
        self.slots[slot] = PlaceholderState(state.position, state.hash, state.nbytes)

    def copy_kv_blocks(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Copy each source block's leading `rows` positions (token and prefix hash) into the
        destination block: a prefix match that ends inside a block (copy-on-write)."""
        for src, dst, rows in copies:
            if src == dst:
                raise AssertionError(f"copy of block {src} onto itself")
            self.kv[dst, :rows] = self.kv[src, :rows]
            self.kv_hash[dst, :rows] = self.kv_hash[src, :rows]

    # The engine may hand this runner its scheduled rows as they are (`Engine._run`): anything with a
    # `SequenceChunk`'s fields whose `token_ids` is a list of ints. A tensor view per decode row and a
    # `SequenceChunk` around it were ~4 us of the ~19 us a trace simulator's row cost.
    takes_token_lists = True

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        """Check each row against its slot and KV, consume its tokens; one-hot logits of the hash.
        A row's `token_ids` is a 1-D tensor or a list of ints (`takes_token_lists`)."""
        logits, captured = [], []
        bs, kv, kv_hash, slots, vocab, nbytes = (self.block_size, self._kv_flat, self._kv_hash_flat, self.slots,
                                                 self.vocab_size, self.snapshot_nbytes)
        one_hots = self._one_hots
        decoded = 0  # decode rows run inline (added to tokens_run once)
        for row in rows:
            ids, start = row.token_ids, row.start_pos
            if type(ids) is not list or len(ids) != 1 or not start or self.check_whole_prefix:
                h, row_captured = self._run_row(row)
                logits.append(self._one_hot(h % vocab))
                captured.append(row_captured)
                continue
            # A decode row given as a list: `_run_row`'s checks and writes in the same order, inlined
            # (~4 million rows a whole trace).
            state, table = slots[row.state_slot], row.block_table
            if state.position != start:
                raise AssertionError(f"slot {row.state_slot} holds position {state.position}, row starts at {start}")
            if len(table) * bs < start + 1:
                raise AssertionError("block table too short for the row")
            if kv_hash[table[(start - 1) // bs] * bs + (start - 1) % bs] != state.hash:
                self._check_prefix(table, start, state.hash)  # raises, naming what is wrong
            token = ids[0]
            h = (state.hash * _BASE + token + 1) % _MOD  # `_roll`
            at = table[start // bs] * bs + start % bs
            if start < row.kv_cached_len:
                if kv_hash[at] != h:
                    raise AssertionError(f"cached KV at position {start} holds another prefix")
            else:
                kv[at], kv_hash[at] = token, h
            state.position, state.hash, state.nbytes = start + 1, h, nbytes
            decoded += 1
            out = one_hots.get(h % vocab)
            logits.append(out if out is not None else self._one_hot(h % vocab))
            captured.append([])
        self.tokens_run += decoded
        return BatchOutput(logits, captured)

    def _one_hot(self, token: int) -> torch.Tensor:
        """The one-hot logits of `token`; under a 4096-token vocabulary built once per token and
        shared (a decode row's hot path): read-only."""
        out = self._one_hots.get(token)
        if out is None:
            out = torch.zeros(self.vocab_size)
            out[token] = 1.0
            if self.vocab_size <= 4096:
                self._one_hots[token] = out
        return out

    def _check_prefix(self, table: Sequence[int], start: int, h: int) -> None:
        """The KV the table exposes below `start` holds the prefix whose hash is `h`."""
        bs = self.block_size
        if self.check_whole_prefix:
            pos = np.arange(start)
            tokens = self.kv[np.asarray(table, np.int64)[pos // bs], pos % bs]
            unwritten = tokens < 0
            if unwritten.any():
                raise AssertionError(f"KV position {int(np.argmax(unwritten))} was never written")
            if int(prefix_hashes(0, tokens)[-1]) != h:
                raise AssertionError(f"KV prefix and SSM state disagree at position {start}")
            return
        b, o = table[(start - 1) // bs], (start - 1) % bs
        if int(self.kv_hash[b, o]) == h:  # a state hash is >= 0: the position was written (one read, not two)
            return
        if self.kv[b, o] < 0:
            raise AssertionError(f"KV position {start - 1} was never written")
        raise AssertionError(f"KV prefix and SSM state disagree at position {start}")

    def _run_row(self, row: SequenceChunk) -> tuple[int, list[PlaceholderState]]:
        bs, start, table, nbytes = self.block_size, row.start_pos, row.block_table, self.snapshot_nbytes
        ids = row.token_ids
        listed = type(ids) is list
        n = len(ids)
        state = PlaceholderState(0, 0, nbytes) if start == 0 else self.slots[row.state_slot]
        if state.position != start:
            raise AssertionError(f"slot {row.state_slot} holds position {state.position}, row starts at {start}")
        if len(table) * bs < start + n:
            raise AssertionError("block table too short for the row")
        if start:
            self._check_prefix(table, start, state.hash)
        if n == 1:  # a decode row: scalars only (`int` of the tensor: a quarter of `.numpy()` and an index)
            token = ids[0] if listed else int(ids)
            h = _roll(state.hash, token)
            b, o = table[start // bs], start % bs
            if start < row.kv_cached_len:
                if int(self.kv_hash[b, o]) != h:
                    raise AssertionError(f"cached KV at position {start} holds another prefix")
            else:
                self.kv[b, o], self.kv_hash[b, o] = token, h
            if start:  # the slot's own object (read_state and write_state copy): updated in place
                state.position, state.hash, state.nbytes = start + 1, h, nbytes
            else:
                self.slots[row.state_slot] = PlaceholderState(1, h, nbytes)
            self.tokens_run += 1
            return h, []
        # a view; tensor indexing costs 6 us a call, numpy's 0.1 (a list: packed once, as `to_chunks` does)
        tokens = np.frombuffer(array("q", ids), np.int64) if listed else ids.numpy()
        hashes = prefix_hashes(state.hash, tokens)
        # flat indices block * bs + offset into the arrays' 1-D views: 72 vs 89 us with (block, offset)
        # pairs for an 8192-token chunk
        pos = np.arange(start, start + n)
        at = (np.asarray(table[start // bs:(start + n - 1) // bs + 1], np.int64) * bs)[pos // bs - start // bs]
        at += pos % bs
        kv, kv_hash = self.kv.reshape(-1), self.kv_hash.reshape(-1)  # views (contiguous)
        k = min(max(row.kv_cached_len - start, 0), n)  # the first k positions hold cached KV
        if k and not np.array_equal(kv_hash[at[:k]], hashes[:k]):
            raise AssertionError(f"cached KV below {row.kv_cached_len} holds another prefix")
        kv[at[k:]] = tokens[k:]
        kv_hash[at[k:]] = hashes[k:]
        row_captured = [PlaceholderState(start + o, int(hashes[o - 1]) if o else state.hash, nbytes)
                        for o in row.capture_offsets]
        h = int(hashes[-1])
        self.slots[row.state_slot] = PlaceholderState(start + n, h, nbytes)
        self.tokens_run += n
        return h, row_captured
