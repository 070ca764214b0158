"""The evaluation protocol: which windows are train, seen and test (experiments/traces/windows.py),
the ratios and spread the held-out command reports (experiments/traces/heldout.py), its run, its
resume and its bad inputs. Expected windows are worked out by hand from the rule in windows.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.traces import heldout, windows
from experiments.traces.windows import Window

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = "mooncake-conversation"


def test_free_stretches_skip_every_taken_window_overlapping_ones_merged():
    taken = [Window("t", 0, 1000, "train"), Window("t", 25, 1075, "seen"), Window("t", 2000, 1000, "seen"),
             Window("t", 5000, 1000, "train")]
    # 0-999 and 25-1,099 merge: free 1,100-1,999, 3,000-4,999, 6,000-12,030
    assert windows.free_stretches(12031, taken) == [(1100, 2000), (3000, 5000), (6000, 12031)]
    assert windows.free_stretches(10, []) == [(0, 10)]
    assert windows.free_stretches(10, [Window("t", 0, 10, "train")]) == []


def test_adjacent_windows_do_not_overlap():
    a, b = Window("t", 0, 1000, "test"), Window("t", 1000, 1000, "test")
    assert not a.overlaps(b) and not b.overlaps(a) and a.overlaps(Window("t", 999, 5, "test"))


def test_mooncake_test_windows_tile_the_untouched_stretches():
    """1,100-1,999 holds no 1,000 window; 3,000-4,999 exactly two (no slack); 6,000-12,030 six with a
    slack of 31 requests put before the first at one seeded offset."""
    tests = windows.held_out(MOONCAKE, 12031)
    starts = [w.start for w in tests]
    assert starts[:2] == [3000, 4000]
    offset = starts[2] - 6000
    assert 0 <= offset <= 31 and starts[2:] == [6000 + offset + 1000 * k for k in range(6)]
    # the offset is the generator's first draw: the first stretch with room has no slack, so it
    # draws integers(0, 1), then this one integers(0, 32)
    rng = np.random.default_rng(windows.TEST_SEED)
    rng.integers(0, 1)
    assert offset == int(rng.integers(0, 32))
    taken = windows.excluded(MOONCAKE)
    assert all(not t.overlaps(x) for t in tests for x in taken)
    assert all(not a.overlaps(b) for i, a in enumerate(tests) for b in tests[i + 1:])
    assert all(w.split == "test" and w.limit == 1000 and w.end <= 12031 for w in tests)


def test_a_count_draws_one_window_per_consecutive_group():
    taken = ()
    tiles = windows.held_out("t", 8000, 1000, taken=taken)  # 8 tiles, no slack: 0, 1000, ..., 7000
    assert [w.start for w in tiles] == [1000 * k for k in range(8)]
    picked = windows.held_out("t", 8000, 1000, count=3, taken=taken)
    groups = [(0, 1000, 2000), (3000, 4000, 5000), (6000, 7000)]  # np.array_split(8 into 3): 3, 3, 2
    assert [w.start in g for w, g in zip(picked, groups)] == [True, True, True] and len(picked) == 3
    assert windows.held_out("t", 8000, 1000, count=3, taken=taken) == picked  # the seed fixes them
    draws = {tuple(w.start for w in windows.held_out("t", 8000, 1000, count=3, seed=s, taken=taken))
             for s in range(20)}
    assert len(draws) > 1  # the seed is used
    assert windows.held_out("t", 8000, 1000, count=20, taken=taken) == tiles  # more asked than fit: all


def test_the_protocol_lists_train_then_test_then_whole_and_never_tests_on_train():
    got = windows.protocol(MOONCAKE, 12031, whole=True)
    assert [w.split for w in got[:2]] == ["train", "train"] and got[-1] == Window(MOONCAKE, 0, 12031, "whole",
                                                                                   got[-1].why)
    assert {(w.start, w.limit) for w in got if w.split == "train"} == {(0, 1000), (5000, 1000)}
    tests = [w for w in got if w.split == "test"]
    assert len(tests) == 8 and all(not t.overlaps(x) for t in tests for x in windows.excluded(MOONCAKE))
    sharegpt = windows.protocol("sharegpt", 20000, count=6)
    assert all(w.start >= 5000 for w in sharegpt if w.split == "test")  # 0-4,999 train or seen
    with pytest.raises(ValueError, match="total"):
        windows.protocol(MOONCAKE, 5500)  # the 5,000-5,999 train window runs past it


def test_the_train_windows_are_the_windows_of_the_train_records():
    for folder, start in (("factorial-mooncake-1000", 0), ("factorial-mooncake-5000-1000", 5000)):
        config = json.loads((REPO / "results/traces" / folder / "factorial.json").read_text())["config"]
        assert config["trace"] == MOONCAKE and (config.get("start") or 0) == start
        assert Window(MOONCAKE, start, config["limit"], "train") in [
            Window(w.trace, w.start, w.limit, "train") for w in windows.TRAIN[MOONCAKE]]


def test_the_peer_pairs_are_the_top_three_of_every_train_cell():
    """Re-derived from the two train records: the three best other-placement pairs of each
    device-only cell."""
    top = set()
    for folder in ("factorial-mooncake-1000", "factorial-mooncake-5000-1000"):
        rows = json.loads((REPO / "results/traces" / folder / "factorial.json").read_text())["rows"]
        for budget in (0.25, 4.0, 16.0, 64.0):
            cell = sorted((r for r in rows if r["budget_gb"] == budget and r["host_gb"] == 0
                           and r["policy"] not in ("optimum", "ours-plus")), key=lambda r: -r["ssm_hit_tokens"])
            assert len(cell) >= 3
            top |= {(r["policy"], r["eviction"]) for r in cell[:3]}
    assert top == set(heldout.PEERS)


def _row(policy, eviction, tokens, start=0, split="test", budget=4.0):
    return {"trace": "t", "reading": "chains", "start": start, "limit": 10, "split": split, "budget_gb": budget,
            "host_gb": 0.0, "tier": "device only", "policy": policy, "eviction": eviction, "ssm_hit_tokens": tokens}


def test_ratios_are_to_the_best_peer_of_the_same_window_and_a_peer_to_the_best_other():
    ours = [("ours-plus", "shadow_best")]
    rows = [_row("ours-plus", "shadow_best", 90), _row("marconi", "lru", 100), _row("trtllm", "seglen", 80),
            _row("ours-plus", "shadow_best", 300, start=10), _row("marconi", "lru", 200, start=10),
            _row("trtllm", "seglen", 250, start=10)]
    got = {(r["start"], r["policy"]): r for r in heldout.with_ratios(rows, ours)}
    assert got[0, "ours-plus"]["ratio_to_best_peer"] == pytest.approx(0.9) and got[0, "ours-plus"]["judged"]
    assert got[0, "ours-plus"]["best_peer"] == "marconi+lru"
    assert got[0, "marconi"]["ratio_to_best_peer"] == pytest.approx(100 / 80)  # not against ours-plus's 90
    assert got[0, "trtllm"]["ratio_to_best_peer"] == pytest.approx(80 / 100)
    assert got[10, "ours-plus"]["ratio_to_best_peer"] == pytest.approx(300 / 250)  # its own window's peers
    assert got[10, "ours-plus"]["best_peer"] == "trtllm+seglen"


def test_spread_counts_wins_and_gives_median_min_max_per_split():
    ours = [("ours-plus", "shadow_best")]
    rows = []
    for start, (o, p) in enumerate([(90, 100), (120, 100), (100, 100), (50, 100)]):  # ratios .9 1.2 1.0 .5
        rows += [_row("ours-plus", "shadow_best", o, start=start * 10), _row("marconi", "lru", p, start=start * 10),
                 _row("trtllm", "seglen", 1, start=start * 10)]
    rows += [_row("ours-plus", "shadow_best", 200, start=100, split="train"), _row("marconi", "lru", 100, start=100,
                                                                                  split="train")]
    spread = {(s["policy"], s["split"]): s for s in heldout.spread(heldout.with_ratios(rows, ours))}
    test = spread["ours-plus", "test"]
    assert (test["windows"], test["wins"]) == (4, 2)  # 1.2 and the tie 1.0
    assert test["ratio_median"] == pytest.approx(0.95) and test["ratio_min"] == pytest.approx(0.5)
    assert test["ratio_max"] == pytest.approx(1.2) and test["worst_window"] == "30-39"
    train = spread["ours-plus", "train"]
    assert (train["windows"], train["wins"], train["ratio_median"]) == (1, 1, pytest.approx(2.0))


def test_pair_list_takes_a_placements_own_eviction_and_refuses_bad_names():
    import argparse

    assert heldout.pair_list("marconi,ours-plus+lru") == (("marconi", "flop_aware"), ("ours-plus", "lru"))
    for bad in ("nope", "marconi+nope", "optimum", "marconi,marconi+flop_aware", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            heldout.pair_list(bad)


SMALL = ["--trace", "synthetic", "--width", "40", "--test-windows", "1", "--peers", "marconi+lru",
         "--budget-gb", "0.25"]


def test_a_run_writes_its_rows_and_resumes_without_rerunning(tmp_path, monkeypatch):
    out = tmp_path / "o"
    assert heldout.main([*SMALL, "--out", str(out)]) == 0
    data = json.loads((out / "heldout.json").read_text())
    rows = data["rows"]
    assert {(r["policy"], r["eviction"]) for r in rows} == {("ours-plus", "shadow_best"), ("marconi", "lru")}
    assert {r["split"] for r in rows} == {"test"} and all(r["limit"] == 40 for r in rows)
    for col in ("trace", "reading", "start", "limit", "split", "budget_gb", "tier", "policy", "eviction",
                "ssm_hit_tokens", "ratio_to_best_peer", "best_peer"):
        assert all(col in r for r in rows), col
    assert (out / "heldout.png").is_file() and "| 0.25 GB, device only |" in (out / "heldout.md").read_text()
    # a resume with one more pair runs only that pair's point
    ran = []
    real = heldout.measure
    monkeypatch.setattr(heldout, "measure", lambda p, b: ran.append(heldout.key(p)) or real(p, b))
    assert heldout.main([*SMALL[:-4], "--peers", "marconi+lru,trtllm+seglen", "--budget-gb", "0.25",
                         "--out", str(out), "--resume"]) == 0
    assert [k[6:] for k in ran] == [("trtllm", "seglen")]
    assert len(json.loads((out / "heldout.json").read_text())["rows"]) == 3


@pytest.mark.parametrize("argv, names", [
    (["--ours", "nope"], "--ours"),
    (["--peers", "ours-plus+shadow_best"], "--peers"),
    (["--trace", "synthetic", "--width", "5000"], "--width"),
    (["--resume"], "--resume"),
    (["--budget-gb", "0"], "--budget-gb"),
])
def test_bad_input_is_one_usage_line_naming_the_flag(argv, names, capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        heldout.main([*argv, "--out", str(tmp_path / "o")] if "--resume" not in argv else argv)
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert names in last and "Traceback" not in last
    assert not (tmp_path / "o").exists()


def test_replot_of_a_broken_record_names_the_file(tmp_path, capsys):
    (tmp_path / "heldout.json").write_text(json.dumps({"config": {}, "rows": [{}]}))
    with pytest.raises(SystemExit) as err:
        heldout.main(["--replot", "--out", str(tmp_path)])
    assert err.value.code == 2 and "heldout.json" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_resume_into_another_studys_folder_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    (tmp_path / "heldout.json").write_text(json.dumps({"config": {"trace": "mooncake-conversation"}}))
    monkeypatch.setattr(heldout, "measure", lambda p, b: pytest.fail("ran a point"))
    with pytest.raises(SystemExit) as err:
        heldout.main([*SMALL, "--out", str(tmp_path), "--resume"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.value.code == 2 and "--resume" in last and "trace='mooncake-conversation' there" in last
