"""Simulate snapshot placement policies on a trace; write DIR/summary.json, the rows and the plots.

    python -m experiments.traces --trace mooncake-conversation --reading as-given,chains \\
        --policies vllm-align,ours-plus --budget-gb 0.25,4,64,inf --shape bamba-9b --limit 500 --out DIR

Every time is simulated (cost model `experiments.traces.cost`, H200 roofline). `--shard i/n` runs
every n-th point and writes its part; `--merge` combines the parts (experiments.sweep_parts).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from experiments import sweep_parts
from experiments.flags import name_list, shard_spec
from experiments.results_io import environment, log, write_json, write_text
from experiments.traces.cost import SHAPES, ShapeCost
from experiments.traces.goals import check as check_goals, markdown as goal_table
from experiments.traces.sweep import NAME, load_requests, points_for, run_on_ray, run_points, summarize, write_ttfts
from experiments.workloads import READINGS, WORKLOADS, default_reading
from planner.eviction import EVICTION_POLICIES
from planner.policies.registry import POLICIES


def budget_list(text: str) -> list[float | None]:
    """Comma-separated GB, each >= 0; `inf` or `unbounded` for no limit."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part in ("inf", "unbounded", "none"):
            out.append(None)
            continue
        try:
            x = float(part)
        except ValueError:
            x = float("nan")
        if not (x >= 0 and math.isfinite(x)):
            raise argparse.ArgumentTypeError(f"each budget must be a number of GB >= 0 or 'inf', got {part!r}")
        out.append(x)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m experiments.traces", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, choices=[w for w in WORKLOADS], help="the workload")
    ap.add_argument("--trace-file", type=Path, default=None,
                    help="a Mooncake-format .jsonl(.gz) read instead of the vendored file of a mooncake trace")
    ap.add_argument("--reading", type=name_list(READINGS), default=None,
                    help="comma-separated readings (Mooncake: as-given, chains; default as-given; sharegpt, "
                         "synthetic: chains)")
    ap.add_argument("--policies", type=name_list(sorted(POLICIES)), required=True,
                    help=f"comma-separated placement policies, of {', '.join(sorted(POLICIES))}")
    ap.add_argument("--budget-gb", type=budget_list, default=[None],
                    help="snapshot memory budgets in GB, comma-separated ('inf': unbounded; default inf)")
    ap.add_argument("--eviction", choices=sorted(EVICTION_POLICIES), default=None,
                    help="run every policy with this snapshot eviction instead of its own (an ablation; the "
                         "optimum keeps Belady's MIN under a budget)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="bamba-9b", help="the model shape of the cost model")
    ap.add_argument("--limit", type=int, default=None, help="the first N requests (default: all)")
    ap.add_argument("--prefill-budget", type=int, default=8192, help="tokens per tick for prefill chunks")
    ap.add_argument("--max-batch-size", type=int, default=64, help="batch slots (concurrent requests)")
    ap.add_argument("--kv-pool-gb", type=float, default=60.0, help="KV cache memory (the same for every policy)")
    ap.add_argument("--time-scale", type=float, default=1.0, help="arrivals at trace time x this factor")
    ap.add_argument("--out", type=Path, required=True, help="folder for summary.json, rows, plots")
    ap.add_argument("--shard", type=shard_spec, default=None, help="run points whose index %% n == i (i/n)")
    ap.add_argument("--merge", action="store_true", help="only combine the parts in --out and write the summary")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points a killed run of the same sweep and shard wrote to its part; run the rest")
    ap.add_argument("--ray", action="store_true", help="run the points as Ray tasks (optional extra 'sweeps')")
    ap.add_argument("--ray-address", default=None, help="a Ray cluster's address (default: a local ray.init())")
    ap.add_argument("--ray-tasks", type=int, default=None, help="Ray tasks = shards (default: one per point)")
    ap.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    ap.add_argument("--no-plots", action="store_true", help="write the data only")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit: must be >= 1, got {args.limit}")
    for flag, v in (("--prefill-budget", args.prefill_budget), ("--max-batch-size", args.max_batch_size)):
        if v < 1:
            ap.error(f"{flag}: must be >= 1, got {v}")
    if args.ray and (args.shard is not None or args.resume):
        ap.error("--ray and --shard / --resume: choose one")
    if args.ray_tasks is not None and args.ray_tasks < 1:
        ap.error(f"--ray-tasks: must be >= 1, got {args.ray_tasks}")
    if not (args.kv_pool_gb > 0 and args.time_scale > 0):
        ap.error("--kv-pool-gb and --time-scale must be > 0")
    if args.trace_file is not None and not args.trace.startswith("mooncake"):
        ap.error("--trace-file: only for the mooncake traces")
    readings = args.reading or [default_reading(args.trace)]
    points = points_for(args.trace, readings, args.policies, args.budget_gb)
    config = {"trace": args.trace, "shape": args.shape, "limit": args.limit, "prefill_budget": args.prefill_budget,
              "max_batch_size": args.max_batch_size, "kv_pool_gb": args.kv_pool_gb, "time_scale": args.time_scale,
              "trace_file": None if args.trace_file is None else str(args.trace_file)}
    if args.eviction is not None:  # only then: the sweeps without it keep their definition (and parts)
        config["eviction"] = args.eviction
    if not args.merge:
        try:  # a bad trace fails here, naming file:line and field, before any part is written
            for reading in readings:
                load_requests(args.trace, reading, args.limit, config["trace_file"])
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        if args.ray:
            tasks = args.ray_tasks or len(points)
            log(f"{len(points)} points as {tasks} Ray tasks ({args.ray_address or 'local ray.init()'})")
            run_on_ray(args.out, points, config, tasks, args.ray_address, args.ray_cpus)
        else:
            run_points(args.out, points, config, args.shard or (0, 1), resume=args.resume)
            if args.shard is not None:
                return 0
    sweep_parts.merge(args.out, NAME)
    _, rows, _ = sweep_parts.collect(args.out, NAME)
    cost = ShapeCost.from_preset(args.shape).summary()
    summary = summarize(rows, config, environment(), cost)
    write_json(args.out / "summary.json", summary)
    write_ttfts(args.out, rows)
    goals = check_goals(summary)
    write_json(args.out / "goals.json", goals)
    write_text(args.out / "goals.md", goal_table(goals))
    log(f"wrote {args.out / 'summary.json'}")
    if not args.no_plots:
        from experiments.traces.plots import plot_all

        for path in plot_all(args.out):
            log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
