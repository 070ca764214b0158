"""The placement x eviction factorial (experiments/traces/factorial.py): which points it runs, the
per-cell verdict, that a run writes its files and resumes, and its bad inputs."""

import json

import pytest

from experiments.common import outputs
from experiments.traces import factorial


class Args:
    policy = ["marconi", "ours-plus"]
    eviction = ["lru", "shadow_best"]
    budget_gb = [0.25, 4.0]
    host_gb = [0.0, 256.0]


def test_every_pair_in_every_cell_then_the_optimum_per_cell():
    pts = factorial.points(Args)
    # marconi's own eviction (flop_aware) joins the listed two; ours-plus's (shadow_best) is listed
    assert len(pts) == (2 * 2 + 1) * 4 + 4 + 1  # pairs x cells, one optimum per cell, ours-plus unbounded
    assert sum(p["eviction"] == "flop_aware" for p in pts) == 4
    assert {(p["budget_gb"], p["host_gb"]) for p in pts[:-1]} == {(0.25, 0.0), (4.0, 0.0), (0.25, 256.0),
                                                                  (4.0, 256.0)}
    assert [p["policy"] for p in pts[-5:-1]] == ["optimum"] * 4 and len({factorial.key(p) for p in pts}) == len(pts)
    assert pts[-1] == {"policy": "ours-plus", "eviction": "shadow_best", "budget_gb": None, "host_gb": 0.0}


def row(policy, eviction, tokens, budget=0.25, host=0.0):
    return {"policy": policy, "eviction": eviction, "budget_gb": budget, "host_gb": host, "ssm_hit_tokens": tokens}


def test_the_verdict_compares_ours_plus_own_eviction_with_the_best_other_pair():
    class One(Args):
        budget_gb, host_gb = [0.25], [0.0]

    rows = [row("ours-plus", "shadow_best", 900), row("ours-plus", "lru", 1000), row("marconi", "lru", 950),
            row("marconi", "learned_value", 10), row("optimum", "next_use", 2000)]
    (v,) = factorial.verdicts(rows, One)
    # ours-plus's own eviction is shadow_best (900); the best other pair is its own placement with lru
    assert (v["ours_plus"], v["best_other"], v["best_other_tokens"]) == (900, "ours-plus+lru", 1000)
    assert v["ratio"] == pytest.approx(0.9) and not v["wins"] and v["optimum"] == 2000
    # against other placements only, the best is marconi+lru (950), not ours-plus+lru
    assert v["best_other_placement"] == "marconi+lru" and v["ratio_other_placement"] == pytest.approx(900 / 950)
    rows[0]["ssm_hit_tokens"] = 1000  # a tie counts as a win: at least as many
    assert factorial.verdicts(rows, One)[0]["wins"]
    assert v["of_unbounded"] is None  # no unbounded run among the rows


def test_the_host_goal_reads_ours_plus_against_its_own_unbounded_run():
    class Two(Args):
        budget_gb, host_gb = [4.0], [0.0, 256.0]

    rows = [dict(row("ours-plus", "shadow_best", 900, 4.0, 0.0), ttft_s_p50=3.0),
            dict(row("ours-plus", "shadow_best", 1940, 4.0, 256.0), ttft_s_p50=2.1),
            dict(row("marconi", "lru", 800, 4.0, 0.0), ttft_s_p50=1.0),  # a peer, not the reference
            dict(row("marconi", "lru", 1000, 4.0, 256.0), ttft_s_p50=1.0),
            dict(row("ours-plus", "lru", 5000, None, 0.0), ttft_s_p50=0.5),  # unbounded, not ours-plus's own eviction
            dict(row("ours-plus", "shadow_best", 2000, None, 0.0), ttft_s_p50=2.0)]
    no_host, host = factorial.verdicts(rows, Two)
    assert host["of_unbounded"] == pytest.approx(0.97) and host["ttft_p50_over_unbounded"] == pytest.approx(1.05)
    assert no_host["of_unbounded"] == pytest.approx(0.45) and no_host["ttft_p50_over_unbounded"] == pytest.approx(1.5)


def test_a_small_run_writes_its_files_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    out = tmp_path / "f"
    argv = ["--trace", "synthetic", "--limit", "40", "--policy", "marconi,ours-plus", "--eviction", "lru,seglen",
            "--budget-gb", "0.2", "--host-gb", "0,64", "--jobs", "1", "--out", str(out)]
    assert factorial.main(argv) == 0
    data = json.loads((out / "factorial.json").read_text())
    # 2 placements x 2 evictions, + each placement's own (marconi flop_aware, ours-plus shadow_best), x 2 cells
    assert len(data["rows"]) == (2 * 2 + 2) * 2 + 2 + 1 and data["simulated"] is True
    assert {(v["budget_gb"], v["host_gb"]) for v in data["verdicts"]} == {(0.2, 0.0), (0.2, 64.0)}
    assert all((out / name).is_file() for name in ("factorial.csv", "factorial.md", "factorial.png", "points.jsonl"))
    assert [r["budget_gb"] for r in data["rows"]].count(None) == 1 and "ours-plus unbounded:" in (
        out / "factorial.md").read_text()
    tiered = [r for r in data["rows"] if r["host_gb"] == 64.0 and r["policy"] != "optimum"]
    assert all(r["snapshots_evicted"] == 0 for r in tiered)  # 64 GB of host holds every demoted snapshot
    lines = (out / "points.jsonl").read_text().splitlines()
    (out / "points.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])  # killed mid-line
    assert factorial.main(argv + ["--resume"]) == 0
    again = json.loads((out / "factorial.json").read_text())
    assert [r["ssm_hit_tokens"] for r in again["rows"]] == [r["ssm_hit_tokens"] for r in data["rows"]]


@pytest.mark.parametrize("argv, flag", [
    (["--resume"], "--resume"),
    (["--budget-gb", "0"], "--budget-gb"),
    (["--host-gb", "-1"], "--host-gb"),
    (["--eviction", "fifo"], "--eviction"),
    (["--policy", "optimum"], "--policy"),
    (["--jobs", "0"], "--jobs"),
])
def test_bad_inputs_are_one_line(tmp_path, capsys, monkeypatch, argv, flag):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    with pytest.raises(SystemExit) as exc:
        factorial.main(["--trace", "synthetic", "--limit", "5", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and f"argument {flag}" in err.strip().splitlines()[-1]
    assert not (tmp_path / "runs").exists()


def test_a_window_of_the_trace():
    """`--start N` with `--limit M`: requests N .. N + M - 1 of the trace, as the whole trace numbers them."""
    from experiments.traces.sweep import load_requests

    whole = load_requests("mooncake-conversation", "chains", 30)
    window = load_requests("mooncake-conversation", "chains", 10, None, 20)
    assert [r.index for r in window] == list(range(20, 30))
    assert [(r.prompt_len, r.parent) for r in window] == [(r.prompt_len, r.parent) for r in whole[20:]]
    assert window[0].prompt_ids() == whole[20].prompt_ids()  # a continuation keeps its ancestors' tokens
    assert load_requests("mooncake-conversation", "chains", None, None, 12031 - 3)[0].index == 12028


def test_a_resume_of_another_study_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    out = tmp_path / "f"
    argv = ["--trace", "synthetic", "--limit", "20", "--policy", "ours-plus", "--eviction", "lru", "--budget-gb", "0.2",
            "--host-gb", "0", "--jobs", "1", "--out", str(out)]
    assert factorial.main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for other in (["--limit", "21"], ["--start", "3"], ["--reading", "as-given"]):
        with pytest.raises(SystemExit) as exc:
            factorial.main([*argv, "--resume", *other])
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert exc.value.code == 2 and "argument --resume" in last and "another study" in last, other
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert factorial.main([*argv, "--resume", "--eviction", "lru,seglen"]) == 0  # more evictions: the same study
    assert {r["eviction"] for r in json.loads((out / "factorial.json").read_text())["rows"]} >= {"lru", "seglen"}
