"""Ablations of the chunk plan on the hybrid model: what each knob does to the warm restore.

    python -m experiments.ablations prompt-len   # legacy vs aligned over prompt lengths 300 .. 32772
    python -m experiments.ablations block-size   # KV block size 16 .. 256 (16388-token prompt)
    python -m experiments.ablations budget       # prefill budget 512 .. 8192 (16388-token prompt)
    python -m experiments.ablations interval     # snapshot interval 0 / 64 / 512 blocks: bytes held vs reuse
    python -m experiments.ablations capture      # last-chunk capture in_pass / two_pass / none
    python -m experiments.ablations all          # every sweep above with its defaults

Every point builds a fresh engine (`max_batch_size` 1, the seed's dense serve) over the real
model, runs a cold request, then a byte-identical warm request `--repeats` times (median TTFT),
and records chunk ends, snapshot positions and bytes, the warm KV match, restore point and
replayed tokens, cold and warm TTFT, and the warm-vs-cold max abs logit difference. A point
whose logits differ by more than 1e-4 (fp32) or whose first token differs is not reported: it
is listed under `failed_points` in the sweep's JSON and the command exits 1.

Point-specific measurements:
* prompt-len: prompts shorter than the budget are one last chunk; its tail snapshot exists only
  because that chunk captures the split point in-pass, so `aligned` is also run with
  `capture_mode=none` there (the legacy policy cuts a last chunk the same way, so at those
  lengths legacy and aligned coincide).
* interval: besides the identical warm request, requests that share only the first k tokens of
  the cold prompt (plus a fresh `--suffix-len`-token suffix, one per repeat) measure how deep a
  partial match restores; their logits are checked against a prefix-caching-off engine.
* capture: the cold request is what the capture costs, so each repeat is a fresh engine (cold +
  warm) and both TTFTs are medians over `--repeats` engines.

Default sizes (preset "small", one torch thread, the shared 2-core CPU at load ~1.1-2.2) took
prompt-len 166 s, block-size 169 s, budget 115 s, interval 101 s, capture 56 s (`all`: 610 s).
The block size, budget and interval sweeps use a 16388-token prompt (16384 + 4, the incident's
shape at half length); `--prompt-len 32772` runs them at the incident's full length (about 3x
the time: the cold prefill and the legacy replay both grow with the context).

Output per sweep: `<out>/<sweep>.csv` (one row per measured request kind), `<out>/<sweep>.json`
(config, environment per shard, failures), `<out>/<sweep>.png` plotted from the CSV. With
`--shard i/n` a run measures every n-th point and writes `<out>/parts/<sweep>.part<i>of<n>.json`;
`--merge` combines the parts and plots (a 1/1 run merges by itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from experiments import sweep_parts
from experiments.engine_runs import (FP32_LOGIT_TOL, THREADS_HELP, build_model, kv_blocks_for, log, make_engine,
                                     max_abs_diff, random_prompt, serve, set_threads, warm_up)
from experiments.results_io import RESULTS, environment, parse_shard, save_figure, shard
from model.hybrid import HybridLM
from planner.scheduler import SchedulerConfig


class PointFailed(AssertionError):
    pass


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


# ------------------------------------------------------------------------------------------ points
def point(sweep: str, label: str, policy: str, prompt_len: int, block_size: int, budget: int, interval: int,
          capture_mode: str = "in_pass", **extra) -> dict:
    return dict(sweep=sweep, label=label, policy=policy, capture_mode=capture_mode, prompt_len=prompt_len,
                block_size=block_size, budget=budget, interval_blocks=interval, **extra)


def points_prompt_len(a) -> list[dict]:
    out = []
    for n in a.lengths:
        for policy in ("legacy", "aligned"):
            out.append(point("prompt_len", policy, policy, n, a.block_size, a.budget, a.interval))
        if n < a.budget:  # one last chunk: only its in-pass capture leaves a tail snapshot
            out.append(point("prompt_len", "aligned, no capture", "aligned", n, a.block_size, a.budget, a.interval,
                             capture_mode="none"))
    return out


def points_block_size(a) -> list[dict]:
    return [point("block_size", policy, policy, a.prompt_len, bs, a.budget, a.interval)
            for bs in a.block_sizes for policy in ("legacy", "aligned")]


def points_budget(a) -> list[dict]:
    return [point("budget", policy, policy, a.prompt_len, a.block_size, b, a.interval)
            for b in a.budgets for policy in ("legacy", "aligned")]


def points_interval(a) -> list[dict]:
    return [point("interval", f"interval {i}", "aligned", a.prompt_len, a.block_size, a.budget, i,
                  shared_prefixes=[k for k in a.shared_prefixes if k < a.prompt_len], suffix_len=a.suffix_len)
            for i in a.intervals]


def points_capture(a) -> list[dict]:
    return [point("capture", mode, "aligned", n, a.block_size, a.budget, a.interval, capture_mode=mode)
            for n in a.lengths for mode in a.modes]


# ------------------------------------------------------------------------------------------ measuring
class ReferenceLogits:
    """Last-prompt-token logits of prompts run with prefix caching off (cached per prompt)."""

    def __init__(self, model: HybridLM):
        self.model, self.cache = model, {}

    def __call__(self, prompt: list[int], block_size: int, budget: int):
        key = (tuple(prompt), block_size, budget)
        if key not in self.cache:
            sched = SchedulerConfig(block_size=block_size, prefill_budget=budget, max_batch_size=1,
                                    num_kv_blocks=kv_blocks_for([len(prompt)], block_size), enable_prefix_caching=False)
            engine = make_engine(self.model, sched)
            req = serve(engine, prompt, "reference")
            self.cache[key] = (engine.prompt_logits["reference"], req.output_token_ids[0])
        return self.cache[key]


def check(diff: float, same_token: bool, what: str) -> None:
    if not diff <= FP32_LOGIT_TOL or not same_token:
        raise PointFailed(f"{what}: max abs logit diff {diff:.3e} (bound {FP32_LOGIT_TOL:g}), "
                          f"same first token: {same_token}")


def one_value(values: list, what: str):
    if len(set(map(repr, values))) != 1:
        raise PointFailed(f"{what} differs between repeats: {values}")
    return values[0]


def measure(model: HybridLM, p: dict, args, reference: ReferenceLogits) -> list[dict]:
    """Every row of one point (see the module docstring); raises PointFailed on a wrong result."""
    vocab, bs, total = model.config.vocab_size, p["block_size"], p["prompt_len"]
    prompt = random_prompt(total, vocab, seed=args.seed * 1_000_003 + total)
    shared = [(k, r, prompt[:k] + random_prompt(p["suffix_len"], vocab, seed=args.seed * 7919 + k * 31 + r))
              for k in p.get("shared_prefixes", []) for r in range(args.repeats)]
    sched = SchedulerConfig(block_size=bs, prefill_budget=p["budget"], max_batch_size=1,
                            num_kv_blocks=kv_blocks_for([total, total] + [len(s[2]) for s in shared], bs),
                            policy=p["policy"], snapshot_interval_blocks=p["interval_blocks"])
    cold_repeats, warm_repeats = (args.repeats, 1) if p["sweep"] == "capture" else (1, args.repeats)
    colds, warms, held, engine = [], [], [], None
    for c in range(cold_repeats):
        engine = make_engine(model, sched, p["capture_mode"])
        cold = serve(engine, prompt, "cold")
        colds.append(cold)
        held.append((len(engine.snapshots), engine.snapshots.bytes_held))
        for w in range(warm_repeats):
            warm = serve(engine, prompt, f"warm{w}")
            diff = max_abs_diff(engine.prompt_logits[warm.request_id], engine.prompt_logits["cold"])
            check(diff, warm.output_token_ids == cold.output_token_ids, f"warm {w} vs cold")
            warms.append((warm, diff))
        log(f"  {p['label']}: cold {cold.metrics.ttft_s:.2f} s, warm restore {warms[-1][0].metrics.restore_at} "
            f"replay {warms[-1][0].metrics.replayed_tokens} in {warms[-1][0].metrics.ttft_s * 1e3:.1f} ms")
    cm, wm = colds[0].metrics, warms[0][0].metrics
    base = {k: v for k, v in p.items() if k not in ("shared_prefixes",)}
    base |= {"preset": args.preset, "dtype": args.dtype, "device": args.device, "seed": args.seed,
             "repeats": args.repeats, "cold_repeats": cold_repeats}
    n_snap, bytes_held = one_value(held, "snapshots after the cold request")
    row = base | {
        "row": 0, "request": "identical", "shared_prefix": total,
        "chunk_ends": one_value([c.metrics.chunk_ends for c in colds], "cold chunk ends"),
        "snapshot_positions": one_value([c.metrics.snapshot_positions for c in colds], "cold snapshot positions"),
        "n_snapshots": n_snap,
        "snapshot_bytes_each": engine.runner.snapshot_nbytes,
        "snapshot_bytes_held": bytes_held,
        "cold_prefill_passes": cm.prefill_passes,
        "cold_ttft_s": statistics.median(c.metrics.ttft_s for c in colds),
        "cold_ttft_s_all": [c.metrics.ttft_s for c in colds],
        "warm_kv_match": one_value([w.metrics.kv_match_tokens for w, _ in warms], "warm KV match"),
        "warm_restore_at": one_value([w.metrics.restore_at for w, _ in warms], "warm restore point"),
        "warm_replayed_tokens": one_value([w.metrics.replayed_tokens for w, _ in warms], "warm replayed tokens"),
        "warm_chunk_ends": wm.chunk_ends,
        "warm_ttft_s": statistics.median(w.metrics.ttft_s for w, _ in warms),
        "warm_ttft_s_all": [w.metrics.ttft_s for w, _ in warms],
        "warm_vs_cold_max_abs_logit_diff": max(d for _, d in warms),
    }
    rows = [row]
    by_k: dict[int, list] = {}
    for k, r, sp in shared:  # the interval sweep: requests sharing only the first k tokens
        req = serve(engine, sp, f"shared{k}-{r}")
        ref_logits, ref_token = reference(sp, bs, p["budget"])
        diff = max_abs_diff(engine.prompt_logits[req.request_id], ref_logits)
        check(diff, req.output_token_ids[0] == ref_token, f"shared prefix {k} repeat {r} vs caching off")
        by_k.setdefault(k, []).append((req, diff))
    for j, (k, reqs) in enumerate(sorted(by_k.items()), start=1):
        m = [q.metrics for q, _ in reqs]
        rows.append(base | {
            "row": j, "request": "shared_prefix", "shared_prefix": k, "request_len": k + p["suffix_len"],
            "n_snapshots": n_snap, "snapshot_bytes_each": engine.runner.snapshot_nbytes, "snapshot_bytes_held": bytes_held,
            "warm_kv_match": one_value([x.kv_match_tokens for x in m], f"shared {k} KV match"),
            "warm_restore_at": one_value([x.restore_at for x in m], f"shared {k} restore point"),
            "warm_replayed_tokens": one_value([x.replayed_tokens for x in m], f"shared {k} replayed tokens"),
            "warm_ttft_s": statistics.median(x.ttft_s for x in m),
            "warm_ttft_s_all": [x.ttft_s for x in m],
            "warm_vs_cold_max_abs_logit_diff": max(d for _, d in reqs),
        })
        log(f"  {p['label']}: shared prefix {k}: restore {rows[-1]['warm_restore_at']} replay "
            f"{rows[-1]['warm_replayed_tokens']} in {rows[-1]['warm_ttft_s'] * 1e3:.1f} ms")
    return rows


# ------------------------------------------------------------------------------------------ plots
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
    return f"{env['device_name']}, preset {cfg['preset']}, {cfg['dtype']}, warm = median of {cfg['repeats']}"


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


# ------------------------------------------------------------------------------------------ sweeps
@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    points: Callable
    plot: Callable
    config_keys: tuple[str, ...]  # the flags that define the sweep (recorded and fingerprinted)


SWEEPS = {
    "prompt-len": Sweep("prompt_len", points_prompt_len, plot_prompt_len, ("lengths", "block_size", "budget", "interval")),
    "block-size": Sweep("block_size", points_block_size, plot_block_size, ("block_sizes", "prompt_len", "budget", "interval")),
    "budget": Sweep("budget", points_budget, plot_budget, ("budgets", "prompt_len", "block_size", "interval")),
    "interval": Sweep("interval", points_interval, plot_interval,
                      ("intervals", "prompt_len", "block_size", "budget", "shared_prefixes", "suffix_len")),
    "capture": Sweep("capture", points_capture, plot_capture, ("lengths", "modes", "block_size", "budget", "interval")),
}
DEFAULTS = {  # per sweep: (flag defaults)
    "prompt-len": dict(lengths=[300, 1000, 4000, 8000, 8200, 16400, 32772], block_size=16, budget=8192, interval=512),
    "block-size": dict(block_sizes=[16, 32, 64, 128, 256], prompt_len=16388, budget=8192, interval=512),
    "budget": dict(budgets=[512, 1024, 2048, 4096, 8192], prompt_len=16388, block_size=16, interval=512),
    "interval": dict(intervals=[0, 64, 512], prompt_len=16388, block_size=16, budget=1024,
                     shared_prefixes=[1500, 4000, 8500, 12000], suffix_len=256),
    "capture": dict(lengths=[1000, 4000, 8000], modes=["in_pass", "two_pass", "none"], block_size=16, budget=8192,
                    interval=512),
}


def plot_from_csv(sweep: Sweep, out: Path) -> Path:
    rows = sweep_parts.load_rows(out / f"{sweep.name}.csv")
    import json

    meta = json.loads((out / f"{sweep.name}.json").read_text())
    path = out / f"{sweep.name}.png"
    sweep.plot(rows, meta, path)
    return path


def run_sweep(cmd: str, args, model: HybridLM | None) -> int:
    sweep = SWEEPS[cmd]
    out = args.out or RESULTS / "ablations" / sweep.name
    spec = parse_shard(args.shard)
    config = {k: getattr(args, k) for k in sweep.config_keys} | {
        "preset": args.preset, "dtype": args.dtype, "device": args.device, "backend": args.backend,
        "repeats": args.repeats, "seed": args.seed}
    points = sweep.points(args)
    fp = sweep_parts.fingerprint(points, config)
    if not args.merge:
        for stale in sweep_parts.clear_stale_parts(out, sweep.name, spec, fp):
            log(f"removed stale part {stale}")
        # the 1-minute load average beside the timings: other jobs on the same cores inflate them
        env = environment(args.device) | {"loadavg_1m_start": os.getloadavg()[0]}
        mine = shard(list(enumerate(points)), spec)
        rows, done, failed = [], [], []
        reference = ReferenceLogits(model)
        t_sweep = time.perf_counter()
        for n, (idx, p) in enumerate(mine, start=1):
            log(f"{sweep.name} point {idx} ({n}/{len(mine)} of shard {spec[0]}/{spec[1]}): {p['label']}, "
                f"prompt {p['prompt_len']}, block {p['block_size']}, budget {p['budget']}, interval "
                f"{p['interval_blocks']}, capture {p['capture_mode']}")
            t0 = time.perf_counter()
            try:
                new = measure(model, p, args, reference)
            except PointFailed as e:
                log(f"  POINT FAILED, not reported: {e}")
                failed.append({"point": idx, "label": p["label"], "error": str(e)})
            else:
                for r in new:
                    r["point"], r["point_wall_s"] = idx, time.perf_counter() - t0
                rows.extend(new)
                done.append(idx)
            env["loadavg_1m_end"] = os.getloadavg()[0]
            sweep_parts.write_part(out, sweep.name, spec, fp, points, config, env, rows, done, failed)
        log(f"{sweep.name}: shard {spec[0]}/{spec[1]} done in {time.perf_counter() - t_sweep:.0f} s "
            f"({len(done)} points, {len(failed)} failed)")
        if spec[1] > 1:
            log(f"merge when every shard is done: python -m experiments.ablations {cmd} --merge --out {out}")
            return 1 if failed else 0
    meta = sweep_parts.merge(out, sweep.name)
    if meta["rows"]:
        png = plot_from_csv(sweep, out)
        log(f"{sweep.name}: wrote {out / (sweep.name + '.csv')}, {png}")
    else:  # nothing passed: no figure, and no stale one from an earlier run either
        (out / f"{sweep.name}.png").unlink(missing_ok=True)
        log(f"{sweep.name}: no point passed its correctness check; no figure")
    return 1 if meta["failed_points"] else 0


def add_common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None, help="output folder (default results/ablations/<sweep>/)")
    ap.add_argument("--preset", default="small", help="model preset (model.config.PRESETS)")
    ap.add_argument("--backend", default="torch", choices=("torch", "triton"), help="kernel backend")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32",),
                    help="model dtype (fp32 only: the warm == cold check is stated for fp32)")
    ap.add_argument("--repeats", type=int, default=3, help="warm requests per point (median TTFT)")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompt seed")
    ap.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    ap.add_argument("--shard", default="0/1", help="run the points whose index %% n == i (i/n); parts merge with --merge")
    ap.add_argument("--merge", action="store_true", help="do not measure: merge the part files in --out and plot")


def add_sweep_flags(ap: argparse.ArgumentParser, cmd: str) -> None:
    d = DEFAULTS[cmd]
    helps = {
        "lengths": "comma-separated prompt lengths",
        "block_sizes": "comma-separated KV block sizes",
        "budgets": "comma-separated prefill budgets (tokens per tick)",
        "intervals": "comma-separated snapshot intervals in blocks (0 = tail snapshots only)",
        "shared_prefixes": "comma-separated k: extra warm requests share the first k cold tokens",
        "modes": "comma-separated last-chunk capture modes (in_pass, two_pass, none)",
        "prompt_len": "cold prompt tokens (32772 = the incident's full length)",
        "block_size": "KV block size in tokens",
        "budget": "prefill token budget per tick",
        "interval": "snapshot interval in blocks (0 = off)",
        "suffix_len": "fresh tokens after the shared prefix of each extra warm request",
    }
    for key, value in d.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):
            conv = strs if key == "modes" else ints
            ap.add_argument(flag, type=conv, default=value, help=f"{helps[key]} (default {','.join(map(str, value))})")
        else:
            ap.add_argument(flag, type=int, default=value, help=f"{helps[key]} (default {value})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Chunk-plan ablations on the hybrid model (see the module docstring).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in SWEEPS:
        p = sub.add_parser(cmd, help=f"the {cmd} sweep")
        add_common(p)
        add_sweep_flags(p, cmd)
    p_all = sub.add_parser("all", help="every sweep with its default sizes")
    add_common(p_all)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats: must be >= 1")
    cmds = list(SWEEPS) if args.cmd == "all" else [args.cmd]
    if args.cmd == "all" and args.out is not None:
        ap.error("--out: not with 'all' (each sweep writes results/ablations/<sweep>/)")
    model = None
    set_threads(args.threads)
    if not args.merge:
        model = build_model(args.preset, args.device, args.seed, args.dtype, args.backend)
        warm_up(model)
    status = 0
    for cmd in cmds:
        sweep_args = argparse.Namespace(**(DEFAULTS[cmd] | vars(args))) if args.cmd == "all" else args
        t0 = time.perf_counter()
        status |= run_sweep(cmd, sweep_args, model)
        log(f"{cmd}: {time.perf_counter() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
