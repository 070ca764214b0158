"""The placement x eviction factorial under snapshot budgets, with and without a host tier (simulated).

    python -m experiments.traces.factorial --trace mooncake-conversation --reading chains --limit 1000 \\
        --budget-gb 0.25,4,16,64 --host-gb 0,256 --out results/traces/factorial-mooncake-1000

Every placement policy runs with every eviction in every (device budget, host tier) cell, through
the same simulator as `python -m experiments.traces` (`sweep.measure_point`: the real engine on the
model-free runner, the cost model's clock); the offline optimum (Belady's MIN over the device, its
demotions to the host included) is each cell's reference, and ours-plus with no budget at all is
the host tier's (the issue's goal: with a 256 GB host, >= 97% of its unbounded restored tokens and a
simulated TTFT p50 within 5% of it). Each point's row is appended to `points.jsonl` as it
finishes (`experiments.common.sweep.Journal`: a header line with the study's identity, then a row a
line), so `--resume` after a kill runs only what is missing (and, with every point kept, redraws
the report and the figure from them); a resume into another study's folder is refused first.

`--ray` runs the points as Ray tasks (one CPU each; the optional extra 'sweeps') on a local Ray with
`--jobs` CPUs; `--ray-address HOST:PORT` (implies `--ray`) on a running cluster instead, e.g. two nodes:

    export RAY_AUTH_MODE=token   # Ray 2.60 starts a head with token auth; its clients need this
    ray start --head --port=6379 --num-cpus=1
    ray start --address=127.0.0.1:6379 --num-cpus=1   # on the second node
    python -m experiments.traces.factorial --trace synthetic --ray-address 127.0.0.1:6379 --out DIR

The driver writes each row as its task finishes (`ray.wait`), so `--resume` works the same; every
node needs this repository at the same path (the tasks import it through PYTHONPATH).

The question (issue 20): does `ours-plus` with its own eviction restore at least as many tokens
as every (placement, eviction) pair in every cell? `factorial.md` answers it per cell, with the
best pair and the ratio; `factorial.png` draws restored tokens per pair, one panel per cell (a row
per host tier, a column per device budget).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from experiments.common.flags import float_list, int_in_range, name_list
from experiments.common.inputs import InputError, read_text, require_extra
from experiments.common.progress import Progress
from experiments.common.results_io import environment, log, write_csv, write_json, write_text
from experiments.common import sweep
from experiments.common.study import Context, Ran, Study, run_study
from experiments.common.sweep import Journal
from experiments.traces.sweep import budget_text, measure_point
from experiments.workloads import READINGS, WORKLOADS
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.registry import POLICIES, get_policy

RECORD = "traces/factorial"
PLACEMENTS = ("vllm-align", "vllm-junction", "sglang", "trtllm", "marconi", "ollama", "ours-plus")
REFERENCE = "optimum"
OURS = "ours-plus"
KEEP = ("ssm_hit_tokens", "kv_hit_tokens", "replayed_tokens", "ttft_s_p50", "ttft_s_p99", "snapshots_saved",
        "snapshots_evicted", "snapshots_demoted", "snapshot_bytes_demoted", "snapshots_promoted",
        "snapshot_bytes_promoted", "restore_transfer_s", "eviction_leaders", "requests", "prompt_tokens", "wall_s")


def cells(args) -> list[tuple[float, float]]:
    return [(b, h) for h in args.host_gb for b in args.budget_gb]


def points(args) -> list[dict]:
    """Every (placement, eviction) in every cell (each placement with its own eviction too, listed
    or not: the verdict needs ours-plus's), then the optimum per cell, then ours-plus unbounded
    (budget None: what a host tier is measured against)."""
    pairs = [(p, e) for p in args.policy for e in args.eviction]
    pairs += [(p, get_policy(p).eviction) for p in args.policy if get_policy(p).eviction not in args.eviction]
    out = [{"policy": p, "eviction": e, "budget_gb": b, "host_gb": h} for b, h in cells(args) for p, e in pairs]
    out += [{"policy": REFERENCE, "eviction": "next_use", "budget_gb": b, "host_gb": h} for b, h in cells(args)]
    return out + [{"policy": OURS, "eviction": get_policy(OURS).eviction, "budget_gb": None, "host_gb": 0.0}]


def key(point: dict) -> tuple:
    return point["policy"], point["eviction"], point["budget_gb"], point["host_gb"]


def measure(job: tuple[dict, dict]) -> dict:
    """One point (in a worker process): the sweep's measurement, the factorial's columns."""
    point, base = job
    config = dict(base, host_gb=point["host_gb"] or None)
    if point["policy"] != REFERENCE:
        config["eviction"] = point["eviction"]
    row = measure_point({"trace": base["trace"], "reading": base["reading"], "policy": point["policy"],
                         "budget_gb": point["budget_gb"]}, config)
    return point | {k: row[k] for k in KEEP if k in row}


def measure_indexed(base: dict, _index: int, point: dict) -> dict:
    """`measure` as the sweep's executors call it (a module-level function: it pickles)."""
    return measure((point, base))


def journal(out: Path, base: dict) -> Journal:
    """`points.jsonl`: a row a point, keyed by its (placement, eviction, budget, host); the study's
    identity (trace, window, model, engine settings) in its header."""
    return Journal(out / "points.jsonl", RECORD, base, key)


def executor(args):
    """`--jobs` spawn processes, or Ray tasks (a local Ray of `--jobs` CPUs, or `--ray-address`)."""
    if not args.ray:
        return sweep.processes(args.jobs)
    return sweep.ray_tasks(args.ray_address, args.jobs, label=lambda p: f"{p['policy']}+{p['eviction']} "
                           f"{budget_text(p['budget_gb'])} host {p['host_gb']:g} GB")


def run(args, base: dict, out: Path, kept: list[dict]) -> list[dict]:
    todo = sweep.pending(points(args), done={key(r) for r in kept}, key=lambda i, p: key(p))
    log(f"{len(todo)} points to run ({len(kept)} kept), " + (
        f"Ray tasks ({args.ray_address or f'local Ray, {args.jobs} CPUs'})" if args.ray else f"{args.jobs} processes"))
    with Progress(len(todo), "points", every_s=30) as progress:
        return sweep.run_journal(journal(out, base), points(args), functools.partial(measure_indexed, base), kept,
                                 executor(args), advance=lambda row: progress.advance(
                                     note=f"{row['policy']}+{row['eviction']} {budget_text(row['budget_gb'])} "
                                          f"host {row['host_gb']:g} GB: {row['ssm_hit_tokens']:,} restored"))


def unbounded_row(rows: list[dict]) -> dict | None:
    """ours-plus with its own eviction and no snapshot budget (None when not among `rows`)."""
    own = get_policy(OURS).eviction
    return next((r for r in rows if r["policy"] == OURS and r["eviction"] == own and r["budget_gb"] is None), None)


def verdicts(rows: list[dict], args) -> list[dict]:
    """Per cell: ours-plus with its own eviction against the best other pair, the optimum, and (the
    host-tier goal) its restored tokens and simulated TTFT p50 over its own unbounded run's."""
    own = get_policy(OURS).eviction
    free = unbounded_row(rows)
    out = []
    for b, h in cells(args):
        cell = [r for r in rows if r["budget_gb"] == b and r["host_gb"] == h]
        pairs = [r for r in cell if r["policy"] != REFERENCE]
        ours = next((r for r in pairs if r["policy"] == "ours-plus" and r["eviction"] == own), None)
        others = [r for r in pairs if not (r["policy"] == "ours-plus" and r["eviction"] == own)]
        best = max(others, key=lambda r: r["ssm_hit_tokens"]) if others else None
        # the same question against other placements only (any eviction): where its placement stands
        placed = max((r for r in others if r["policy"] != OURS), key=lambda r: r["ssm_hit_tokens"], default=None)
        ref = next((r for r in cell if r["policy"] == REFERENCE), None)
        if ours is None or best is None:
            continue
        out.append({"budget_gb": b, "host_gb": h, "ours_plus": ours["ssm_hit_tokens"],
                    "best_other": f"{best['policy']}+{best['eviction']}", "best_other_tokens": best["ssm_hit_tokens"],
                    "ratio": ours["ssm_hit_tokens"] / max(best["ssm_hit_tokens"], 1),
                    "wins": ours["ssm_hit_tokens"] >= best["ssm_hit_tokens"],
                    "best_other_placement": f"{placed['policy']}+{placed['eviction']}" if placed else None,
                    "ratio_other_placement": (ours["ssm_hit_tokens"] / max(placed["ssm_hit_tokens"], 1)
                                              if placed else None),
                    "optimum": ref["ssm_hit_tokens"] if ref else None,
                    "of_unbounded": ours["ssm_hit_tokens"] / max(free["ssm_hit_tokens"], 1) if free else None,
                    "ttft_p50_over_unbounded": ours["ttft_s_p50"] / free["ttft_s_p50"] if free else None})
    return out


def report(rows: list[dict], args, base: dict) -> str:
    start = base.get("start") or 0
    window = (f"first {base['limit']:,} requests" if not start
              else f"requests {start:,}-{start + base['limit'] - 1:,}")
    lines = [f"# Placement x eviction factorial (simulated): {base['trace']} ({base['reading']}), "
             f"{window}, {base['shape']}", "",
             "Restored (SSM-usable) tokens per (placement, eviction) pair; each cell a device budget with or "
             "without a host tier (PCIe 5 x16, `planner/snapshot_tiers.py`). `ours-plus` means its placement "
             f"with its own eviction ({get_policy(OURS).eviction}); the verdict is against every other pair, its own placement "
             "with the other evictions included, and `ours / best other placement` against the other placements "
             "alone. Simulated: cost-model clock, not measured.", "",
             "| device | host | ours-plus (own) | best other pair | its tokens | ours / best | optimum | verdict "
             "| ours / best other placement | ours / unbounded | TTFT p50 / unbounded |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratio = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for v in verdicts(rows, args):
        lines.append(f"| {v['budget_gb']:g} GB | {v['host_gb']:g} GB | {v['ours_plus']:,} | {v['best_other']} | "
                     f"{v['best_other_tokens']:,} | {v['ratio']:.3f} | "
                     f"{v['optimum']:,} | {'wins' if v['wins'] else 'loses'} | "
                     f"{ratio(v['ratio_other_placement'])} ({v['best_other_placement'] or '-'}) | "
                     f"{ratio(v['of_unbounded'])} | "
                     f"{ratio(v['ttft_p50_over_unbounded'])} |")
    free = unbounded_row(rows)
    if free is not None:
        lines += ["", f"ours-plus unbounded: {free['ssm_hit_tokens']:,} restored tokens, simulated TTFT p50 "
                      f"{free['ttft_s_p50']:.3f} s (the issue's host-tier goal: >= 0.97 of its tokens and a p50 "
                      "within 5% of its, at every device budget with a 256 GB host)."]
    lines += ["", "## Every pair", ""]
    for b, h in cells(args):
        cell = sorted((r for r in rows if r["budget_gb"] == b and r["host_gb"] == h),
                      key=lambda r: -r["ssm_hit_tokens"])
        lines += [f"### device {b:g} GB, host {h:g} GB", "",
                  "| placement | eviction | restored tokens | TTFT p50 / p99 (s, simulated) | saved | evicted | "
                  "demoted | promoted |", "|---|---|---|---|---|---|---|---|"]
        for r in cell:
            lines.append(f"| {r['policy']} | {r['eviction']} | {r['ssm_hit_tokens']:,} | {r['ttft_s_p50']:.3f} / "
                         f"{r['ttft_s_p99']:.3f} | {r['snapshots_saved']:,} | {r['snapshots_evicted']:,} | "
                         f"{sum(r.get('snapshots_demoted', {}).values()):,} | "
                         f"{sum(r.get('snapshots_promoted', {}).values()):,} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], args, base: dict, path: Path) -> Path:
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    # one row per host tier, one column per device budget: a reader compares across a row or a column
    fig, axes = plt.subplots(len(args.host_gb), len(args.budget_gb), figsize=(4.2 * len(args.budget_gb),
                             4.0 * len(args.host_gb)), sharey=False, squeeze=False)
    free = unbounded_row(rows)
    # the listed evictions, then any placement's own that was run beside them (marconi's flop_aware, say)
    evictions = list(args.eviction) + sorted({r["eviction"] for r in rows if r["policy"] != REFERENCE}
                                             - set(args.eviction))
    for ax, (b, h) in zip(axes.flat, [(b, h) for h in args.host_gb for b in args.budget_gb]):
        cell = [r for r in rows if r["budget_gb"] == b and r["host_gb"] == h]
        for i, p in enumerate(args.policy):
            for j, e in enumerate(evictions):
                r = next((r for r in cell if r["policy"] == p and r["eviction"] == e), None)
                if r is not None:  # colour: the placement; marker: the eviction; side by side
                    ax.plot(i + 0.14 * (j - (len(evictions) - 1) / 2), r["ssm_hit_tokens"] / 1e3,
                            linestyle="none", color=fs.color(p), marker=fs.eviction_marker(e),
                            markersize=10 if fs.eviction_marker(e) == "*" else 7)
        ref = next((r for r in cell if r["policy"] == REFERENCE), None)
        if ref is not None:
            ax.axhline(ref["ssm_hit_tokens"] / 1e3, color=fs.color(REFERENCE), linestyle=":", linewidth=1.2)
        if free is not None:
            ax.axhline(free["ssm_hit_tokens"] / 1e3, color=fs.color(OURS), linestyle="--", linewidth=1.0)
        top = max([r["ssm_hit_tokens"] for r in cell + ([free] if free else [])] or [1]) / 1e3
        ax.set_ylim(0, top * 1.08)  # the optimum's line stays inside the axes
        ax.set_xticks(range(len(args.policy)), args.policy, rotation=35, ha="right")
        ax.set_title(f"device {b:g} GB, host {h:g} GB", fontsize=10)
        ax.set_ylabel("restored tokens (thousands)")
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Line2D([], [], color="0.3", linestyle="none", marker=fs.eviction_marker(e), label=e)
               for e in evictions]
    handles.append(plt.Line2D([], [], color=fs.color(REFERENCE), linestyle=":", label="offline optimum (Belady)"))
    if free is not None:
        handles.append(plt.Line2D([], [], color=fs.color(OURS), linestyle="--", label="ours-plus, unbounded"))
    fig.legend(handles=handles, title="eviction (marker colour: placement)", loc="upper center",
               ncol=len(handles), bbox_to_anchor=(0.5, 0.02), fontsize=8)
    fs.title(fig, "Placement x eviction: restored tokens per cell",
             workload=f"{base['trace']} ({base['reading']} reading)" + (
                 f", requests {base['start']:,}-{base['start'] + base['limit'] - 1:,}" if base.get("start") else ""),
             model=base["shape"], requests=base["limit"], simulated=True)
    return fs.save(fig, path)


def add_flags(ap) -> None:
    ap.add_argument("--trace", choices=list(WORKLOADS), default="mooncake-conversation", help="the workload")
    ap.add_argument("--reading", choices=READINGS, default="chains", help="how its requests continue each other")
    ap.add_argument("--limit", type=int_in_range(1), default=1000, help="N requests (from --start)")
    ap.add_argument("--start", type=int_in_range(0), default=0, help="skip the trace's first N requests (0-based)")
    ap.add_argument("--policy", type=name_list(sorted(set(POLICIES) - {REFERENCE}), refuse_offline=False),
                    default=",".join(PLACEMENTS), help=f"placement policies (comma list; {REFERENCE} always runs, "
                                                       "as the reference)")
    ap.add_argument("--eviction", type=name_list(sorted(EVICTION_POLICIES)), default=",".join(sorted(EVICTION_POLICIES)),
                    help="evictions (comma list)")
    ap.add_argument("--budget-gb", type=float_list(0, lo_open=True), default="0.25,4,16,64",
                    help="device snapshot budgets in GB (comma list; finite)")
    ap.add_argument("--host-gb", type=float_list(0), default="0,256",
                    help="host tiers in GB (comma list; 0: none)")
    ap.add_argument("--model", default="bamba-9b", choices=("bamba-9b", "granite-4.0-h-small", "nemotron-h-8b"),
                    help="the model shape of the cost model")
    ap.add_argument("--jobs", type=int_in_range(1), default=2,
                    help="worker processes (with --ray: the local Ray's CPUs)")
    ap.add_argument("--resume", action="store_true", help="keep the points in --out's points.jsonl; run the rest")
    ap.add_argument("--ray", action="store_true", help="run the points as Ray tasks (optional extra 'sweeps')")
    ap.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                    help="a running Ray cluster's address (implies --ray; default: a local Ray)")


def check_same_run(ap, path: Path, base: dict) -> None:
    """A resume adds points to the run in `path`'s folder only if it is the same study (trace, window,
    model, engine settings); added placements, evictions or cells are fine. Checked before anything is
    written; a folder whose run never finished a report has no factorial.json and is not checked."""
    if not path.is_file():
        return
    try:
        stored = json.loads(read_text(path, "a factorial's report"))["config"]
    except (json.JSONDecodeError, KeyError, TypeError):
        ap.error(f"argument --resume: {path} is not a factorial's report (no config in it)")
    differ = [f"{k}={stored.get(k)!r} there, {v!r} here" for k, v in base.items() if stored.get(k) != v]
    if differ:
        ap.error(f"argument --resume: {path.parent} holds another study: " + "; ".join(differ))


def base_of(args) -> dict:
    """The study's identity (trace, window, model, engine settings): a --resume must match it."""
    return {"trace": args.trace, "reading": args.reading, "limit": args.limit, "start": args.start,
            "shape": args.model,
            "prefill_budget": 8192, "max_batch_size": 64, "kv_pool_gb": 60.0, "time_scale": 1.0, "trace_file": None}


class Factorial(Study):
    record = RECORD
    prog = "python -m experiments.traces.factorial"
    description = __doc__.split("\n")[0]
    replot = False  # the figure is drawn from the rows in memory; factorial.json holds them

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        """Ray's extra, and a --resume's folder: its points readable, its report the same study's."""
        args = ctx.args
        args.ray = args.ray or args.ray_address is not None
        if args.ray:  # before anything is read or written
            require_extra("ray", "sweeps", "--ray")
        if args.resume and args.out is None:
            ctx.error("argument --resume: needs --out FOLDER (the killed run's folder)")
        if args.resume:  # the points file of the same study (its header), then its report's config
            try:
                ctx.inputs["kept"] = journal(args.out, base_of(args)).kept()
            except InputError as err:
                ctx.error(f"argument --resume: {err}")
            check_same_run(ctx.ap, args.out / "factorial.json", base_of(args))

    def run(self, ctx: Context) -> Ran:
        args, out, base = ctx.args, ctx.out, base_of(ctx.args)
        t0 = time.time()
        rows = run(args, base, out, ctx.inputs.get("kept", []))
        rows.sort(key=lambda r: (r["host_gb"], r["budget_gb"] if r["budget_gb"] is not None else float("inf"),
                                 r["policy"], r["eviction"]))
        config = base | {"policies": args.policy, "evictions": args.eviction, "budget_gb": args.budget_gb,
                         "host_gb": args.host_gb}
        written = [write_json(out / "factorial.json", {"simulated": True, "config": config, **environment(),
                                                       "verdicts": verdicts(rows, args), "rows": rows,
                                                       "points_wall_s": sum(r.get("wall_s", 0.0) for r in rows),
                                                       "invocation_wall_s": time.time() - t0}),
                   write_csv(out / "factorial.csv", [{k: json.dumps(v) if isinstance(v, dict) else v
                                                       for k, v in r.items()} for r in rows]),
                   write_text(out / "factorial.md", report(rows, args, base)), out / "points.jsonl"]
        for v in verdicts(rows, args):
            log(f"device {v['budget_gb']:g} GB host {v['host_gb']:g} GB: ours-plus {v['ours_plus']:,} vs best other "
                f"{v['best_other']} {v['best_other_tokens']:,} ({v['ratio']:.3f}x)")
        return Ran(written, result=rows)

    def figures(self, ctx: Context) -> list[Path]:
        return [plot(ctx.result, ctx.args, base_of(ctx.args), ctx.out / "factorial.png")]


STUDY = Factorial()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
