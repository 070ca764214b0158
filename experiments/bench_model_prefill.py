"""Prefill throughput on the CPU: our torch backend against transformers' `BambaForCausalLM`, same run.

Both sides run the same config (a preset, default "small") with the same weights (ours, copied
into transformers' model by name), fp32, on one sequence of `--tokens` tokens from position 0:

* ours: one cold `forward_batch` row (the engine's prefill: paged KV write, paged attention,
  varlen conv and SSD scan, SSM/conv state into the pools, last-token logits);
* transformers: `model(ids, use_cache=False, logits_to_keep=1)`: its pure-PyTorch Mamba-2 path
  (no mamba_ssm / causal_conv1d on a CPU) and its default SDPA attention, no cache writes, last
  token's logits only: the least work it can be asked to do.

The two are timed alternately (ours, theirs, ours, ...) so that load from other processes on the
shared cores falls on both; the medians of `--repeats` give tokens/s and the ratio. Before timing,
the last-token logits of the two must agree to `--atol` (fp32); otherwise nothing is reported and
the script exits 1.

    python -m experiments.bench_model_prefill                      # small, 8192 tokens, 5 repeats
    python -m experiments.bench_model_prefill --preset tiny --tokens 2048 --repeats 3

Writes results/bench_model_prefill/bench.csv (one row per timed call, with device, versions and
config), summary.json (medians, ratio) and bench.png (drawn from the CSV).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

from experiments.results_io import RESULTS, environment, read_csv, save_figure, write_csv, write_json
from model import PRESETS, SequenceChunk, from_preset
from model.loading import hf_name

GOAL_RATIO = 1.5  # issue #5: torch-backend prefill >= 1.5x transformers' Bamba at 8192 tokens


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model preset (default: %(default)s)")
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
    return p.parse_args(argv)


def build(args):
    from transformers import BambaConfig, BambaForCausalLM

    ours = from_preset(args.preset, backend="torch", seed=args.seed)
    theirs = BambaForCausalLM(BambaConfig(**ours.config.to_hf_dict())).eval()
    result = theirs.load_state_dict({hf_name(k): v for k, v in ours.state_dict().items()}, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"weight copy into transformers failed: missing {result.missing_keys}, "
                           f"unexpected {result.unexpected_keys}")
    return ours, theirs


def main(argv=None) -> int:
    args = parse_args(argv)
    csv_path, png_path = args.out / "bench.csv", args.out / "bench.png"
    if args.plot_only:
        plot(csv_path, png_path)
        return 0
    ours, theirs = build(args)
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
    print(f"last-token logits: max abs diff {diff:.3g} (gate {args.atol})")
    if not diff <= args.atol:
        print("correctness gate failed: not reporting timings", file=sys.stderr)
        return 1

    config = dataclasses.asdict(ours.config)
    threads_list = ([int(t) for t in args.threads.split(",")] if args.threads
                    else sorted({torch.get_num_threads(), 1}, reverse=True))
    rows, summary_by_threads = [], {}
    impls = (("ours_torch_forward_batch", run_ours), ("transformers_bamba", run_theirs))
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
                             "max_abs_logit_diff": diff, "preset": args.preset, **env, "config": str(config)})
                print(f"{threads} thr {impl:>26}  repeat {rep}: {wall:7.3f} s  ({T / wall:8.1f} tok/s, "
                      f"cpu {cpu:.2f} s)", flush=True)
        mine = [r for r in rows if r["threads"] == threads]
        med = {impl: statistics.median(r["seconds"] for r in mine if r["impl"] == impl) for impl, _ in impls}
        ratio = med["transformers_bamba"] / med["ours_torch_forward_batch"]
        best = {impl: min(r["seconds"] for r in mine if r["impl"] == impl) for impl, _ in impls}
        cpu = {impl: statistics.median(r["cpu_seconds"] for r in mine if r["impl"] == impl) for impl, _ in impls}
        summary_by_threads[threads] = {
            "median_seconds": med, "median_tokens_per_s": {k: T / v for k, v in med.items()},
            "speedup_ours_over_transformers": ratio, "goal_met": ratio >= GOAL_RATIO,
            # Readings less moved by other processes on shared cores: the fastest repeat, and the
            # CPU time this process got (at 1 thread it is the compute; at 2 threads it also counts
            # OpenMP spin-waits for a preempted thread).
            "min_seconds": best, "speedup_by_min": best["transformers_bamba"] / best["ours_torch_forward_batch"],
            "median_cpu_seconds": cpu,
            "speedup_by_cpu_seconds": cpu["transformers_bamba"] / cpu["ours_torch_forward_batch"],
        }
        print(f"{threads} thr median: ours {med['ours_torch_forward_batch']:.3f} s, transformers "
              f"{med['transformers_bamba']:.3f} s -> {ratio:.2f}x (goal {GOAL_RATIO}x); by min "
              f"{summary_by_threads[threads]['speedup_by_min']:.2f}x, by cpu time "
              f"{summary_by_threads[threads]['speedup_by_cpu_seconds']:.2f}x")
    summary = {
        "preset": args.preset, "tokens": T, "repeats": args.repeats, "block_size": args.block_size,
        "goal": GOAL_RATIO, "by_threads": summary_by_threads, "max_abs_logit_diff": diff,
        "environment": environment("cpu"), "config": config,
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
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    threads = list(dict.fromkeys(r["threads"] for r in rows))
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.8 / len(impls)
    ratios = []
    for k, impl in enumerate(impls):
        for j, th in enumerate(threads):
            tps = [float(r["tokens_per_s"]) for r in rows if r["impl"] == impl and r["threads"] == th]
            x = j + (k - (len(impls) - 1) / 2) * width
            ax.bar(x, statistics.median(tps), width, color=["tab:blue", "tab:gray"][k % 2],
                   label=impl.replace("_", " ") if j == 0 else None)
            ax.scatter([x] * len(tps), tps, color="black", s=8, zorder=3)
    for th in threads:
        med = {i: statistics.median(float(r["seconds"]) for r in rows if r["impl"] == i and r["threads"] == th)
               for i in impls}
        ratios.append(f"{th} thr: {med[impls[1]] / med[impls[0]]:.2f}x")
    ax.set_xticks(range(len(threads)), [f"{t} thread(s)" for t in threads])
    ax.set_ylabel("prefill tokens / s (bars: median; dots: repeats)")
    ax.legend(fontsize=8)
    r0 = rows[0]
    ax.set_title(f"{r0['preset']} preset, {r0['tokens']} tokens, fp32, {r0['device_name']}\n"
                 f"ours / transformers: {', '.join(ratios)} (goal {GOAL_RATIO}x)", fontsize=9)
    save_figure(fig, png_path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
