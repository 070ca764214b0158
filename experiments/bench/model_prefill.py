"""Prefill throughput on the CPU: our torch backend against transformers' same model, same run.

For each model (a preset, or a checkpoint folder) both sides run the same config with the same
weights (ours, saved with `model.save_pretrained` and read back by transformers'
`AutoModelForCausalLM.from_pretrained`, so the family's tensor-name map is checked too), fp32,
on one sequence of `--tokens` tokens from position 0:

* ours: one cold `forward_batch` row (the engine's prefill: paged KV write, paged attention,
  varlen conv and SSD scan, MoE by sorted dispatch, SSM/conv state into the pools, last-token
  logits);
* transformers: `model(ids, use_cache=False, logits_to_keep=1)`: its pure-PyTorch Mamba-2 path
  (no mamba_ssm / causal_conv1d on a CPU), its default SDPA attention and experts
  implementation, no cache writes, last token's logits only: the least work it can be asked to do.

The two are timed alternately (ours, theirs, ours, ...) so that load from other processes on the
shared cores falls on both; the medians of `--repeats` give tokens/s and the ratio. Before timing,
the last-token logits of the two must agree to `--atol` (fp32); otherwise nothing is reported and
the script exits 1.

    python -m experiments.bench.model_prefill          # each family's CPU preset, 8192 tokens, 5 repeats
    python -m experiments.bench.model_prefill --preset tiny --tokens 2048 --repeats 3
    python -m experiments.bench.model_prefill --model granite-small-cpu --model path/to/checkpoint

Writes results/bench_model_prefill/bench.csv (one row per timed call, with device, versions and
config), summary.json (medians and ratio per model) and bench.png (drawn from the CSV).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from experiments.results_io import RESULTS, environment, read_csv, save_figure, write_csv, write_json
from model import PRESETS, SequenceChunk, from_preset, load_pretrained, save_pretrained

GOAL_RATIO = 1.5  # issues #5 and #10: torch-backend prefill >= 1.5x transformers at 8192 tokens
# The reduced CPU preset of each family, run when no --preset/--model is given.
DEFAULT_MODELS = ("small", "granite-small-cpu", "granite-dense-cpu", "nemotron-h-small-cpu")
OURS = "ours_torch_forward_batch"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="one model preset (same as --model PRESET)")
    p.add_argument("--model", action="append", default=None,
                   help="a preset name or a checkpoint folder; repeat for several (default: "
                        f"{', '.join(DEFAULT_MODELS)}, one per family)")
    p.add_argument("--tokens", type=int, default=8192, help="prompt length in tokens (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per implementation (default: %(default)s)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size of our cache (default: %(default)s)")
    p.add_argument("--threads", default=None,
                   help="torch thread counts to time, comma-separated, e.g. 2,1 (default: all cores, then 1: "
                        "one thread is the reading least disturbed by other processes on shared cores)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt seed (default: %(default)s)")
    p.add_argument("--atol", type=float, default=1e-4,
                   help="max abs last-token logit difference allowed before timing (default: %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_model_prefill",
                   help="output folder (default: %(default)s)")
    p.add_argument("--plot-only", action="store_true", help="redraw bench.png from an existing bench.csv")
    args = p.parse_args(argv)
    args.models = list(args.model or []) + ([args.preset] if args.preset else [])
    args.models = args.models or list(DEFAULT_MODELS)
    for m in args.models:
        if m not in PRESETS and not (Path(m) / "config.json").is_file():
            p.error(f"--model: {m!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a checkpoint folder")
    return args


def build(name: str, seed: int):
    """(ours, theirs, label): the same weights in our model and in transformers' AutoModelForCausalLM."""
    from transformers import AutoModelForCausalLM

    ours = from_preset(name, backend="torch", seed=seed) if name in PRESETS else load_pretrained(name)
    with tempfile.TemporaryDirectory() as tmp:
        path = name if name not in PRESETS else save_pretrained(ours, tmp)
        theirs, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} | ({"errors": info["error_msgs"]}
                                                                         if info.get("error_msgs") else {})
    if bad:
        raise RuntimeError(f"weight copy into transformers failed: {bad}")
    return ours, theirs.eval(), name if name in PRESETS else Path(name).name


def bench_model(args, name: str, threads_list: list[int]):
    """Timed rows and the summary of one model."""
    torch.set_num_threads(threads_list[0])
    ours, theirs, label = build(name, args.seed)
    T = args.tokens
    ids = torch.randint(0, ours.config.vocab_size, (T,), generator=torch.Generator().manual_seed(args.seed))
    blocks = -(-T // args.block_size)
    cache = ours.allocate_cache(blocks, args.block_size, 1)
    row = SequenceChunk(ids, 0, list(range(blocks)), 0)

    def run_ours():
        return ours.forward_batch([row], cache).logits[0]

    @torch.no_grad()
    def run_theirs():
        return theirs(ids[None], use_cache=False, logits_to_keep=1).logits[0, -1]

    # correctness gate (also the warm-up call of each)
    diff = (run_ours() - run_theirs()).abs().max().item()
    print(f"{label}: last-token logits: max abs diff {diff:.3g} (gate {args.atol})")
    if not diff <= args.atol:
        return None, None, diff

    theirs_impl = f"transformers_{ours.config.model_type}"
    config = dataclasses.asdict(ours.config)
    impls = ((OURS, run_ours), (theirs_impl, run_theirs))
    rows, summary_by_threads = [], {}
    for threads in threads_list:
        torch.set_num_threads(threads)
        env = environment("cpu")
        for _, fn in impls:  # warm-up at this thread count
            fn()
        for rep in range(args.repeats):
            for impl, fn in impls:
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                rows.append({"impl": impl, "threads": threads, "repeat": rep, "tokens": T, "seconds": round(wall, 4),
                             "cpu_seconds": round(cpu, 4), "tokens_per_s": round(T / wall, 1),
                             "max_abs_logit_diff": diff, "preset": label, **env, "config": str(config)})
                print(f"{label} {threads} thr {impl:>30}  repeat {rep}: {wall:7.3f} s  ({T / wall:8.1f} tok/s, "
                      f"cpu {cpu:.2f} s)", flush=True)
        summary_by_threads[threads] = _summarize([r for r in rows if r["threads"] == threads], theirs_impl)
        s = summary_by_threads[threads]
        print(f"{label} {threads} thr median: ours {s['median_seconds'][OURS]:.3f} s, transformers "
              f"{s['median_seconds'][theirs_impl]:.3f} s -> {s['speedup_ours_over_transformers']:.2f}x (goal "
              f"{GOAL_RATIO}x); by min {s['speedup_by_min']:.2f}x, by cpu time {s['speedup_by_cpu_seconds']:.2f}x")
    summary = {"model_type": ours.config.model_type, "transformers_impl": theirs_impl,
               "by_threads": summary_by_threads, "max_abs_logit_diff": diff, "config": config}
    return rows, summary, diff


def _summarize(rows: list[dict], theirs: str) -> dict:
    med = {impl: statistics.median(r["seconds"] for r in rows if r["impl"] == impl) for impl in (OURS, theirs)}
    best = {impl: min(r["seconds"] for r in rows if r["impl"] == impl) for impl in (OURS, theirs)}
    cpu = {impl: statistics.median(r["cpu_seconds"] for r in rows if r["impl"] == impl) for impl in (OURS, theirs)}
    ratio = med[theirs] / med[OURS]
    T = rows[0]["tokens"]
    return {
        "median_seconds": med, "median_tokens_per_s": {k: T / v for k, v in med.items()},
        "speedup_ours_over_transformers": ratio, "goal_met": ratio >= GOAL_RATIO,
        # Readings less moved by other processes on shared cores: the fastest repeat, and the
        # CPU time this process got (at 1 thread it is the compute; at 2 threads it also counts
        # OpenMP spin-waits for a preempted thread).
        "min_seconds": best, "speedup_by_min": best[theirs] / best[OURS],
        "median_cpu_seconds": cpu, "speedup_by_cpu_seconds": cpu[theirs] / cpu[OURS],
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    csv_path, png_path = args.out / "bench.csv", args.out / "bench.png"
    if args.plot_only:
        plot(csv_path, png_path)
        return 0
    threads_list = ([int(t) for t in args.threads.split(",")] if args.threads
                    else sorted({torch.get_num_threads(), 1}, reverse=True))
    rows, by_model = [], {}
    for name in args.models:
        model_rows, summary, diff = bench_model(args, name, threads_list)
        if model_rows is None:
            print(f"correctness gate failed for {name} ({diff:.3g} > {args.atol}): not reporting timings",
                  file=sys.stderr)
            return 1
        rows += model_rows
        by_model[model_rows[0]["preset"]] = summary
    summary = {
        "models": list(by_model), "tokens": args.tokens, "repeats": args.repeats, "block_size": args.block_size,
        "goal": GOAL_RATIO, "by_model": by_model, "environment": environment("cpu"),
    }
    write_csv(csv_path, rows)
    write_json(args.out / "summary.json", summary)
    plot(csv_path, png_path)
    print(f"wrote {csv_path}, {args.out / 'summary.json'}, {png_path}")
    return 0


def plot(csv_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_csv(csv_path)
    models = list(dict.fromkeys(r["preset"] for r in rows))
    threads = list(dict.fromkeys(r["threads"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models) + 1.0, 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["preset"] == model]
        impls = list(dict.fromkeys(r["impl"] for r in mine))  # ours first, then transformers
        width = 0.8 / len(impls)
        ratios = []
        for k, impl in enumerate(impls):
            for j, th in enumerate(threads):
                tps = [float(r["tokens_per_s"]) for r in mine if r["impl"] == impl and r["threads"] == th]
                x = j + (k - (len(impls) - 1) / 2) * width
                ax.bar(x, statistics.median(tps), width, color=["tab:blue", "tab:gray"][k % 2],
                       label=impl.replace("_", " ") if j == 0 else None)
                ax.scatter([x] * len(tps), tps, color="black", s=8, zorder=3)
        for th in threads:
            med = {i: statistics.median(float(r["seconds"]) for r in mine if r["impl"] == i and r["threads"] == th)
                   for i in impls}
            ratios.append(f"{th} thr: {med[impls[1]] / med[impls[0]]:.2f}x")
        ax.set_xticks(range(len(threads)), [f"{t} thread(s)" for t in threads])
        ax.set_ylabel("prefill tokens / s (bars: median; dots: repeats)")
        ax.legend(fontsize=7)
        r0 = mine[0]
        ax.set_title(f"{model}, {r0['tokens']} tokens, fp32, {r0['device_name']}\n"
                     f"ours / transformers: {', '.join(ratios)} (goal {GOAL_RATIO}x)", fontsize=8)
    save_figure(fig, png_path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
