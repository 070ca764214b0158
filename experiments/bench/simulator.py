"""Benchmark the trace simulator: seconds per simulated point, per request and per scheduler row,
beside the independent reference simulator (tests/reference_simulator.py) in the same run.

Two parts, both written as data (`bench_simulator.json`, with the machine, versions and git commit):

* points: each configuration of `tests/sim_digest_points.py` (every eviction, a 256 GB host tier, a
  3 GB KV pool) on the first `--limit` Mooncake conversation requests: CPU and wall seconds, per
  request and per row (rows: what the runner ran, prefill chunks and decode tokens), and the point's
  row digest (the same as `tests/test_sim_digest.py` pins, so a faster run shows it is the same run);
* reference: the first `--ref-requests` requests of the same trace served one at a time (the
  reference's contract: each finishes before the next arrives; a KV pool that holds them all), run
  by the simulator and by the reference for each `--ref-points` configuration: seconds per request
  of each, and whether their records agree (KV match, restore point, replay, forwards, chunk ends,
  snapshot positions).

    python -m experiments.bench.simulator --limit 1000                  # runs/bench_simulator/<timestamp>/
    python -m experiments.bench.simulator --limit 200 --points ours-plus-4gb-shadow_best-host256

CPU seconds (`time.process_time`) are the figure to compare: the 2-core machine this runs on is
shared, and wall time there is not the simulator's.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from experiments.common.results_io import environment, log, write_json
from experiments.common.study import Context, Ran, Study, run_study

RECORD = "bench_simulator"
REF_POINTS = ("trtllm-0.25gb-lru", "ours-plus-4gb-shadow_best", "marconi-0.25gb-seglen")
REF_GAP_S = 1000.0  # simulated seconds between the reference part's arrivals: a request ends well before


def _counting_runner():
    """Patch the simulator's runner to count the rows it runs (restored by the caller)."""
    from experiments.traces import runner as runner_module

    counts = {"rows": 0}
    original = runner_module.SimulatedRunner.forward

    def forward(self, rows):
        counts["rows"] += len(rows)
        return original(self, rows)

    runner_module.SimulatedRunner.forward = forward
    return counts, lambda: setattr(runner_module.SimulatedRunner, "forward", original)


def time_point(name: str, limit: int) -> dict:
    """One digest point: its seconds, per request and per row, and its digest."""
    from tests.sim_digest_points import POINTS, digest, run_point

    counts, restore = _counting_runner()
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        out = run_point(name, limit)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        restore()
    reading, policy, budget, eviction, host, kv_pool = POINTS[name]
    requests = out["metrics"]["requests"]
    return {"part": "points", "point": name, "reading": reading, "policy": policy, "budget_gb": budget,
            "eviction": out["metrics"]["eviction"], "host_gb": host, "kv_pool_gb": kv_pool, "requests": requests,
            "rows": counts["rows"], "cpu_s": cpu, "wall_s": wall, "cpu_us_per_request": cpu / requests * 1e6,
            "cpu_us_per_row": cpu / max(counts["rows"], 1) * 1e6, "digest": digest(out),
            "ssm_hit_tokens": out["metrics"]["ssm_hit_tokens"]}


def time_against_reference(name: str, n: int) -> dict:
    """The first `n` requests served one at a time, by the simulator and by the reference."""
    import dataclasses

    from experiments.traces.cost import ShapeCost
    from experiments.traces.simulate import SimConfig, simulate
    from experiments.traces.sweep import load_requests
    from experiments.workloads.request import WorkloadRequest
    from planner.policies.registry import get_policy
    from tests.reference_simulator import simulate_reference
    from tests.sim_digest_points import POINTS, TRACE

    reading, policy, budget, eviction, host, _ = POINTS[name]
    if host:
        raise ValueError(f"--ref-points: {name} has a host tier, which the reference does not model")
    trace = [(list(r.prompt_ids()), list(r.reply_ids())) for r in load_requests(TRACE, reading, n)]
    requests = [WorkloadRequest(index=i, arrival_s=i * REF_GAP_S, prompt_len=len(p), output_len=len(r), parent=None,
                                session=None, load_prompt=lambda p=p: p, load_reply=lambda r=r: r)
                for i, (p, r) in enumerate(trace)]
    cost = ShapeCost.from_preset("bamba-9b")
    cfg = SimConfig(policy, budget_gb=budget, eviction=eviction, max_batch_size=1)
    block = cfg.engine_settings(cost)["block_size"]
    need = sum(-(-(len(p) + len(r)) // block) for p, r in trace)  # a KV pool that never evicts
    cfg = dataclasses.replace(cfg, kv_pool_gb=(need + 4) * block * cost.kv_bytes_per_token / 1e9)
    counts, restore = _counting_runner()
    try:
        t0 = time.process_time()
        sim = simulate(requests, cfg)
        sim_s = time.process_time() - t0
    finally:
        restore()
    flops = [cost.snapshot_flops(p) for p in range(max(len(p) + len(r) for p, r in trace) + 1)]
    t0 = time.process_time()
    ref = simulate_reference(trace, cfg.engine_settings(cost), cost.state_bytes, eviction or get_policy(policy).eviction,
                             flops)
    ref_s = time.process_time() - t0
    fields = ("kv_match", "restore_at", "replayed", "forwards", "chunk_ends", "snapshot_positions")
    agree = len(sim["records"]) == len(ref.records) and all(
        getattr(a, f) == getattr(b, f) for a, b in zip(sim["records"], ref.records) for f in fields)
    return {"part": "reference", "point": name, "requests": n, "rows": counts["rows"], "simulator_cpu_s": sim_s,
            "reference_cpu_s": ref_s, "simulator_cpu_us_per_request": sim_s / n * 1e6,
            "reference_cpu_us_per_request": ref_s / n * 1e6, "simulator_cpu_us_per_row": sim_s / max(counts["rows"], 1) * 1e6,
            # the same workload's rows (prefill chunks and decode tokens) as the simulator ran them
            "reference_cpu_us_per_row": ref_s / max(counts["rows"], 1) * 1e6,
            "reference_over_simulator": ref_s / sim_s, "records_agree": agree}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


class SimulatorBench(Study):
    """1 if a point's records disagree with the reference simulator's."""
    record = RECORD
    prog = "python -m experiments.bench.simulator"
    description = __doc__.split("\n")[0]
    replot = False

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        from tests.sim_digest_points import POINTS

        ap.add_argument("--limit", type=int, default=1000, help="Mooncake conversation requests per point")
        ap.add_argument("--points", default=",".join(POINTS), help=f"comma list of {sorted(POINTS)}")
        ap.add_argument("--ref-requests", type=int, default=30, help="requests of the reference part (0: skip it)")
        ap.add_argument("--ref-points", default=",".join(REF_POINTS), help="points of the reference part")

    def points(self, args) -> tuple[list[str], list[str]]:
        points = [p for p in args.points.split(",") if p]
        return points, [p for p in args.ref_points.split(",") if p] if args.ref_requests else []

    def check(self, ctx: Context) -> None:
        from tests.sim_digest_points import POINTS

        points, ref_points = self.points(ctx.args)
        for name in points + ref_points:
            if name not in POINTS:
                ctx.error(f"argument --points/--ref-points: {name!r} is not one of {sorted(POINTS)}")
        if ctx.args.limit < 1 or ctx.args.ref_requests < 0:
            ctx.error("argument --limit: must be >= 1 (and --ref-requests >= 0)")

    def run(self, ctx: Context) -> Ran:
        args = ctx.args
        points, ref_points = self.points(args)
        rows = []
        for name in points:
            rows.append(time_point(name, args.limit))
            r = rows[-1]
            log(f"{name}: {r['cpu_s']:.1f} s CPU ({r['cpu_us_per_request']:.0f} us a request, "
                f"{r['cpu_us_per_row']:.1f} us a row, {r['rows']} rows)")
        for name in ref_points:
            rows.append(time_against_reference(name, args.ref_requests))
            r = rows[-1]
            log(f"reference {name}: simulator {r['simulator_cpu_us_per_request']:.0f} us a request "
                f"({r['simulator_cpu_us_per_row']:.1f} a row), reference {r['reference_cpu_us_per_request']:.0f} "
                f"({r['reference_cpu_us_per_row']:.1f} a row; reference / simulator {r['reference_over_simulator']:.3g}); agree "
                f"{r['records_agree']}")
        data = {"config": {"trace": "mooncake-conversation", "limit": args.limit, "ref_requests": args.ref_requests,
                           "shape": "bamba-9b", "commit": _commit()},
                "environment": environment("cpu"), "rows": rows}
        return Ran([write_json(Path(ctx.out) / "bench_simulator.json", data)],
                   status=0 if all(r.get("records_agree", True) for r in rows) else 1)


STUDY = SimulatorBench()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
