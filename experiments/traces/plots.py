"""Figures from a run's `summary.json` and `ttft.json` (data first; nothing is recomputed here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def plot_all(out: Path) -> list[Path]:
    """SSM-usable hit rate against snapshot memory, lost tokens per policy, TTFT CDF; per reading."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.results_io import save_figure

    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    ttfts = json.loads((out / "ttft.json").read_text())
    paths = []
    for reading, data in summary["readings"].items():
        pols, prompt = data["policies"], data["prompt_tokens"]
        budgets = sorted({k for p in pols.values() for k in p["by_budget"]},
                         key=lambda k: float("inf") if k == "unbounded" else float(k))
        finite = [float(b) for b in budgets if b != "unbounded"]
        x_inf = (max(finite) * 4 if finite else 1.0)
        xs = [x_inf if b == "unbounded" else float(b) for b in budgets]

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, p in pols.items():
            ys = [p["by_budget"][b]["ssm_hit_tokens"] / prompt if b in p["by_budget"] else np.nan for b in budgets]
            ax.plot(xs, ys, marker="o", label=name)
        kv = max((p["by_budget"][b]["kv_hit_tokens"] for p in pols.values() for b in p["by_budget"]
                  if p["by_budget"][b]["block_size"] == 16), default=None)
        if kv is not None:  # only when a policy ran with 16-token blocks
            ax.axhline(kv / prompt, color="k", ls=":", lw=1, label="KV hit, 16-token blocks")
        ax.set_xscale("log")
        ax.set_xticks(xs, [b if b == "unbounded" else f"{float(b):g}" for b in budgets])
        ax.set_xlabel("snapshot memory (GB)")
        ax.set_ylabel("SSM-usable hit tokens / prompt tokens")
        ax.set_title(f"{summary['trace']} ({reading}), {summary['shape']}, {summary['requests']} requests")
        ax.legend(fontsize=7, ncol=2)
        paths.append(save_figure(fig, out / f"hit_rate_vs_memory_{reading}.png"))
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 4.2))
        top = budgets[-1]
        names = list(pols)
        lost = [pols[n]["by_budget"].get(top, {}).get("lost_tokens", np.nan) / prompt for n in names]
        replayed = [pols[n]["by_budget"].get(top, {}).get("replayed_tokens", np.nan) / prompt for n in names]
        ix = np.arange(len(names))
        ax.bar(ix - 0.2, lost, 0.4, label="lost (KV match - restore point)")
        ax.bar(ix + 0.2, replayed, 0.4, label="replayed (recomputed)")
        ax.set_xticks(ix, names, rotation=30, fontsize=8)
        ax.set_ylabel("tokens / prompt tokens")
        ax.set_title(f"lost and replayed tokens, snapshot memory {top} GB ({reading})")
        ax.legend(fontsize=8)
        paths.append(save_figure(fig, out / f"lost_tokens_{reading}.png"))
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for row in ttfts:
            key = "unbounded" if row["budget_gb"] is None else f"{row['budget_gb']:g}"
            if row["reading"] != reading or key != top:
                continue
            t = np.sort(np.asarray(row["ttft_s"]))
            ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=row["policy"])
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s, simulated)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFT CDF, snapshot memory {top} GB ({reading})")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out / f"ttft_cdf_{reading}.png"))
        plt.close(fig)
    return paths
