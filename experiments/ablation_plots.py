"""The ablation sweeps' figures, each drawn from a sweep's merged CSV rows and JSON meta.

`plot(sweep_name, out)` reads `<out>/<sweep>.csv` and `<out>/<sweep>.json` and writes
`<out>/<sweep>.png`; the measuring side is `experiments.ablations`.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments import sweep_parts
from experiments.results_io import save_figure


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLORS = {"legacy": "tab:red", "aligned": "tab:green", "aligned, no capture": "tab:gray",
          "in_pass": "tab:green", "two_pass": "tab:blue", "none": "tab:gray"}


def _series(rows, x_key, label):
    sel = sorted((r for r in rows if r["label"] == label and r["request"] == "identical"), key=lambda r: r[x_key])
    return sel, [r[x_key] for r in sel]


def _title(meta: dict) -> str:
    env = meta["environments"][0]
    cfg = meta["config"]
    return f"{env['device_name']}, model {cfg['preset']}, {cfg['dtype']}, warm = median of {cfg['repeats']}"


def plot_versus(rows, meta, path, x_key: str, x_label: str, log_x: bool, title: str, vline: tuple | None = None):
    """Replayed tokens and warm TTFT (and cold TTFT) against one knob, a line per label."""
    plt = _plt()
    fig, (ax_rep, ax_ttft) = plt.subplots(1, 2, figsize=(12, 4.4))
    for label in dict.fromkeys(r["label"] for r in rows):
        sel, xs = _series(rows, x_key, label)
        c = COLORS.get(label)
        # legacy hollow and larger: where the two policies coincide both stay visible
        mk = dict(ms=9, mfc="none") if label == "legacy" else dict(ms=5)
        ax_rep.plot(xs, [max(r["warm_replayed_tokens"], 0.8) for r in sel], "o-", color=c, label=label, **mk)
        ax_ttft.plot(xs, [r["warm_ttft_s"] for r in sel], "o-", color=c, label=f"{label}: warm", **mk)
        ax_ttft.plot(xs, [r["cold_ttft_s"] for r in sel], "x:", color=c, alpha=0.6, label=f"{label}: cold")
        for r, x in zip(sel, xs):
            ax_rep.annotate(str(r["warm_replayed_tokens"]), (x, max(r["warm_replayed_tokens"], 0.8)), fontsize=7,
                            textcoords="offset points", xytext=(3, 4), color=c)
    for ax in (ax_rep, ax_ttft):
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3, which="both")
    if vline is not None:
        for ax in (ax_rep, ax_ttft):
            ax.axvline(vline[0], color="k", ls="--", lw=0.8)
        ax_rep.annotate(vline[1], (vline[0], ax_rep.get_ylim()[0]), fontsize=7, ha="right", va="bottom", rotation=90)
    ax_rep.set_ylabel("warm request: replayed tokens")
    ax_ttft.set_ylabel("TTFT (s)")
    ax_rep.legend(fontsize=8)
    ax_ttft.legend(fontsize=7)
    fig.suptitle(f"{title}\n{_title(meta)}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_prompt_len(rows, meta, path):
    cfg = meta["config"]
    plot_versus(rows, meta, path, "prompt_len", "prompt tokens", True,
                f"Prompt length: block {cfg['block_size']}, budget {cfg['budget']} (prompts below it are one "
                f"last chunk; 'no capture' drops its in-pass tail snapshot)", vline=(cfg["budget"], "prefill budget"))


def plot_block_size(rows, meta, path):
    cfg = meta["config"]
    plot_versus(rows, meta, path, "block_size", "KV block size (tokens)", True,
                f"Block size: {cfg['prompt_len']}-token prompt, budget {cfg['budget']}")


def plot_budget(rows, meta, path):
    cfg = meta["config"]
    plot_versus(rows, meta, path, "budget", "prefill budget (tokens per tick)", True,
                f"Prefill budget: {cfg['prompt_len']}-token prompt, block {cfg['block_size']}")


def plot_interval(rows, meta, path):
    plt = _plt()
    cfg = meta["config"]
    fig, (ax_bytes, ax_rep, ax_ttft) = plt.subplots(1, 3, figsize=(16, 4.4))
    ident = sorted((r for r in rows if r["request"] == "identical"), key=lambda r: r["interval_blocks"])
    labels = [f"{r['interval_blocks']} blocks\n({r['n_snapshots']} snapshots)" for r in ident]
    bars = ax_bytes.bar(labels, [r["snapshot_bytes_held"] / 2**20 for r in ident], color="tab:purple")
    ax_bytes.bar_label(bars, [f"{r['snapshot_bytes_held'] / 2**20:.2f} MiB" for r in ident], fontsize=8)
    ax_bytes.set_ylabel("snapshot bytes held after the cold prompt (MiB)")
    ax_bytes.set_xlabel("snapshot interval")
    for j, r in enumerate(ident):
        c = f"C{j}"  # one color per interval in both panels
        sel = sorted((x for x in rows if x["interval_blocks"] == r["interval_blocks"]), key=lambda x: x["shared_prefix"])
        ks = [x["shared_prefix"] for x in sel]
        ax_rep.plot(ks, [x["warm_replayed_tokens"] for x in sel], "o-", color=c,
                    label=f"interval {r['interval_blocks']}: replayed")
        ax_rep.plot(ks, [x["warm_restore_at"] for x in sel], "s--", color=c, alpha=0.5,
                    label=f"interval {r['interval_blocks']}: restore at")
        ax_ttft.plot(ks, [x["warm_ttft_s"] for x in sel], "o-", color=c, label=f"interval {r['interval_blocks']}")
    ax_rep.set_xlabel("tokens shared with the cold prompt (k; last point = identical prompt)")
    ax_rep.set_ylabel("tokens")
    ax_rep.set_yscale("symlog", linthresh=10)
    ax_ttft.set_xlabel(ax_rep.get_xlabel())
    ax_ttft.set_ylabel("warm TTFT (s)")
    ax_ttft.set_yscale("log")
    for ax in (ax_rep, ax_ttft):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Snapshot interval: {cfg['prompt_len']}-token cold prompt, budget {cfg['budget']}, block "
                 f"{cfg['block_size']}, shared-prefix requests add {cfg['suffix_len']} fresh tokens\n{_title(meta)}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_capture(rows, meta, path):
    plt = _plt()
    cfg = meta["config"]
    fig, (ax_cold, ax_warm) = plt.subplots(1, 2, figsize=(12, 4.4))
    lengths = sorted({r["prompt_len"] for r in rows})
    modes = list(dict.fromkeys(r["capture_mode"] for r in rows))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        sel = {r["prompt_len"]: r for r in rows if r["capture_mode"] == mode}
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(lengths))]
        cold = ax_cold.bar(xs, [sel[n]["cold_ttft_s"] for n in lengths], width, color=COLORS.get(mode), label=mode)
        ax_cold.bar_label(cold, [f"{sel[n]['cold_prefill_passes']} pass" for n in lengths], fontsize=7)
        warm = ax_warm.bar(xs, [sel[n]["warm_ttft_s"] for n in lengths], width, color=COLORS.get(mode), label=mode)
        ax_warm.bar_label(warm, [f"replay {sel[n]['warm_replayed_tokens']}" for n in lengths], fontsize=7, rotation=90,
                          padding=2)
    for ax, what in ((ax_cold, "cold TTFT (s): what the capture costs"), (ax_warm, "warm TTFT (s): what it buys")):
        ax.set_xticks(range(len(lengths)), [f"{n} tokens" for n in lengths])
        ax.set_ylabel(what)
        ax.legend(fontsize=8)
    ax_warm.set_yscale("log")
    ax_warm.set_ylim(bottom=0.5 * min(r["warm_ttft_s"] for r in rows))
    fig.suptitle(f"Last-chunk capture mode: aligned policy, budget {cfg['budget']}, block {cfg['block_size']} "
                 f"(cold and warm: medians over {cfg['repeats']} fresh engines)\n{_title(meta)}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


PLOTS = {"prompt_len": plot_prompt_len, "block_size": plot_block_size, "budget": plot_budget,
         "interval": plot_interval, "capture": plot_capture}


def plot(name: str, out: Path) -> Path:
    """Redraw `<out>/<name>.png` from the sweep's CSV and JSON."""
    rows = sweep_parts.load_rows(out / f"{name}.csv")
    meta = json.loads((out / f"{name}.json").read_text())
    path = out / f"{name}.png"
    PLOTS[name](rows, meta, path)
    return path
