"""The ablation sweeps' figures, each drawn from a sweep's merged CSV rows and JSON meta.

`plot(sweep_name, out)` reads `<out>/<sweep>.csv` and `<out>/<sweep>.json` and writes
`<out>/<sweep>.png`; the measuring side is `experiments.ablations.study`.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common import figure_style as fs
from experiments.common import sweep_parts


def _plt():
    return fs.pyplot()


# label -> where its replayed-token labels go (offset points, alignment): apart where values are close
_ANNOTATE = {"legacy": ((4, 5), "left"), "aligned": ((0, -12), "center"), "aligned, no capture": ((-4, 5), "right")}


def _series(rows, x_key, label):
    sel = sorted((r for r in rows if r["label"] == label and r["request"] == "identical"), key=lambda r: r[x_key])
    return sel, [r[x_key] for r in sel]


def _title(fig, meta: dict, headline: str, **parts) -> None:
    env = meta["environments"][0]
    cfg = meta["config"]
    fs.title(fig, headline, workload="one cold prompt, then warm requests", model=f"{cfg['preset']} ({cfg['dtype']})",
             device=f"{env['device_name']}, measured", extra=[f"warm = median of {cfg['repeats']}"], **parts)


def plot_versus(rows, meta, path, x_key: str, x_label: str, log_x: bool, title: str, vline: tuple | None = None):
    """Replayed tokens and warm TTFT (and cold TTFT) against one knob, a line per label."""
    plt = _plt()
    fig, (ax_rep, ax_ttft) = plt.subplots(1, 2, figsize=(12, 4.4))
    aligned = {r[x_key]: r["warm_replayed_tokens"] for r in _series(rows, x_key, "aligned")[0]}
    for label in dict.fromkeys(r["label"] for r in rows):
        sel, xs = _series(rows, x_key, label)
        st = fs.style(label)
        # legacy hollow and larger: where the two policies coincide both stay visible
        mk = dict(ms=9, mfc="none") if label == "legacy" else dict(ms=5)
        ax_rep.plot(xs, [max(r["warm_replayed_tokens"], 0.8) for r in sel], **st, linestyle="-", label=label, **mk)
        ax_ttft.plot(xs, [r["warm_ttft_s"] for r in sel], **st, linestyle="-", label=f"{label}: warm", **mk)
        ax_ttft.plot(xs, [r["cold_ttft_s"] for r in sel], "x:", color=st["color"], alpha=0.6, label=f"{label}: cold")
        off, ha = _ANNOTATE.get(label, ((3, 4), "left"))
        for i, (r, x) in enumerate(zip(sel, xs)):
            if label == "legacy" and aligned.get(r[x_key]) == r["warm_replayed_tokens"]:
                continue  # the same as aligned's, labelled there
            o, h = off, ha  # a neighbour closer than 10% in x: the two labels lean apart
            if i + 1 < len(xs) and xs[i + 1] < 1.1 * x:
                o, h = (-3, off[1]), "right"
            elif i > 0 and x < 1.1 * xs[i - 1]:
                o, h = (3, off[1]), "left"
            ax_rep.annotate(str(r["warm_replayed_tokens"]), (x, max(r["warm_replayed_tokens"], 0.8)), fontsize=7,
                            textcoords="offset points", xytext=o, ha=h, color=st["color"])
    for ax in (ax_rep, ax_ttft):
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3, which="both")
    if vline is not None:
        for ax in (ax_rep, ax_ttft):
            ax.axvline(vline[0], color="k", ls="--", lw=0.8)
        ax_rep.annotate(vline[1], (vline[0], 0.3), xycoords=("data", "axes fraction"), fontsize=7, ha="right",
                        va="center", rotation=90, xytext=(-3, 0), textcoords="offset points")
    ax_rep.set_ylabel("warm request: replayed tokens")
    ax_ttft.set_ylabel("TTFT (s)")
    lo, hi = ax_rep.get_ylim()
    ax_rep.set_ylim(lo / 2.5, hi * 2.5)  # room for the labels above and below the points
    ax_rep.margins(x=0.08)
    ax_rep.legend(fontsize=8, loc="upper left")
    fs.legend_outside(ax_ttft)
    _title(fig, meta, title)
    fs.save(fig, path)


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
    cols = [fs.style(f"interval {r['interval_blocks']}")["color"] for r in ident]
    bars = ax_bytes.bar(labels, [r["snapshot_bytes_held"] / 2**20 for r in ident], color=cols)
    ax_bytes.bar_label(bars, [f"{r['snapshot_bytes_held'] / 2**20:.2f} MiB" for r in ident], fontsize=8)
    ax_bytes.set_ylabel("snapshot bytes held after the cold prompt (MiB)")
    ax_bytes.set_xlabel("snapshot interval")
    for j, r in enumerate(ident):
        c = cols[j]  # one color per interval in all panels
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
    ax_rep.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    fs.legend_outside(ax_ttft)
    _title(fig, meta, f"Snapshot interval: {cfg['prompt_len']}-token cold prompt, prefill budget {cfg['budget']}, "
           f"block {cfg['block_size']}, shared-prefix requests add {cfg['suffix_len']} fresh tokens")
    fs.save(fig, path)


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
        st = fs.style(mode)
        cold = ax_cold.bar(xs, [sel[n]["cold_ttft_s"] for n in lengths], width, color=st["color"], label=mode)
        ax_cold.bar_label(cold, [f"{sel[n]['cold_prefill_passes']} pass" for n in lengths], fontsize=7)
        # warm: points on a log axis (bars from an arbitrary floor mean nothing there)
        ax_warm.plot(xs, [sel[n]["warm_ttft_s"] for n in lengths], linestyle="none", ms=8, label=mode, **st)
        for x, n in zip(xs, lengths):
            ax_warm.annotate(f"replay\n{sel[n]['warm_replayed_tokens']}", (x, sel[n]["warm_ttft_s"]), fontsize=6,
                             ha="center", va="bottom", xytext=(0, 6), textcoords="offset points", color=st["color"])
    for ax, what in ((ax_cold, "cold TTFT (s): what the capture costs"), (ax_warm, "warm TTFT (s): what it buys")):
        ax.set_xticks(range(len(lengths)), [f"{n} tokens" for n in lengths])
        ax.set_ylabel(what)
        ax.legend(fontsize=8, loc="upper left")
    ax_warm.set_yscale("log")
    ax_warm.set_ylim(0.5 * min(r["warm_ttft_s"] for r in rows), 4 * max(r["warm_ttft_s"] for r in rows))
    ax_warm.set_xlim(-0.5, len(lengths) - 0.5)
    ax_warm.grid(axis="y", alpha=0.3, which="both")
    _title(fig, meta, f"Last-chunk capture mode: aligned policy, prefill budget {cfg['budget']}, block "
           f"{cfg['block_size']} (cold and warm: medians over {cfg['repeats']} fresh engines)")
    fs.save(fig, path)


PLOTS = {"prompt_len": plot_prompt_len, "block_size": plot_block_size, "budget": plot_budget,
         "interval": plot_interval, "capture": plot_capture}


def plot(name: str, out: Path) -> Path:
    """Redraw `<out>/<name>.png` from the sweep's CSV and JSON."""
    rows = sweep_parts.load_rows(out / f"{name}.csv")
    meta = json.loads((out / f"{name}.json").read_text())
    path = out / f"{name}.png"
    PLOTS[name](rows, meta, path)
    return path
