"""The snapshot-placement dynamic program against brute force over every subset."""

import itertools
import random

import pytest

from planner.snapshot_dp import best_snapshots, restored_tokens


def brute_force(depths, weights, m):
    best = 0.0
    for r in range(1, min(m, len(depths)) + 1):
        for subset in itertools.combinations(depths, r):
            best = max(best, restored_tokens(depths, weights, subset))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_on_random_instances(seed):
    rng = random.Random(seed)
    k = rng.randint(1, 8)
    depths = rng.sample(range(16, 16 * 200, 16), k)
    weights = [rng.choice([1, 1, 1, 2, 5, 40]) for _ in depths]
    for m in range(0, k + 2):
        value, positions = best_snapshots(depths, weights, m)
        assert value == pytest.approx(brute_force(depths, weights, m))
        assert len(positions) <= m and positions == sorted(positions) and set(positions) <= set(depths)
        assert restored_tokens(depths, weights, positions) == pytest.approx(value)  # the placement achieves it


def test_hand_worked_instance():
    # depths 512 (800 requests), 4096 (1), 4608 (1), 20000 (2): one snapshot is best at 512
    # (800*512 + 4*512 = 411,648 > 4*4096 or 2*20000 + ...), two add 20000 (+ 2*(20000-512))
    depths, weights = [4096, 512, 20000, 4608], [1, 800, 2, 1]
    assert best_snapshots(depths, weights, 1) == (pytest.approx(411_648), [512])
    assert best_snapshots(depths, weights, 2) == (pytest.approx(411_648 + 2 * 19_488), [512, 20000])
    value, positions = best_snapshots(depths, weights, 10)  # as many as depths: every match restored
    assert positions == [512, 4096, 4608, 20000] and value == pytest.approx(800 * 512 + 4096 + 4608 + 40000)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"^m: must be >= 0, got -1"):
        best_snapshots([16], [1], -1)
    with pytest.raises(ValueError, match=r"^weights: need one per depth"):
        best_snapshots([16, 32], [1], 1)
    with pytest.raises(ValueError, match=r"^depths: must be distinct"):
        best_snapshots([16, 16], [1, 1], 1)
    with pytest.raises(ValueError, match=r"^weights: must be > 0"):
        best_snapshots([16], [0], 1)


def test_snapshot_curve_on_a_synthetic_trace():
    from experiments.traces.snapshot_budget import curve, grid, uniform
    from experiments.workloads import open_workload

    assert uniform(100, 2, 16) == [48, 96] and grid(100, 32, 16) == [32, 64, 96]
    requests = tuple(open_workload("synthetic").requests(limit=40))
    rows = curve(requests, 16, ms=(1, 2), grids=(64,))
    by = {(r["placement"], r["m"]): r for r in rows}
    top = next(r for r in rows if r["placement"] == "dp-all")
    assert top["restored_share"] == 1.0 and top["matched_tokens"] > 0  # a snapshot at every depth
    for r in rows:  # nothing beats the optimum with as many snapshots per owner
        assert r["restored_tokens"] <= top["restored_tokens"]
    assert by[("dp", 1)]["restored_tokens"] >= by[("uniform", 1)]["restored_tokens"]
    if ("dp", 2) in by:
        assert by[("dp", 2)]["restored_tokens"] >= by[("uniform", 2)]["restored_tokens"]


def test_depths_must_be_positive_and_one_is_the_smallest():
    # A depth is a matched prefix length: 0 matches nothing (the check's message names `depths`).
    # At depths 1 and 16 (one request each) one snapshot restores the most at 16 (16 > 1 + 1).
    assert best_snapshots([1, 16], [1, 1], 1) == (pytest.approx(16.0), [16])
    with pytest.raises(ValueError, match="depths"):
        best_snapshots([0, 16], [1, 1], 1)
