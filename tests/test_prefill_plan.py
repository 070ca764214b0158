"""The seed's prefill_plan semantics (BRIEF section 2), the legacy policy, and their properties."""

import pytest
from hypothesis import given, settings, strategies as st

from planner.policies.aligned import (
    check_interval,
    is_checkpoint_chunk_end,
    is_prompt_tail_end,
    last_block_boundary,
    last_chunk_capture_offsets,
    plan_chunk_len,
    tail_split_point,
)
from planner.policies.legacy import plan_chunk_len_legacy
from planner.policies.registry import POLICIES, get_policy
from planner.prefill_plan import plan_chunk, plan_prompt

INCIDENT = dict(total=32772, block_size=16)


def dense_serve_budget(prefill_budget=8192, max_batch_size=1):
    """A lone request: the first chunk gets budget + 1 slot, later chunks budget (the slot is held)."""
    return lambda i: prefill_budget + max_batch_size if i == 0 else prefill_budget + max_batch_size - 1


# ---------------------------------------------------------------- the four functions, by example
@pytest.mark.parametrize(
    "total,bs,last,split",
    [(32772, 16, 32768, 32752), (32768, 16, 32752, 32736), (17, 16, 16, None), (33, 16, 32, 16),
     (32, 16, 16, None), (16, 16, 0, None), (1, 1, 0, None), (3, 1, 2, 1), (100, 7, 98, 91)],
    ids=lambda v: str(v),
)
def test_tail_split_point(total, bs, last, split):
    assert last_block_boundary(total, bs) == last
    assert tail_split_point(total, bs) == split


def test_is_prompt_tail_end():
    assert is_prompt_tail_end(32768, **INCIDENT) and is_prompt_tail_end(32752, **INCIDENT)
    for end in (0, 16, 32736, 32769, 32771, 32772, 24577):
        assert not is_prompt_tail_end(end, **INCIDENT), end
    assert not is_prompt_tail_end(0, 16, 16)  # last boundary 0 is never a checkpoint


def test_is_checkpoint_chunk_end():
    total, bs = 32772, 16
    assert is_checkpoint_chunk_end(32752, total, bs, 0)  # tail ends checkpoint with intervals off
    assert not is_checkpoint_chunk_end(8192, total, bs, 0)
    assert is_checkpoint_chunk_end(8192, total, bs, 512)  # block 512 = 1 * 512
    assert is_checkpoint_chunk_end(16384, total, bs, 512)
    assert not is_checkpoint_chunk_end(8192 + 16, total, bs, 512)
    assert not is_checkpoint_chunk_end(8193, total, bs, 1)  # not a block boundary
    assert is_checkpoint_chunk_end(16, total, bs, 1)
    assert not is_checkpoint_chunk_end(0, total, bs, 1)  # block 0 never checkpoints


def test_plan_chunk_len_examples():
    total, bs = 32772, 16
    assert plan_chunk_len(0, total, 8193, bs) == 8192  # floored to a boundary
    assert plan_chunk_len(24576, total, 8192, bs) == 32752 - 24576  # ends at the split point
    assert plan_chunk_len(32752, total, 20, bs) == 20  # last chunk unchanged
    assert plan_chunk_len(32769, total, 3, bs) == 3
    assert plan_chunk_len(5, total, 3, bs) == 3  # flooring would leave nothing: proposed
    assert plan_chunk_len(5, total, 30, bs) == 27  # 5 + 30 = 35 -> 32
    assert plan_chunk_len(0, 100, 100, bs) == 100  # a lone last chunk spanning the split point


def test_legacy_keeps_proposed():
    assert plan_chunk_len_legacy(0, 32772, 8193, 16) == 8193
    assert plan_chunk_len_legacy(24577, 32772, 8192, 16) == 8192


@pytest.mark.parametrize(
    "policy,ends,snapshots",
    [("legacy", [8193, 16385, 24577, 32769, 32772], [8193, 16385, 24577, 32769]),
     ("aligned", [8192, 16384, 24576, 32752, 32772], [32752])],
)
def test_incident_chunk_ends(policy, ends, snapshots):
    plans = plan_prompt(32772, 16, dense_serve_budget(), interval=0, policy=policy)
    assert [p.end for p in plans] == ends
    assert sorted(pos for p in plans for pos in p.snapshot_positions) == snapshots


def test_last_chunk_captures_the_split_point():
    plan = plan_chunk(0, 1000, 1000, 16, 0, POLICIES["aligned"])  # one chunk shorter than the budget
    assert plan.is_last and plan.capture_offsets == (tail_split_point(1000, 16),) == (976,)
    assert plan.snapshot_positions == (976,)
    assert last_chunk_capture_offsets(976, 24, 1000, 16) == ()  # starts at the split: nothing inside
    assert plan_chunk(0, 1000, 1000, 16, 0, POLICIES["legacy"]).capture_offsets == (976,)  # the old dispatch did this too


# ---------------------------------------------------------------- argument errors
@pytest.mark.parametrize(
    "args,name",
    [((0, 10, 5, 0), "block_size"), ((-1, 10, 5, 4), "offset"), ((10, 10, 1, 4), "offset"),
     ((0, 10, 0, 4), "proposed"), ((3, 10, 8, 4), "proposed"), ((0, 0, 1, 4), "total")],
    ids=["block_size", "offset_neg", "offset_total", "proposed_zero", "proposed_past_end", "total_zero"],
)
@pytest.mark.parametrize("fn", [plan_chunk_len, plan_chunk_len_legacy])
def test_plan_chunk_len_bad_arguments(fn, args, name):
    with pytest.raises(ValueError, match=name):
        fn(*args)


def test_bad_interval_and_policy():
    with pytest.raises(ValueError, match="interval"):
        is_checkpoint_chunk_end(16, 100, 16, -1)
    with pytest.raises(ValueError, match="interval"):
        plan_chunk(0, 100, 10, 16, -1, POLICIES["aligned"])
    with pytest.raises(ValueError, match="policy"):
        get_policy("greedy")
    # the planner takes the policy object only: a name is resolved once, where the engine is built
    with pytest.raises(ValueError, match="^policy: must be a PlacementPolicy .*got 'aligned'"):
        plan_chunk(0, 100, 10, 16, 0, "aligned")
    with pytest.raises(ValueError, match="^snapshot_interval_blocks: must be >= 0 blocks"):
        check_interval(-1, "snapshot_interval_blocks")
    check_interval(0)
    assert get_policy(POLICIES["legacy"]) is get_policy("legacy") is POLICIES["legacy"]
    with pytest.raises(ValueError, match="block_size"):
        tail_split_point(100, 0)


# ---------------------------------------------------------------- properties
chunk_args = st.integers(1, 64).flatmap(
    lambda bs: st.integers(1, 4000).flatmap(
        lambda total: st.integers(0, total - 1).flatmap(
            lambda offset: st.tuples(st.just(offset), st.just(total), st.integers(1, total - offset), st.just(bs)))))


@given(chunk_args)
@settings(max_examples=400, deadline=None)
def test_plan_length_in_range_and_last_unchanged(args):
    offset, total, proposed, bs = args
    n = plan_chunk_len(*args)
    assert 1 <= n <= proposed
    if offset + proposed >= total:
        assert n == proposed
    end, split = offset + n, tail_split_point(total, bs)
    if end < total and proposed >= bs:  # with a budget of a block or more, non-last ends are aligned
        assert end % bs == 0 or end == split
    if end < total and split is not None and offset < split:
        assert end <= split  # a non-last chunk never steps over the split point


@given(st.integers(1, 64), st.integers(2, 5000), st.integers(1, 3000), st.integers(0, 8), st.randoms())
@settings(max_examples=300, deadline=None)
def test_every_prompt_with_a_split_point_gets_a_tail_snapshot(bs, total, budget, interval, rnd):
    """Under aligned, the split point is a non-last chunk end with a snapshot or an in-chunk capture."""
    budgets = lambda i: max(1, budget + rnd.randint(-budget // 2, budget // 2))
    plans = plan_prompt(total, bs, budgets, interval, "aligned")
    assert plans[-1].end == total and all(a.end == b.offset for a, b in zip(plans, plans[1:]))
    split = tail_split_point(total, bs)
    saved = {pos for p in plans for pos in p.snapshot_positions}
    if split is not None:
        assert split in saved
    for p in plans[:-1]:
        assert p.snapshot_at_end == is_checkpoint_chunk_end(p.end, total, bs, interval)
    assert all(0 < pos < total for pos in saved)
