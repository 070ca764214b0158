"""Figures from a run's `summary.json` and `ttft.json.gz` (data first; nothing is recomputed here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from experiments.common import compact
from experiments.traces.sweep import TTFTS


def _eviction(name: str, policy: dict, config: dict) -> str | None:
    """The eviction a policy ran with: its summary's, the run's override, else (older summaries) its
    registered default; the optimum under a finite budget evicts by next use (`simulate.simulate`)."""
    from planner.policies.registry import POLICIES

    if policy.get("eviction") or config.get("eviction"):
        return policy.get("eviction") or config.get("eviction")
    if name == "optimum" and any(b != "unbounded" for b in policy.get("by_budget", {})):
        return "next_use"
    return POLICIES[name].eviction if name in POLICIES else None


def _hits(ax, pols: dict, prompt: int, budgets: list[str], evs: dict) -> None:
    """SSM-usable hits per policy against snapshot memory ('unbounded' apart), each policy's KV hit
    (dotted, hollow), and ours-plus's goals."""
    from experiments.common import figure_style as fs
    from experiments.traces.goals import GOALS, OURS

    x_inf = fs.budget_axis(ax, [float(b) for b in budgets if b != "unbounded"], "unbounded" in budgets)
    shift = {name: fs.dodge(k, len(pols)) for k, name in enumerate(pols)}  # one budget's points side by side
    for name, p in pols.items():
        ys = [p["by_budget"][b]["ssm_hit_tokens"] / prompt if b in p["by_budget"] else np.nan for b in budgets]
        fs.plot_budgets(ax, budgets, ys, x_inf, name, evs[name], shift[name], label=fs.label(name, evs[name]), ms=7)
        kv = [p["by_budget"][b]["kv_hit_tokens"] / prompt if b in p["by_budget"] else np.nan for b in budgets]
        fs.plot_budgets(ax, budgets, kv, x_inf, name, None, shift[name], label=None, linestyle=":", lw=0.9,
                        mfc="none", ms=4, alpha=0.7)
    ax.plot([], [], ":", color="0.3", lw=0.9, marker="o", mfc="none", ms=4,
            label="dotted, hollow: that policy's KV hit")
    if OURS in pols and "optimum" in pols:
        target = GOALS["ssm_vs_optimum"][1]
        pts = [((x_inf if b == "unbounded" else float(b)) * shift[OURS],
                pols["optimum"]["by_budget"][b]["ssm_hit_tokens"] / prompt * target)
               for b in budgets if b in pols["optimum"]["by_budget"]]
        fs.goal_marks(ax, *zip(*pts), f"{OURS} >= {target:g} x optimum")
    if OURS in pols and "unbounded" in pols[OURS]["by_budget"]:
        target = GOALS["ssm_vs_kv"][1]
        kv = pols[OURS]["by_budget"]["unbounded"]["kv_hit_tokens"] / prompt
        fs.goal_marks(ax, [x_inf * shift[OURS]], [kv * target], f"(unbounded) {OURS} >= {target:g} x its KV hit",
                      alpha=0.5)
    ax.set_ylabel("SSM-usable hit tokens / prompt tokens")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fs.legend_outside(ax)


def _lost(ax, pols: dict, prompt: int, top: str, evs: dict) -> None:
    """Lost (hatched) and replayed (solid) tokens per policy at the largest budget, and ours-plus's replay goals."""
    from experiments.common import figure_style as fs
    from experiments.traces.goals import GOALS, OURS

    names = list(pols)
    at = {n: pols[n]["by_budget"].get(top, {}) for n in names}
    lost = [at[n].get("lost_tokens", np.nan) / prompt for n in names]
    replayed = [at[n].get("replayed_tokens", np.nan) / prompt for n in names]
    ix = np.arange(len(names))
    cols = [fs.color(n) for n in names]
    ax.bar(ix - 0.2, lost, 0.4, color=cols, alpha=0.45, edgecolor=cols, hatch="//")
    ax.bar(ix + 0.2, replayed, 0.4, color=cols, edgecolor="k", lw=0.5)
    ax.bar([0], [0], 0, color="0.6", alpha=0.45, edgecolor="0.6", hatch="//",  # neutral legend entries
           label="lost (KV match - restore point), hatched, left")
    ax.bar([0], [0], 0, color="0.45", edgecolor="k", lw=0.5, label="replayed (recomputed), solid, right")
    for i, (lo, re) in enumerate(zip(lost, replayed)):
        ax.annotate(f"{lo:.3f}", (i - 0.2, lo), ha="center", va="bottom", fontsize=6)
        ax.annotate(f"{re:.3f}", (i + 0.2, re / 2), ha="center", va="center", fontsize=7, color="white", rotation=90)
    if OURS in at and at[OURS]:
        k = names.index(OURS)
        for other, goal in (("vllm-align", "replay_vs_vllm_align"), ("vllm-junction", "replay_vs_vllm_junction")):
            if other in at and at[other]:
                target = GOALS[goal][1]
                fs.goal_marks(ax, [k + 0.2], [at[other]["replayed_tokens"] / prompt * target],
                              f"{OURS} replayed <= {target:g} x {other}'s", ms=18, alpha=1.0 if target < 1 else 0.5)
    crowded = len(names) > 7
    ax.set_xticks(ix, [fs.label(n, evs[n]).replace(" (", " (" if crowded else "\n(") for n in names], fontsize=7,
                  rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel("tokens / prompt tokens")
    ax.set_ylim(0, 1.12)
    ax.grid(axis="y", alpha=0.3)
    fs.legend_outside(ax)


def _cdf(ax, ttfts: list[dict], reading: str, top: str, evs: dict) -> None:
    """Each policy's TTFT CDF at the largest budget; its marker at the median."""
    from experiments.common import figure_style as fs

    for row in ttfts:
        key = "unbounded" if row["budget_gb"] is None else f"{row['budget_gb']:g}"
        if row["reading"] != reading or key != top:
            continue
        t = np.sort(np.asarray(row["ttft_s"]))
        name = row["policy"]
        ax.plot(t, np.arange(1, len(t) + 1) / len(t), **fs.line(name, evs.get(name), lw=1.3, ms=7),
                markevery=[(len(t) - 1) // 2], label=fs.label(name, evs.get(name)))
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, simulated; marker: the median)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3, which="both")
    fs.legend_outside(ax)


def plot_all(out: Path) -> list[Path]:
    """SSM-usable hit rate against snapshot memory, lost tokens per policy, TTFT CDF; per reading."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    ttfts = json.loads(compact.read_text(out / TTFTS))  # ttft.json.gz, or a plain ttft.json of an older run
    config = summary.get("config", {})
    paths = []
    for reading, data in summary["readings"].items():
        pols, prompt = data["policies"], data["prompt_tokens"]
        evs = {n: _eviction(n, p, config) for n, p in pols.items()}
        budgets = sorted({k for p in pols.values() for k in p["by_budget"]},
                         key=lambda k: float("inf") if k == "unbounded" else float(k))
        top = budgets[-1]
        top_gb = "unbounded" if top == "unbounded" else f"{top} GB"
        common = dict(workload=f"{summary['trace']} ({reading} reading)", model=summary["shape"],
                      requests=summary["requests"],
                      eviction=f"{config['eviction']} for every policy" if config.get("eviction")
                      else "each policy's own (in the legend)" if all(p.get("eviction") for p in pols.values())
                      else "each policy's default (in the legend; this summary does not record it)",
                      simulated=summary.get("simulated", True),
                      extra=(f"prefix match unit {config['prefix_match_unit']} token(s), every policy but the optimum",)
                      if config.get("prefix_match_unit") else ())

        fig, ax = plt.subplots(figsize=(9, 4.8))
        _hits(ax, pols, prompt, budgets, evs)
        fs.title(fig, "SSM-usable hits against snapshot memory", budget="snapshot memory " + ", ".join(
            b if b == "unbounded" else f"{b} GB" for b in budgets), **common)
        paths.append(fs.save(fig, out / f"hit_rate_vs_memory_{reading}.png"))

        fig, ax = plt.subplots(figsize=(9, 4.8))
        _lost(ax, pols, prompt, top, evs)
        fs.title(fig, f"Lost and replayed tokens per policy at {top_gb} snapshot memory",
                 budget=f"snapshot memory {top_gb}", **common)
        paths.append(fs.save(fig, out / f"lost_tokens_{reading}.png"))

        fig, ax = plt.subplots(figsize=(9, 4.8))
        _cdf(ax, ttfts, reading, top, evs)
        fs.title(fig, f"TTFT CDF at {top_gb} snapshot memory", budget=f"snapshot memory {top_gb}", **common)
        paths.append(fs.save(fig, out / f"ttft_cdf_{reading}.png"))
    return paths
