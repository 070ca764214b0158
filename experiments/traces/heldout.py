"""Judge placements out of sample: pairs on train and held-out windows, with the spread (simulated).

Policy x eviction pairs on the train windows, the held-out test windows and (optionally) the whole
trace, with the spread across windows.

    python -m experiments.traces.heldout --trace mooncake-conversation --reading chains --budget-gb 4 \\
        --out results/traces/heldout

The windows come from `experiments/traces/windows.py`: its train windows (what ours-plus's
constants were chosen on), then its held-out windows by the rule stated there (seeded, spread over
the whole trace, never touching a train or seen window). Every window runs the judged pairs
(`--ours`, default ours-plus with its own eviction) and the peer pairs (`--peers`, default `PEERS`)
at each device budget and host tier, through the factorial's measurement (`sweep.measure_point`:
the real engine on the model-free runner, the cost model's clock). Each window starts with an empty
store. A row per point: trace, reading, window start / limit, split (train / test / whole), budget,
tier, placement, eviction, restored (SSM-usable) tokens, and its ratio to the best peer pair of
that window and cell (a peer's ratio is to the best of the *other* peers). `heldout.md` reports,
per split, how many windows each judged pair wins and the median / min / max of its ratio, then
every window's row; `heldout.png` draws the ratio per window across the trace and every pair's
spread. Rows are appended to `points.jsonl` as they finish (`experiments.common.sweep.Journal`: a
header line with the study's identity, then a row a line), so `--resume` runs only what is missing.

A constant is never re-chosen here: the command measures, it tunes nothing.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from experiments.common.flags import float_list, int_in_range
from experiments.common.inputs import InputError, read_json, read_text
from experiments.common.results_io import environment, log, write_csv, write_json, write_text
from experiments.common import sweep
from experiments.common.study import Study, run_study
from experiments.common.sweep import Journal
from experiments.traces.windows import TEST_SEED, TRAIN, WINDOW_REQUESTS, Window, excluded, protocol
from experiments.workloads import READINGS, WORKLOADS
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.registry import POLICIES, get_policy

RECORD = "traces/heldout"
OURS = ("ours-plus", get_policy("ours-plus").eviction)
# The peer pairs: the three best other-placement pairs of every device-only cell (0.25 / 4 / 16 /
# 64 GB) of the two Mooncake train windows' factorials (results/traces/factorial-mooncake-1000/,
# factorial-mooncake-5000-1000/; tests/test_heldout.py re-derives the set from those records).
# Chosen on the train windows like everything else; a pair that is best only on a test window and
# never in the top three of a train cell is not run (the whole-trace factorial has every pair).
PEERS = (("marconi", "flop_aware"), ("marconi", "learned_value"), ("marconi", "lru"), ("marconi", "seglen"),
         ("marconi", "shadow_best"), ("trtllm", "seglen"), ("trtllm", "shadow_best"),
         ("vllm-junction", "learned_value"), ("vllm-junction", "seglen"), ("vllm-junction", "shadow_best"))
KEEP = ("ssm_hit_tokens", "kv_hit_tokens", "replayed_tokens", "ttft_s_p50", "ttft_s_p99", "snapshots_saved",
        "snapshots_evicted", "saved_by_origin", "restored_tokens_by_origin", "eviction_leaders", "requests",
        "prompt_tokens", "wall_s")  # by origin: which captures paid back (issue 32 item 4's question)


def pair_text(pair: tuple[str, str]) -> str:
    return f"{pair[0]}+{pair[1]}"


def pair_list(text: str) -> tuple[tuple[str, str], ...]:
    """`placement+eviction,...` (a placement alone: with its own eviction); each a known name."""
    import argparse

    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        placement, _, eviction = item.partition("+")
        if placement not in POLICIES or get_policy(placement).needs_oracle:
            raise argparse.ArgumentTypeError(f"{item!r}: placement must be one of the online policies "
                                             f"{sorted(p for p in POLICIES if not get_policy(p).needs_oracle)}")
        eviction = eviction or get_policy(placement).eviction
        if eviction not in EVICTION_POLICIES:
            raise argparse.ArgumentTypeError(f"{item!r}: eviction must be one of {sorted(EVICTION_POLICIES)}")
        if (placement, eviction) in out:
            raise argparse.ArgumentTypeError(f"{item!r} is listed twice")
        out.append((placement, eviction))
    if not out:
        raise argparse.ArgumentTypeError("expected at least one placement+eviction pair")
    return tuple(out)


def cells(args) -> list[tuple[float, float]]:
    return [(b, h) for h in args.host_gb for b in args.budget_gb]


def tier_text(host_gb: float) -> str:
    return "device only" if not host_gb else f"device + {host_gb:g} GB host"


def points(windows: list[Window], args) -> list[dict]:
    """Every (window, cell, pair): the judged pairs first, then the peers."""
    pairs = list(args.ours) + [p for p in args.peers if p not in args.ours]
    return [{"trace": w.trace, "reading": args.reading, "start": w.start, "limit": w.limit, "split": w.split,
             "budget_gb": b, "host_gb": h, "tier": tier_text(h), "policy": p, "eviction": e}
            for w in windows for b, h in cells(args) for p, e in pairs]


def key(point: dict) -> tuple:
    return (point["trace"], point["reading"], point["start"], point["limit"], point["budget_gb"], point["host_gb"],
            point["policy"], point["eviction"])


def base_config(args) -> dict:
    return {"shape": args.model, "prefill_budget": 8192, "max_batch_size": 64, "kv_pool_gb": 60.0, "time_scale": 1.0,
            "trace_file": None}


def measure(point: dict, base: dict) -> dict:
    """One point: the factorial's measurement on its window, the protocol's columns."""
    from experiments.traces.sweep import measure_point

    config = dict(base, limit=point["limit"], start=point["start"], host_gb=point["host_gb"] or None,
                  eviction=point["eviction"])
    row = measure_point({"trace": point["trace"], "reading": point["reading"], "policy": point["policy"],
                         "budget_gb": point["budget_gb"]}, config)
    return point | {k: row[k] for k in KEEP if k in row}


def journal(out: Path, config: dict) -> Journal:
    """`points.jsonl`: a row a point, keyed by `key`; the study's identity (`SAME_STUDY`) in its header."""
    return Journal(Path(out) / "points.jsonl", RECORD, {k: config[k] for k in SAME_STUDY}, key)


def run(journal: Journal, points: list[dict], kept: list[dict], base: dict, todo: int) -> list[dict]:
    """Measure the `todo` points not kept in this process (one core), appending each row as it finishes."""
    from experiments.common.progress import Progress

    with Progress(todo, "points", every_s=60) as progress:
        return sweep.run_journal(journal, points, lambda i, point: measure(point, base), kept, advance=lambda row: (
            progress.advance(note=f"{row['split']} {row['start']:,}+{row['limit']:,} {row['budget_gb']:g} GB "
                                  f"{row['tier']}: {row['policy']}+{row['eviction']} {row['ssm_hit_tokens']:,} restored "
                                  f"in {row['wall_s']:.0f} s")))


def with_ratios(rows: list[dict], ours: list[tuple[str, str]]) -> list[dict]:
    """Each row with `best_peer` / `best_peer_tokens` / `ratio_to_best_peer`: the best peer pair of its
    window and cell (a judged pair's: the best peer; a peer's: the best other peer)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["reading"], r["start"], r["limit"], r["budget_gb"], r["host_gb"]), []).append(r)
    out = []
    for group in groups.values():
        peers = [r for r in group if (r["policy"], r["eviction"]) not in ours]
        for r in group:
            others = [p for p in peers if p is not r]
            best = max(others, key=lambda p: p["ssm_hit_tokens"], default=None)
            out.append(r | {"judged": (r["policy"], r["eviction"]) in ours,
                            "best_peer": pair_text((best["policy"], best["eviction"])) if best else None,
                            "best_peer_tokens": best["ssm_hit_tokens"] if best else None,
                            "ratio_to_best_peer": (r["ssm_hit_tokens"] / max(best["ssm_hit_tokens"], 1)
                                                   if best else None)})
    return sorted(out, key=lambda r: (r["host_gb"], r["budget_gb"], ("train", "test", "whole").index(r["split"]),
                                      r["start"], not r["judged"], -r["ssm_hit_tokens"]))


def spread(rows: list[dict]) -> list[dict]:
    """Per (cell, pair, split): windows, wins (ratio >= 1), and the median / min / max ratio."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["ratio_to_best_peer"] is not None:
            groups.setdefault((r["host_gb"], r["budget_gb"], r["policy"], r["eviction"], r["split"]), []).append(r)
    for (h, b, p, e, split), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], not kv[1][0]["judged"],
                                                                         kv[0][2], kv[0][3],
                                                                         ("train", "test", "whole").index(kv[0][4]))):
        ratios = [r["ratio_to_best_peer"] for r in rs]
        worst = min(rs, key=lambda r: r["ratio_to_best_peer"])
        out.append({"host_gb": h, "budget_gb": b, "tier": tier_text(h), "policy": p, "eviction": e,
                    "judged": rs[0]["judged"], "split": split, "windows": len(rs),
                    "wins": sum(x >= 1 for x in ratios), "ratio_median": statistics.median(ratios),
                    "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "worst_window": f"{worst['start']:,}-{worst['start'] + worst['limit'] - 1:,}",
                    "restored_tokens_median": statistics.median(r["ssm_hit_tokens"] for r in rs)})
    return out


def report(rows: list[dict], config: dict) -> str:
    lines = [f"# Held out: {config['trace']} ({config['reading']}), {config['model']}, windows of "
             f"{config['width']:,} requests (simulated)", "",
             "Train windows (what ours-plus's constants were chosen on; `experiments/traces/windows.py`): "
             + (", ".join(w["label"] for w in config["windows"] if w["split"] == "train") or "none") + ". Seen while tuning "
             "(kept out of the test set): " + (", ".join(w["label"] for w in config["excluded"] if w["split"] == "seen")
                                               or "none") + ". Test windows (held out, seed "
             f"{config['seed']}: {config['test_rule']}): "
             + ", ".join(w["label"] for w in config["windows"] if w["split"] == "test") + "."
             + (" `whole`: the whole trace (it holds the train windows)." if any(
                 w["split"] == "whole" for w in config["windows"]) else ""), "",
             "Ratio: restored (SSM-usable) tokens over the best peer pair's in the same window and cell (a peer's: "
             "over the best other peer). Peer pairs: " + ", ".join(config["peers"]) + ". Each window starts with an "
             "empty store; the cost-model clock, not measured.", "",
             "## Spread across windows", "",
             "| cell | pair | split | windows | wins | median | min | max | worst window | median restored |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in spread(rows):
        name = f"**{s['policy']}+{s['eviction']}**" if s["judged"] else f"{s['policy']}+{s['eviction']}"
        lines.append(f"| {s['budget_gb']:g} GB, {s['tier']} | {name} | {s['split']} | {s['windows']} | {s['wins']} | "
                     f"{s['ratio_median']:.3f} | {s['ratio_min']:.3f} | {s['ratio_max']:.3f} | {s['worst_window']} | "
                     f"{s['restored_tokens_median']:,.0f} |")
    lines += ["", "## Every window (judged pairs)", "",
              "| cell | window | split | pair | restored | best peer pair | its restored | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["judged"] and r["best_peer"] is not None:
            lines.append(f"| {r['budget_gb']:g} GB, {r['tier']} | {r['start']:,}-{r['start'] + r['limit'] - 1:,} | "
                         f"{r['split']} | {r['policy']}+{r['eviction']} | {r['ssm_hit_tokens']:,} | {r['best_peer']} | "
                         f"{r['best_peer_tokens']:,} | {r['ratio_to_best_peer']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], config: dict, path: Path) -> Path:
    """Per cell: the judged pairs' ratio per window across the trace (left), every pair's ratios on
    the test windows (right: one column a pair, the placement's colour, the eviction's marker)."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    cellz = sorted({(r["host_gb"], r["budget_gb"]) for r in rows})
    fig, axes = plt.subplots(len(cellz), 2, figsize=(15, 4.6 * len(cellz)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.1, 1.4]})
    for (h, b), (left, right) in zip(cellz, axes):
        cell = [r for r in rows if r["host_gb"] == h and r["budget_gb"] == b and r["ratio_to_best_peer"] is not None]
        for pair in sorted({(r["policy"], r["eviction"]) for r in cell if r["judged"]}):
            for split, fill in (("train", "none"), ("test", None), ("whole", None)):
                pts = sorted((r["start"] + r["limit"] / 2, r["ratio_to_best_peer"]) for r in cell
                             if (r["policy"], r["eviction"]) == pair and r["split"] == split)
                # colour: the placement; marker and line style: the eviction (two judged pairs may share a placement)
                if pts and split == "whole":
                    left.axhline(pts[0][1], color=fs.color(pair[0]), linewidth=1.2,
                                 linestyle=fs.EVICTION_STYLES.get(pair[1], {}).get("linestyle", "--"),
                                 label=f"{pair_text(pair)}, whole trace")
                elif pts:
                    left.plot(*zip(*pts), linestyle="none", color=fs.color(pair[0]), marker=fs.eviction_marker(pair[1]),
                              ms=10, mfc=fill, label=f"{pair_text(pair)}, {split} windows")
        for w in config["windows"]:
            if w["split"] == "train":  # where the constants were chosen, shaded
                left.axvspan(w["start"], w["start"] + w["limit"], color="0.85", zorder=0)
        left.axhline(1.0, color="0.4", linewidth=0.8)
        left.set_xlabel("window centre (request index in the trace)")
        left.set_ylabel("restored / best peer pair's")
        left.set_title(f"device {b:g} GB, {tier_text(h)}: per window", fontsize=10)
        left.grid(alpha=0.3)
        left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        pairs = sorted({(r["policy"], r["eviction"]) for r in cell}, key=lambda p: (p not in config["ours_pairs"], p))
        for i, pair in enumerate(pairs):
            for split, fill, dx in (("train", "none", -0.15), ("test", None, 0.1)):
                ys = [r["ratio_to_best_peer"] for r in cell if (r["policy"], r["eviction"]) == pair and r["split"] == split]
                if ys:
                    right.plot([i + dx] * len(ys), ys, linestyle="none", color=fs.color(pair[0]),
                               marker=fs.eviction_marker(pair[1]), ms=7, mfc=fill, alpha=0.85)
            test = [r["ratio_to_best_peer"] for r in cell if (r["policy"], r["eviction"]) == pair and r["split"] == "test"]
            if test:
                right.plot([i - 0.3, i + 0.3], [statistics.median(test)] * 2, color=fs.color(pair[0]), linewidth=2)
        right.axhline(1.0, color="0.4", linewidth=0.8)
        right.set_xticks(range(len(pairs)), [pair_text(p) for p in pairs], rotation=35, ha="right", fontsize=8)
        right.set_ylabel("restored / best other peer pair's")
        right.set_title("every pair: train (hollow), test (filled), test median (bar)", fontsize=10)
        right.grid(axis="y", alpha=0.3)
        right.legend(handles=[plt.Line2D([], [], color="0.3", linestyle="none", marker=fs.eviction_marker(e), label=e)
                              for e in sorted({p[1] for p in pairs})], title="eviction\n(colour: placement)",
                     fontsize=7, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fs.title(fig, "Out of sample: restored tokens against the best peer pair, window by window",
             workload=f"{config['trace']} ({config['reading']} reading), windows of {config['width']:,}",
             model=config["model"], budget=", ".join(f"{b:g} GB" for b in config["budget_gb"]),
             simulated=True, extra=["train windows (shaded, hollow): " + (", ".join(w["label"] for w in config["windows"]
                                                                    if w["split"] == "train") or "none")])
    return fs.save(fig, path)


def figures_from(out: Path) -> list[Path]:
    """The report and the figure from `out/heldout.json` (a bad file is an InputError naming it)."""
    path = Path(out) / "heldout.json"
    data = read_json(path, ("config", "rows"), what="a held-out run")
    try:
        config = data["config"] | {"ours_pairs": [tuple(p) for p in data["config"]["ours_pairs"]]}
        return [write_text(out / "heldout.md", report(data["rows"], config)), plot(data["rows"], config,
                                                                                  out / "heldout.png")]
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InputError(f"{path}: not a held-out run ({type(err).__name__}: {err})") from None


def trace_length(trace: str, reading: str, cap: int | None) -> int:
    from experiments.traces.sweep import load_requests

    try:
        n = len(load_requests(trace, reading, cap))
    except (ValueError, ModuleNotFoundError) as err:
        raise InputError(f"{trace}: {err}") from None
    if not n:
        raise InputError(f"{trace}: no requests (reading {reading})")
    return n


SAME_STUDY = ("trace", "reading", "model", "shape", "prefill_budget", "max_batch_size", "kv_pool_gb", "time_scale")


class Heldout(Study):
    record = RECORD
    prog = "python -m experiments.traces.heldout"
    description = __doc__.split("\n")[0]

    def add_flags(self, ap):
        ap.add_argument("--trace", choices=list(WORKLOADS), default="mooncake-conversation", help="the workload")
        ap.add_argument("--reading", choices=READINGS, default="chains", help="how its requests continue each other")
        ap.add_argument("--width", type=int_in_range(1), default=WINDOW_REQUESTS, help="requests per test window")
        ap.add_argument("--test-windows", type=int_in_range(1), default=None,
                        help="at most this many test windows (absent: every one the rule gives)")
        ap.add_argument("--seed", type=int, default=TEST_SEED, help="the test windows' seed (windows.py's rule)")
        ap.add_argument("--trace-requests", type=int_in_range(1), default=None,
                        help="take the trace as its first N requests (absent: all of them, counted)")
        ap.add_argument("--whole", action="store_true", help="also run every pair on the whole trace")
        ap.add_argument("--ours", type=pair_list, default=pair_text(OURS),
                        help="the judged pairs, placement+eviction (comma list; a placement alone: its own eviction)")
        ap.add_argument("--peers", type=pair_list, default=",".join(map(pair_text, PEERS)),
                        help="the peer pairs they are judged against (comma list)")
        ap.add_argument("--budget-gb", type=float_list(0, lo_open=True), default="4",
                        help="device snapshot budgets in GB (comma list)")
        ap.add_argument("--host-gb", type=float_list(0), default="0", help="host tiers in GB (comma list; 0: none)")
        ap.add_argument("--model", default="bamba-9b", choices=("bamba-9b", "granite-4.0-h-small", "nemotron-h-8b"),
                        help="the model shape of the cost model")
        ap.add_argument("--resume", action="store_true", help="keep the points in --out's points.jsonl; run the rest")

    def check(self, ctx):
        args = ctx.args
        if ctx.replotting:
            return
        if args.resume and args.out is None:
            ctx.error("argument --resume: needs --out FOLDER (the killed run's folder)")
        overlap = set(args.ours) & set(args.peers)
        if overlap:
            ctx.error(f"argument --peers: {', '.join(map(pair_text, sorted(overlap)))} is also judged (--ours)")
        total = trace_length(args.trace, args.reading, args.trace_requests)
        windows = protocol(args.trace, total, args.width, args.test_windows, args.seed, args.whole)
        if not any(w.split == "test" for w in windows):
            ctx.error(f"argument --width: no {args.width}-request test window fits in {args.trace}'s {total:,} "
                      "requests outside its train and seen windows")
        config = study_config(args, total, windows)
        kept = []
        if args.resume:  # the points file of the same study (its header), then its report's config
            try:
                kept = journal(args.out, config).kept()
            except InputError as err:
                ctx.error(f"argument --resume: {err}")
            self.check_same_study(ctx, Path(args.out) / "heldout.json", config)
        ctx.inputs.update(windows=windows, config=config, kept=kept)

    @staticmethod
    def check_same_study(ctx, path: Path, config: dict) -> None:
        """A resume adds points only to a run of the same trace, reading, model and engine settings
        (added windows, pairs or cells are fine); a folder with no report yet is not checked."""
        if not path.is_file():
            return
        try:
            stored = json.loads(read_text(path, "a held-out run's report"))["config"]
        except (json.JSONDecodeError, KeyError, TypeError):
            ctx.error(f"argument --resume: {path} is not a held-out run's report (no config in it)")
        differ = [f"{k}={stored.get(k)!r} there, {config[k]!r} here" for k in SAME_STUDY if stored.get(k) != config[k]]
        if differ:
            ctx.error(f"argument --resume: {path.parent} holds another study: " + "; ".join(differ))

    def run(self, ctx):
        args, out = ctx.args, ctx.out
        windows, config = ctx.inputs["windows"], ctx.inputs["config"]
        kept, store, every = ctx.inputs["kept"], journal(out, config), points(windows, args)
        todo = sweep.pending(every, done={key(r) for r in kept}, key=lambda i, p: key(p))
        log(f"{args.trace} ({args.reading}), {config['trace_requests']:,} requests: windows "
            + ", ".join(f"{w.split} {w.label()}" for w in windows) + f"; {len(todo)} points to run ({len(kept)} kept)")
        t0 = time.time()
        rows = with_ratios(run(store, every, kept, base_config(args), len(todo)), list(args.ours))
        for s in spread(rows):
            if s["judged"]:
                log(f"{s['budget_gb']:g} GB {s['tier']} {s['policy']}+{s['eviction']} {s['split']}: wins {s['wins']} "
                    f"of {s['windows']}, ratio median {s['ratio_median']:.3f} (min {s['ratio_min']:.3f}, max "
                    f"{s['ratio_max']:.3f})")
        return [write_json(out / "heldout.json", {"simulated": True, "config": config, **environment(),
                                                  "spread": spread(rows), "rows": rows,
                                                  "points_wall_s": sum(r.get("wall_s", 0.0) for r in rows),
                                                  "invocation_wall_s": time.time() - t0}),
                write_csv(out / "heldout.csv", [{k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()
                                                 if k != "eviction_leaders"} for r in rows]),
                store.path]

    def figures(self, ctx):
        return figures_from(ctx.out)


def study_config(args, total: int, windows: list[Window]) -> dict:
    """What the record says about the run: trace, reading, model, windows (each with its split and
    why), the excluded ones, the pairs, the cells and the engine settings."""
    as_dict = lambda w: {"start": w.start, "limit": w.limit, "split": w.split, "label": w.label(),  # noqa: E731
                         "why": w.why}
    return {"trace": args.trace, "reading": args.reading, "model": args.model, "trace_requests": total,
            "width": args.width, "seed": args.seed, "budget_gb": args.budget_gb, "host_gb": args.host_gb,
            "ours_pairs": [list(p) for p in args.ours], "peers": [pair_text(p) for p in args.peers],
            "test_rule": "tiles of the stretches no train or seen window touches, slack offset and (with "
                         "--test-windows) one per consecutive group drawn by numpy default_rng(seed)",
            "windows": [as_dict(w) for w in windows], "excluded": [as_dict(w) for w in excluded(args.trace)],
            "train_traces": sorted(TRAIN), **base_config(args)}


STUDY = Heldout()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
