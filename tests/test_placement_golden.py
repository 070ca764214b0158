"""Golden tables for every placement policy: given a prompt, a block, a budget and an admission
(KV match, restore point), the chunk ends, snapshot positions, in-chunk captures, junction marks
and speculative marks, each derived by hand from the policy's stated rule (arithmetic beside
each row), never pasted from our output.

Where each rule comes from:
* `legacy`, `aligned`: the brief's pinned semantics (BRIEF section 2) and the
  `planner.policies.aligned` module docstring. L = (n-1)//bs*bs is the last boundary under n, the
  split point L-bs (none when <= 0).
* `vllm-align`, `vllm-junction`: vLLM 0.32's rules as `planner.policies.vllm` states them (its
  docstrings of `vllm_checkpoint_position`, `vllm_checkpoint_in_forward`, `vllm_chunk_len` and
  the policies' `source`): checkpoint C = floor((n-1)/unit)*unit; in-forward export when the
  chunk starts on a unit, start + unit <= C, start < C < end and ceil(end/block) - 2 >
  (start-1)//block; non-last ends floored to the block; stops at floor((n-1)/block)*block
  (unless exported in-forward), at the next block boundary for a chunk starting mid-block, and
  (junction) at C.
* `sglang`: BRIEF sections 4 and 6: states only on the grid max(kernel chunk, page), at the last
  grid point under n (captured, no stop) and at grid-aligned chunk ends.
* `trtllm`: BRIEF sections 4 and 6: `periodic_snapshot_interval` (4096 tokens, our choice), an
  offset from the end at the last block boundary under n, branch snapshot at the junction; each
  one a chunk stop.
* `marconi`: the Marconi paper (arXiv 2411.19379) as the policy's `source` reads it: a state at
  the branch point (the KV match) only, a chunk stop.
* `ours-plus`, `optimum`: `aligned`, plus the junction captured in-launch; ours-plus also
  captures speculatively every ceil(2048/bs)*bs tokens and at n-1 where a match can end there
  ((n-1) % unit == 0; unit the block unless a token unit is given) (`planner.policies.ours_plus`
  and its `source`).

The junction (vllm-junction, trtllm, marconi, ours-plus, optimum) is the KV match exactly when
restore_at < kv_match < n. At admission the scheduler keeps the marks and speculative marks in
(restore_at, n) and drops from the speculative ones any position that is also a mark; the tables
plan with that rule (`_admission`), and the last test checks it through the engine.
"""

from __future__ import annotations

import pytest

from model.engine import Engine
from planner.policies.base import PlanContext
from planner.policies.ours_plus import OURS_PLUS_GRID_TOKENS, OURS_PLUS_UNBOUNDED_GRID_TOKENS
from planner.policies.registry import get_policy
from planner.policies.trtllm import TRTLLM_PERIOD_TOKENS
from planner.policies.vllm import vllm_checkpoint_in_forward, vllm_checkpoint_position
from planner.prefill_plan import plan_prompt


def row(rid, total, block, budget, *, ends, snaps, captures=None, kv=0, restore=0, interval=0,
        state_block=0, kernel_chunk=256, marks=(), spec=(), match_unit=0):
    """One golden case: inputs, then the chunk ends, the snapshot positions (every chunk's, in
    order), each chunk's capture offsets, the policy's marks and its speculative marks kept in
    (restore, total). `budget`: one int, or (first chunk, later chunks); `captures=None`: no
    chunk captures anything."""
    captures = captures if captures is not None else ((),) * len(ends)
    case = dict(total=total, block=block, budget=budget, kv=kv, restore=restore, interval=interval,
                state_block=state_block, kernel_chunk=kernel_chunk, ends=list(ends), snaps=list(snaps),
                captures=tuple(captures), marks=tuple(marks), spec=tuple(spec), match_unit=match_unit)
    return pytest.param(case, id=rid)


def _budget(budget):
    if isinstance(budget, int):
        return budget
    first, later = budget
    return lambda i: first if i == 0 else later


def _admission(policy, c, ctx):
    """The scheduler's admission rule: marks and speculative marks inside (restore, total); a
    speculative mark that is also a mark counts as a mark."""
    inside = lambda ms: {m for m in ms if c["restore"] < m < c["total"]}
    own = inside(policy.marks(c["kv"], c["restore"], c["total"], ctx))
    speculative = inside(policy.speculative_marks(c["kv"], c["restore"], c["total"], ctx)) - own
    return own, speculative


def check(name, c):
    """Run one golden case under the policy `name`: marks, speculative marks, then the plan."""
    policy = get_policy(name)
    ctx = PlanContext(c["block"], c["interval"], c["state_block"], c["kernel_chunk"], c["match_unit"])
    assert policy.marks(c["kv"], c["restore"], c["total"], ctx) == c["marks"]
    spec = policy.speculative_marks(c["kv"], c["restore"], c["total"], ctx)
    assert tuple(m for m in spec if c["restore"] < m < c["total"]) == c["spec"]
    own, speculative = _admission(policy, c, ctx)
    plans = plan_prompt(c["total"], c["block"], _budget(c["budget"]), c["interval"], name, start=c["restore"],
                        marks=sorted(own | speculative), ctx=ctx)
    assert plans[0].offset == c["restore"]
    assert [p.end for p in plans] == c["ends"]
    assert tuple(p.capture_offsets for p in plans) == c["captures"]
    assert [s for p in plans for s in p.snapshot_positions] == c["snaps"]


# ---------------------------------------------------------------- legacy (BRIEF section 2)
LEGACY = [
    # The seed's incident: chunks keep 8193 then 8192: 8193, 16385, 24577, 32769, then 3 left;
    # every non-last end saves; the split 32768-16 = 32752 lies in [24577, 32769), not in the last.
    row("incident", 32772, 16, (8193, 8192), ends=[8193, 16385, 24577, 32769, 32772],
        snaps=[8193, 16385, 24577, 32769]),
    # 10-token chunks, no flooring: 10, 20, 30 saved; split (39//16*16) - 16 = 16 not in [30, 40).
    row("sub-block", 40, 16, 10, ends=[10, 20, 30, 40], snaps=[10, 20, 30]),
    # Last chunk [600, 1000) spans split 992 - 16 = 976: captured at 976 - 600 = 376.
    row("last-captures-split", 1000, 16, 600, ends=[600, 1000], captures=[(), (376,)], snaps=[600, 976]),
    # Replay from 24577 (legacy restore): min(8193, 8195) -> 32770, saved; [32770, 32772) has no split.
    # kv 32768 > restore: legacy has no junction.
    row("restore-mid-block", 32772, 16, 8193, kv=32768, restore=24577, ends=[32770, 32772], snaps=[32770]),
]

# ---------------------------------------------------------------- aligned (BRIEF section 2)
ALIGNED = [
    # 8193 floored to 8192; +8192 = 16384, 24576 on boundaries; 24576 + 8192 = 32768 spans the
    # split 32752 = 32768 - 16 -> ends there (a tail end: saved); [32752, 32772) last.
    row("incident", 32772, 16, (8193, 8192), ends=[8192, 16384, 24576, 32752, 32772], snaps=[32752]),
    # Interval 128 blocks = 2048 tokens: 1024 is block 64 (64 % 128 != 0), 2048 block 128, 4096
    # block 256 save; [4096, 5000) last, split (4999//16*16 = 4992) - 16 = 4976 -> 4976 - 4096 = 880.
    row("interval-128-blocks", 5000, 16, 1024, interval=128, ends=[1024, 2048, 3072, 4096, 5000],
        captures=[(), (), (), (), (880,)], snaps=[2048, 4096, 4976]),
    # L = 39//16*16 = 32, split 16. [0,10): floor 0 leaves nothing -> 10; [10,20) spans 16 -> 16 (saved);
    # [16,26): floor 16 leaves nothing -> 26; [26,36) -> floor 32 = L (saved); [32,40) last.
    row("budget-under-a-block", 40, 16, 10, ends=[10, 16, 26, 32, 40], snaps=[16, 32]),
    # Same with interval 1 block: 16 and 32 are blocks 1 and 2; 10 and 26 are no boundaries: no save.
    row("budget-under-a-block-interval-1", 40, 16, 10, interval=1, ends=[10, 16, 26, 32, 40], snaps=[16, 32]),
    # One past a boundary: n=33, L = 32, split 16, captured in the lone chunk.
    row("n=33", 33, 16, 8192, ends=[33], captures=[(16,)], snaps=[16]),
    # On a boundary: n=32, L = 31//16*16 = 16, split 0 -> none.
    row("n=32", 32, 16, 8192, ends=[32], snaps=[]),
    # n=47: L = 46//16*16 = 32, split 16; n=48: L = 47//16*16 = 32, split 16; n=49: L = 48, split 32.
    row("n=47", 47, 16, 8192, ends=[47], captures=[(16,)], snaps=[16]),
    row("n=48", 48, 16, 8192, ends=[48], captures=[(16,)], snaps=[16]),
    row("n=49", 49, 16, 8192, ends=[49], captures=[(32,)], snaps=[32]),
    # Block 48: L = 999//48*48 = 960, split 912. 300 -> 288 (6 blocks), 588 -> 576, 876 -> 864;
    # [864, 1000) last captures 912 - 864 = 48.
    row("block-48", 1000, 48, 300, ends=[288, 576, 864, 1000], captures=[(), (), (), (48,)], snaps=[912]),
    # Same with interval 6 blocks: 288 = block 6, 576 = 12, 864 = 18 all save.
    row("block-48-interval-6", 1000, 48, 300, interval=6, ends=[288, 576, 864, 1000],
        captures=[(), (), (), (48,)], snaps=[288, 576, 864, 912]),
    # Replay from 24577: min(8193, 8195) -> 32770 spans the split 32752 -> stops there; no junction.
    row("restore-mid-block", 32772, 16, 8193, kv=32768, restore=24577, ends=[32752, 32772], snaps=[32752]),
    # Replay from the split itself: one 20-token last chunk, nothing inside.
    row("restore-at-split", 32772, 16, 8193, kv=32768, restore=32752, ends=[32772], snaps=[]),
]

# ---------------------------------------------------------------- vllm-align (placements docstrings)
# Block 528 (Bamba-9B's padded block) against a 256 kernel chunk: Mamba-2's alignment is 1, so the
# kernel chunk plays no part (1584 = 6.19 x 256 is still exported in-forward).
VLLM_ALIGN = [
    # C = 2999//528*528 = 2640. 1000 -> 528, 1528 -> 1056, 2056 -> 1584, 2584 -> 2112 (each
    # saved: multiples of 528); [2112, 3000) last: 2112 % 528 = 0, 2112 + 528 = 2640 <= C,
    # ceil(3000/528) - 2 = 4 > 2111//528 = 3 -> C in-forward at 2640 - 2112 = 528.
    row("multi-chunk", 3000, 528, 1000, ends=[528, 1056, 1584, 2112, 3000],
        captures=[(), (), (), (), (528,)], snaps=[528, 1056, 1584, 2112, 2640]),
    # Budget under a block: C = 1199//528*528 = 1056. [0,400): floor 0 -> 400 (400 % 528: no save);
    # [400,800) -> floor 528 (saved); [528,928): floor 528 leaves nothing -> 928 (no save);
    # [928,1200) last, 928 % 528 != 0 -> not in-forward -> stops at last cache 1056 (saved); [1056,1200).
    row("sub-block-budget", 1200, 528, 400, ends=[400, 528, 928, 1056, 1200], snaps=[528, 1056]),
    # One past a boundary: C = 1584//528*528 = 1584; 0 + 528 <= 1584 < 1585, ceil(1585/528) - 2 = 2 > -1.
    row("n=1585", 1585, 528, 8192, ends=[1585], captures=[(1584,)], snaps=[1584]),
    # On a boundary: C = 1583//528*528 = 1056, exported in-forward.
    row("n=1584", 1584, 528, 8192, ends=[1584], captures=[(1056,)], snaps=[1056]),
    # One block plus one: C = 528 = 0 + 528 (<= holds), ceil(529/528) - 2 = 0 > -1 -> in-forward.
    row("n=529", 529, 528, 8192, ends=[529], captures=[(528,)], snaps=[528]),
    # Exactly one block: C = 527//528*528 = 0 -> nothing to export or stop at.
    row("n=528", 528, 528, 8192, ends=[528], snaps=[]),
    # Replay from 2112 (kv 2640 > restore: vllm-align has no junction): 2112 + 528 = 2640 <= C = 2640,
    # ceil(3000/528) - 2 = 4 > 3 -> in-forward at 528.
    row("restore-one-block-under-C", 3000, 528, 8192, kv=2640, restore=2112, ends=[3000],
        captures=[(528,)], snaps=[2640]),
    # Replay from 1056: 1056 + 528 <= 2640, 4 > 1055//528 = 1 -> captured at 2640 - 1056 = 1584.
    row("restore-1056", 3000, 528, 8192, kv=1056, restore=1056, ends=[3000], captures=[(1584,)], snaps=[2640]),
    # Replay from C itself: start < C fails, nothing inside.
    row("restore-at-C", 3000, 528, 8192, kv=2640, restore=2640, ends=[3000], snaps=[]),
]

# ---------------------------------------------------------------- vllm-junction (placements docstrings)
# unit = the KV block 16, state block 528, kernel chunk 256: C = (n-1)//16*16, last cache (n-1)//528*528.
VLLM_JUNCTION = [
    # C = 2999//16*16 = 2992; [0,3000): 0 % 16 = 0, 16 <= 2992, ceil(3000/528) - 2 = 4 > -1 -> in-forward.
    row("one-chunk", 3000, 16, 8192, state_block=528, ends=[3000], captures=[(2992,)], snaps=[2992]),
    # [0,2000): floor to 528 -> 1584 (saved: 3 x 528); stops 2640 and C = 2992 lie beyond.
    # [1584,3000) last: 1584 % 16 = 0, 1600 <= 2992, 4 > 1583//528 = 2 -> in-forward at 1408.
    row("two-chunks", 3000, 16, 2000, state_block=528, ends=[1584, 3000], captures=[(), (1408,)],
        snaps=[1584, 2992]),
    # Junction 992 (528 < 992 < 3000): [528,3000) would export C in-forward but stops at 992
    # (saved as a mark); [992,3000): 992 % 16 = 0, 1008 <= 2992, 4 > 991//528 = 1 -> in-forward at 2000.
    row("junction", 3000, 16, 8192, state_block=528, kv=992, restore=528, marks=[992], ends=[992, 3000],
        captures=[(), (2000,)], snaps=[992, 2992]),
    # Restored at the match 992 (no junction): [992, 2192) floors to 2112 but stops at the next
    # state block 1056 (992 is mid-block; saved); [1056,2256) -> 2112 (saved); [2112,3000) last:
    # 4 > 2111//528 = 3 -> in-forward at 2992 - 2112 = 880.
    row("restore-mid-state-block", 3000, 16, 1200, state_block=528, kv=992, restore=992,
        ends=[1056, 2112, 3000], captures=[(), (), (880,)], snaps=[1056, 2112, 2992]),
    # Restored at 2640: ceil(3000/528) - 2 = 4 is not > 2639//528 = 4 -> no in-forward export;
    # last cache 2640 is the start; the tail stop C = 2992 (2640 < 2992 < 3000) ends the chunk (saved: = C).
    row("restore-2640-tail-stop", 3000, 16, 8192, state_block=528, kv=2640, restore=2640, ends=[2992, 3000],
        snaps=[2992]),
    # Restored at 2112 instead: 4 > 3 -> in-forward at 2992 - 2112 = 880, no stop.
    row("restore-2112-in-forward", 3000, 16, 8192, state_block=528, kv=2112, restore=2112, ends=[3000],
        captures=[(880,)], snaps=[2992]),
    # One past a unit boundary: n=2993, C = 2992//16*16 = 2992, last cache 2992//528*528 = 2640;
    # from 2640: ceil(2993/528) - 2 = 4, not > 4 -> stop at C = 2992 (saved); [2992, 2993).
    row("n=2993-restore-2640", 2993, 16, 8192, state_block=528, kv=2640, restore=2640, ends=[2992, 2993],
        snaps=[2992]),
    # On a unit boundary: n=2992, C = 2991//16*16 = 2976 (from 0: in-forward, 4 > -1).
    row("n=2992", 2992, 16, 8192, state_block=528, ends=[2992], captures=[(2976,)], snaps=[2976]),
]

# ---------------------------------------------------------------- sglang (BRIEF sections 4 and 6)
SGLANG = [
    # Grid max(256, 16) = 256, tail 2999//256*256 = 2816. 1008-token chunks end 1008 (= 3.94 x 256)
    # and 2016 (7.875 x 256): off the grid, no save; 2816 captured in [2016, 3000) at 800.
    row("ends-off-kernel-grid", 3000, 16, 1008, marks=[2816], ends=[1008, 2016, 3000],
        captures=[(), (), (800,)], snaps=[2816]),
    # 1024-token chunks: 1024 = 4 x 256 and 2048 = 8 x 256 save; 2816 at 2816 - 2048 = 768.
    row("ends-on-kernel-grid", 3000, 16, 1024, marks=[2816], ends=[1024, 2048, 3000],
        captures=[(), (), (768,)], snaps=[1024, 2048, 2816]),
    # Block 48 (does not divide 256): grid max(256, 48) = 256, tail 2816. 960, 1920, 2880 are
    # 3.75, 7.5, 11.25 x 256: no save; 2816 lies in the non-last chunk [1920, 2880): captured at 896.
    row("block-48-off-grid", 3000, 48, 960, marks=[2816], ends=[960, 1920, 2880, 3000],
        captures=[(), (), (896,), ()], snaps=[2816]),
    # Block 48, 768-token chunks: 768, 1536, 2304 = 3, 6, 9 x 256 save; 2816 at 2816 - 2304 = 512.
    row("block-48-on-grid", 3000, 48, 768, marks=[2816], ends=[768, 1536, 2304, 3000],
        captures=[(), (), (), (512,)], snaps=[768, 1536, 2304, 2816]),
    # Page 512 over the 256 kernel chunk: grid 512, tail 2999//512*512 = 2560. 768 and 2304 are
    # 1.5 and 4.5 x 512 (no save), 1536 = 3 x 512 saves; 2560 at 2560 - 2304 = 256.
    row("page-over-kernel-chunk", 3000, 512, 768, marks=[2560], ends=[768, 1536, 2304, 3000],
        captures=[(), (), (), (256,)], snaps=[1536, 2560]),
    # One chunk: tail 999//256*256 = 768 only (no split-point capture at 976).
    row("n=1000-one-chunk", 1000, 16, 8192, marks=[768], ends=[1000], captures=[(768,)], snaps=[768]),
    # One past a grid point: 2816//256*256 = 2816; on it: 2815//256*256 = 2560; one short: 2560.
    row("n=2817", 2817, 16, 8192, marks=[2816], ends=[2817], captures=[(2816,)], snaps=[2816]),
    row("n=2816", 2816, 16, 8192, marks=[2560], ends=[2816], captures=[(2560,)], snaps=[2560]),
    row("n=2815", 2815, 16, 8192, marks=[2560], ends=[2815], captures=[(2560,)], snaps=[2560]),
    # n=256: tail 255//256*256 = 0, not above the restore point 0 -> no mark.
    row("n=256", 256, 16, 8192, ends=[256], snaps=[]),
    # Restored at the tail 2816: 2816 > 2816 fails -> no mark (kv plays no part: no junction).
    row("restore-at-tail", 3000, 16, 8192, kv=2816, restore=2816, ends=[3000], snaps=[]),
    # Restored one grid point under it: 2816 > 2560 -> captured at 256.
    row("restore-under-tail", 3000, 16, 8192, kv=2816, restore=2560, marks=[2816], ends=[3000],
        captures=[(256,)], snaps=[2816]),
]

# ---------------------------------------------------------------- trtllm (BRIEF sections 4 and 6)
TRTLLM = [
    # Periodic 4096, 8192 (< 9000); tail 8999//16*16 = 8992; each a stop, saved as a mark.
    row("periodic-and-tail", 9000, 16, 8192, marks=[4096, 8192, 8992], ends=[4096, 8192, 8992, 9000],
        snaps=[4096, 8192, 8992]),
    # Plus the junction 992 (0 < 992 < 9000).
    row("junction", 9000, 16, 8192, kv=992, marks=[992, 4096, 8192, 8992], ends=[992, 4096, 8192, 8992, 9000],
        snaps=[992, 4096, 8192, 8992]),
    # Replay from 5000, match 6000: periodic 4096 is below the restore point; junction 6000.
    row("restore-5000", 9000, 16, 8192, kv=6000, restore=5000, marks=[6000, 8192, 8992],
        ends=[6000, 8192, 8992, 9000], snaps=[6000, 8192, 8992]),
    # No period under 3000; tail 2992. 1000, 2000 are not marks: no save (trtllm saves only marks).
    row("plain-ends-do-not-save", 3000, 16, 1000, marks=[2992], ends=[1000, 2000, 2992, 3000], snaps=[2992]),
    # n=8193: periodic 4096, 8192; tail 8192//16*16 = 8192, the same position once.
    row("n=8193", 8193, 16, 8192, marks=[4096, 8192], ends=[4096, 8192, 8193], snaps=[4096, 8192]),
    # Block 48: tail 8999//48*48 = 187 x 48 = 8976; the period stays 4096 tokens (85.3 blocks).
    row("block-48", 9000, 48, 8192, marks=[4096, 8192, 8976], ends=[4096, 8192, 8976, 9000],
        snaps=[4096, 8192, 8976]),
    # n=4097 restored at 4096: period 4096 and tail 4096//16*16 = 4096 are not above 4096.
    row("restore-at-period", 4097, 16, 8192, kv=4096, restore=4096, ends=[4097], snaps=[]),
]

# ---------------------------------------------------------------- ollama (x/mlxrunner/pipeline.go)
OLLAMA = [
    # Every 8192 (8192, 16384 < 20000) and 20000 - 4 = 19996, each a stop and saved as a mark;
    # 8192 and 16384 are budget ends too; [16384, 20000) stops at 19996.
    row("periodic-and-end", 20000, 16, 8192, marks=[8192, 16384, 19996], ends=[8192, 16384, 19996, 20000],
        snaps=[8192, 16384, 19996]),
    # ollama's own 2048-token chunks: plain ends do not save; 8192 and 9000 - 4 = 8996 do.
    row("chunks-2048", 9000, 16, 2048, marks=[8192, 8996], ends=[2048, 4096, 6144, 8192, 8996, 9000],
        snaps=[8192, 8996]),
    # No period under 100; 96 = 100 - 4 (on a block boundary by chance).
    row("n=100", 100, 16, 8192, marks=[96], ends=[96, 100], snaps=[96]),
    # n=103: 99, not block-aligned, is still a stop (the snapshot sits at the exact token).
    row("n=103", 103, 16, 8192, marks=[99], ends=[99, 103], snaps=[99]),
    # n=5: 1; n=4: 0 is no position, no mark.
    row("n=5", 5, 16, 8192, marks=[1], ends=[1, 5], snaps=[1]),
    row("n=4", 4, 16, 8192, ends=[4], snaps=[]),
    # Restored at 16384 with match 16384: only 19996 is above it; ollama has no junction mark.
    row("restore-16384", 20000, 16, 8192, kv=16384, restore=16384, marks=[19996], ends=[19996, 20000],
        snaps=[19996]),
]

# ---------------------------------------------------------------- marconi (arXiv 2411.19379)
MARCONI = [
    # Junction 992 stops the chunk (saved); no split capture, no other save.
    row("junction", 3000, 16, 8192, kv=992, marks=[992], ends=[992, 3000], snaps=[992]),
    # 1000-token chunks: stop at 992, then 1992, 2992 (the last boundary, not saved), 3000.
    row("junction-multi-chunk", 3000, 16, 1000, kv=992, marks=[992], ends=[992, 1992, 2992, 3000], snaps=[992]),
    # Restore one block under the match: 976 < 992 -> a 16-token chunk to the junction.
    row("restore-one-block-under", 3000, 16, 8192, kv=992, restore=976, marks=[992], ends=[992, 3000],
        snaps=[992]),
    # Restored at the match: nothing lags, no mark, nothing saved.
    row("restore-at-match", 3000, 16, 8192, kv=992, restore=992, ends=[3000], snaps=[]),
]

# ---------------------------------------------------------------- ours-plus (placements + aligned)
OURS_PLUS = [
    # Grid ceil(2048/16)*16 = 2048: 2048, 4096; split 4999//16*16 - 16 = 4976; all in one launch.
    row("grid-bs16", 5000, 16, 8192, spec=[2048, 4096], ends=[5000], captures=[(2048, 4096, 4976)],
        snaps=[2048, 4096, 4976]),
    # 3000 floored to 2992 (not a tail end, no save), 2048 captured inside; [2992, 5000): 4096 at
    # 1104, split 4976 at 1984.
    row("grid-two-chunks", 5000, 16, 3000, spec=[2048, 4096], ends=[2992, 5000],
        captures=[(2048,), (1104, 1984)], snaps=[2048, 4096, 4976]),
    # 1024-token chunks end on the grid points 2048, 4096: a mark at a non-last end saves there;
    # [4096, 5000) captures the split 4976 at 880.
    row("grid-at-chunk-ends", 5000, 16, 1024, spec=[2048, 4096], ends=[1024, 2048, 3072, 4096, 5000],
        captures=[(), (), (), (), (880,)], snaps=[2048, 4096, 4976]),
    # Junction on the grid: kv 2048 > restore 1024 -> a mark; speculative keeps only 4096.
    # Captures from 1024: 1024, 3072, 4976 - 1024 = 3952.
    row("junction-on-grid", 5000, 16, 8192, kv=2048, restore=1024, marks=[2048], spec=[2048, 4096], ends=[5000],
        captures=[(1024, 3072, 3952)], snaps=[2048, 4096, 4976]),
    # Junction off the grid from 976: 992 at 16, 2048 at 1072, 4096 at 3120, 4976 at 4000.
    row("junction-off-grid", 5000, 16, 8192, kv=992, restore=976, marks=[992], spec=[2048, 4096], ends=[5000],
        captures=[(16, 1072, 3120, 4000)], snaps=[992, 2048, 4096, 4976]),
    # Restored at 2048: the grid point 2048 is not above it; 4096 at 2048, 4976 at 2928.
    row("restore-on-grid", 5000, 16, 8192, kv=2048, restore=2048, spec=[4096], ends=[5000],
        captures=[(2048, 2928)], snaps=[4096, 4976]),
    # Block 48: grid ceil(2048/48) = 43 blocks = 2064: 2064, 4128; L = 4999//48*48 = 4992, split 4944.
    row("grid-bs48", 5000, 48, 8192, spec=[2064, 4128], ends=[5000], captures=[(2064, 4128, 4944)],
        snaps=[2064, 4128, 4944]),
    # Block 48, 1024 budget: 1024 -> 1008 (21 blocks), 2032 -> 2016, 3040 -> 3024 (2064 inside at 48),
    # 4048 -> 4032; [4032, 5000) last: 4128 at 96, split 4944 at 912.
    row("grid-bs48-multi-chunk", 5000, 48, 1024, spec=[2064, 4128], ends=[1008, 2016, 3024, 4032, 5000],
        captures=[(), (), (48,), (), (96, 912)], snaps=[2064, 4128, 4944]),
    # Block 96: ceil(2048/96) = 22 blocks = 2112: 2112, 4224; L = 4999//96*96 = 4992, split 4896.
    row("grid-bs96", 5000, 96, 8192, spec=[2112, 4224], ends=[5000], captures=[(2112, 4224, 4896)],
        snaps=[2112, 4224, 4896]),
    # One past a grid point: n=4097 -> 2048, 4096; L = 4096, split 4080. n-1 = 4096 = 256 blocks (a
    # match can end there) is speculative too, and already on the grid.
    row("n=4097", 4097, 16, 8192, spec=[2048, 4096], ends=[4097], captures=[(2048, 4080, 4096)],
        snaps=[2048, 4080, 4096]),
    # On it: n=4096 -> 2048 only (4096 is not under n); L = 4080, split 4064.
    row("n=4096", 4096, 16, 8192, spec=[2048], ends=[4096], captures=[(2048, 4064)], snaps=[2048, 4064]),
    # n=2049: 2048 (the grid's and n-1); L = 2048, split 2032. n=2048: no grid point, n-1 = 2047
    # not on the block; L = 2032, split 2016.
    row("n=2049", 2049, 16, 8192, spec=[2048], ends=[2049], captures=[(2032, 2048)], snaps=[2032, 2048]),
    row("n=2048", 2048, 16, 8192, ends=[2048], captures=[(2016,)], snaps=[2016]),
    # A token match unit: n-1 = 4999 is speculative, captured in the same launch at 4999 beside 2048,
    # 4096 and the split 4976.
    row("unit1-cold", 5000, 16, 8192, match_unit=1, spec=[2048, 4096, 4999], ends=[5000],
        captures=[(2048, 4096, 4976, 4999)], snaps=[2048, 4096, 4976, 4999]),
    # Unit 8 on block 16: 4999 is not on it (4999 % 8 = 7): no mark. n = 5001: 5000 = 625 x 8 is.
    row("unit8-off", 5000, 16, 8192, match_unit=8, spec=[2048, 4096], ends=[5000],
        captures=[(2048, 4096, 4976)], snaps=[2048, 4096, 4976]),
    row("unit8-on", 5001, 16, 8192, match_unit=8, spec=[2048, 4096, 5000], ends=[5001],
        captures=[(2048, 4096, 4976, 5000)], snaps=[2048, 4096, 4976, 5000]),
    # A warm repeat, match 4999 and restored there: no junction (restore = match); 4999 is not above
    # the restore point (kept marks lie in (restore, n)), nothing left to capture; the one token runs.
    row("unit1-repeat", 5000, 16, 8192, match_unit=1, kv=4999, restore=4999, ends=[5000], snaps=[]),
    # Two chunks of 3000 at unit 1: 2992 floored (2048 captured at 2048); [2992, 5000): 4096 at 1104,
    # 4976 at 1984, 4999 at 2007.
    row("unit1-two-chunks", 5000, 16, 3000, match_unit=1, spec=[2048, 4096, 4999], ends=[2992, 5000],
        captures=[(2048,), (1104, 1984, 2007)], snaps=[2048, 4096, 4976, 4999]),
]

# ---------------------------------------------------------------- optimum (ours-plus without the grid)
OPTIMUM = [
    # No speculative grid; split 4976 only.
    row("no-grid", 5000, 16, 8192, ends=[5000], captures=[(4976,)], snaps=[4976]),
    # Junction 992 captured in-launch, with the split.
    row("junction", 5000, 16, 8192, kv=992, marks=[992], ends=[5000], captures=[(992, 4976)], snaps=[992, 4976]),
    # 3000 -> 2992 (992 captured inside); [2992, 5000): split at 1984.
    row("junction-two-chunks", 5000, 16, 3000, kv=992, marks=[992], ends=[2992, 5000],
        captures=[(992,), (1984,)], snaps=[992, 4976]),
]

@pytest.mark.parametrize("case", LEGACY)
def test_legacy(case):
    check("legacy", case)


@pytest.mark.parametrize("case", ALIGNED)
def test_aligned(case):
    check("aligned", case)


@pytest.mark.parametrize("case", VLLM_ALIGN)
def test_vllm_align(case):
    check("vllm-align", case)


@pytest.mark.parametrize("case", VLLM_JUNCTION)
def test_vllm_junction(case):
    check("vllm-junction", case)


@pytest.mark.parametrize("case", SGLANG)
def test_sglang(case):
    check("sglang", case)


@pytest.mark.parametrize("case", TRTLLM)
def test_trtllm(case):
    check("trtllm", case)


@pytest.mark.parametrize("case", MARCONI)
def test_marconi(case):
    check("marconi", case)


@pytest.mark.parametrize("case", OLLAMA)
def test_ollama(case):
    check("ollama", case)


@pytest.mark.parametrize("case", OURS_PLUS)
def test_ours_plus(case):
    check("ours-plus", case)


@pytest.mark.parametrize("case", OPTIMUM)
def test_optimum(case):
    check("optimum", case)


# ---------------------------------------------------------------- the mark functions alone
# The junction rule: the KV match when restore_at < kv_match < total.
JUNCTION_ROWS = [
    ((992, 0, 3000), (992,)),  # 0 < 992 < 3000
    ((992, 976, 3000), (992,)),  # restore one block below the match
    ((992, 992, 3000), ()),  # restore == match: nothing lags
    ((0, 0, 3000), ()),  # no match
    ((2992, 0, 3000), (2992,)),  # the last boundary under n
    ((3000, 0, 3000), ()),  # match == n: not < n
]


@pytest.mark.parametrize("name", ["vllm-junction", "marconi", "ours-plus", "optimum"])
@pytest.mark.parametrize("args,expected", JUNCTION_ROWS, ids=lambda v: str(v))
def test_junction_marks(name, args, expected):
    assert get_policy(name).marks(*args, PlanContext(16, 0, 528 if name == "vllm-junction" else 0)) == expected


@pytest.mark.parametrize("args,expected", [
    ((992, 0, 3000), (992, 2992)),  # junction + tail 2999//16*16 = 2992
    ((992, 992, 3000), (2992,)),  # restore == match: tail only
    ((0, 0, 3000), (2992,)),
    ((3000, 0, 3000), (2992,)),  # match == n: no junction
], ids=lambda v: str(v))
def test_trtllm_junction_marks(args, expected):
    assert get_policy("trtllm").marks(*args, PlanContext(16)) == expected


@pytest.mark.parametrize("name", ["legacy", "aligned", "vllm-align"])
def test_policies_without_marks(name):
    policy = get_policy(name)
    assert policy.marks(992, 0, 3000, PlanContext(16)) == () == policy.speculative_marks(0, 0, 5000, PlanContext(16))


@pytest.mark.parametrize("name", ["legacy", "aligned", "vllm-align", "vllm-junction", "sglang", "trtllm",
                                  "marconi", "ollama", "optimum"])
def test_only_ours_plus_speculates(name):
    assert get_policy(name).speculative_marks(0, 0, 5000, PlanContext(16)) == ()


@pytest.mark.parametrize("block,expected", [
    (16, (2048, 4096)),  # 2048/16 = 128 blocks exactly
    (48, (2064, 4128)),  # ceil(2048/48) = 43 -> 2064
    (96, (2112, 4224)),  # ceil(2048/96) = 22 -> 2112
    (1, (2048, 4096, 4999)),  # a 1-token block: n-1 = 4999 is on the (block) match unit too
    (2048, (2048, 4096)),
    (4096, (4096,)),  # ceil(2048/4096) = 1 block = 4096
])
def test_ours_plus_speculative_grid(block, expected):
    assert OURS_PLUS_GRID_TOKENS == 2048
    assert get_policy("ours-plus").speculative_marks(0, 0, 5000, PlanContext(block)) == expected


def test_constants_and_vllm_checkpoint_functions():
    assert TRTLLM_PERIOD_TOKENS == 4096
    # C = floor((n-1)/unit)*unit, never below 0.
    assert [vllm_checkpoint_position(n, u) for n, u in ((3000, 16), (3000, 528), (528, 528), (529, 528), (1, 16))] \
        == [2992, 2640, 0, 528, 0]
    # (start, end, C, unit, block): the column rule ceil(end/block) - 2 > (start-1)//block.
    assert not vllm_checkpoint_in_forward(2640, 3000, 2992, 16, 528)  # 4 > 4 fails
    assert vllm_checkpoint_in_forward(2112, 3000, 2992, 16, 528)  # 4 > 3
    assert vllm_checkpoint_in_forward(2112, 3000, 2640, 528, 528)  # 2112 + 528 <= 2640: the edge holds
    assert not vllm_checkpoint_in_forward(1000, 3000, 2992, 16, 528)  # 1000 % 16 = 8 (the rest holds: 4 > 1)
    assert vllm_checkpoint_in_forward(992, 3000, 2992, 16, 528)  # 992 = 62 x 16


# ---------------------------------------------------------------- the admission rule, through the engine
def two_requests_over_a_grid_point(snapshot_byte_budget: int | None):
    """ours-plus's placement alone (its decode states and token match, defaults of its engine, off
    explicitly), block 16: A = 2048 tokens, then B = A + 2952 new; the engine and both requests."""
    eng = Engine.for_placeholder(policy="ours-plus", block_size=16, prefill_budget=8192, num_kv_blocks=512,
                                 max_batch_size=1, decode_snapshots=False, prefix_match_unit=16,
                                 snapshot_byte_budget=snapshot_byte_budget)
    a = list(range(1, 2049))
    first, b = [eng.add_request(p, max_new_tokens=1) for p in (a, a + [9000 + i for i in range(2952)])]
    eng.run_until_done()
    return eng, first, b


def test_engine_labels_a_junction_on_the_grid_as_a_mark():
    """A computes 2048 tokens (its split 2032 - 16 = 2016 captured; no grid point under 2048).
    B shares them and goes on to 5000: KV match 2048, restore 2016, so the junction 2048 is a
    mark although it is also a grid point; the grid keeps 4096 as speculative; B captures 2048,
    4096 and its split 4976 in one launch from 2016. A budget (1 TiB, never full) keeps the
    2048-token grid: a store with none takes the 1024 grid (the next test)."""
    eng, _, b = two_requests_over_a_grid_point(snapshot_byte_budget=1 << 40)
    assert (b.metrics.kv_match_tokens, b.metrics.restore_at) == (2048, 2016)
    assert b.marked_positions == {2048} and b.speculative_positions == {4096}
    assert b.metrics.chunk_ends == [5000] and b.metrics.snapshot_positions == [2048, 4096, 4976]
    assert dict(eng.snapshots.stats.saved_by_origin) == {"chunk": 2, "mark": 1, "speculative": 1}


def test_engine_grid_is_1024_tokens_in_a_store_with_no_budget():
    """The same two requests with no snapshot budget: the grid is OURS_PLUS_UNBOUNDED_GRID_TOKENS.
    A (2048 tokens) captures its grid point 1024 (speculative) and its split 2016 in one launch;
    B (KV match 2048, restore 2016) marks the junction 2048 (also a grid point) and keeps 3072 and
    4096 as speculative, all captured in one launch with its split 4976."""
    assert OURS_PLUS_UNBOUNDED_GRID_TOKENS == 1024
    _, first, b = two_requests_over_a_grid_point(snapshot_byte_budget=None)
    assert first.speculative_positions == {1024} and first.metrics.snapshot_positions == [1024, 2016]
    assert (b.metrics.kv_match_tokens, b.metrics.restore_at) == (2048, 2016)
    assert b.marked_positions == {2048} and b.speculative_positions == {3072, 4096}
    assert b.metrics.chunk_ends == [5000] and b.metrics.snapshot_positions == [2048, 3072, 4096, 4976]
