"""How many snapshots per sequence a trace needs: the Sparse Prefix Caching dynamic program
(`planner.snapshot_dp`) against fixed placements, offline and static.

Every request of the trace that a later request matches (its *owner*, `oracle.optimum_matches`:
the first sequence, prompt + reply but its last token (what its KV holds), that had the matched
prefix, at the engine's 16-token KV block, with an unbounded KV cache) gets at most M snapshots. Each later match restores at the
deepest snapshot at or below it. Restored tokens are reported against the matched tokens (the
most any placement restores). Placements, all given the owners (which no online policy knows):

* `dp`: the exact optimum for M per owner over its known match depths and counts (`dp-all`: M =
  the most distinct depths any owner has, so every match restores);
* `uniform`: M positions evenly spaced over the owner's sequence, block-aligned, the last at its
  end (the decode-time state);
* `grid-G`: every G tokens plus the sequence end (ours-plus's grid is G = 2048); its mean count
  per owner is reported as its M.

Static: no memory budget over time, no KV eviction, no timing (the simulator has those); this is
the SPC paper's setting, one sequence at a time with its overlap depths known.

    python -m experiments.traces.snapshot_budget --trace mooncake-conversation --reading as-given,chains \\
        --out results/traces/snapshot-budget-mooncake-whole      # default: runs/traces/snapshot-budget/<time>/
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Sequence

from experiments.common.flags import name_list
from experiments.common.study import Context, Study, run_study
from experiments.traces.oracle import optimum_matches
from experiments.traces.sweep import load_requests
from experiments.workloads import READINGS, WORKLOADS, default_reading
from experiments.workloads.request import WorkloadRequest
from planner.snapshot_dp import best_snapshots, restored_tokens

MS = (1, 2, 3, 4, 6, 8, 16, 32)
GRIDS = (512, 1024, 2048, 4096, 8192)


def owner_depths(requests: Sequence[WorkloadRequest], block_size: int = 16
                 ) -> tuple[dict[int, tuple[list[int], list[int]]], dict[int, int]]:
    """Per owner: its match depths and how many later requests match at each; and per owner its
    sequence length (prompt + reply)."""
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for _, owner, position in optimum_matches(requests, block_size):
        counts[owner][position] += 1
    length = {r.index: r.prompt_len + (r.output_len if r.load_reply is not None else 0) for r in requests}
    depths = {o: (sorted(c), [c[d] for d in sorted(c)]) for o, c in counts.items()}
    return depths, {o: length[o] for o in depths}


def uniform(length: int, m: int, block_size: int) -> list[int]:
    """M block-aligned positions evenly over [0, length], the last at the last block boundary."""
    end = length // block_size * block_size
    return sorted({max(block_size, round(end * t / m / block_size) * block_size) for t in range(1, m + 1)})


def grid(length: int, spacing: int, block_size: int) -> list[int]:
    """Every `spacing` tokens below `length`, plus its last block boundary."""
    end = length // block_size * block_size
    return sorted({*range(spacing, end, spacing), end} - {0})


def curve(requests: Sequence[WorkloadRequest], block_size: int = 16, ms: Sequence[int] = MS,
          grids: Sequence[int] = GRIDS) -> list[dict]:
    """One row per (placement, M): restored tokens, their share of the matched tokens, mean
    snapshots per owner."""
    depths, length = owner_depths(requests, block_size)
    matched = sum(d * w for ds, ws in depths.values() for d, w in zip(ds, ws))
    owners = len(depths)
    rows = []

    def row(placement: str, m: float | None, snapshots_of) -> None:
        """Every owner's snapshots from `snapshots_of(owner)`; `m` None: their mean count."""
        restored = snapshots = 0
        for o, (ds, ws) in depths.items():
            pos = snapshots_of(o)
            restored, snapshots = restored + restored_tokens(ds, ws, pos), snapshots + len(pos)
        per_owner = snapshots / owners if owners else 0.0
        rows.append({"placement": placement, "m": round(per_owner, 2) if m is None else m,
                     "restored_tokens": int(restored), "matched_tokens": matched,
                     "restored_share": restored / matched if matched else 0.0, "owners": owners,
                     "snapshots_per_owner": per_owner})

    most = max((len(ds) for ds, _ in depths.values()), default=0)  # dp-all: every depth, all matched
    for name, m in (*(("dp", m) for m in ms if m < most), ("dp-all", most)):
        row(name, m, lambda o, m=m: best_snapshots(*depths[o], m)[1])
    for m in ms:
        row("uniform", m, lambda o, m=m: uniform(length[o], m, block_size))
    for g in grids:
        row(f"grid-{g}", None, lambda o, g=g: grid(length[o], g, block_size))
    return rows


def plot(rows: list[dict], out: Path, title: str) -> Path:
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    readings = sorted({r["reading"] for r in rows})
    for n, reading in enumerate(readings):
        rs = [r for r in rows if r["reading"] == reading]
        for placement, ls in (("dp", "-"), ("uniform", "--"), ("grid", ":")):
            pts = sorted((r["snapshots_per_owner"], r["restored_share"]) for r in rs
                         if r["placement"].startswith(placement))
            label = {"grid": "grid 8192..512 (ours-plus's: 2048)", "dp": "dp (the optimum for M)"}.get(placement,
                                                                                                      placement)
            # a second reading: the same colour and marker, hollow and smaller
            ax.plot(*zip(*pts), **fs.line(placement, linestyle=ls), ms=8 - 3 * n, mfc="none" if n else None,
                    label=f"{label} ({reading})")
    ax.set_xscale("log")
    ax.set_xlabel("snapshots per reused sequence (mean)")
    ax.set_ylabel("restored / matched tokens")
    ax.grid(alpha=0.3, which="both")
    fs.legend_outside(ax)
    block = {r.get("block_size") for r in rows} - {None}
    fs.title(fig, title, workload=f"{rows[0]['trace']} ({', '.join(readings)} reading)" if rows else None,
             requests=rows[0]["requests"] if rows else None,
             budget="none over time (M snapshots per reused sequence)",
             extra=["offline and static: token counts, no model, no timing, not simulated"]
             + ([f"KV block {block.pop()}"] if len(block) == 1 else []))
    return fs.save(fig, out / "snapshots_per_sequence.png")


def replot(out: Path) -> Path:
    """The figure again from `out/curve.json` (data first; a bad file is an InputError naming it)."""
    from experiments.common.inputs import InputError, read_json

    path = Path(out) / "curve.json"
    data = read_json(path, ("config", "rows"), what="a snapshot-budget curve")
    rows = data["rows"]
    try:
        title = f"{data['config']['trace']}, {rows[0]['requests']} requests: snapshots per sequence"
        return plot(rows, Path(out), title)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InputError(f"{path}: not a snapshot-budget curve ({type(err).__name__}: {err})") from None


def _requests(trace: str, reading: str, limit: int | None):
    from experiments.common.inputs import InputError

    try:
        requests = load_requests(trace, reading, limit)
    except (ValueError, ModuleNotFoundError) as err:
        raise InputError(str(err)) from None
    if not requests:
        raise InputError(f"{trace}: no requests (reading {reading})")
    return requests


class SnapshotBudget(Study):
    record = "traces/snapshot-budget"
    prog = "python -m experiments.traces.snapshot_budget"
    description = __doc__.split("\n")[0]

    def add_flags(self, ap) -> None:
        from experiments.common.flags import add_limit_flag, int_in_range

        ap.add_argument("--trace", choices=list(WORKLOADS), default=None, help="the workload (required unless --replot)")
        ap.add_argument("--reading", type=name_list(READINGS), default=None,
                        help=f"comma-separated, of {', '.join(READINGS)} (absent: the trace's)")
        add_limit_flag(ap, None)
        ap.add_argument("--block-size", type=int_in_range(1), default=16, help="KV block size (snapshot grid)")
        ap.add_argument("--no-plots", action="store_true", help="write the data only")

    def check(self, ctx: Context) -> None:
        """The flags, then every reading's requests (a bad or empty trace names it) before the folder."""
        args = ctx.args
        if args.publish:
            ctx.error("argument --publish: the record folder depends on the trace; name it: "
                      "--out results/traces/snapshot-budget-<trace>")
        if ctx.reading:
            return
        if args.trace is None:
            ctx.error("the following arguments are required: --trace")
        readings = args.reading or [default_reading(args.trace)]
        ctx.inputs["requests"] = {reading: _requests(args.trace, reading, args.limit) for reading in readings}

    def run(self, ctx: Context) -> list[Path]:
        from experiments.common.results_io import environment, log, write_csv, write_json

        args, requests = ctx.args, ctx.inputs["requests"]
        rows = []
        for reading in requests:
            log(f"{args.trace} ({reading}): {len(requests[reading])} requests")
            rows += [{"trace": args.trace, "reading": reading, "requests": len(requests[reading]), **r}
                     for r in curve(requests[reading], args.block_size)]
        config = {"trace": args.trace, "readings": list(requests), "limit": args.limit,
                  "block_size": args.block_size, "ms": list(MS), "grids": list(GRIDS)}
        return [write_csv(ctx.out / "curve.csv", rows),
                write_json(ctx.out / "curve.json", {"config": config, **environment(), "rows": rows})]

    def figures(self, ctx: Context) -> list[Path]:
        return [] if ctx.args.no_plots and not ctx.replotting else [replot(ctx.out)]


STUDY = SnapshotBudget()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
