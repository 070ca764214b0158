"""The runners' and the engine loop's rules at exact values: the placeholder runner, the two-pass
fallback, `ModelRunner`'s token count and the engine's tick loop, timestamps and defaults.

Where each rule comes from:
* the placeholder (`model/engine/placeholder_runner.py` docstring): its state is (position, rolling
  hash of the tokens consumed), h' = (h * 1_000_003 + token + 1) mod (2^31 - 1) from h = 0 (the
  `_MOD` comment: 2^31 - 1); logits are a one-hot of the hash mod vocab; a wrong restore, a KV
  position never written or a block table too short fails loudly. A fresh slot has consumed
  nothing: (0, 0). Its snapshot defaults to 1 MiB (`snapshot_nbytes=1 << 20`, as
  `experiments/multiturn/cli.py` reads it).
* the two-pass fallback (`model/engine/two_pass.py` docstring): offsets 0 < o1 < o2 < ... < n cut a
  row into segments; one state per capture offset, the last segment's logits, 1 + captures passes.
* the engine (`model/engine/engine.py`): `run_until_done(max_ticks)` runs at most max_ticks ticks;
  a first token's time is the tick that sampled it; `prompt_logits` only when the config keeps
  them (default off), the last prompt token's; a snapshot adds its `.nbytes` to the request's
  `snapshot_bytes`; `decode_snapshot_grid` is 0 or a multiple of the block; `to_chunk` converts a
  scheduled row.
* a runner's `tokens_run` (`ModelRunner`, the placeholder): the tokens its forwards consumed.
"""

import dataclasses
import itertools

import pytest
import torch

from model.batch import BatchOutput, SequenceChunk
from model.engine import Engine, EngineConfig, ModelRunner, PlaceholderRunner, cut_at_captures, run_in_passes, to_chunk
from model.engine.placeholder_runner import PlaceholderState
from model.engine.settings import ModelShape, resolve_settings
from planner.scheduler import SchedulerConfig

MIB = 1 << 20


def chunk(ids, start=0, table=(0,), slot=0, captures=(), kv_cached_len=0):
    return SequenceChunk(torch.tensor(ids, dtype=torch.long), start, list(table), slot, kv_cached_len, tuple(captures))


def engine(**settings):
    base = dict(block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=64, policy="aligned")
    return Engine.for_placeholder(**{**base, **settings})


# ---------------------------------------------------------------- the placeholder's hash and state
# h([]) = 0; h([t]) = 0 * 1_000_003 + t + 1 = t + 1; h([0, 0]) = 1 * 1_000_003 + 0 + 1 = 1_000_004;
# h([0, 0, 0]) = (1_000_004 * 1_000_003 + 1) mod (2^31 - 1) = 1_000_007_000_013 mod 2_147_483_647:
# 465 * 2_147_483_647 = 998_579_895_855, remainder 1_427_104_158 (mod 2^31 it would be 1_427_103_693).
@pytest.mark.parametrize("ids,expected_hash", [
    ([0], 1), ([5], 6), ([0, 0], 1_000_004), ([0, 0, 0], 1_427_104_158),
])
def test_placeholder_state_is_position_and_rolling_hash(ids, expected_hash):
    runner = PlaceholderRunner(num_slots=1, num_blocks=1, block_size=4, vocab_size=64, snapshot_nbytes=100)
    out = runner.forward([chunk(ids)])
    assert runner.read_state(0) == PlaceholderState(len(ids), expected_hash, 100)
    assert int(torch.argmax(out.logits[0])) == expected_hash % 64  # one-hot of the hash
    assert runner.tokens_run == len(ids)


def test_a_fresh_slot_holds_the_empty_prefix_and_a_default_snapshot_of_one_mib():
    runner = PlaceholderRunner(num_slots=2, num_blocks=1, block_size=4)
    assert runner.read_state(1) == PlaceholderState(0, 0, MIB)  # nothing consumed: position 0, hash 0
    assert runner.snapshot_nbytes == MIB


def two_rows_run():
    """Slot 0 ran [1, 2, 3, 4] into block 0, slot 1 ran [5, 6, 7, 8] into block 1 (block 4)."""
    runner = PlaceholderRunner(num_slots=2, num_blocks=3, block_size=4)
    runner.forward([chunk([1, 2, 3, 4], table=[0], slot=0), chunk([5, 6, 7, 8], table=[1], slot=1)])
    return runner


def test_a_correct_restore_resumes_with_the_same_logits_as_a_cold_run():
    runner = two_rows_run()
    runner.write_state(1, runner.read_state(0))  # slot 1 now at position 4 of [1, 2, 3, 4], KV in block 0
    warm = runner.forward([chunk([9], start=4, table=[0, 2], slot=1, kv_cached_len=4)])
    cold = PlaceholderRunner(num_slots=1, num_blocks=2, block_size=4).forward([chunk([1, 2, 3, 4, 9], table=[0, 1])])
    assert torch.equal(warm.logits[0], cold.logits[0])


def test_a_state_restored_over_another_prefix_fails_loudly():
    runner = two_rows_run()
    runner.write_state(1, runner.read_state(0))  # hash of [1..4] but the table exposes [5..8]
    with pytest.raises(AssertionError, match="disagree at position 4"):
        runner.forward([chunk([9], start=4, table=[1, 2], slot=1, kv_cached_len=4)])


def test_a_kv_position_never_written_fails_loudly():
    runner = two_rows_run()
    runner.write_state(1, runner.read_state(0))  # block 2 was never written: its position 0 is the first
    with pytest.raises(AssertionError, match="KV position 0 was never written"):
        runner.forward([chunk([9], start=4, table=[2, 0], slot=1)])


def test_a_block_table_too_short_for_the_row_fails_loudly():
    runner = PlaceholderRunner(num_slots=1, num_blocks=2, block_size=4)
    runner.forward([chunk([1, 2, 3, 4], table=[0])])  # 4 tokens in 1 block of 4: enough
    with pytest.raises(AssertionError, match="block table too short"):
        runner.forward([chunk([5], start=4, table=[0])])  # 4 + 1 = 5 positions > 1 block * 4
    with pytest.raises(AssertionError, match="block table too short"):
        PlaceholderRunner(num_slots=1, num_blocks=2, block_size=4).forward([chunk([1, 2, 3, 4, 5], table=[0])])


# ---------------------------------------------------------------- the two-pass fallback
@pytest.mark.parametrize("offsets,lengths", [((1,), [1, 3]), ((3,), [3, 1]), ((1, 2, 3), [1, 1, 1, 1])])
def test_cut_accepts_offsets_strictly_inside_the_row(offsets, lengths):
    segments = cut_at_captures(chunk([1, 2, 3, 4], start=8, table=[0, 1, 2], captures=offsets))
    assert [s.num_tokens for s in segments] == lengths
    assert [s.start_pos for s in segments] == [8 + a for a in (0, *offsets)]
    assert all(s.capture_offsets == () for s in segments)


# n = 4: 0 and 4 are not inside; (2, 2) and (3, 1) are not strictly increasing; 2.0 is not an int
@pytest.mark.parametrize("offsets", [(0,), (4,), (2, 2), (3, 1), (2.0,)])
def test_cut_rejects_offsets_outside_the_row_or_out_of_order(offsets):
    with pytest.raises(ValueError, match="^capture_offsets: "):
        cut_at_captures(chunk([1, 2, 3, 4], captures=offsets))


def test_run_in_passes_rejects_no_rows():
    with pytest.raises(ValueError, match="^rows: "):
        run_in_passes(PlaceholderRunner(1, 1, 4), [])


def test_two_passes_give_what_one_in_pass_forward_gives():
    # Row 0 captures at 1 and 3 of 4 tokens (3 segments), row 1 none: 1 + 2 = 3 passes; row 0 gets
    # 2 states, at positions 1 and 3, row 1 none.
    rows = [chunk([1, 2, 3, 4], table=[0], slot=0, captures=(1, 3)), chunk([7, 8], table=[1], slot=1)]
    in_pass = PlaceholderRunner(num_slots=2, num_blocks=2, block_size=4).forward(rows)
    two_pass_runner = PlaceholderRunner(num_slots=2, num_blocks=2, block_size=4)
    out, passes = run_in_passes(two_pass_runner, rows)
    assert passes == 3
    assert [len(c) for c in out.captured] == [2, 0]
    assert [s.position for s in out.captured[0]] == [1, 3]
    assert out.captured == in_pass.captured
    assert all(torch.equal(a, b) for a, b in zip(out.logits, in_pass.logits))
    assert two_pass_runner.read_state(0).position == 4


# ---------------------------------------------------------------- the engine loop
def test_run_until_done_stops_after_max_ticks():
    # Prompt 16 in one chunk, 5 tokens: tick 1 samples the first, ticks 2..5 decode. Two ticks: two
    # forwards, two tokens, nothing finished; the rest runs to the end (3 more ticks).
    eng = engine()
    req = eng.add_request(list(range(16)), max_new_tokens=5)
    assert eng.run_until_done(max_ticks=2) == []
    assert (eng.forward_passes, len(req.output_token_ids)) == (2, 2)
    assert eng.run_until_done() == [req]
    assert eng.forward_passes == 5


def test_first_token_time_is_the_tick_that_sampled_it():
    # Clock 0 at arrival, then one reading per tick. Prompt 32 at budget 16: tick 1 (clock 1) a
    # chunk, no token; tick 2 (clock 2) the last chunk samples token 1; tick 3 (clock 3) token 2, done.
    eng = engine(prefill_budget=16, clock=itertools.count().__next__)
    req = eng.add_request(list(range(32)), max_new_tokens=2)
    eng.run_until_done()
    m = req.metrics
    assert m.chunk_ends == [16, 32]
    assert (m.arrival_s, m.first_token_s, m.finish_s) == (0, 2, 3)


def test_prompt_logits_kept_only_when_asked_and_only_the_prompts():
    # Default off: nothing kept, even across a multi-chunk prompt.
    eng = engine(prefill_budget=16)
    eng.add_request(list(range(32)), max_new_tokens=2, request_id="r")
    eng.run_until_done()
    assert eng.prompt_logits == {}
    # Prompt [5]: hash 6, one-hot at 6, first token 6; decode of 6: 6 * 1_000_003 + 7 = 6_000_025,
    # mod 64 = 25 (64 * 93_750 = 6_000_000). The kept logits are the prompt's (at 6), not the reply's.
    eng = engine(keep_prompt_logits=True)
    req = eng.add_request([5], max_new_tokens=3, request_id="r")
    eng.run_until_done()
    assert req.output_token_ids[:2] == [6, 25]
    assert int(torch.argmax(eng.prompt_logits["r"])) == 6


@pytest.mark.parametrize("settings,each", [({}, MIB), ({"snapshot_nbytes": 1000}, 1000)])
def test_snapshot_bytes_add_up_each_saved_state(settings, each):
    # Aligned, block 16, prompt 100: its one save is the tail capture one block below the last
    # boundary under the prompt end, 96 - 16 = 80 (no decode states). One snapshot of `each` bytes.
    eng = engine(**settings)
    req = eng.add_request(list(range(1000, 1100)), max_new_tokens=1)
    eng.run_until_done()
    assert req.metrics.snapshot_positions == [80]
    assert req.metrics.snapshot_bytes == each


@pytest.mark.parametrize("grid,ok", [(0, True), (16, True), (32, True), (8, False), (24, False), (-16, False)])
def test_decode_snapshot_grid_is_zero_or_a_multiple_of_the_block(grid, ok):
    make = lambda: EngineConfig(SchedulerConfig(block_size=16), decode_snapshot_grid=grid)  # noqa: E731
    if ok:
        assert make().decode_snapshot_grid == grid
    else:
        with pytest.raises(ValueError, match="^decode_snapshot_grid: "):
            make()


def test_to_chunk_converts_a_scheduled_row():
    eng = engine()
    req = eng.add_request([7, 8, 9], max_new_tokens=1)
    (row,) = eng.scheduler.schedule().rows
    c = to_chunk(row)
    assert c.token_ids.tolist() == [7, 8, 9] and c.token_ids.dtype == torch.long
    assert (c.start_pos, c.block_table, c.state_slot, c.capture_offsets) == (0, req.lease.block_ids, req.slot, ())


class CountingModel:
    """Stands in for `HybridLM.forward_batch` (the real one's first build costs 1.5 s of torch's lazy
    imports): one zero logit row per row. `ModelRunner`'s count does not read the logits."""

    def forward_batch(self, rows, cache):
        return BatchOutput([torch.zeros(4) for _ in rows], [[] for _ in rows])


def test_model_runner_counts_the_tokens_it_ran():
    # Forward 1: rows of 3 and 1 tokens; forward 2: one row of 5. 3 + 1 + 5 = 9 tokens.
    runner = ModelRunner(CountingModel(), cache=None)
    runner.forward([chunk([1, 2, 3]), chunk([4], slot=1)])
    assert runner.tokens_run == 4
    runner.forward([chunk([5, 6, 7, 8, 9], table=[0, 1])])
    assert runner.tokens_run == 9


# ---------------------------------------------------------------- model/engine/settings.py: a policy's defaults
def test_vllm_junction_decode_grid_is_its_state_block_or_else_the_kv_block():
    # vllm-junction: KV block 16, states on vLLM's padded block (528 at Bamba-9B, a multiple of 16),
    # decode states on the state block (policy decode_grid "state"); an explicit state_block 0 means
    # "the KV block", so the grid falls back to 16.
    shape = ModelShape(vllm_block=528, kernel_chunk=256)
    out = resolve_settings(shape, policy="vllm-junction", block_size=16)
    assert (out["block_size"], out["state_block"], out["decode_snapshot_grid"]) == (16, 528, 528)
    out = resolve_settings(shape, policy="vllm-junction", block_size=16, state_block=0)
    assert (out["state_block"], out["decode_snapshot_grid"]) == (0, 16)


def test_settings_checks_take_the_smallest_value_and_refuse_the_next():
    # block_size, vllm_block and kernel_chunk are token counts: an int >= 1.
    assert resolve_settings(None, policy="aligned", block_size=1)["block_size"] == 1
    for bad in (0, "16", 16.0):
        with pytest.raises(ValueError, match="^block_size"):
            resolve_settings(None, policy="aligned", block_size=bad)
    assert ModelShape(1, 1) == ModelShape(vllm_block=1, kernel_chunk=1)
    for field, args in (("vllm_block", (0, 256)), ("kernel_chunk", (528, 0)), ("vllm_block", (528.0, 256))):
        with pytest.raises(ValueError, match=f"^{field}"):
            ModelShape(*args)
    with pytest.raises(dataclasses.FrozenInstanceError):  # a shape is a value the settings are derived from
        ModelShape(528, 256).vllm_block = 16


def test_engine_config_alone_keeps_no_decode_states():
    # Decode-time states are a policy's choice (`resolve_settings` fills them in for every engine
    # built through `Engine.for_*`); a bare EngineConfig, as the seed's engine, keeps none.
    assert EngineConfig().decode_snapshots is False and EngineConfig().decode_snapshot_grid == 0
    assert EngineConfig().keep_prompt_logits is False
