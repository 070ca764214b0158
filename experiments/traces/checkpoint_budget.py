"""How many checkpoints per sequence a trace needs: the Sparse Prefix Caching dynamic program
(`planner.checkpoint_dp`) against fixed placements, offline and static.

Every request of the trace that a later request matches (its *owner*, `oracle.optimum_matches`:
the first sequence, prompt + reply but its last token (what its KV holds), that had the matched
prefix, at the engine's 16-token KV block, with an unbounded KV cache) gets at most M checkpoints. Each later match restores at the
deepest checkpoint at or below it. Restored tokens are reported against the matched tokens (the
most any placement restores). Placements, all given the owners (which no online policy knows):

* `dp`: the exact optimum for M per owner over its known match depths and counts (`dp-all`: M =
  the most distinct depths any owner has, so every match restores);
* `uniform`: M positions evenly spaced over the owner's sequence, block-aligned, the last at its
  end (the decode-time state);
* `grid-G`: every G tokens plus the sequence end (ours-plus's grid is G = 2048); its mean count
  per owner is reported as its M.

Static: no memory budget over time, no KV eviction, no timing (the simulator has those); this is
the SPC paper's setting, one sequence at a time with its overlap depths known.

    python -m experiments.traces.checkpoint_budget --trace mooncake-conversation --reading as-given,chains \\
        --out results/traces/checkpoint-budget
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
from typing import Sequence

from experiments.flags import name_list
from experiments.traces.oracle import optimum_matches
from experiments.traces.sweep import load_requests
from experiments.workloads import READINGS, WORKLOADS, default_reading
from experiments.workloads.request import WorkloadRequest
from planner.checkpoint_dp import best_checkpoints, restored_tokens

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
    checkpoints per owner."""
    depths, length = owner_depths(requests, block_size)
    matched = sum(d * w for ds, ws in depths.values() for d, w in zip(ds, ws))
    owners = len(depths)
    rows = []

    def row(placement: str, m: float | None, checkpoints_of) -> None:
        """Every owner's checkpoints from `checkpoints_of(owner)`; `m` None: their mean count."""
        restored = checkpoints = 0
        for o, (ds, ws) in depths.items():
            pos = checkpoints_of(o)
            restored, checkpoints = restored + restored_tokens(ds, ws, pos), checkpoints + len(pos)
        per_owner = checkpoints / owners if owners else 0.0
        rows.append({"placement": placement, "m": round(per_owner, 2) if m is None else m,
                     "restored_tokens": int(restored), "matched_tokens": matched,
                     "restored_share": restored / matched if matched else 0.0, "owners": owners,
                     "checkpoints_per_owner": per_owner})

    most = max((len(ds) for ds, _ in depths.values()), default=0)  # dp-all: every depth, all matched
    for name, m in (*(("dp", m) for m in ms if m < most), ("dp-all", most)):
        row(name, m, lambda o, m=m: best_checkpoints(*depths[o], m)[1])
    for m in ms:
        row("uniform", m, lambda o, m=m: uniform(length[o], m, block_size))
    for g in grids:
        row(f"grid-{g}", None, lambda o, g=g: grid(length[o], g, block_size))
    return rows


def plot(rows: list[dict], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.results_io import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"dp": "C3", "uniform": "C0", "grid": "C2"}
    for n, reading in enumerate(sorted({r["reading"] for r in rows})):
        rs = [r for r in rows if r["reading"] == reading]
        for placement, style in (("dp", "-o"), ("uniform", "--s"), ("grid", ":^")):
            pts = sorted((r["checkpoints_per_owner"], r["restored_share"]) for r in rs
                         if r["placement"].startswith(placement))
            label = "grid 8192..512" if placement == "grid" else placement
            ax.plot(*zip(*pts), style, color=colors[placement], ms=8 - 3 * n, mfc="none" if n else None,
                    label=f"{label} ({reading})")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoints per reused sequence (mean)")
    ax.set_ylabel("restored / matched tokens")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    path = save_figure(fig, out / "checkpoints_per_sequence.png")
    plt.close(fig)
    return path


def replot(out: Path) -> Path:
    """The figure again from `out/curve.json` (data first)."""
    import json

    data = json.loads((Path(out) / "curve.json").read_text())
    rows = data["rows"]
    return plot(rows, Path(out), f"{data['config']['trace']}, {rows[0]['requests']} requests: checkpoints per sequence")


def main(argv: Sequence[str] | None = None) -> None:
    from experiments.results_io import environment, log, write_csv, write_json

    ap = argparse.ArgumentParser(prog="python -m experiments.traces.checkpoint_budget", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, choices=list(WORKLOADS))
    ap.add_argument("--reading", type=name_list(READINGS), default=None,
                    help=f"comma-separated, of {', '.join(READINGS)} (default: the trace's)")
    ap.add_argument("--limit", type=int, default=None, help="the first N requests (default: all)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    readings = args.reading or [default_reading(args.trace)]
    rows = []
    for reading in readings:
        requests = load_requests(args.trace, reading, args.limit)
        log(f"{args.trace} ({reading}): {len(requests)} requests")
        rows += [{"trace": args.trace, "reading": reading, "requests": len(requests), **r}
                 for r in curve(requests, args.block_size)]
    config = {"trace": args.trace, "readings": readings, "limit": args.limit, "block_size": args.block_size,
              "ms": list(MS), "grids": list(GRIDS)}
    write_csv(args.out / "curve.csv", rows)
    write_json(args.out / "curve.json", {"config": config, **environment(), "rows": rows})
    if not args.no_plots:
        replot(args.out)
    log(f"wrote {args.out}/curve.csv")


if __name__ == "__main__":
    main()
