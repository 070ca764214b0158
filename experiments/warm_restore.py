"""The seed's incident, reproduced end to end on the hybrid model (the README's main command).

    python -m experiments.warm_restore [--preset small] [--backend torch] [--device cpu] [--repeats 3]

A dense serve (max_batch_size 1, prefill budget 8192, KV block size 16) prefills a 32772-token
prompt, then serves a byte-identical warm request, under each chunk policy:

* legacy: chunk ends 8193, 16385, 24577, 32769, 32772; no tail snapshot; the warm request
  matches 32768 tokens of KV, restores its SSM state at 24577 and replays 8195 tokens;
* aligned: chunk ends 8192, 16384, 24576, 32752, 32772; the snapshot at the tail split point
  32752 is saved; the warm request restores there and replays 20 tokens.

Warm TTFT is measured `--repeats` times per policy (median and spread); warm logits are
compared with cold logits. Then the forward time of n replayed tokens at the end of the same
context is measured for several n and fitted as a + b*n, which explains our legacy/aligned
ratio next to the seed's 12.5 s / 0.2 s = 62.5.

Writes results/warm_restore/{warm_restore.json, warm_restore.png, README.md} (or `--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from experiments.engine_runs import (build_model, kv_blocks_for, log, make_engine, max_abs_diff, random_prompt,
                                     set_threads)
from experiments.results_io import RESULTS, environment, save_figure, write_json, write_text
from model.batch import SequenceChunk
from model.engine import Engine
from model.hybrid import HybridLM
from model.engine import ModelRunner
from planner.scheduler import SchedulerConfig

SEED = {"legacy": {"chunk_ends": [8193, 16385, 24577, 32769, 32772], "warm_restore_at": 24577,
                   "warm_replayed_tokens": 8195, "warm_ttft_s": 12.5},
        "aligned": {"chunk_ends": [8192, 16384, 24576, 32752, 32772], "warm_restore_at": 32752,
                    "warm_replayed_tokens": 20, "warm_ttft_s": 0.2}}
POLICIES = ("legacy", "aligned")
CURVE_POINTS = (1, 4, 20, 64, 256, 1024, 4096, 8195)


def policy_engine(model: HybridLM, policy: str, args) -> Engine:
    """The seed's dense serve: one slot, the prompt's blocks plus slack, in-pass captures."""
    cfg = SchedulerConfig(block_size=args.block_size, prefill_budget=args.budget, max_batch_size=1,
                          num_kv_blocks=kv_blocks_for([args.prompt_len], args.block_size), policy=policy,
                          snapshot_interval_blocks=args.interval)
    return make_engine(model, cfg, capture_mode="in_pass", keep_prompt_logits=True)


def serve(engine: Engine, prompt: list[int], request_id: str, label: str):
    """One request to completion (one output token: TTFT is the whole of it), with progress."""
    req = engine.add_request(prompt, 1, request_id)
    while engine.scheduler.has_work:
        engine.step()
        m = req.metrics
        done = m.chunk_ends[-1] if m.chunk_ends else m.restore_at
        log(f"{label}: {done}/{len(prompt)} tokens ({time.perf_counter() - m.arrival_s:.2f} s)")
    return req


def run_policy(model: HybridLM, policy: str, prompt: list[int], args) -> dict:
    engine = policy_engine(model, policy, args)
    cold = serve(engine, prompt, "cold", f"{policy} cold")
    warm_ttfts, diffs, warm = [], [], None
    for i in range(args.repeats):
        warm = serve(engine, prompt, f"warm{i}", f"{policy} warm {i + 1}/{args.repeats}")
        warm_ttfts.append(warm.metrics.ttft_s)
        diffs.append(max_abs_diff(engine.prompt_logits[warm.request_id], engine.prompt_logits["cold"]))
    return {
        "chunk_ends": cold.metrics.chunk_ends,
        "snapshot_positions": cold.metrics.snapshot_positions,
        "snapshot_bytes_each": engine.runner.snapshot_nbytes,
        "snapshot_bytes_held": engine.snapshots.bytes_held,
        "warm_kv_match": warm.metrics.kv_match_tokens,
        "warm_restore_at": warm.metrics.restore_at,
        "warm_replayed_tokens": warm.metrics.replayed_tokens,
        "warm_chunk_ends": warm.metrics.chunk_ends,
        "cold_ttft_s": cold.metrics.ttft_s,
        "warm_ttft_s": statistics.median(warm_ttfts),
        "warm_ttft_s_all": warm_ttfts,
        "warm_vs_cold_max_abs_logit_diff": max(diffs),
        "cold_first_token": cold.output_token_ids[0],
        "warm_first_token": warm.output_token_ids[0],
        "engine": engine,  # dropped before writing; the curve reuses its KV cache
    }


def replay_curve(engine: Engine, prompt: list[int], points, repeats: int) -> list[dict]:
    """Forward time of the last n prompt tokens over the cached KV of the rest (no engine overhead)."""
    runner: ModelRunner = engine.runner
    total, bs = len(prompt), engine.config.scheduler.block_size
    table = list(range(-(-total // bs)))  # timing only: which blocks are read does not change the cost
    rows = []
    for n in points:
        times = []
        for _ in range(repeats):
            row = SequenceChunk(torch.tensor(prompt[total - n:]), total - n, table, 0, kv_cached_len=total)
            t0 = time.perf_counter()
            runner.forward([row])
            times.append(time.perf_counter() - t0)
        rows.append({"replayed_tokens": n, "forward_s": statistics.median(times), "forward_s_all": times})
        log(f"curve: {n} tokens at context {total - n}: {rows[-1]['forward_s'] * 1e3:.1f} ms")
    return rows


def fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares a + b*x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def _plot_plan(ax, result: dict, lo: int, hi: int, annotate: bool) -> None:
    """Both policies' chunk ends (ticks) and snapshots (circles) on one token axis."""
    for y, policy, color in ((1, "legacy", "tab:red"), (0, "aligned", "tab:green")):
        r = result[policy]
        ax.hlines(y, lo, hi, color="0.85", lw=8)
        ends = [e for e in r["chunk_ends"] if lo <= e <= hi]
        snaps = [p for p in r["snapshot_positions"] if lo <= p <= hi]
        ax.vlines(ends, y - 0.25, y + 0.25, color=color, lw=1.5)
        ax.plot(snaps, [y] * len(snaps), "o", color=color, ms=8, mfc="white", label=f"{policy}: snapshots")
        if annotate or lo <= r["warm_restore_at"] <= hi:
            ax.annotate(f"restore {r['warm_restore_at']}\nreplay {r['warm_replayed_tokens']}",
                        (r["warm_restore_at"], y + 0.3), ha="center", fontsize=8, color=color)
        if not annotate:
            for k, e in enumerate(ends):  # staggered: neighbouring ends can be 3 tokens apart
                ax.annotate(str(e), (e, y - 0.4 - 0.15 * (k % 2)), ha="center", fontsize=7, color=color)
    ax.axvline(result["aligned"]["warm_kv_match"], color="k", ls="--", lw=1, label="warm KV match")
    ax.set_xlim(lo, hi)
    ax.set_yticks([0, 1], ["aligned", "legacy"])
    ax.set_ylim(-0.7, 1.8)


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (ax_plan, ax_tail), (ax_ttft, ax_curve) = axes
    cfg = result["config"]
    total = cfg["prompt_len"]
    _plot_plan(ax_plan, result, 0, total, annotate=True)
    ax_plan.set_xlabel("token position (ticks: chunk ends)")
    ax_plan.set_title(f"{total}-token prompt, block {cfg['block_size']}, budget {cfg['budget']}")
    ax_plan.legend(loc="lower left", fontsize=8)
    tail_lo = max(0, (result["aligned"]["warm_restore_at"] // cfg["block_size"] - 2) * cfg["block_size"])
    _plot_plan(ax_tail, result, tail_lo, total + 2, annotate=False)
    ax_tail.set_xlabel("token position (the prompt's tail)")
    ax_tail.set_title("tail: legacy's deepest snapshot (32769) lies past the match")

    labels = ["seed\nlegacy", "seed\naligned", "ours\nlegacy", "ours\naligned"]
    values = [SEED["legacy"]["warm_ttft_s"], SEED["aligned"]["warm_ttft_s"],
              result["legacy"]["warm_ttft_s"], result["aligned"]["warm_ttft_s"]]
    bars = ax_ttft.bar(labels, values, color=["0.6", "0.8", "tab:red", "tab:green"])
    ax_ttft.bar_label(bars, [f"{v:.3g} s" for v in values], fontsize=8)
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("warm TTFT (s)")
    ax_ttft.set_title(f"warm TTFT ratio legacy/aligned: seed 62.5, ours {result['warm_ttft_ratio_legacy_over_aligned']:.0f}")

    curve = result["replay_curve"]
    xs = [p["replayed_tokens"] for p in curve]
    ax_curve.plot(xs, [p["forward_s"] for p in curve], "o", color="tab:blue", label="forward of n tokens (measured)")
    a, b = result["replay_fit"]["a_s"], result["replay_fit"]["b_s_per_token"]
    grid = [1 + i * (max(xs) - 1) / 400 for i in range(401)]
    ax_curve.plot(grid, [a + b * x for x in grid], "-", color="tab:blue", lw=1,
                  label=f"fit {a * 1e3:.1f} ms + {b * 1e3:.3f} ms/token")
    sa, sb = result["replay_fit"]["seed_a_s"], result["replay_fit"]["seed_b_s_per_token"]
    ax_curve.plot(grid, [sa + sb * x for x in grid], ":", color="0.4", lw=1,
                  label=f"seed's line {sa * 1e3:.0f} ms + {sb * 1e3:.2f} ms/token")
    for policy, color in (("legacy", "tab:red"), ("aligned", "tab:green")):
        r = result[policy]
        ax_curve.plot([r["warm_replayed_tokens"]], [r["warm_ttft_s"]], "s", color=color, label=f"{policy} warm TTFT")
    ax_curve.set_xscale("log")
    ax_curve.set_yscale("log")
    ax_curve.set_xlabel(f"replayed tokens at the end of a {total}-token context")
    ax_curve.set_ylabel("seconds")
    ax_curve.legend(fontsize=7)
    ax_curve.set_title("cost of replay")
    fig.suptitle(f"Warm restore: {result['environment']['device_name']}, preset {cfg['preset']}, "
                 f"backend {cfg['backend']}, {cfg['dtype']}", fontsize=10)
    fig.tight_layout()
    out = save_figure(fig, path)
    plt.close(fig)
    return out


def report(result: dict) -> str:
    L, A = result["legacy"], result["aligned"]
    fit = result["replay_fit"]
    env, cfg = result["environment"], result["config"]
    spread = result["warm_ttft_ratio_spread"]
    lines = [
        "# Warm restore: the seed's incident, reproduced",
        "",
        f"Command: `python -m experiments.warm_restore --preset {cfg['preset']} --backend {cfg['backend']} "
        f"--device {cfg['device']} --repeats {cfg['repeats']}`  ",
        f"Device: {env['device_name']}; torch {env['torch']}, triton {env['triton']}; {env['date']}  ",
        f"Model preset `{cfg['preset']}` ({result['model']['params_m']:.1f} M parameters, "
        f"{result['model']['layers']}), dtype {cfg['dtype']}, seed {cfg['seed']}.",
        "",
        "| | seed legacy | ours legacy | seed aligned | ours aligned |",
        "|---|---|---|---|---|",
        f"| chunk ends | {SEED['legacy']['chunk_ends']} | {L['chunk_ends']} | {SEED['aligned']['chunk_ends']} | {A['chunk_ends']} |",
        f"| snapshots saved | | {L['snapshot_positions']} | | {A['snapshot_positions']} |",
        f"| warm KV match | 32768 | {L['warm_kv_match']} | 32768 | {A['warm_kv_match']} |",
        f"| warm restore at | {SEED['legacy']['warm_restore_at']} | {L['warm_restore_at']} | {SEED['aligned']['warm_restore_at']} | {A['warm_restore_at']} |",
        f"| warm replayed tokens | {SEED['legacy']['warm_replayed_tokens']} | {L['warm_replayed_tokens']} | {SEED['aligned']['warm_replayed_tokens']} | {A['warm_replayed_tokens']} |",
        f"| cold TTFT | | {L['cold_ttft_s']:.2f} s | | {A['cold_ttft_s']:.2f} s |",
        f"| warm TTFT (median of {cfg['repeats']}) | 12.5 s | {L['warm_ttft_s']:.3f} s | ~0.2 s | {A['warm_ttft_s'] * 1e3:.1f} ms |",
        f"| warm vs cold max abs logit diff | | {L['warm_vs_cold_max_abs_logit_diff']:.2e} | | {A['warm_vs_cold_max_abs_logit_diff']:.2e} |",
        "",
        f"**Warm TTFT ratio legacy / aligned: {result['warm_ttft_ratio_legacy_over_aligned']:.1f}** "
        f"(median over {cfg['repeats']} paired repeats; min {spread['min']:.1f}, max {spread['max']:.1f}); the seed's is 62.5.",
        "",
        "## Why the ratio differs from the seed's",
        "",
        f"Forward time of n replayed tokens at the end of the {cfg['prompt_len']}-token context, least-squares fit "
        f"a + b*n over n = 1..8195: a = {fit['a_s'] * 1e3:.1f} ms, b = {fit['b_s_per_token'] * 1e3:.3f} ms/token "
        f"(a fixed cost worth a/b = {fit['a_s'] / fit['b_s_per_token']:.0f} tokens). "
        f"The seed's two points (12.5 s for 8195 tokens, 0.2 s for 20) imply a = {fit['seed_a_s'] * 1e3:.0f} ms and "
        f"b = {fit['seed_b_s_per_token'] * 1e3:.2f} ms/token (a/b = {fit['seed_a_s'] / fit['seed_b_s_per_token']:.0f} "
        f"tokens; {1 / fit['seed_b_s_per_token']:.0f} prefill tokens/s at ~30K context, a slow device or a large model).",
        "",
        "The ratio is (a + 8195 b) / (a + 20 b): it tends to 8195 / 20 = 410 as the fixed cost a/b shrinks. "
        f"With the seed's a/b it is 62.5; with ours the fit predicts {fit['predicted_ratio']:.0f} "
        f"and we measure {result['warm_ttft_ratio_legacy_over_aligned']:.0f}. Our fixed cost per request is small in "
        "token-equivalents because the CPU's per-token cost is high relative to Python and scheduling overhead; "
        "on a GPU the per-token cost falls much more than the fixed cost, so the ratio there falls towards the seed's.",
        "",
        f"Aligned warm TTFT is {A['warm_ttft_s'] / fit['forward_20_s']:.2f}x the forward time of its 20 replayed tokens alone "
        f"({fit['forward_20_s'] * 1e3:.1f} ms): the rest is hashing the prompt's blocks, the prefix match, the snapshot lookup "
        "and restore, and scheduling.",
        "",
        "Data: `warm_restore.json`; figure: `warm_restore.png`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Reproduce the seed's warm-restore incident on the hybrid model.")
    ap.add_argument("--out", type=Path, default=RESULTS / "warm_restore", help="output folder")
    ap.add_argument("--preset", default="small", help="model preset (model.config.PRESETS)")
    ap.add_argument("--backend", default="torch", choices=("torch", "triton"), help="kernel backend")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="model dtype")
    ap.add_argument("--repeats", type=int, default=3, help="warm requests per policy (median and spread)")
    ap.add_argument("--prompt-len", type=int, default=32772, help="prompt tokens (seed: 32772)")
    ap.add_argument("--block-size", type=int, default=16, help="KV block size (seed: 16)")
    ap.add_argument("--budget", type=int, default=8192, help="prefill token budget per tick (seed: 8192)")
    ap.add_argument("--interval", type=int, default=512, help="interval snapshots every this many blocks (0 = off)")
    ap.add_argument("--curve-repeats", type=int, default=3, help="repeats per point of the replay-cost curve")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompt seed")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default). On a machine shared with other jobs use 1: "
                         "two threads waiting on each other's barriers made a 20-token replay 100x slower here")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the figure and report from the JSON already in --out")
    args = ap.parse_args(argv)
    if args.replot:
        result = json.loads((args.out / "warm_restore.json").read_text())
        plot(result, args.out / "warm_restore.png")
        write_text(args.out / "README.md", report(result))
        return 0
    if args.repeats < 1:
        ap.error("--repeats: must be >= 1")
    if args.threads:
        set_threads(args.threads)

    torch.manual_seed(args.seed)
    model = build_model(args.preset, args.device, args.seed, args.dtype, args.backend)
    prompt = random_prompt(args.prompt_len, model.config.vocab_size, args.seed)

    result = {"config": vars(args) | {"out": str(args.out)}, "environment": environment(args.device),
              "model": {"params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                        "layers": "".join("A" if t == "attention" else "M" for t in model.config.layer_types)},
              "seed_figures": SEED}
    engines = {}
    for policy in POLICIES:
        r = run_policy(model, policy, prompt, args)
        engines[policy] = r.pop("engine")
        result[policy] = r
        log(f"{policy}: restore {r['warm_restore_at']}, replay {r['warm_replayed_tokens']}, "
            f"warm TTFT {r['warm_ttft_s']:.3f} s, logit diff {r['warm_vs_cold_max_abs_logit_diff']:.2e}")
    ratios = [l / a for l, a in zip(result["legacy"]["warm_ttft_s_all"], result["aligned"]["warm_ttft_s_all"])]
    result["warm_ttft_ratio_legacy_over_aligned"] = statistics.median(ratios)
    result["warm_ttft_ratio_spread"] = {"min": min(ratios), "max": max(ratios), "all": ratios}

    curve = replay_curve(engines["aligned"], prompt, [n for n in CURVE_POINTS if n < args.prompt_len], args.curve_repeats)
    a, b = fit_line([p["replayed_tokens"] for p in curve], [p["forward_s"] for p in curve])
    seed_b = (SEED["legacy"]["warm_ttft_s"] - SEED["aligned"]["warm_ttft_s"]) / (8195 - 20)
    result["replay_curve"] = curve
    result["replay_fit"] = {
        "a_s": a, "b_s_per_token": b, "predicted_ratio": (a + 8195 * b) / (a + 20 * b),
        "seed_a_s": SEED["aligned"]["warm_ttft_s"] - 20 * seed_b, "seed_b_s_per_token": seed_b,
        "forward_20_s": next(p["forward_s"] for p in curve if p["replayed_tokens"] == 20),
    }
    result["aligned_warm_ttft_over_forward_20"] = result["aligned"]["warm_ttft_s"] / result["replay_fit"]["forward_20_s"]

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "warm_restore.json", result)
    plot(result, args.out / "warm_restore.png")
    write_text(args.out / "README.md", report(result))
    log(f"ratio legacy/aligned {result['warm_ttft_ratio_legacy_over_aligned']:.1f}; wrote {args.out}")
    ok = (result["legacy"]["warm_restore_at"], result["legacy"]["warm_replayed_tokens"],
          result["aligned"]["warm_restore_at"], result["aligned"]["warm_replayed_tokens"]) == (24577, 8195, 32752, 20) \
        or args.prompt_len != 32772 or args.block_size != 16 or args.budget != 8192
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
