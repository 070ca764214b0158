"""The GPU session's one command (experiments/bench/gpu_check.py, scripts/gpu_check.sh): the deadline
guard, the step list, pytest's flags, and the CPU dry run end to end (its files in $OUT, at most 8)."""

import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from experiments.bench import gpu_check as gc

ROOT = Path(__file__).resolve().parents[1]


def sleeper(seconds: float) -> gc.Step:
    def argv(run):
        return [sys.executable, "-c", f"import time; print('started', flush=True); time.sleep({seconds})"]

    return gc.Step("sleeper", budget_s=2, min_s=1, argv=argv, dry_argv=argv)


def test_a_step_is_killed_at_its_budget_and_still_packed(tmp_path):
    run = gc.Run(tmp_path / "w", tmp_path, dry=False, ceilings=None)
    t0 = time.monotonic()
    rec = gc.run_step(sleeper(60), run, deadline=time.monotonic() + 100)
    assert time.monotonic() - t0 < 15
    assert rec["status"] == "timeout" and rec["rc"] is None and rec["timeout_s"] == 2
    with tarfile.open(tmp_path / "sleeper.tar.gz") as tar:
        log = tar.extractfile("sleeper/log.txt").read().decode()
    assert "started" in log and "killed at its timeout" in log


def test_a_step_gets_at_most_what_is_left(tmp_path):
    run = gc.Run(tmp_path / "w", tmp_path, dry=False, ceilings=None)
    step = gc.Step("s", budget_s=100, min_s=1, argv=sleeper(60).argv, dry_argv=sleeper(60).argv)
    rec = gc.run_step(step, run, deadline=time.monotonic() + gc.PACK_S + 3)
    assert rec["status"] == "timeout" and rec["timeout_s"] <= 3


def test_a_step_that_would_not_fit_is_skipped_and_logged(tmp_path):
    run = gc.Run(tmp_path / "w", tmp_path, dry=False, ceilings=None)
    step = gc.Step("big", budget_s=100, min_s=50, argv=sleeper(0).argv, dry_argv=sleeper(0).argv)
    rec = gc.run_step(step, run, deadline=time.monotonic() + 30)
    assert rec["status"] == "skipped" and "needs at least 50 s" in rec["why"]
    assert not (tmp_path / "big.tar.gz").exists() and not (tmp_path / "w" / "big").exists()


def test_steps_fit_the_returned_files_and_the_order_is_by_value():
    assert gc.STEP_NAMES == ("ceilings", "paged", "ssd", "gdn", "decode", "warm", "tests")
    assert gc.ARCHIVES == ("ceilings", "paged", "ssd", "decode", "warm", "tests")  # gdn's folder goes in ssd's
    assert len(gc.ARCHIVES) + len(gc.SUMMARY_FILES) <= gc.MAX_OUT_FILES == 8
    assert gc.DEADLINE_S < 9 * 60
    assert all(s.min_s <= s.budget_s for s in gc.STEPS)


def test_step_list_and_bad_flags_are_one_line(capsys):
    assert gc.step_list("tests,ssd") == ["tests", "ssd"]
    for bad in ("ssd,foo", "ssd,ssd", ""):
        with pytest.raises(SystemExit):
            gc.main(["--steps", bad, "--out", "/nonexistent/never"])
        assert "--steps" in capsys.readouterr().err


def test_gpu_tests_run_without_x_and_with_n_and_timeouts_where_installed():
    have = lambda name: object()  # noqa: E731
    flags = gc.pytest_flags(False, have=have)
    assert flags[:2] == ["-n", "8"] and f"--timeout={gc.TEST_TIMEOUT_S}" in flags
    bare = gc.pytest_flags(False, have=lambda name: None)
    assert "-n" not in bare and f"faulthandler_timeout={gc.TEST_TIMEOUT_S}" in bare
    argv = gc.STEPS[-1].argv(gc.Run(Path("/w"), Path("/o"), False, None))
    assert "-x" not in argv and not any("compile" in a for a in argv)
    assert all((ROOT / t).is_file() for t in gc.GPU_TESTS)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dry") / "out"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    return out, proc


@pytest.mark.slow
def test_dry_run_runs_every_step_and_returns_at_most_8_files(dry_run):
    out, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted([f"{a}.tar.gz" for a in gc.ARCHIVES] + list(gc.SUMMARY_FILES))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] is True
    assert [(r["step"], r["status"]) for r in summary["steps"]] == [(s, "ok") for s in gc.STEP_NAMES]
    assert "ceilings" in (out / "summary.txt").read_text() and "tests" in proc.stdout


EXPECTED = {"ceilings": "ceilings.json", "paged": "bench.csv", "ssd": "bench_ssd_scan.csv",
            "gdn": "bench_gated_delta_rule.csv", "decode": "decode_step.json", "warm": "warm_restore.json",
            "tests": "log.txt"}
ARCHIVE_OF = {s.name: s.archive or s.name for s in gc.STEPS}


@pytest.mark.slow
@pytest.mark.parametrize("step", gc.STEP_NAMES)
def test_dry_run_tarball_holds_the_steps_files(dry_run, step):
    out, _ = dry_run
    with tarfile.open(out / f"{ARCHIVE_OF[step]}.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile(f"{step}/log.txt").read().decode()
    assert {f"{step}/log.txt", f"{step}/{EXPECTED[step]}"} <= names
    if step in ("paged", "ssd", "gdn", "decode"):  # the ceilings measured first reach the benches
        assert "--ceilings" in log.splitlines()[0]


@pytest.mark.slow
def test_dry_run_ratio_columns(dry_run):
    """The paged bench's peers get their time over ours, and the ceilings' share columns are filled."""
    import csv
    import io

    out, _ = dry_run
    with tarfile.open(out / "paged.tar.gz") as tar:
        rows = list(csv.DictReader(io.StringIO(tar.extractfile("paged/bench.csv").read().decode())))
    ours = {(r["kind"], r["batch"]): float(r["ms"]) for r in rows if r["impl"] == "triton_paged"}
    peers = [r for r in rows if r["impl"] in ("sdpa_contiguous", "flex_paged") and r["ms"]]
    assert peers
    for r in peers:
        assert float(r["peer_over_ours"]) == pytest.approx(float(r["ms"]) / ours[(r["kind"], r["batch"])], rel=1e-3)
    assert all(r["pct_copy_bw"] and r["pct_gemm"] for r in rows if r["ms"])
    assert any(r["note"] == "flex:page128:eager" for r in peers)  # the CPU's flex is eager, and says so


def test_out_holding_an_earlier_run_is_refused(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(SystemExit):
        gc.main(["--dry-run", "--out", str(tmp_path), "--steps", "ceilings"])
    assert "already holds summary.json" in capsys.readouterr().err
