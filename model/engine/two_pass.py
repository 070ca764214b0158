"""The two-pass fallback: a row's captures taken by cutting it, not inside the scan.

A row that asks for captures at in-chunk offsets o1 < o2 < ... is cut into the segments
[0, o1), [o1, o2), ..., [ok, n); segment k of every row runs in forward pass k, and the slot's
state after a non-final segment is the capture at that offset. The logits, final slot state and
captures equal those of one in-pass forward, at the cost of one extra forward per capture. It
works on any runner: the scan never sees a capture offset.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from kernels.checks import require
from model.batch import BatchOutput, SequenceChunk
from model.engine.runner import Runner


def cut_at_captures(row: SequenceChunk) -> list[SequenceChunk]:
    """`row` as consecutive segments cut at its capture offsets (none of them captures).

    Each segment keeps the row's block table, state slot, cached-KV length and `all_logits`.
    """
    n, offsets = row.num_tokens, tuple(row.capture_offsets)
    require(all(isinstance(o, int) and 0 < o < n for o in offsets)
            and all(a < b for a, b in zip(offsets, offsets[1:])), "capture_offsets",
            f"offsets must be strictly increasing ints with 0 < o < n = {n}, got {offsets}")
    cuts = (0, *offsets, n)
    return [dataclasses.replace(row, token_ids=row.token_ids[a:b], start_pos=row.start_pos + a, capture_offsets=())
            for a, b in zip(cuts, cuts[1:])]


def run_in_passes(runner: Runner, rows: Sequence[SequenceChunk]) -> tuple[BatchOutput, int]:
    """Run `rows` with their captures taken by the two-pass fallback.

    Returns what one in-pass `runner.forward(rows)` returns (logits per row: the last segment's,
    or every segment's concatenated when the row wants `all_logits`; one state per capture
    offset) and the number of forward passes it took (1 + the most captures of any row).
    """
    require(len(rows) > 0, "rows", "expected a non-empty list of SequenceChunk")
    segments = [cut_at_captures(row) for row in rows]
    logits: list[list[torch.Tensor]] = [[] for _ in rows]
    captured: list[list[Any]] = [[] for _ in rows]
    passes = max(len(s) for s in segments)
    for k in range(passes):
        active = [i for i, s in enumerate(segments) if k < len(s)]
        out = runner.forward([segments[i][k] for i in active])
        for i, row_logits in zip(active, out.logits):
            if k + 1 < len(segments[i]):
                captured[i].append(runner.read_state(rows[i].state_slot))
            if rows[i].all_logits or k + 1 == len(segments[i]):
                logits[i].append(row_logits)
    merged = [torch.cat(lg) if row.all_logits else lg[-1] for row, lg in zip(rows, logits)]
    return BatchOutput(logits=merged, captured=captured), passes
