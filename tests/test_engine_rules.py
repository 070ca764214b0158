"""The engine's snapshot rules at exact positions, driven through `Engine.for_placeholder`.

Where each rule comes from:
* decode-time states (`model/engine/engine.py`, `EngineConfig.decode_snapshots` /
  `decode_snapshot_grid`): at finish a request keeps the state at the last grid point (0: the KV
  block) that a decode row or its last prefill chunk ended on. The last sampled token is never
  fed back, so a request computes prompt + max_new_tokens - 1 positions; a non-last chunk's end
  is the planner's, not a decode state.
* the next turn (`planner/prefix_cache.py`, `planner/scheduler.py` `Scheduler._admit`): its KV
  match is the full blocks the previous turn computed (block-floored), its restore point the
  deepest snapshot at or below the match, and it replays everything after that.
* origins (`planner/scheduler.py` `_admit`, `planner/snapshot_store.py` `ORIGINS` and `save`):
  ours-plus's junction (the KV match, when the restore lags it) is a mark even where it lands on
  the speculative 2048-token grid; a mark may evict under a full budget, a speculative save
  with LRU is declined.
* where the aligned policy captures in a last chunk (`planner/prefill_plan.py`): one block below
  the last block boundary under the prompt end (the tail split point).

Block 16 throughout; the placeholder runner checks every restore against the KV it resumes on.
"""

import pytest

from model.engine import Engine


def engine(**settings):
    base = dict(block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=512, policy="aligned")
    return Engine.for_placeholder(**{**base, **settings})


def tokens(n, first=1000):
    return list(range(first, first + n))


def run(eng, prompt, max_new_tokens):
    req = eng.add_request(prompt, max_new_tokens=max_new_tokens)
    eng.run_until_done()
    return req


def restore_triple(req):
    m = req.metrics
    return m.kv_match_tokens, m.restore_at, m.replayed_tokens


# ---------------------------------------------------------------- decode states on a grid
# Prompt 100 in one chunk: the aligned capture at 96 - 16 = 80 (origin "chunk"). Decode rows end at
# 101 .. 100 + max_new - 1. The next turn is prompt + reply + 6 new tokens; its KV match is the
# full blocks of the 100 + max_new - 1 computed positions.
@pytest.mark.parametrize("max_new,grid,decode_at,next_turn", [
    # 149 computed, decode rows ending at 101..149: the last multiple of 16 is 144, of 64 128,
    # of 112 112, of 48 144; 96 is a grid point only inside the prompt's chunk, so no decode state
    (50, 0, 144, (144, 144, 156 - 144)),  # next turn 150 + 6 = 156 tokens, match 9 blocks = 144
    (50, 64, 128, (144, 128, 156 - 128)),
    (50, 112, 112, (144, 112, 156 - 112)),
    (50, 48, 144, (144, 144, 156 - 144)),
    (50, 96, None, (144, 80, 156 - 80)),
    # 128 computed: on both grids (token 128 of prompt + reply is the last sampled one, never run)
    (29, 0, 128, (128, 128, 135 - 128)),  # next turn 129 + 6 = 135, match 8 blocks
    (29, 64, 128, (128, 128, 135 - 128)),
    # 127 computed: 112 on the block; no multiple of 64 in the decode rows' ends 101..127
    (28, 0, 112, (112, 112, 134 - 112)),  # next turn 128 + 6 = 134, match 7 blocks (127 // 16)
    (28, 64, None, (112, 80, 134 - 80)),  # only the chunk capture at 80 to restore
])
def test_decode_state_on_its_grid_and_the_next_turn_restores_there(max_new, grid, decode_at, next_turn):
    eng = engine(decode_snapshots=True, decode_snapshot_grid=grid)
    turn1 = run(eng, tokens(100), max_new)
    assert turn1.metrics.snapshot_positions == [80] + ([decode_at] if decode_at else [])
    assert eng.snapshots.stats.saved_by_origin["decode"] == (1 if decode_at else 0)
    turn2 = run(eng, turn1.all_token_ids + tokens(6, first=5000), 1)
    assert restore_triple(turn2) == next_turn


def test_without_decode_snapshots_the_next_turn_restores_at_the_prompt_capture():
    eng = engine(decode_snapshots=False, decode_snapshot_grid=64)
    turn1 = run(eng, tokens(100), 50)
    assert turn1.metrics.snapshot_positions == [80]
    assert restore_triple(run(eng, turn1.all_token_ids + tokens(6, first=5000), 1)) == (144, 80, 156 - 80)


# ---------------------------------------------------------------- a last prefill chunk on the grid
@pytest.mark.parametrize("prompt_len,budget,grid,saved,next_turn", [
    # 128 in one chunk, capture at 112 - 16 = 96; the chunk ends on the block and on the 64 grid.
    # Next turn 129 + 11 = 140 tokens, match 8 blocks = 128.
    (128, 4096, 0, [96, 128], (128, 128, 12)),
    (128, 4096, 64, [96, 128], (128, 128, 12)),
    # two chunks (tick budget 64 + 1: [0, 64) then [64, 128) capturing 96): only the last one counts
    (128, 64, 0, [96, 128], (128, 128, 12)),
    # 112 ends on the block, not on the 64 grid: capture at 96 - 16 = 80; next turn 113 + 11 = 124, match 112
    (112, 4096, 0, [80, 112], (112, 112, 12)),
    (112, 4096, 64, [80], (112, 80, 44)),
    # 120 in [0, 64) + [64, 120): 120 is off the block; the non-last end 64 is no decode state.
    # Capture at 112 - 16 = 96; next turn 121 + 11 = 132, match 7 blocks = 112 (120 // 16)
    (120, 64, 0, [96], (112, 96, 36)),
    (120, 64, 64, [96], (112, 96, 36)),
])
def test_last_prefill_chunk_on_the_grid_is_the_next_turns_state(prompt_len, budget, grid, saved, next_turn):
    eng = engine(prefill_budget=budget, decode_snapshots=True, decode_snapshot_grid=grid)
    turn1 = run(eng, tokens(prompt_len), 1)  # max_new_tokens 1: no decode row runs
    assert turn1.metrics.snapshot_positions == saved
    assert eng.snapshots.stats.saved_by_origin["decode"] == (prompt_len in saved)  # the chunk end's state
    turn2 = run(eng, turn1.all_token_ids + tokens(11, first=5000), 1)
    assert restore_triple(turn2) == next_turn


# ---------------------------------------------------------------- a junction on the speculative grid
SNAPSHOT = 1000  # bytes of one placeholder snapshot
# ours-plus's placement alone: its decode states off, a block match unit and LRU eviction, given
# explicitly (explicit settings win over the policy's engine defaults: exact decode states, a token
# match unit and learned-value eviction)
OURS_PLUS = dict(policy="ours-plus", decode_snapshots=False, eviction="lru", prefix_match_unit=16)
ROOMY = 1 << 40  # a budget never reached: every save fits, and the grid is the budgeted 2048 one (a store
# with no budget takes OURS_PLUS_UNBOUNDED_GRID_TOKENS, 1024: tests/test_placement_golden.py)


@pytest.mark.parametrize("budget", [ROOMY, SNAPSHOT])
def test_junction_on_the_speculative_grid_is_a_mark(budget):
    """A: 2040 prompt tokens + 20 generated (2059 computed, 128 full blocks = 2048 published);
    ours-plus's 2048 grid has no point under 2040, so A keeps only its capture at 2032 - 16 = 2016.
    B: A's first 2050 tokens + 50 new = 2100: KV match 2048, restore at 2016 (< 2048), so its
    junction mark is 2048, which is also the grid's first point; marks exclude it from the
    speculative ones. B replays [2016, 2100) in one chunk capturing 2048 (mark) and 2096 - 16 = 2080."""
    eng = engine(**OURS_PLUS, snapshot_byte_budget=budget, snapshot_nbytes=SNAPSHOT)
    a = run(eng, tokens(2040), 20)
    assert a.metrics.snapshot_positions == [2016]
    b = run(eng, a.all_token_ids[:2050] + tokens(50, first=9000), 1)
    assert restore_triple(b) == (2048, 2016, 84)
    assert b.metrics.snapshot_positions == [2048, 2080]  # stored even when it must evict (budget: one snapshot)
    stats = eng.snapshots.stats
    assert dict(stats.saved_by_origin) == {"chunk": 2, "mark": 1}
    assert stats.declined == 0
    # held at the end: roomy all three; one snapshot wide: the last save (LRU evicted 2016, then 2048)
    assert eng.snapshots.positions() == ([2016, 2048, 2080] if budget == ROOMY else [2080])
    if budget == ROOMY:  # C shares B's prefix past the junction: it restores there
        c = run(eng, b.all_token_ids[:2060] + tokens(30, first=7000), 1)
        assert restore_triple(c) == (2048, 2048, 2090 - 2048)


def test_a_grid_point_past_the_junction_stays_speculative():
    """A cold 2100-token prompt under ours-plus: its grid point 2048 is speculative (no KV match,
    so no junction), captured beside the tail capture at 2096 - 16 = 2080. With a budget of one
    snapshot the speculative save goes into the empty store, and the chunk capture evicts it."""
    roomy = engine(**OURS_PLUS, snapshot_byte_budget=ROOMY, snapshot_nbytes=SNAPSHOT)
    a = run(roomy, tokens(2100), 1)
    assert a.metrics.snapshot_positions == [2048, 2080]
    assert dict(roomy.snapshots.stats.saved_by_origin) == {"speculative": 1, "chunk": 1}
    full = engine(**OURS_PLUS, snapshot_byte_budget=SNAPSHOT, snapshot_nbytes=SNAPSHOT)
    run(full, tokens(2100, first=3000), 1)
    run(full, tokens(2100, first=6000), 1)  # a second cold prompt: its 2048 finds the store full
    assert full.snapshots.stats.declined == 1 and full.snapshots.stats.saved_by_origin["speculative"] == 1
    assert full.snapshots.positions() == [2080]
