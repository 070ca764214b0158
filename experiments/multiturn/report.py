"""The multi-turn study's files: the merge of the shards' parts (checked), and the figure from the CSVs.

`finalize(out)` combines `<out>/parts/multiturn.part*.json.gz`, checks that every configuration
generated the same tokens as the reference (`off` when it ran), and writes `requests.csv.gz` (one
row per request and configuration, gzip'd: `experiments.common.compact`), `summary.csv` (one row per configuration), `multiturn.json`
(workload definition and distributions, config, environment, and per configuration the settings
its engine ran under, `effective_settings`, whose `policy` names the policy); on a failure it writes none
of them (and removes stale ones, the figure too). `plot(out)` draws `multiturn.png` from the files (the
command calls it after a merge and for --replot).
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common import compact
from experiments.common import figure_style as fs
from experiments.common import sweep_parts
from experiments.multiturn.run import NAME, mismatches
from experiments.common.results_io import log, read_csv, write_csv, write_json

REQUESTS = "requests.csv.gz"  # per-request, so compact (113 requests x 9 configurations: 105 KB plain, 21 KB)
OUTPUTS = ("summary.csv", REQUESTS, "multiturn.json", "multiturn.png")


def _fail(out: Path, message: str) -> int:
    for f in OUTPUTS:
        (out / f).unlink(missing_ok=True)
        compact.twin(out / f).unlink(missing_ok=True)  # a plain requests.csv of an older run
    log(f"FAILED: {message}; nothing written")
    return 1


def finalize(out: Path) -> int:
    """Merge the parts, check every configuration generated the same tokens, write CSVs, JSON, PNG."""
    parts, rows, failed = sweep_parts.collect(out, NAME)
    if failed:
        return _fail(out, str([f["error"] for f in failed]))
    outputs = {r["config"]: {q["request"]: q["output_sha"] for q in r["request_rows"]} for r in rows}
    ref_name = "off" if "off" in outputs else rows[0]["config"]
    for name, out_tokens in outputs.items():
        bad = mismatches(outputs[ref_name], out_tokens)
        if bad:
            return _fail(out, f"config {name} generated other tokens than {ref_name} for {bad[:5]} ({len(bad)} "
                              "requests): the cache changed an output")
    cfg = parts[0]["config"]
    meta = cfg["workload_meta"] | {
        "config": {k: v for k, v in cfg.items() if k != "workload_meta"},
        "environment": parts[0]["environment"], "environments": [p["environment"] for p in parts],
        "shards": len(parts), "snapshot_budget_bytes": cfg["snapshot_budget_bytes"],
        "snapshot_nbytes": cfg["snapshot_nbytes"], "kv_pool_blocks": cfg["kv_pool_blocks"],
        "outputs_identical_across_configs": True, "reference_config": ref_name,
        "configs_run": [r["config"] for r in rows],
        "effective_settings": {r["config"]: r["effective_settings"] for r in rows if "effective_settings" in r},
    }
    write_json(out / "multiturn.json", meta)
    write_csv(out / REQUESTS, [q for r in rows for q in r["request_rows"]])
    write_csv(out / "summary.csv", [{k: v for k, v in r.items() if k != "request_rows"} for r in rows])
    log(f"{NAME}: merged {len(rows)} configurations from {len(parts)} part(s)")  # the figure: the command's figures
    return 0


# ------------------------------------------------------------------------------------------ figure
KIND_COLORS = {k: v["color"] for k, v in fs.KIND_STYLES.items()}


class Bars:
    """Bars per configuration in its policy's colour (`figure_style`; caching off grey), hatched by its
    eviction (dotted LRU, // FLOP-aware)."""

    def __init__(self, summary: list[dict]):
        self.color = [fs.color(r["policy"]) for r in summary]
        self.hatch = [fs.hatch(r["eviction"]) for r in summary]

    def __call__(self, ax, xs, vals, width, **kw):
        bs = ax.bar(xs, vals, width, color=self.color, edgecolor="k", linewidth=0.5, **kw)
        for bar, h in zip(bs, self.hatch):
            bar.set_hatch(h)
        return bs


def _panel_hits(ax, summary, bars) -> None:
    x = range(len(summary))
    for off, key, alpha in ((-0.2, "token_hit_rate", 1.0), (0.2, "ssm_restore_depth", 0.55)):
        vals = [float(r[key]) for r in summary]
        b = bars(ax, [i + off for i in x], vals, 0.4, alpha=alpha)
        ax.bar_label(b, [f"{v:.3f}" for v in vals], fontsize=6, rotation=90, padding=2)
    ax.set_title("token hit rate (KV-matched / prompt tokens, solid) and SSM restore depth "
                 "(restore position / prompt tokens, pale)", fontsize=8)
    ax.set_ylim(0, 1.15)


def _panel_replayed(ax, summary) -> None:
    cached = [i for i, r in enumerate(summary) if r["policy"] != "off"]  # caching off replays everything
    bottom = [0.0] * len(cached)
    for kind, c in KIND_COLORS.items():
        vals = [float(summary[i][f"replayed_{kind}"]) for i in cached]
        n = summary[0][f"requests_{kind}"]
        ax.bar(cached, vals, 0.6, bottom=bottom, color=c, edgecolor="k", linewidth=0.3, label=f"{kind} ({n} requests)")
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in zip(cached, bottom):
        ax.annotate(f"{total:.0f}", (i, total), ha="center", va="bottom", fontsize=7)
    off_total = [r["replayed_tokens"] for r in summary if r["policy"] == "off"]
    ax.set_title("replayed prompt tokens by request kind (stacked)"
                 + (f"; caching off computes all {off_total[0]}" if off_total else ""), fontsize=9)
    ax.legend(fontsize=7)


def _panel_ttft(ax, summary, requests, bars) -> None:
    """Points, not bars, on the log axis: median (filled, label in ms), p90 (hollow), every request (ticks)."""
    for i, r in enumerate(summary):
        ts = [float(q["ttft_s"]) for q in requests if q["config"] == r["config"]]
        ax.plot([i - 0.12] * len(ts), ts, "_", color="k", alpha=0.3, ms=10)
        st = fs.style(r["policy"])
        med, p90 = float(r["ttft_median_s"]), float(r["ttft_p90_s"])
        ax.plot([i + 0.12], [med], linestyle="none", ms=8, **st)
        ax.plot([i + 0.12], [p90], linestyle="none", ms=8, mfc="none", mew=1.5, **st)
        ax.annotate(f"{med * 1e3:.0f}", (i + 0.12, med), xytext=(6, 0), textcoords="offset points", va="center",
                    fontsize=6)
    ax.set_yscale("log")
    ax.set_xlim(-0.6, len(summary) - 0.4)
    ax.set_title("TTFT (s): median (filled, label in ms), p90 (hollow), every request (ticks)", fontsize=9)


def _panel_memory(ax, summary, meta, bars) -> None:
    x, mib = range(len(summary)), 1 / 2**20
    held = [float(r["snapshot_bytes_held_peak"]) * mib for r in summary]
    b = bars(ax, [i - 0.2 for i in x], held, 0.4)
    ax.bar_label(b, [f"{v:.0f}" for v in held], fontsize=7)
    saved = [float(r["snapshot_bytes_saved"]) * mib for r in summary]
    ev = [float(r["snapshot_bytes_evicted"]) * mib for r in summary]
    ax.bar([i + 0.2 for i in x], saved, 0.4, color="none", edgecolor="k", label="saved (all time)")
    ax.plot([i + 0.2 for i in x], ev, "kx", ms=7, label="evicted")
    if meta["snapshot_budget_bytes"]:
        ax.axhline(meta["snapshot_budget_bytes"] * mib, color="k", ls="--", lw=1,
                   label="byte budget (the +budget configurations)")
    ax.set_title("snapshot MiB: peak held (filled), saved (outline), evicted (x)", fontsize=9)
    ax.legend(fontsize=7)


def _title(fig, meta: dict) -> None:
    w, c = meta["workload"], meta["config"]
    fs.title(fig, "Multi-turn study: hits, replay, TTFT and snapshot memory per configuration",
             workload=f"{w['sessions']} sessions (system prompt {meta['system_prompt_tokens']} tokens, "
                      f"{meta['n_branch_sessions']} branch sessions, {meta['n_regenerations']} regenerations)",
             model=f"{c['preset']} ({c['runner']} runner, block {c['block_size']}, prefill budget "
                   f"{c['prefill_budget']}, interval {c['interval']} blocks, concurrency {c['concurrency']})",
             requests=meta["n_requests"], budget=f"{c['snapshot_budget']} snapshots in the +budget configurations",
             eviction=f"dotted LRU, // FLOP-aware (alpha {c['flop_alpha']:g})",
             device=f"{meta['environment']['device_name']}, measured",
             extra=[f"colour: the policy's (grey: caching off, red: legacy, green: {c.get('policy', 'aligned')})"])


def plot(out: Path) -> Path:
    plt = fs.pyplot()
    summary = read_csv(out / "summary.csv")
    requests = read_csv(out / REQUESTS)  # or a plain requests.csv of an older run
    meta = json.loads((out / "multiturn.json").read_text())
    bars = Bars(summary)
    fig, ((ax_hit, ax_rep), (ax_ttft, ax_mem)) = plt.subplots(2, 2, figsize=(15, 9))
    _panel_hits(ax_hit, summary, bars)
    _panel_replayed(ax_rep, summary)
    _panel_ttft(ax_ttft, summary, requests, bars)
    _panel_memory(ax_mem, summary, meta, bars)
    names = [r["config"] for r in summary]
    for ax in (ax_hit, ax_rep, ax_ttft, ax_mem):
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3, which="both")
    _title(fig, meta)
    return fs.save(fig, out / "multiturn.png")
