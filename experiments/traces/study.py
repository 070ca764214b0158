"""Simulate snapshot placement policies on a trace; write DIR/summary.json, the rows and the plots.

    python -m experiments.traces --trace mooncake-conversation --reading as-given,chains \\
        --policy vllm-align,ours-plus --budget-gb 0.25,4,64,inf --model bamba-9b --limit 500

Every time is simulated (cost model `experiments.traces.cost`, H200 roofline). Output: a new
`runs/traces/<timestamp>/` unless `--out FOLDER` (the committed record: `--out results/traces/<slice>`).
`--shard i/n` runs every n-th point and writes its part into `--out`; `--merge` combines the parts
(experiments.common.sweep_parts); `--replot` redraws the figures from the summary in `--out`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from experiments.common import compact, sweep_parts
from experiments.common.flags import (add_limit_flag, add_policy_list_flag, add_prefill_budget_flag,
                                      add_snapshot_dtype_flag, float_in_range, int_in_range, name_list, shard_spec)
from experiments.common.inputs import InputError, read_json, require_extra
from experiments.common.outputs import RESULTS, check_writable
from experiments.common.results_io import environment, log, write_json, write_text
from experiments.common.study import Context, Ran, Study
from experiments.traces.cost import SHAPES, ShapeCost
from experiments.traces.simulate import SimConfig
from experiments.traces.goals import check as check_goals, markdown as goal_table
from experiments.traces.sweep import (NAME, PER_REQUEST, TTFTS, load_requests, points_for, run_on_ray, run_points,
                                      summarize, write_ttfts)
from experiments.workloads import READINGS, WORKLOADS, default_reading
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.registry import POLICIES

RECORD = "traces"
DEFAULT_POLICIES = ("vllm-align", "vllm-junction", "trtllm", "marconi", "ours-plus", "optimum")


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


def trace_file(text: str) -> Path:
    """An existing regular file (its lines are checked when read)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'not a file' if path.exists() else 'no such file'}")
    return path


def add_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trace", choices=list(WORKLOADS), default=None,
                    help="the workload (required, except with --merge or --replot)")
    ap.add_argument("--trace-file", type=trace_file, default=None,
                    help="a Mooncake-format .jsonl(.gz) read instead of the vendored file of a mooncake trace")
    ap.add_argument("--reading", type=name_list(READINGS), default=None,
                    help="comma-separated readings (Mooncake: as-given, chains; default as-given; sharegpt, "
                         "synthetic: chains)")
    add_policy_list_flag(ap, DEFAULT_POLICIES, sorted(POLICIES))
    ap.add_argument("--budget-gb", type=budget_list, default=[None], metavar="GB,...",
                    help="snapshot memory budgets in GB, comma-separated ('inf': unbounded)")
    ap.add_argument("--eviction", choices=sorted(EVICTION_POLICIES), default=None,
                    help="run every policy with this snapshot eviction instead of its own (an ablation; the "
                         "optimum keeps Belady's MIN under a budget)")
    ap.add_argument("--host-gb", type=float_in_range(0), default=0.0,
                    help="a host-memory snapshot tier below each finite budget, in GB (PCIe 5 x16, "
                         "planner.snapshot_tiers; 0: none)")
    ap.add_argument("--disk-gb", type=float_in_range(0), default=0.0,
                    help="a disk snapshot tier below that, in GB (NVMe; 0: none)")
    ap.add_argument("--prefix-match-unit", type=int_in_range(1), default=None, metavar="TOKENS",
                    help="where a prefix match may end, dividing the 16-token block (1: any token) for every "
                         "policy but the optimum, whose oracle marks whole blocks (absent: each policy's own: "
                         "ours-plus 1, the others the block). Mooncake's prompts are 512-token hash blocks: a "
                         "finer unit gains only in a prompt's last, partial hash block and at reply ends")
    add_snapshot_dtype_flag(ap)
    ap.add_argument("--model", choices=sorted(SHAPES), default="bamba-9b", help="the model shape of the cost model")
    add_limit_flag(ap, None)
    ap.add_argument("--start", type=int_in_range(0), default=0,
                    help="skip the trace's first N requests (0-based): with --limit, any window of the trace")
    add_prefill_budget_flag(ap, 8192)
    ap.add_argument("--max-batch-size", type=int_in_range(1), default=64, help="batch slots (concurrent requests)")
    ap.add_argument("--kv-pool-gb", type=float_in_range(0, lo_open=True), default=60.0,
                    help="KV cache memory (the same for every policy)")
    ap.add_argument("--time-scale", type=float_in_range(0, lo_open=True), default=1.0,
                    help="arrivals at trace time x this factor")
    ap.add_argument("--shard", type=shard_spec, default=None,
                    help="run points whose index %% n == i (i/n) into --out's parts/")
    ap.add_argument("--merge", action="store_true", help="only combine the parts in --out and write the summary")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points a killed run of the same sweep and shard wrote to its part; run the rest")
    ap.add_argument("--ray", action="store_true", help="run the points as Ray tasks (optional extra 'sweeps')")
    ap.add_argument("--ray-address", default=None,
                    help="a running Ray cluster's address (implies --ray; default: a local Ray)")
    ap.add_argument("--ray-tasks", type=int_in_range(1), default=None, help="Ray tasks = shards (absent: one per point)")
    ap.add_argument("--ray-cpus", type=int_in_range(1), default=None, help="CPUs of the local Ray (default: all)")
    ap.add_argument("--no-plots", action="store_true", help="write the data only")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Cross-flag checks, before anything is read or written."""
    if args.trace is None and not (args.merge or args.replot):
        ap.error("the following arguments are required: --trace")
    args.ray = args.ray or args.ray_address is not None  # an address means Ray, as in traces.factorial
    if args.ray and (args.shard is not None or args.resume):
        ap.error("argument --ray: not with --shard / --resume; choose one")
    if (args.merge or args.resume or args.shard is not None) and args.out is None and not args.publish:
        flag = "--merge" if args.merge else "--resume" if args.resume else "--shard"
        ap.error(f"argument {flag}: needs --out FOLDER (the sweep's folder)")
    if args.merge and args.replot:
        ap.error("argument --replot: not with --merge (--merge writes the summary and plots)")
    if (args.host_gb or args.disk_gb) and None in args.budget_gb:
        ap.error("argument --host-gb/--disk-gb: a lower tier sits below a finite device budget; drop 'inf' "
                 "from --budget-gb")
    if args.prefix_match_unit is not None and SimConfig.block_size % args.prefix_match_unit:
        ap.error(f"argument --prefix-match-unit: must divide the KV block ({SimConfig.block_size} tokens), "
                 f"got {args.prefix_match_unit}")
    if args.trace_file is not None and not (args.trace or "").startswith("mooncake"):
        ap.error("argument --trace-file: only for the mooncake traces")
    if args.publish:
        ap.error("argument --publish: a traces record folder depends on the slice; name it: "
                 "--out results/traces/<trace>-<limit>")
    if args.ray:
        require_extra("ray", "sweeps", "--ray")


def config_of(args) -> dict:
    config = {"trace": args.trace, "shape": args.model, "limit": args.limit, "prefill_budget": args.prefill_budget,
              "max_batch_size": args.max_batch_size, "kv_pool_gb": args.kv_pool_gb, "time_scale": args.time_scale,
              "trace_file": None if args.trace_file is None else str(args.trace_file)}
    if args.eviction is not None:  # only then: the sweeps without it keep their definition (and parts)
        config["eviction"] = args.eviction
    for key in ("host_gb", "disk_gb", "start", "prefix_match_unit", "snapshot_dtype"):  # the same: only when asked
        if getattr(args, key):
            config[key] = getattr(args, key)
    return config


def check_requests(args, readings: list[str], config: dict) -> None:
    """Read every reading's requests now (cached for the points): a bad or empty trace is an
    InputError naming the file, before any part is written."""
    where = args.trace_file or args.trace
    for reading in readings:
        try:
            requests = load_requests(args.trace, reading, args.limit, config["trace_file"], config.get("start", 0))
        except ModuleNotFoundError as err:  # the sharegpt source's extra
            raise InputError(str(err)) from None
        except ValueError as err:  # names file:line and the field
            raise InputError(f"--trace-file {err}" if args.trace_file else str(err)) from None
        if not requests and config.get("start", 0):  # the trace has requests, all before --start
            total = len(load_requests(args.trace, reading, None, config["trace_file"], 0))
            if total:
                raise InputError(f"--start {config['start']}: past the end of {where} ({total} requests, "
                                 f"reading {reading}; --start counts from 0)")
        if not requests:
            raise InputError(f"{where}: no requests in it (reading {reading}); is the file empty?")
        log(f"{args.trace} ({reading}): {len(requests)} requests")


def check_parts(out: Path) -> None:
    """Every part file in `out/parts` readable and a sweep part, the set complete: else an InputError
    naming the file or what is missing (`sweep_parts.collect` reads them guarded)."""
    try:
        sweep_parts.collect(out, NAME)
    except sweep_parts.IncompleteSweep as err:
        raise InputError(str(err)) from None


def replot(out: Path) -> list[Path]:
    """The figures again from `out/summary.json` and `out/ttft.json.gz` (or a plain `ttft.json`; guarded reads)."""
    from experiments.traces.plots import plot_all

    read_json(out / "summary.json", ("readings", "trace", "shape", "requests"), what="a traces summary")
    ttfts_path = compact.locate(out / TTFTS)
    ttfts = read_json(ttfts_path, what="the per-request TTFTs of a traces run")
    if not isinstance(ttfts, list):
        raise InputError(f"{ttfts_path}: not a list of TTFT rows")
    try:
        return plot_all(out)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InputError(f"{out / 'summary.json'}: not a traces summary ({type(err).__name__}: {err})") from None


def finish(out: Path) -> tuple[list[Path], dict]:
    """Merge the parts, write the summary, TTFTs and goals; returns the files written and the summary."""
    sweep_parts.merge(out, NAME, per_request=PER_REQUEST)
    parts, rows, _ = sweep_parts.collect(out, NAME)
    config = parts[0]["config"]  # what the shards ran (a --merge's own flags may differ)
    cost = ShapeCost.from_preset(config["shape"]).summary()
    summary = summarize(rows, config, environment(), cost)
    written = [out / f"{NAME}.csv", out / f"{NAME}.json", write_json(out / "summary.json", summary)]
    goals = check_goals(summary)
    written += [write_ttfts(out, rows), write_json(out / "goals.json", goals),
                write_text(out / "goals.md", goal_table(goals))]
    return written, summary


def committed_like(summary: dict) -> dict | None:
    """The committed summary of the same slice (trace, limit, shape, trace file, eviction) that shares
    the most (policy, budget) cells with this one, if any."""
    want = {k: summary["config"].get(k) for k in ("trace", "limit", "shape", "trace_file", "eviction", "start")}
    mine = {(p, b) for p, m in summary["policies"].items() for b in m["by_budget"]}
    best, shared = None, 0
    for path in sorted((RESULTS / RECORD).rglob("summary.json")):
        try:
            other = read_json(path, ("config", "policies", "prompt_tokens"))
            cells = {(p, b) for p, m in other["policies"].items() for b in m["by_budget"]}
        except (InputError, AttributeError, KeyError, TypeError):
            continue
        if {k: other["config"].get(k) for k in want} == want and len(cells & mine) > shared:
            best, shared = other | {"_folder": path.parent.relative_to(RESULTS / RECORD).as_posix()}, len(cells & mine)
    return best


def headline(summary: dict, committed: dict) -> list[tuple]:
    """SSM-usable hit share of the prompt tokens for up to 4 policies, at the first budget both ran."""
    rows = []
    for name in sorted(summary["policies"], key=lambda p: (p != "ours-plus", p)):
        mine, theirs = summary["policies"][name], committed["policies"].get(name)
        if theirs is None:
            continue
        common = [b for b in mine["by_budget"] if b in theirs["by_budget"]]
        if common:
            b = "unbounded" if "unbounded" in common else common[-1]
            rows.append((f"{name} SSM hit share, {b} GB",
                         mine["by_budget"][b]["ssm_hit_tokens"] / summary["prompt_tokens"],
                         theirs["by_budget"][b]["ssm_hit_tokens"] / committed["prompt_tokens"]))
    return rows[:4]


class Traces(Study):
    record = RECORD
    prog = "python -m experiments.traces"
    description = __doc__.split("\n")[0]

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        """The flags together, then the trace's requests (a bad or empty trace names the file)."""
        args = ctx.args
        check_args(ctx.ap, args)
        if not ctx.reading:
            check_requests(args, self.readings(args), config_of(args))
        if args.resume and args.out is not None and args.out.is_dir():  # another run's parts: refused before any work
            points = points_for(args.trace, self.readings(args), args.policy, args.budget_gb)
            try:
                sweep_parts.refuse_stale(args.out, NAME, points, config_of(args), args.shard or (0, 1))
            except sweep_parts.IncompleteSweep as err:
                ctx.error(f"argument --resume: {err}")

    def readings(self, args) -> list[str]:
        return args.reading or [default_reading(args.trace)]

    def run(self, ctx: Context) -> Ran:
        args, out = ctx.args, ctx.out
        if args.merge:
            check_parts(out)
            check_writable(ctx.ap, out)
        else:
            config = config_of(args)
            points = points_for(args.trace, self.readings(args), args.policy, args.budget_gb)
            log(f"{len(points)} points into {out}")
            if args.ray:
                tasks = args.ray_tasks or len(points)
                log(f"{len(points)} points as {tasks} Ray tasks ({args.ray_address or 'local ray.init()'})")
                run_on_ray(out, points, config, tasks, args.ray_address, args.ray_cpus)
            else:
                part = run_points(out, points, config, args.shard or (0, 1), resume=args.resume)
                if args.shard is not None:
                    return Ran([sweep_parts.part_path(out, NAME, args.shard)] if part else [], finished=False)
        written, summary = finish(out)
        return Ran(written, result=summary)

    def figures(self, ctx: Context) -> list[Path]:
        if ctx.replotting:
            return replot(ctx.out)
        if ctx.args.no_plots:
            return []
        from experiments.traces.plots import plot_all

        return plot_all(ctx.out)

    def headline(self, ctx: Context) -> dict:
        """Beside the committed summary of the same slice, in its own folder under results/traces/."""
        committed = committed_like(ctx.result)
        return {} if committed is None else {f"{RECORD}/{committed['_folder']}": headline(ctx.result, committed)}


STUDY = Traces()
parser = STUDY.parser
main = STUDY.main
