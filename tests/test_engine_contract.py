"""The engine's public surface for a driver (`model/engine/engine.py` docstring) and the one
model-free runner (`model/engine/placeholder_runner.py` docstring).

Rules checked:
* the placeholder's vectorized hash (`prefix_hashes`, the closed form of the recurrence) equals the
  scalar `_roll` applied token by token, for any start state and token ids up to 2^31 - 2, and a
  prompt run in chunks and decode rows ends in the state of one row over it;
* `check_whole_prefix=True` re-hashes every KV position under a row, so a block overwritten below
  the row start fails; `False` checks only the position just below it (the trace simulator's
  O(row) check), so the same overwrite passes there;
* `Engine.add_request(forced_output_ids=...)`: output token k is forced_output_ids[k], past its end
  the engine takes the argmax, as it would on the prompt extended by the forced tokens;
  `snapshot_marks` leave "oracle" snapshots there; `arrival_s` overrides the clock's arrival;
* `Engine.step()` returns a `StepReport`: the requests admitted that tick, each row's request and
  state slot, the requests finished; `run_until_done()` returns the requests finished during that
  call, and the engine keeps no finished request.
"""

import random

import numpy as np
import pytest
import torch

from model.batch import SequenceChunk
from model.engine import Engine, PlaceholderRunner, StepReport
from model.engine.placeholder_runner import _MOD, PlaceholderState, _roll, prefix_hashes


def chunk(ids, start=0, table=(0,), slot=0, captures=(), kv_cached_len=0):
    return SequenceChunk(torch.tensor(ids, dtype=torch.long), start, list(table), slot, kv_cached_len, tuple(captures))


def engine(**settings):
    base = dict(block_size=16, prefill_budget=4096, max_batch_size=2, num_kv_blocks=64, policy="aligned")
    return Engine.for_placeholder(**{**base, **settings})


# ---------------------------------------------------------------- the runner
@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 5000])
def test_vectorized_hash_equals_the_scalar_roll(n):
    rng = random.Random(n)
    tokens = [rng.choice((0, 1, 63, _MOD - 2, rng.randrange(_MOD - 1))) for _ in range(n)]
    for h0 in (0, 1, _MOD - 1, rng.randrange(_MOD)):
        h, want = h0, []
        for t in tokens:
            h = _roll(h, t)
            want.append(h)
        assert prefix_hashes(h0, np.array(tokens, np.int64)).tolist() == want


def test_chunks_and_decode_rows_end_in_the_state_of_one_row():
    ids = list(range(100, 141))  # 41 tokens, block 4
    one = PlaceholderRunner(1, 16, 4)
    whole = one.forward([chunk(ids, table=range(11), captures=(5, 20))])
    h = 0
    for t in ids:
        h = _roll(h, t)
    assert one.read_state(0) == PlaceholderState(41, h, 1 << 20)
    h5 = 0
    for t in ids[:5]:
        h5 = _roll(h5, t)
    assert whole.captured[0][0] == PlaceholderState(5, h5, 1 << 20)
    parts = PlaceholderRunner(1, 16, 4, check_whole_prefix=False)
    parts.forward([chunk(ids[:16], table=range(11))])
    parts.forward([chunk(ids[16:40], start=16, table=range(11))])
    out = parts.forward([chunk(ids[40:], start=40, table=range(11))])  # a one-token row
    assert parts.read_state(0) == one.read_state(0) and torch.equal(out.logits[0], whole.logits[0])
    assert int(torch.argmax(out.logits[0])) == h % 64


@pytest.mark.parametrize("whole", [True, False])
def test_a_block_overwritten_below_the_row_start(whole):
    # Slot 0 ran 8 tokens into blocks 0 and 1; slot 1 then writes other tokens into block 0 (a
    # shared block handed out twice). Slot 0's next row starts at 8: the KV just below it (block 1)
    # is intact, block 0 is not.
    r = PlaceholderRunner(2, 4, 4, check_whole_prefix=whole)
    r.forward([chunk(range(8), table=[0, 1], slot=0)])
    r.forward([chunk([50, 51, 52, 53], table=[0], slot=1)])
    nxt = [chunk([8], start=8, table=[0, 1, 2], slot=0)]
    if whole:
        with pytest.raises(AssertionError, match="disagree at position 8"):
            r.forward(nxt)
    else:
        r.forward(nxt)  # the O(row) check sees only position 7
        assert r.read_state(0).position == 9


# ---------------------------------------------------------------- the engine's surface
def test_forced_output_then_the_argmax():
    eng = engine()
    req = eng.add_request([5, 6, 7], max_new_tokens=4, forced_output_ids=[40, 41])
    assert eng.run_until_done() == [req]
    assert req.output_token_ids[:2] == [40, 41]
    # past the forced tokens: the argmax, as on the prompt extended by them
    ref = engine()
    extended = ref.add_request([5, 6, 7, 40, 41], max_new_tokens=2)
    ref.run_until_done()
    assert req.output_token_ids[2:] == extended.output_token_ids
    h = 0
    for t in (5, 6, 7, 40, 41):
        h = _roll(h, t)
    assert req.output_token_ids[2] == h % 64


def test_a_forced_output_longer_than_the_request_is_cut_and_identical_requests_agree():
    eng = engine()
    a = eng.add_request(list(range(30)), max_new_tokens=3, forced_output_ids=[1, 2, 3, 4, 5])
    b = eng.add_request(list(range(30)), max_new_tokens=3, forced_output_ids=[1, 2, 3, 4, 5])
    eng.run_until_done()
    assert a.output_token_ids == b.output_token_ids == [1, 2, 3]


def test_snapshot_marks_and_arrival_time_through_add_request():
    eng = engine(clock=lambda: 100.0)
    req = eng.add_request(list(range(1000, 1100)), max_new_tokens=1, snapshot_marks=[40], arrival_s=3.0)
    eng.run_until_done()
    assert 40 in req.metrics.snapshot_positions and eng.snapshots.stats.saved_by_origin.get("oracle", 0) >= 1
    assert (req.metrics.arrival_s, req.metrics.first_token_s) == (3.0, 100.0)
    plain = engine().add_request([1, 2, 3])
    assert plain.metrics.arrival_s is not None


def test_step_reports_admissions_rows_and_finishes():
    eng = engine(prefill_budget=16)
    assert not eng.has_work
    a = eng.add_request(list(range(20)), max_new_tokens=1, request_id="a")  # two chunks: 16 + 4
    assert eng.has_work
    first = eng.step()
    assert isinstance(first, StepReport)
    assert first.admitted == (a,) and first.ran == ((a, 0),) and first.finished == () and first.preempted == ()
    b = eng.add_request(list(range(500, 504)), max_new_tokens=2, request_id="b")
    second = eng.step()  # a's last chunk (it finishes) and b admitted in slot 1
    assert second.admitted == (b,) and second.ran == ((a, 0), (b, 1)) and second.finished == (a,)
    assert eng.run_until_done() == [b] and not eng.has_work
    assert eng.run_until_done() == [] and eng.step() == StepReport()
    assert not hasattr(eng, "finished")  # the caller holds the requests: the engine keeps none
