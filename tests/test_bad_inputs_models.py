"""Bad inputs to the model-study entry points end in one usage line, before any work.

`warm_restore` (and `warm_restore_families`), `plan_incident`, `ablations`, `multiturn` and
`busy_load`: every case below must exit with code 2, print no traceback, name the flag or the
file in its last stderr line, and write nothing (no output folder, no run folder under runs/).
Each stops at the argument or file checks, so the whole file runs in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from experiments.ablations import study as ablations
from experiments.common import busy_load
from experiments.common import outputs
from experiments.plan_incident import study as plan_incident
from experiments.warm_restore import study as warm_restore
from experiments.warm_restore import families as warm_restore_families
from experiments.multiturn import cli as multiturn
from model.families import PRESETS, config_to_hf

MAINS = {"warm_restore": warm_restore.main, "families": warm_restore_families.main,
         "plan_incident": plan_incident.main, "ablations": ablations.main, "multiturn": multiturn.main,
         "busy_load": busy_load.main}
MT = ["--runner", "placeholder", "--quick"]  # multiturn without the model: the checks are the same


@pytest.fixture(autouse=True)
def no_runs(tmp_path, monkeypatch):
    """Default run folders go under tmp_path/runs; the test checks nothing was created there."""
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    yield
    assert not (tmp_path / "runs").exists()


def absent_cuda_device() -> str:
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


# ------------------------------------------------------------------------------------------ files
def a_file(t: Path) -> Path:
    f = t / "a_file"
    f.write_text("not a folder\n")
    return f


def ckpt_corrupt(t: Path) -> Path:
    folder = t / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_to_hf(PRESETS["tiny"])))
    (folder / "model.safetensors").write_bytes(b"\x00\x01 this is not a safetensors file " * 40)
    return folder


def ckpt_empty(t: Path) -> Path:
    (t / "ckpt").mkdir()
    return t / "ckpt"


def ckpt_bad_config(t: Path) -> Path:
    folder = t / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bamba", "hidden_size": ')
    return folder


def ckpt_no_weights(t: Path) -> Path:
    folder = t / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_to_hf(PRESETS["tiny"])))
    return folder


def folder_with(t: Path, name: str, text: str | None) -> Path:
    """`t/run` holding `name` with `text` (None: the folder alone)."""
    run = t / "run"
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    if text is not None:
        (run / name).write_text(text)
    return run


GOOD_WR = {"config": {"prompt_len": 260, "block_size": 4, "budget": 64, "repeats": 1, "backend": "torch",
                      "dtype": "float32", "device": "cpu", "threads": 1, "seed": 0, "policy": "aligned"},
           "environment": {}, "model": {}, "replay_curve": [], "replay_fit": {}, "warm_ttft_ratio_spread": {}}
PART_KEYS = ["name", "shard", "fingerprint", "points", "config", "environment", "done", "failed", "rows"]
BUDGET_CSV_HEADER = ",".join(ablations.PLOT_COLUMNS)
BUDGET_ROW = "legacy,identical,legacy,in_pass,260,4,64,0,67,193,0.1,0.5"
BUDGET_META = {"config": {"budgets": [64], "prompt_len": 260, "block_size": 4, "interval": 0, "preset": "tiny",
                          "dtype": "float32", "repeats": 1}, "environments": [{"device_name": "CPU"}]}


# ------------------------------------------------------------------------------------------ cases
# id -> (command, setup(tmp_path) -> (argv, text the last stderr line must contain))
CASES = {
    # warm_restore: sizes, names, devices, flags that go together
    "wr-prompt-len-below-21": ("warm_restore", lambda t: (["--prompt-len", "20"], "argument --prompt-len")),
    "wr-prompt-len-not-int": ("warm_restore", lambda t: (["--prompt-len", "abc"], "argument --prompt-len")),
    "wr-block-size-0": ("warm_restore", lambda t: (["--block-size", "0"], "argument --block-size")),
    "wr-prefill-budget-0": ("warm_restore", lambda t: (["--prefill-budget", "0"], "argument --prefill-budget")),
    "wr-budget-below-block": ("warm_restore", lambda t: (["--block-size", "16", "--prefill-budget", "8"],
                                                         "argument --prefill-budget: must be >= --block-size")),
    "wr-repeats-0": ("warm_restore", lambda t: (["--repeats", "0"], "argument --repeats")),
    "wr-curve-repeats-0": ("warm_restore", lambda t: (["--curve-repeats", "0"], "argument --curve-repeats")),
    "wr-interval-negative": ("warm_restore", lambda t: (["--interval", "-1"], "argument --interval")),
    "wr-threads-negative": ("warm_restore", lambda t: (["--threads", "-1"], "argument --threads")),
    "wr-seed-negative": ("warm_restore", lambda t: (["--seed", "-1"], "argument --seed")),
    "wr-model-unknown": ("warm_restore", lambda t: (["--model", "no-such-preset"], "argument --model")),
    "wr-model-empty-folder": ("warm_restore", lambda t: (["--model", str(ckpt_empty(t))], "config.json")),
    "wr-model-bad-config": ("warm_restore", lambda t: (["--model", str(ckpt_bad_config(t))], "config.json")),
    "wr-model-no-weights": ("warm_restore", lambda t: (["--model", str(ckpt_no_weights(t))], "model.safetensors")),
    "wr-model-corrupt-weights": ("warm_restore", lambda t: (["--model", str(ckpt_corrupt(t))],
                                                            "model.safetensors: not a readable safetensors file")),
    "wr-device-absent-cuda": ("warm_restore", lambda t: (["--device", absent_cuda_device()], "argument --device")),
    "wr-device-tpu": ("warm_restore", lambda t: (["--device", "tpu"], "argument --device")),
    "wr-backend-unknown": ("warm_restore", lambda t: (["--backend", "cuda"], "argument --backend")),
    "wr-dtype-float16": ("warm_restore", lambda t: (["--dtype", "float16"], "argument --dtype")),
    "wr-backend-unknown": ("warm_restore", lambda t: (["--backend", "cuda"], "argument --backend")),
    "wr-policy-legacy": ("warm_restore", lambda t: (["--policy", "legacy"], "argument --policy")),
    "wr-policy-list": ("warm_restore", lambda t: (["--policy", "aligned,sglang"], "argument --policy")),
    "wr-old-preset-flag": ("warm_restore", lambda t: (["--preset", "tiny"], "--preset")),
    "wr-old-budget-flag": ("warm_restore", lambda t: (["--budget", "64"], "--budget")),
    # warm_restore: where it writes
    "wr-out-under-a-file": ("warm_restore", lambda t: (["--out", str(a_file(t) / "sub")], "argument --out")),
    "wr-out-is-a-file": ("warm_restore", lambda t: (["--out", str(a_file(t))], "argument --out")),
    "wr-out-and-publish": ("warm_restore", lambda t: (["--out", str(t / "o"), "--publish"], "--publish")),
    # warm_restore --replot: what it reads
    "wr-replot-no-json": ("warm_restore", lambda t: (["--replot", "--out", str(folder_with(t, "x", None))],
                                                      "warm_restore.json: no such file")),
    "wr-replot-empty-json": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", ""))], "warm_restore.json: empty")),
    "wr-replot-truncated-json": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", json.dumps(GOOD_WR)[:60]))],
        "warm_restore.json: not valid JSON")),
    "wr-replot-json-list": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", "[1, 2]"))], "warm_restore.json: not a")),
    "wr-replot-json-no-policies": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", json.dumps(GOOD_WR)))],
        "warm_restore.json: not a warm_restore result JSON (no 'legacy'")),
    "wr-replot-json-policy-incomplete": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", json.dumps(
            GOOD_WR | {"legacy": {}, "aligned": {}, "warm_ttft_ratio_legacy_over_aligned": 1.0})))],
        "'legacy.chunk_ends'")),
    "wr-replot-values-do-not-draw": ("warm_restore", lambda t: (
        ["--replot", "--out", str(folder_with(t, "warm_restore.json", json.dumps(
            GOOD_WR | {p: {k: "x" for k in warm_restore.POLICY_KEYS} for p in ("legacy", "aligned")}
            | {"warm_ttft_ratio_legacy_over_aligned": 1.0})))], "warm_restore.json: cannot be drawn")),
    "wr-replot-out-missing": ("warm_restore", lambda t: (["--replot", "--out", str(t / "nowhere")],
                                                          "argument --replot")),
    "wr-replot-out-a-file": ("warm_restore", lambda t: (["--replot", "--out", str(a_file(t))], "argument --replot")),
    "wr-replot-no-run-folder": ("warm_restore", lambda t: (["--replot"], "argument --replot: no run folder")),
    # warm_restore_families
    "families-no-json": ("families", lambda t: (["--out", str(folder_with(t, "x", None))],
                                                "argument --out: no warm_restore.json")),
    "families-corrupt-json": ("families", lambda t: (["--out", str(folder_with(t, "tiny/warm_restore.json", "{"))],
                                                     "warm_restore.json: not valid JSON")),
    "families-old-root-flag": ("families", lambda t: (["--root", str(t)], "--root")),
    # plan_incident
    "pi-prompt-len-0": ("plan_incident", lambda t: (["--prompt-len", "0"], "argument --prompt-len")),
    "pi-budget-below-block": ("plan_incident", lambda t: (["--prefill-budget", "8"], "argument --prefill-budget")),
    "pi-model-unknown": ("plan_incident", lambda t: (["--model", "bamba-10b"], "argument --model")),
    "pi-model-corrupt": ("plan_incident", lambda t: (["--model", str(ckpt_corrupt(t))], "model.safetensors")),
    "pi-policy-unknown": ("plan_incident", lambda t: (["--policy", "nope"], "argument --policy")),
    "pi-interval-not-int": ("plan_incident", lambda t: (["--interval", "x"], "argument --interval")),
    "pi-out-under-a-file": ("plan_incident", lambda t: (["--out", str(a_file(t) / "x" / "y")], "argument --out")),
    "pi-old-budget-flag": ("plan_incident", lambda t: (["--budget", "8192"], "--budget")),
    # ablations: sweep lists
    "abl-budget-list-zero": ("ablations", lambda t: (["budget", "--prefill-budget", "16,0"], "argument --prefill-budget")),
    "abl-prompt-len-list-word": ("ablations", lambda t: (["prompt-len", "--prompt-len", "40,abc"], "argument --prompt-len")),
    "abl-prompt-len-list-empty": ("ablations", lambda t: (["prompt-len", "--prompt-len", ","], "argument --prompt-len")),
    "abl-capture-mode-unknown": ("ablations", lambda t: (["capture", "--capture-mode", "in_pass,bogus"],
                                                         "argument --capture-mode")),
    "abl-capture-mode-repeated": ("ablations", lambda t: (["capture", "--capture-mode", "in_pass,in_pass"],
                                                          "argument --capture-mode")),
    "abl-interval-list-negative": ("ablations", lambda t: (["interval", "--interval", "0,-2"], "argument --interval")),
    "abl-block-list-over-budget": ("ablations", lambda t: (["block-size", "--block-size", "4,8", "--prefill-budget", "6",
                                                            "--prompt-len", "260"], "argument --prefill-budget")),
    "abl-shard-out-of-range": ("ablations", lambda t: (["budget", "--shard", "2/2"], "argument --shard")),
    "abl-shard-not-i-n": ("ablations", lambda t: (["budget", "--shard", "x"], "argument --shard")),
    "abl-device-absent-cuda": ("ablations", lambda t: (["budget", "--device", absent_cuda_device()], "argument --device")),
    "abl-dtype-bfloat16": ("ablations", lambda t: (["budget", "--dtype", "bfloat16"], "argument --dtype")),
    "abl-old-budgets-flag": ("ablations", lambda t: (["budget", "--budgets", "512"], "--budgets")),
    "abl-old-lengths-flag": ("ablations", lambda t: (["prompt-len", "--lengths", "300"], "--lengths")),
    "abl-no-sweep": ("ablations", lambda t: ([], "cmd")),
    "abl-unknown-sweep": ("ablations", lambda t: (["warmth"], "argument cmd")),
    "abl-merge-and-replot": ("ablations", lambda t: (["budget", "--merge", "--replot", "--out", str(t)], "--replot")),
    "abl-all-out-under-a-file": ("ablations", lambda t: (["all", "--out", str(a_file(t) / "x")], "argument --out")),
    # ablations --merge: the part files
    "abl-merge-no-parts": ("ablations", lambda t: (["budget", "--merge", "--out", str(folder_with(t, "x", None))],
                                                   "no part files")),
    "abl-merge-empty-part": ("ablations", lambda t: (
        ["budget", "--merge", "--out", str(folder_with(t, "parts/budget.part0of1.json", ""))],
        "budget.part0of1.json: empty")),
    "abl-merge-truncated-part": ("ablations", lambda t: (
        ["budget", "--merge", "--out", str(folder_with(t, "parts/budget.part0of1.json", '{"name": "bud'))],
        "budget.part0of1.json: not valid JSON")),
    "abl-merge-part-is-a-list": ("ablations", lambda t: (
        ["budget", "--merge", "--out", str(folder_with(t, "parts/budget.part0of1.json", "[]"))],
        "budget.part0of1.json: not a sweep part file")),
    "abl-merge-part-bad-shard": ("ablations", lambda t: (
        ["budget", "--merge", "--out", str(folder_with(t, "parts/budget.part0of1.json", json.dumps(
            {k: [] for k in PART_KEYS} | {"shard": [3, 1]})))], "budget.part0of1.json: not a sweep part file")),
    "abl-merge-out-missing": ("ablations", lambda t: (["budget", "--merge", "--out", str(t / "nowhere")],
                                                      "argument --merge")),
    "abl-merge-no-run-folder": ("ablations", lambda t: (["budget", "--merge"], "argument --merge: no run folder")),
    # ablations --replot: the merged CSV and JSON
    "abl-replot-no-csv": ("ablations", lambda t: (["budget", "--replot", "--out", str(folder_with(t, "x", None))],
                                                  "budget.csv: no such file")),
    "abl-replot-header-only-csv": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", BUDGET_CSV_HEADER + "\n"))],
        "budget.csv: has a header but no rows")),
    "abl-replot-csv-wrong-columns": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", "a,b\n1,2\n"))], "budget.csv: not the")),
    "abl-replot-no-json": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", BUDGET_CSV_HEADER + "\n" + BUDGET_ROW + "\n"))],
        "budget.json: no such file")),
    "abl-replot-corrupt-json": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", BUDGET_CSV_HEADER + "\n" + BUDGET_ROW + "\n")
                                            and folder_with(t, "budget.json", '{"config": {'))],
        "budget.json: not valid JSON")),
    "abl-replot-json-no-config": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", BUDGET_CSV_HEADER + "\n" + BUDGET_ROW + "\n")
                                            and folder_with(t, "budget.json", '{"environments": []}'))],
        "budget.json: not the budget sweep's JSON (no 'config')")),
    "abl-replot-values-do-not-plot": ("ablations", lambda t: (
        ["budget", "--replot", "--out", str(folder_with(t, "budget.csv", BUDGET_CSV_HEADER + "\n"
                                                        + BUDGET_ROW.replace(",67,", ",abc,") + "\n")
                                            and folder_with(t, "budget.json", json.dumps(BUDGET_META)))],
        "budget.csv: cannot be plotted")),
    # multiturn
    "mt-eviction-unknown": ("multiturn", lambda t: ([*MT, "--eviction", "lru,random"], "argument --eviction")),
    "mt-eviction-repeated": ("multiturn", lambda t: ([*MT, "--eviction", "lru,lru"], "argument --eviction")),
    "mt-branch-fraction-above-1": ("multiturn", lambda t: ([*MT, "--branch-fraction", "1.5"], "argument --branch-fraction")),
    "mt-configs-unknown": ("multiturn", lambda t: ([*MT, "--configs", "aligned,nope"], "argument --configs")),
    "mt-turns-min-above-max": ("multiturn", lambda t: ([*MT, "--turns-min", "5", "--turns-max", "3"],
                                                       "argument --turns-min")),
    "mt-concurrency-0": ("multiturn", lambda t: ([*MT, "--concurrency", "0"], "argument --concurrency")),
    "mt-budget-below-block": ("multiturn", lambda t: ([*MT, "--block-size", "16", "--prefill-budget", "4",
                                                       "--concurrency", "1"], "argument --prefill-budget")),
    "mt-runner-unknown": ("multiturn", lambda t: (["--runner", "gpu"], "argument --runner")),
    "mt-device-absent-cuda": ("multiturn", lambda t: ([*MT, "--device", absent_cuda_device()], "argument --device")),
    "mt-old-plot-only-flag": ("multiturn", lambda t: (["--plot-only"], "--plot-only")),
    "mt-old-preset-flag": ("multiturn", lambda t: ([*MT, "--preset", "tiny"], "--preset")),
    "mt-out-under-a-file": ("multiturn", lambda t: ([*MT, "--out", str(a_file(t) / "x")], "argument --out")),
    "mt-merge-and-replot": ("multiturn", lambda t: (["--merge", "--replot", "--out", str(t)], "--replot")),
    "mt-replot-no-summary": ("multiturn", lambda t: (["--replot", "--out", str(folder_with(t, "x", None))],
                                                     "summary.csv: no such file")),
    "mt-replot-summary-wrong-columns": ("multiturn", lambda t: (
        ["--replot", "--out", str(folder_with(t, "summary.csv", "config,policy\noff,off\n"))], "summary.csv: not the")),
    "mt-replot-empty-requests": ("multiturn", lambda t: (
        ["--replot", "--out", str(folder_with(t, "summary.csv", ",".join(multiturn.SUMMARY_COLUMNS) + "\n"
                                               + ",".join(["1"] * len(multiturn.SUMMARY_COLUMNS)) + "\n"))],
        "requests.csv.gz: no such file")),
    "mt-merge-no-parts": ("multiturn", lambda t: (["--merge", "--out", str(folder_with(t, "x", None))],
                                                  "no part files")),
    "mt-merge-truncated-part": ("multiturn", lambda t: (
        ["--merge", "--out", str(folder_with(t, "parts/multiturn.part0of1.json", '{"rows": ['))],
        "multiturn.part0of1.json: not valid JSON")),
    # busy_load
    "busy-threads-0": ("busy_load", lambda t: (["--threads", "0"], "argument --threads")),
    "busy-seconds-0": ("busy_load", lambda t: (["--seconds", "0"], "argument --seconds")),
    "busy-size-8": ("busy_load", lambda t: (["--size", "8"], "argument --size")),
    "busy-every-0": ("busy_load", lambda t: (["--every", "0"], "argument --every")),
}
# a run's default --out (so the case checks nothing is created there): the commands that write
WRITES = {"warm_restore", "plan_incident", "ablations", "multiturn"}


def test_there_are_enough_cases():
    assert len(CASES) >= 45


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_usage_line_and_writes_nothing(tmp_path, capsys, case):
    command, setup = CASES[case]
    argv, expected = setup(tmp_path)
    out = tmp_path / "out"
    if command in WRITES and "--out" not in argv and "--replot" not in argv and "--merge" not in argv \
            and argv[:1] != ["all"]:
        argv = ([argv[0], "--out", str(out), *argv[1:]] if command == "ablations" and argv else [*argv, "--out", str(out)])
    before = listing(tmp_path)
    with pytest.raises(SystemExit) as exc:
        MAINS[command](argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    last = captured.err.strip().splitlines()[-1]
    assert ": error: " in last and expected in last, last
    assert not out.exists()
    assert listing(tmp_path) == before  # nothing written, nothing created


def test_triton_on_a_cpu_without_the_interpreter_is_one_line(tmp_path, capsys, monkeypatch):
    """`--backend triton` where it cannot run (no CUDA device, TRITON_INTERPRET unset) names the
    setting that makes it run, instead of Triton's driver traceback."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device runs triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as exc:
        warm_restore.main(["--backend", "triton", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and not (tmp_path / "o").exists()
    assert "argument --backend: triton needs a CUDA device" in err and "TRITON_INTERPRET=1" in err
