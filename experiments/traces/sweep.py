"""Policies x snapshot budgets x readings as one sweep through `experiments.common.sweep_parts`.

A point is `{"trace", "reading", "policy", "budget_gb"}` (budget None: unbounded). `run_points`
measures the points of one shard and writes its part; `run_on_ray` runs shards 0..n-1 as Ray tasks
(`experiments.common.sweep.ray_tasks`; each writes its own part, as a `--shard i/n` process would;
a cluster needs `out` on a shared file system); `summarize` turns
the merged rows into the command's `summary.json`. Requests are read once per (trace, reading)
per process.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator, Sequence

from experiments.traces.oracle import optimum_marks, optimum_matches, optimum_uses
from experiments.traces.simulate import SimConfig, simulate
from experiments.workloads import MooncakeTrace, open_workload
from experiments.workloads.request import WorkloadRequest
from planner.policies.base import PlacementPolicy
from planner.policies.registry import get_policy

NAME = "traces"
METRICS = ("kv_hit_tokens", "ssm_hit_tokens", "lost_tokens", "replayed_tokens", "forwards", "snapshot_bytes_peak",
           "snapshot_bytes_mean", "snapshots_saved", "snapshots_evicted", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99")


@functools.lru_cache(maxsize=4)
def load_requests(trace: str, reading: str, limit: int | None, trace_file: str | None = None, start: int = 0
                  ) -> tuple[WorkloadRequest, ...]:
    """`limit` requests of a trace in a reading from request `start` (0-based; a window read with its
    earlier requests, which the chains reading links to, and then skipped); `trace_file`: a
    Mooncake-format file read instead of the named trace. A bad line raises ValueError naming
    file:line and the field."""
    upto = None if limit is None else start + limit
    source = MooncakeTrace(trace_file, reading) if trace_file is not None else open_workload(trace, reading)
    return tuple(source.requests(limit=upto))[start:]


@functools.lru_cache(maxsize=4)
def oracle_for(trace: str, reading: str, limit: int | None, trace_file: str | None, block_size: int, start: int = 0
               ) -> tuple[dict, dict]:
    """The optimum's capture positions and future restores for these requests (once per process)."""
    requests = load_requests(trace, reading, limit, trace_file, start)
    matches = optimum_matches(requests, block_size)
    return optimum_marks(requests, block_size, matches), optimum_uses(requests, block_size, matches)


def points_for(trace: str, readings: Sequence[str], policies: Sequence[str],
               budgets: Sequence[float | None]) -> list[dict]:
    return [{"trace": trace, "reading": r, "policy": p, "budget_gb": b}
            for r in readings for b in budgets for p in policies]


def budget_text(budget_gb: float | None) -> str:
    return "unbounded" if budget_gb is None else f"{budget_gb:g} GB"


def _admitted(requests: Sequence[WorkloadRequest], every_s: float) -> Iterator[WorkloadRequest]:
    """The requests as the simulator admits them, with a progress line (rate, ETA) every `every_s`
    (none for a point that ends sooner: the point's own line follows)."""
    from experiments.common.progress import Progress
    from experiments.common.results_io import log

    p = Progress(len(requests), "requests admitted", every_s)
    for r in requests:
        yield r
        p.done += 1
        if p.clock() - p.last >= every_s:
            p.last = p.clock()
            log("  " + p.line())


def _match_unit(policy: PlacementPolicy, config: dict) -> int | None:
    """The sweep's `prefix_match_unit` for `policy` (None: the policy's own); the optimum keeps its
    own, the block: its oracle marks whole-block matches (experiments/traces/oracle.py)."""
    return None if policy.needs_oracle else config.get("prefix_match_unit")


def measure_point(point: dict, config: dict, progress_s: float | None = None) -> dict:
    """One simulated run: the row of metrics, with the per-request TTFTs for the CDF. `progress_s`:
    log the requests admitted so far (rate, ETA) every that many seconds."""
    start = config.get("start", 0)
    policy = get_policy(point["policy"])  # the point names it (a row of JSON): resolved once, handed down
    requests = load_requests(point["trace"], point["reading"], config["limit"], config.get("trace_file"), start)
    cfg = SimConfig(policy, shape=config["shape"], budget_gb=point["budget_gb"],
                    prefill_budget=config["prefill_budget"], max_batch_size=config["max_batch_size"],
                    kv_pool_gb=config["kv_pool_gb"], time_scale=config["time_scale"], eviction=config.get("eviction"),
                    host_gb=config.get("host_gb"), disk_gb=config.get("disk_gb"),
                    prefix_match_unit=_match_unit(policy, config),
                    snapshot_dtype=config.get("snapshot_dtype"))
    marks = uses = None
    if policy.needs_oracle:
        marks, uses = oracle_for(point["trace"], point["reading"], config["limit"], config.get("trace_file"),
                                 cfg.block_size, start)
    out = simulate(requests if progress_s is None else _admitted(requests, progress_s), cfg, marks, uses)
    return {**point, **out["metrics"], "ttft_s": [round(r.ttft_s, 6) for r in out["records"]]}


def run_points(out: Path, points: list[dict], config: dict, spec: tuple[int, int], resume: bool = False) -> dict:
    """Measure shard `spec` of the points and write its part (`sweep_parts.run_shard`; `resume`:
    keep the points a killed run of this shard finished)."""
    from experiments.common import sweep_parts
    from experiments.common.progress import Progress
    from experiments.common.results_io import log, shard

    mine = len(shard(list(range(len(points))), spec))
    progress = Progress(mine, "points", every_s=0.0)

    def measure(i: int, point: dict) -> list[dict]:
        log(f"point {i}: {point['reading']} {point['policy']} snapshot memory {budget_text(point['budget_gb'])}")
        row = measure_point(point, config, progress_s=30.0)
        progress.advance(note=f"kv {row['kv_hit_tokens']} ssm {row['ssm_hit_tokens']} replayed "
                              f"{row['replayed_tokens']} in {row['wall_s']:.0f} s")
        return [{"point": i, "row": 0, **row}]

    return sweep_parts.run_shard(Path(out), NAME, points, config, spec, measure, tag=lambda p: dict(p), resume=resume)


def run_on_ray(out: Path, points: list[dict], config: dict, tasks: int, address: str | None = None,
               num_cpus: int | None = None) -> list[int]:
    """Shards 0..tasks-1 as Ray tasks (`experiments.common.sweep.ray_tasks`: one CPU each) on a local
    Ray (`address` None, `num_cpus` if given) or the cluster at `address`; returns the shards done."""
    from experiments.common import sweep

    shards = [(i, {"shard": [i, tasks]}) for i in range(tasks)]
    with sweep.ray_tasks(address, num_cpus, label=lambda s: f"shard {s['shard'][0]}/{tasks}")(
            functools.partial(_ray_shard, str(out), points, config), shards) as results:
        return sorted(i for i, _, _ in results)


def _ray_shard(out: str, points: list[dict], config: dict, i: int, job: dict) -> int:
    run_points(Path(out), points, config, tuple(job["shard"]))
    return i


def summarize(rows: list[dict], config: dict, environment: dict, cost: dict) -> dict:
    """`summary.json`: per reading, per policy, the metrics at each budget; top level as the issue asks."""
    budgets = sorted({r["budget_gb"] for r in rows}, key=lambda b: float("inf") if b is None else b)
    readings = sorted({r["reading"] for r in rows})

    def entry(rs: list[dict]) -> dict:
        by_budget = {("unbounded" if r["budget_gb"] is None else f"{r['budget_gb']:g}"): _metrics(r) for r in rs}
        first = _metrics(rs[0])
        return {**first, "budget_gb": rs[0]["budget_gb"], "by_budget": by_budget}

    def policies(reading: str) -> dict:
        out: dict = {}
        for r in rows:
            if r["reading"] == reading:
                out.setdefault(r["policy"], []).append(r)
        return {p: entry(sorted(rs, key=lambda r: budgets.index(r["budget_gb"]))) for p, rs in out.items()}

    first = readings[0]
    return {
        "trace": rows[0]["trace"], "reading": first, "shape": config["shape"],
        "budget_gb": budgets[0] if len(budgets) == 1 else budgets,
        "prompt_tokens": next(r["prompt_tokens"] for r in rows if r["reading"] == first),
        "requests": next(r["requests"] for r in rows if r["reading"] == first),
        "simulated": True, "cost_model": cost, "config": config, **environment,
        "policies": policies(first),
        "readings": {rd: {"prompt_tokens": next(r["prompt_tokens"] for r in rows if r["reading"] == rd),
                          "policies": policies(rd)} for rd in readings},
    }


def _metrics(row: dict) -> dict:
    keep = (*METRICS, "requests", "prompt_tokens", "engine_forwards", "snapshots_restored", "snapshots_declined", "eviction",
            "saved_by_origin", "restored_tokens_by_origin", "preemptions", "snapshots_demoted",
            "snapshot_bytes_demoted", "snapshots_promoted", "snapshot_bytes_promoted", "restore_transfer_s",
            "ttft_s_mean", "simulated_span_s", "simulated_busy_s", "block_size", "state_block", "effective_settings",
            "wall_s")
    return {k: row[k] for k in keep if k in row}


PER_REQUEST = ("ttft_s",)  # row keys with one value per request: in the parts and ttft.json.gz, not traces.csv
TTFTS = "ttft.json.gz"  # per-request, so compact (12,031 requests x 14 points: 2.68 MB plain, 0.61 MB gzip'd)


def write_ttfts(out: Path, rows: list[dict]) -> Path:
    from experiments.common.results_io import write_json

    return write_json(Path(out) / TTFTS, [{k: r[k] for k in ("reading", "policy", "budget_gb", "ttft_s")} for r in rows])
