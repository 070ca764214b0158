"""ours-plus whose junction marks are admitted by their online payback (`ours-adaptive`, issue 32
item 4): the same rules as `ours-plus` (planner/policies/ours_plus.py), but under a snapshot budget
a junction mark is asked for only while marks pay back at least as well as the decode states they
compete with, learned from the store's own counters (`PlanContext.snapshot_stats`).

Why marks, and why against decode states: in the held-out ShareGPT windows (results/traces/heldout/)
ours-plus saves 705-748 junction marks a window (265 on its train window) and restores 6.7-16.8 K
tokens from decode states against Marconi's 336-426 K; a scratch ablation with no marks raised those
windows to 0.68-0.72 of Marconi but cut Mooncake 3,000-3,999 from 794,579 to 160,826 restored
tokens. Decode-time states and marks are the two origins that take evictions (the speculative grid
and the prompt tail go into free memory only), and the decode states are the engine's
(`decode_grid`), not a rule this class can gate: so the mark is the lever, and the decode state's
payback its yardstick.
"""

from __future__ import annotations

from planner.policies.base import PlanContext, junction_marks
from planner.policies.ours_plus import OursPlus

# Marks admitted unconditionally until this many are saved: the payback estimate needs evidence
# before it may shut an origin. While shut, one junction in ADAPTIVE_EXPLORE_EVERY (a fixed hash of
# the junction and prompt length, so a run is reproducible) is still marked: a shut origin keeps
# getting evidence, so the gate can reopen when the workload moves. Both chosen on the train windows
# only (experiments/traces/windows.py TRAIN; 4 GB, chains): ShareGPT 0-999 restored tokens for
# (warm-up, explore) (8, 8) 447,480; (8, 4) 432,432; (8, 16) 443,210; (16, 8) 438,705; (32, 8)
# 442,894; (32, 4) 436,788; (32, 16) 442,171; (128, 8) 440,320 (ours-plus 436,231). Mooncake 0-999
# and 5,000-5,999: the gate never shut, 1,149,955 and 1,176,256 with warm-up 8 / 32 (/ 128 on 0-999),
# ours-plus's figures exactly.
ADAPTIVE_WARMUP_MARKS = 8
ADAPTIVE_EXPLORE_EVERY = 8
_HASH = 2654435761  # Knuth's multiplicative hash constant (2^32 / golden ratio)


def payback(stats, origin: str) -> float:
    """Restored tokens per saved snapshot of `origin` so far (0.0 before its first save). Per saved
    snapshot is per saved byte up to one constant: every state of a model has the same size."""
    saved = stats.saved_by_origin[origin]  # a Counter: a missing origin reads 0, nothing is inserted
    return stats.restored_tokens_by_origin[origin] / saved if saved else 0.0


def marks_pay_back(stats) -> bool:
    """Whether junction marks should be asked for now: during the warm-up, then while a saved mark
    has restored at least as many tokens as a saved decode state."""
    if stats.saved_by_origin["mark"] < ADAPTIVE_WARMUP_MARKS:
        return True
    return payback(stats, "mark") >= payback(stats, "decode")


class OursAdaptive(OursPlus):
    """This project: `ours-plus` (its KV block, exact decode states, token match unit, speculative
    grid, in-launch captures and shadow-best eviction), with its junction mark gated by an online
    estimate of what marks pay back at this budget: under a snapshot budget, after
    ADAPTIVE_WARMUP_MARKS (8) saved marks, the junction is marked only while the store's restored
    tokens per saved mark are at least its restored tokens per saved decode state
    (`PlanContext.snapshot_stats`, the store's live counters), and otherwise in one junction of
    ADAPTIVE_EXPLORE_EVERY (8), chosen by a fixed hash, so a shut gate can reopen. With no budget,
    or no counters (a context built outside a scheduler), its marks are ours-plus's. Source: this
    project, issue 32 item 4."""

    name = "ours-adaptive"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        junction = junction_marks(kv_match, restore_at, total)
        stats = ctx.snapshot_stats
        if not junction or stats is None or not ctx.snapshot_memory_bounded or marks_pay_back(stats):
            return junction
        explore = (kv_match * _HASH + total) % (1 << 32) % ADAPTIVE_EXPLORE_EVERY == 0
        return junction if explore else ()
