"""The GPU session's one command, sized to the lease: every step under one deadline, in the order of
its value, each step's files in $OUT as soon as it ends.

A lent H200 gives 15 minutes of device time in all (its start and idle time included) and at most 10
minutes a command; at most 8 files come back from $OUT. So this runs one command under 9 minutes
(`--deadline-s`, default 530): before each step it checks the seconds left, skips (and logs) a step
whose least useful time (`min_s`) no longer fits, and gives each step at most its budget or what is
left. Steps, in order:

  ceilings  a large copy's GB/s and a bf16 GEMM's TFLOP/s (the rates every floor divides by)
  paged     paged attention: decode GB/s and prefill TFLOP/s; SDPA, FlexAttention, vLLM's kernel beside it
  ssd       the SSD scan with and without captures, kernel alone and public call, mamba_ssm and fla beside it
  gdn       the gated delta rule scan (Qwen3-Next-80B's DeltaNet shape) likewise, fla's chunk_gated_delta_rule
            beside it (packed into ssd.tar.gz: at most 8 files come back)
  decode    one whole-model decode step at Bamba-9B shapes: CUDA graph vs eager, against its floor
  warm      the warm-restore incident at Bamba-9B shapes (random weights, bf16, Triton)
  tests     the GPU tests, with pytest-xdist's -n and pytest-timeout's --timeout where installed, no -x

The compile checks need no GPU and do not run here (`python -m kernels.compile_check`, CI).
Peers come from ./peers (`bash scripts/fetch_peers.sh`; carry it: device tool `carry: ["peers"]`).

$OUT gets one `<step>.tar.gz` per step (its output folder and log.txt; a step with an `archive` is
added to that step's tarball) plus `summary.json` and `summary.txt`, rewritten after every step: a
killed command still returns the steps that ended.

    bash scripts/gpu_check.sh                              # everything (writes $OUT, else runs/gpu_check/<ts>/)
    bash scripts/gpu_check.sh --steps ssd,tests --deadline-s 300   # a targeted rerun in the minutes left
    bash scripts/gpu_check.sh --dry-run --out /tmp/dry     # the same steps on the CPU at tiny shapes (CI's test)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

from experiments.common.results_io import REPO
from experiments.common.study import Context, Ran, Study, run_study

MAX_OUT_FILES = 8  # the device tool returns at most 8 files from $OUT
DEADLINE_S = 530  # under the 9 minutes the issue allows one command (the tool's limit is 10)
PACK_S = 5  # kept back from every step's timeout for killing it and packing its folder
GPU_TESTS = ("tests/test_paged_attention.py", "tests/test_kv_cache_write.py", "tests/test_kv_block_copy.py",
             "tests/test_ssd_scan.py", "tests/test_causal_conv1d.py", "tests/test_ssm_decode.py",
             "tests/test_gated_delta_rule.py", "tests/test_gated_delta_decode.py",
             "tests/test_pad_slots.py", "tests/test_model_backends.py", "tests/test_decode_graph.py",
             "tests/test_step_host_syncs.py")
TEST_TIMEOUT_S = 120  # per test: the longest CUDA test compiles a few dozen kernels


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    budget_s: int  # its timeout: the most it may take
    min_s: int  # skipped when fewer seconds than this are left
    argv: Callable[["Run"], list[str]]  # on the GPU
    dry_argv: Callable[["Run"], list[str]]  # --dry-run: the same command on the CPU at tiny shapes
    archive: str = ""  # the tarball it is packed into, beside that step's folder ('': its own, <name>.tar.gz)


@dataclasses.dataclass
class Run:
    work: Path  # the steps' output folders (not $OUT: only tarballs and the summary go there)
    out: Path
    dry: bool
    ceilings: Path | None  # a ceilings.json for the benches' ratio columns, once one exists

    def folder(self, step: str) -> Path:
        return self.work / step

    def ceilings_flag(self) -> list[str]:
        return ["--ceilings", str(self.ceilings)] if self.ceilings and self.ceilings.is_file() else []


def _py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def pytest_flags(dry: bool, have=importlib.util.find_spec) -> list[str]:
    """-n and --timeout where pytest-xdist and pytest-timeout import (the GPU image has both, and no
    network to install them); else one process and faulthandler's traceback dump at the timeout."""
    if dry:
        return ["--collect-only"]
    flags = ["-n", "8"] if have("xdist") else []
    if have("pytest_timeout"):
        return flags + [f"--timeout={TEST_TIMEOUT_S}"]
    return flags + ["-o", f"faulthandler_timeout={TEST_TIMEOUT_S}"]


STEPS = (
    Step("ceilings", 40, 15,
         lambda r: _py("experiments.bench.ceilings", "--out", str(r.folder("ceilings"))),
         lambda r: _py("experiments.bench.ceilings", "--device", "cpu", "--copy-mib", "16", "--gemm-size", "128",
                       "--rep", "20", "--out", str(r.folder("ceilings")))),
    Step("paged", 130, 40,
         lambda r: _py("experiments.bench.paged_attention", "--out", str(r.folder("paged")), *r.ceilings_flag(),
                       "--batches", "1,16,64", "--contexts", "4096,131072", "--prefixes", "0,32768",
                       "--mixed-chunks", "512,8192"),  # 9 configs (B=64 at 128K is over --max-kv-gib)
         lambda r: _py("experiments.bench.paged_attention", "--out", str(r.folder("paged")), *r.ceilings_flag(),
                       "--device", "cpu", "--model", "tiny", "--dtype", "float32", "--batches", "1", "--contexts", "40",
                       "--prefixes", "0", "--prefill-queries", "24", "--mixed-chunks", "", "--warmup", "1",
                       "--rep", "1")),
    Step("ssd", 90, 25,
         lambda r: _py("experiments.bench.ssd_scan", "--out", str(r.folder("ssd")), *r.ceilings_flag(),
                       "--tokens", "8192,32768", "--warmup-ms", "25", "--rep-ms", "100"),
         lambda r: _py("experiments.bench.ssd_scan", "--out", str(r.folder("ssd")), *r.ceilings_flag(),
                       "--device", "cpu", "--impl", "torch", "--model", "tiny", "--tokens", "97", "--repeats", "1",
                       "--sequential-tokens", "0")),
    Step("gdn", 75, 30,  # fla autotunes its kernels at its first call, the gate (keys: heads, head dims, chunk)
         lambda r: _py("experiments.bench.gated_delta_rule", "--out", str(r.folder("gdn")), *r.ceilings_flag(),
                       "--tokens", "8192,32768", "--warmup-ms", "25", "--rep-ms", "100"),
         lambda r: _py("experiments.bench.gated_delta_rule", "--out", str(r.folder("gdn")), *r.ceilings_flag(),
                       "--device", "cpu", "--impl", "torch", "--model", "qwen3-next-tiny", "--tokens", "97",
                       "--repeats", "1"),
         archive="ssd"),
    Step("decode", 50, 25,
         lambda r: _py("experiments.bench.decode_step", "--out", str(r.folder("decode")), *r.ceilings_flag(),
                       "--batches", "1,16,64"),
         lambda r: _py("experiments.bench.decode_step", "--out", str(r.folder("decode")), *r.ceilings_flag(),
                       "--device", "cpu", "--model", "tiny", "--batches", "1", "--context", "20", "--repeats", "1")),
    Step("warm", 75, 40,
         lambda r: _py("experiments.warm_restore", "--out", str(r.folder("warm")), "--model", "bamba-9b",
                       "--backend", "triton", "--device", "cuda", "--dtype", "bfloat16", "--repeats", "3",
                       "--curve-repeats", "3"),
         lambda r: _py("experiments.warm_restore", "--out", str(r.folder("warm")), "--model", "tiny",
                       "--prompt-len", "48", "--prefill-budget", "32", "--repeats", "1", "--curve-repeats", "1")),
    Step("tests", 200, 60,
         lambda r: _py("pytest", "-q", "-p", "no:cacheprovider", "-rfE", *pytest_flags(False),
                       f"--junitxml={r.folder('tests') / 'junit.xml'}", *GPU_TESTS),
         lambda r: _py("pytest", "-q", "-p", "no:cacheprovider", *pytest_flags(True), *GPU_TESTS)),
)
STEP_NAMES = tuple(s.name for s in STEPS)
ARCHIVES = tuple(dict.fromkeys(s.archive or s.name for s in STEPS))
SUMMARY_FILES = ("summary.json", "summary.txt")
assert len(ARCHIVES) + len(SUMMARY_FILES) <= MAX_OUT_FILES


def step_env(dry: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRITON_DEFAULT_FP_FUSION="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    if dry:  # the CPU, even on a GPU machine: Triton through its interpreter
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return env


def run_command(argv: list[str], log_path: Path, timeout_s: float, env: dict) -> tuple[int | None, float]:
    """(exit code, or None when killed at `timeout_s`; wall seconds). Output to `log_path`; the
    command runs in its own process group, so a timeout also ends its children (xdist workers)."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
            log.write(f"\n[gpu_check] killed at its timeout, {timeout_s:.0f} s\n")
    return rc, time.monotonic() - t0


def pack(folders: list[Path], out: Path, name: str) -> Path:
    """`folders` (each under its own name) as out/<name>.tar.gz, written beside and renamed (a kill
    mid-write leaves the old one)."""
    path = out / f"{name}.tar.gz"
    tmp = out / f".{name}.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name)
    os.replace(tmp, path)
    return path


def run_step(step: Step, run: Run, deadline: float) -> dict:
    """One step under the global deadline: skipped when under `min_s` is left, else run for at most
    its budget or what is left; its folder packed into $OUT at once."""
    left = deadline - time.monotonic()
    record = dict(step=step.name, budget_s=step.budget_s, left_before_s=round(left, 1))
    if left < step.min_s + PACK_S:
        return dict(record, status="skipped", why=f"{left:.0f} s left, needs at least {step.min_s} s")
    folder = run.folder(step.name)
    folder.mkdir(parents=True, exist_ok=True)
    argv = (step.dry_argv if run.dry else step.argv)(run)
    timeout_s = min(step.budget_s, left - PACK_S)
    rc, wall = run_command(argv, folder / "log.txt", timeout_s, step_env(run.dry))
    status = "timeout" if rc is None else ("ok" if rc == 0 else "failed")
    if step.name == "ceilings" and rc == 0:
        run.ceilings = folder / "ceilings.json"
    archive = step.archive or step.name
    sharing = [run.folder(s.name) for s in STEPS if s.name != step.name and (s.archive or s.name) == archive
               and run.folder(s.name).is_dir()]
    record.update(status=status, rc=rc, wall_s=round(wall, 1), timeout_s=round(timeout_s, 1), argv=argv,
                  headline=headline(step.name, folder), archive=pack([*sharing, folder], run.out, archive).name)
    return record


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def _peer_ratios(rows: list[dict], impl_col: str, ours: str) -> list[str]:
    """'peer time / ours: median over N configs' for each impl other than `ours` with ratios."""
    by_peer: dict[str, list[float]] = {}
    for r in rows:
        if r.get(impl_col) != ours and r.get("peer_over_ours") not in ("", None):
            by_peer.setdefault(r[impl_col], []).append(float(r["peer_over_ours"]))
    return [f"{p} time / ours: median {_median(v):.3g} over {len(v)} configs" for p, v in by_peer.items()]


def _headline_of(step: str, folder: Path) -> list[str]:
    from experiments.common.results_io import read_csv

    if step == "ceilings":
        c = json.loads((folder / "ceilings.json").read_text())
        return [f"copy {c['copy_gbps']} GB/s, GEMM {c['gemm_tflops']} TFLOP/s ({c['gemm_dtype']} {c['gemm_size']}^3)"]
    if step == "paged":
        rows = [r for r in read_csv(folder / "bench.csv") if r.get("ms")]
        ours = [float(r["pct_copy_bw"]) for r in rows if r["impl"] == "triton_paged" and r["kind"] == "decode"
                and r.get("pct_copy_bw")]
        return ([f"triton decode: best {max(ours):.1f}% of copy"] if ours else []) + _peer_ratios(rows, "impl",
                                                                                                 "triton_paged")
    if step in ("ssd", "gdn"):
        rows = read_csv(folder / {"ssd": "bench_ssd_scan.csv", "gdn": "bench_gated_delta_rule.csv"}[step])
        out = [f"{r['shape']} T={r['T']} {r['variant']}: {r['median_ms']} ms, {r['overhead_vs_none_pct']}% vs "
               f"{r.get('overhead_vs', 'none')}" for r in rows if r["variant"] in ("capture1", "capture1_kernel")]
        ours = "none_kernel" if any(r["variant"] == "none_kernel" for r in rows) else "none"
        return out + _peer_ratios(rows, "variant", ours) + [
            f"{r['variant']}: {r['note']}" for r in rows if not r.get("median_ms")]
    if step == "decode":
        d = json.loads((folder / "decode_step.json").read_text())
        return [f"B={r['batch']}: graph {r['graph_ms']:.3f} ms = {r['graph_over_floor']:.2f} x floor "
                f"({r['floor_ms']:.3f} ms), eager {r['eager_ms']:.3f} ms" for r in d["rows"]]
    if step == "warm":
        d = json.loads((folder / "warm_restore.json").read_text())
        return [f"warm TTFT ratio legacy/aligned {d['warm_ttft_ratio_legacy_over_aligned']:.3g}"]
    return []


def headline(step: str, folder: Path) -> list[str]:
    """A few figures from a step's files, else the last line of its log (a missing file says so)."""
    try:
        lines = _headline_of(step, folder)
    except Exception as err:  # noqa: BLE001  (the summary must still be written)
        lines = [f"no headline: {type(err).__name__}: {err}"[:200]]
    log = folder / "log.txt"
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] if log.is_file() else []
    return lines or tail


def device_info(dry: bool) -> dict:
    """nvidia-smi's name / memory / driver line (where it exists) and this Python's versions."""
    info = dict(python=sys.version.split()[0], dry_run=dry, argv=sys.argv[1:])
    smi = shutil.which("nvidia-smi")
    if smi and not dry:
        q = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    for name in ("torch", "triton", "xdist", "pytest_timeout"):
        spec = importlib.util.find_spec(name)
        info[name] = "absent" if spec is None else "present"
    from experiments.bench.peers import versions

    info["peers"] = versions() or "absent (bash scripts/fetch_peers.sh)"
    return info


def write_summary(out: Path, info: dict, records: list[dict], started: float) -> None:
    """summary.json (everything) and summary.txt (the short table the reply's tail shows)."""
    data = dict(info, elapsed_s=round(time.monotonic() - started, 1), steps=records)
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str))
    lines = [f"gpu_check{' --dry-run' if info['dry_run'] else ''}: {data['elapsed_s']} s; "
             f"{info.get('nvidia_smi', 'no nvidia-smi')}; peers {info['peers']}"]
    for r in records:
        lines.append(f"{r['step']:<9} {r['status']:<8} {r.get('wall_s', '-'):>6} s  "
                     f"{r.get('why', '') or (r.get('headline') or [''])[0]}")
        lines += [f"{'':<26}{h}" for h in (r.get("headline") or [])[1:]]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")


def step_list(text: str) -> list[str]:
    """Comma-separated step names, known and distinct, in any order (they run in STEPS' order)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in STEP_NAMES]
    if not names or bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names from {','.join(STEP_NAMES)}, got {text!r}")
    return names


def resolve_out(p: argparse.ArgumentParser, args) -> Path:
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                       REPO / "runs" / "gpu_check" / time.strftime("%Y%m%d-%H%M%S"))
    if out.exists() and not out.is_dir():
        p.error(f"argument --out: {out} is a file")
    out.mkdir(parents=True, exist_ok=True)
    stale = [f.name for f in out.iterdir() if f.name in SUMMARY_FILES or f.name.endswith(".tar.gz")]
    if stale:
        p.error(f"argument --out: {out} already holds {', '.join(sorted(stale))} (an earlier run's)")
    return out


class GpuCheck(Study):
    """0 when every step that ran passed. Its folder is its own: --out, else $OUT, else a new
    runs/gpu_check/<timestamp>/, refused when it holds an earlier run's files (`resolve_out` above)."""
    prog = "bash scripts/gpu_check.sh"
    description = __doc__.splitlines()[0]
    folder = "optional"
    replot = False

    def add_flags(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--steps", type=step_list, default=",".join(STEP_NAMES), help="steps to run, comma-separated")
        p.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                       help="seconds for the whole command; no step starts that would not fit")
        p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny shapes")
        p.add_argument("--out", type=Path, default=None,
                       help="where the tarballs and summary go (default $OUT, else a new runs/gpu_check/<timestamp>/)")
        p.add_argument("--ceilings", type=Path, default=None,
                       help="an earlier run's ceilings.json, for a rerun without the ceilings step")

    def check(self, ctx: Context) -> None:
        args = ctx.args
        if args.deadline_s <= 0:
            ctx.error(f"argument --deadline-s: must be > 0, got {args.deadline_s}")
        if args.ceilings is not None and not args.ceilings.is_file():
            ctx.error(f"argument --ceilings: {args.ceilings}: no such file")

    def run(self, ctx: Context) -> Ran:
        started, args = time.monotonic(), ctx.args
        out = resolve_out(ctx.ap, args)
        deadline = started + args.deadline_s
        info = device_info(args.dry_run)
        records: list[dict] = []
        with tempfile.TemporaryDirectory(prefix="gpu_check.") as work:
            run = Run(Path(work), out, args.dry_run, args.ceilings)
            for step in STEPS:
                if step.name in args.steps:
                    records.append(run_step(step, run, deadline))
                    write_summary(out, info, records, started)
                    print(f"[gpu_check] {records[-1]['step']}: {records[-1]['status']} "
                          f"({records[-1].get('wall_s', 0)} s)", flush=True)
        write_summary(out, info, records, started)
        print((out / "summary.txt").read_text(), end="")  # the summary is its report (no wrote line)
        return Ran([], status=0 if all(r["status"] in ("ok",) for r in records) else 1)


STUDY = GpuCheck()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
