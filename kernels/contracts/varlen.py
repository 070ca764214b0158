"""Packed variable-length batches, shared by the SSD scan and the causal conv1d.

Sequences are packed along tokens with `cu_seqlens` (S+1,). `capture_offsets[s]` lists token
offsets o (0 < o < len_s, strictly increasing) at which the state after tokens [0, o) of
sequence s is returned; captures are packed sequence by sequence, offsets ascending. Decode steps
update state pools in place through `slot_idx` (one distinct slot a sequence).

`build_chunk_table` splits such a batch into *logical chunks* that never span a sequence: the
Triton SSD scan cuts them at capture offsets too, the CPU chunked scan and the conv kernel's
token tiles use them without cuts.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from kernels.checks import debug_checks, require
from kernels.contracts.tensors import INDEX_DTYPES, check_tensor


def check_seqlens(cu_seqlens, total_tokens: int, device, seqlens: Sequence[int] | None = None) -> list[int]:
    """Validates `cu_seqlens` (S+1,) int32/int64, 0 .. T, non-decreasing; returns the lengths.

    Without `seqlens` it reads `cu_seqlens` on the host (one sync). With `seqlens` (the step's
    host metadata, e.g. a plan's) it checks those and the tensor's shape only, and reads the
    tensor back to compare just when the debug switch (`kernels.checks.debug_checks`) is on."""
    check_tensor("cu_seqlens", cu_seqlens, (None,), INDEX_DTYPES, device)
    require(cu_seqlens.numel() >= 2, "cu_seqlens", "needs at least 2 entries (S+1 with S >= 1)")
    if seqlens is not None:
        lens = list(seqlens)
        require(cu_seqlens.numel() == len(lens) + 1, "cu_seqlens",
                f"expected {len(lens) + 1} entries for the plan's {len(lens)} sequences, got {cu_seqlens.numel()}")
        require(min(lens) >= 0 and sum(lens) == total_tokens, "seqlens",
                f"the plan's lengths must be >= 0 and sum to T={total_tokens}, got {lens}")
        if debug_checks():
            cu = cu_seqlens.tolist()
            require([b - a for a, b in zip(cu[:-1], cu[1:])] == lens and cu[0] == 0, "cu_seqlens",
                    f"does not match the plan's lengths {lens}: got {cu}")
        return lens
    cu = cu_seqlens.tolist()  # one host sync: the chunk table is built on the host anyway
    require(cu[0] == 0 and cu[-1] == total_tokens, "cu_seqlens",
            f"must start at 0 and end at T={total_tokens}, got {cu[0]} .. {cu[-1]}")
    lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    require(min(lens) >= 0, "cu_seqlens", "must be non-decreasing")
    return lens


def check_host_seqlens(seqlens: Sequence[int]) -> list[int]:
    """Host lengths of a plan: a non-empty list of ints >= 0."""
    lens = list(seqlens)
    require(len(lens) >= 1 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lens),
            "seqlens", f"expected a non-empty list of ints >= 0, got {lens}")
    return lens


def check_capture_offsets(capture_offsets, seqlens: Sequence[int]) -> list[list[int]]:
    """Validates offsets: S lists of ints, strictly increasing, each 0 < o < len."""
    if capture_offsets is None:
        return [[] for _ in seqlens]
    require(isinstance(capture_offsets, (list, tuple)) and len(capture_offsets) == len(seqlens),
            "capture_offsets", f"expected a list of S={len(seqlens)} lists of ints")
    out = []
    for s, (offs, n) in enumerate(zip(capture_offsets, seqlens)):
        require(isinstance(offs, (list, tuple)), "capture_offsets",
                f"entry {s} must be a list of ints, got {type(offs).__name__}")
        offs = list(offs)
        for o in offs:
            require(isinstance(o, int) and not isinstance(o, bool), "capture_offsets",
                    f"sequence {s}: offsets must be ints, got {o!r}")
            require(0 < o < n, "capture_offsets", f"sequence {s}: offset {o} outside the allowed range 0 < o < len={n}")
        if any(b <= a for a, b in zip(offs[:-1], offs[1:])):
            require(False, "capture_offsets", f"sequence {s}: offsets must be strictly increasing, got {offs}")
        out.append(offs)
    return out


def check_slot_idx(slot_idx, num_slots: int, count: int, pad_slots: bool = False, name: str = "slot_idx") -> None:
    """Slots in range and distinct; with `pad_slots`, -1 (a padded row: nothing read or written)
    is allowed too, any number of times. Reads slot_idx on the host: one sync, so callers with
    host-checked slots (the model's step metadata, a CUDA graph) skip it unless the debug
    switch is on."""
    if count == 0:
        return
    lo, hi = int(slot_idx.min()), int(slot_idx.max())
    low = -1 if pad_slots else 0
    require(low <= lo and hi < num_slots, name,
            f"slots must lie in {low} .. {num_slots - 1}{' (-1 = pad)' if pad_slots else ''}, got {lo} .. {hi}")
    real = slot_idx[slot_idx >= 0] if pad_slots else slot_idx
    require(torch.unique(real).numel() == real.numel(), name,
            "slots must be distinct (two sequences cannot update one state)")


def check_state_pool(state_pool, state_slots, row_shape, dtypes, device, count: int, initial_states,
                     pad_slots: bool = False) -> None:
    """The pool mode of the varlen scans: sequence s starts from `state_pool[state_slots[s]]` and
    its final state is written back there. `state_pool` (num_slots, *row_shape), contiguous;
    `state_slots` (count,) checked on the host (`check_slot_idx`, a sync) only with the debug
    switch on: the model's slots come from its host metadata."""
    require(initial_states is None, "initial_states", "must be None when the states come from state_pool")
    require(state_slots is not None, "state_slots", "needed with state_pool")
    check_tensor("state_pool", state_pool, (None, *row_shape), dtypes, device)
    require(state_pool.is_contiguous(), "state_pool", "must be contiguous (updated in place)")
    check_tensor("state_slots", state_slots, (count,), INDEX_DTYPES, device)
    if debug_checks():
        check_slot_idx(state_slots, state_pool.shape[0], count, pad_slots, "state_slots")


class ChunkTable(NamedTuple):
    """Logical chunks: each lies inside one sequence and holds at most `chunk_size` tokens."""

    start: list[int]  # global token index of the chunk's first token
    length: list[int]  # 1 .. chunk_size
    seq: list[int]  # sequence index
    capture: list[int]  # capture slot filled with the state after this chunk, or -1
    seq_chunks: list[int]  # (S+1,) first chunk of each sequence; a sequence of length 0 has none


def build_chunk_table(seqlens: Sequence[int], offsets: Sequence[Sequence[int]], chunk_size: int) -> ChunkTable:
    """Chunk ends: every `chunk_size` tokens from each sequence's start, every capture offset,
    and the sequence end. A capture splits one chunk in two, so the chunks after it keep their
    places; K captures add at most K chunks."""
    start, length, seq, capture, seq_chunks = [], [], [], [], [0]
    tok, k = 0, 0
    for s, n in enumerate(seqlens):
        cuts = sorted(set(range(chunk_size, n, chunk_size)) | set(offsets[s]) | {n}) if n > 0 else []
        cap_at = {o: k + i for i, o in enumerate(offsets[s])}
        k += len(offsets[s])
        lo = 0
        for hi in cuts:
            start.append(tok + lo)
            length.append(hi - lo)
            seq.append(s)
            capture.append(cap_at.get(hi, -1))
            lo = hi
        tok += n
        seq_chunks.append(len(start))
    return ChunkTable(start, length, seq, capture, seq_chunks)
