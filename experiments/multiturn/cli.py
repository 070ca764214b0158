"""The multi-turn study's command line: `python -m experiments.multiturn --help`.

Writes into a new run folder, runs/multiturn/<UTC timestamp>/ (`--out FOLDER` elsewhere,
`--publish` the committed results/multiturn/), then prints the headline (replayed tokens and
median TTFT of legacy and `--policy`) beside the committed record's. `--merge` and `--replot`
read `--out` (default: the newest run folder).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from experiments.common.flags import (add_model_flags, add_policy_flag, add_prefill_budget_flag, float_in_range,
                                      int_in_range, name_list, require_block_of_budget, shard_spec)
from experiments.common import sweep_parts
from experiments.common.inputs import InputError, read_csv, read_json
from experiments.common.results_io import log
from experiments.common.runs import build_model_or_exit, model_config, set_threads, warm_up
from experiments.common.study import Context, Ran, Study
from experiments.multiturn.report import OUTPUTS, REQUESTS, finalize, plot
from experiments.multiturn.run import NAME, RunConfig, Study as MultiturnSetup, configs_for, run_configs
from experiments.workloads.synthetic import QUICK, SyntheticSessions, WorkloadConfig
from model.cost import ModelCost
from model.engine import ModelShape, PlaceholderRunner
from planner.evictions.registry import EVICTION_POLICIES

WORKLOAD_TYPES = {"user_median": float_in_range(0, lo_open=True), "user_sigma": float_in_range(0),
                  "branch_fraction": float_in_range(0, 1), "regenerate_fraction": float_in_range(0, 1)}


def workload_config(ap: argparse.ArgumentParser, args) -> WorkloadConfig:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(WorkloadConfig)
                 if f.name != "seed" and getattr(args, f.name) is not None}
    fields = dataclasses.asdict(WorkloadConfig()) | (QUICK if args.quick else {}) | overrides | {"seed": args.seed}
    for what in ("system", "turns", "user", "reply"):  # each flag alone is checked when parsed; here the pairs
        lo, hi = fields[f"{what}_min"], fields[f"{what}_max"]
        if lo > hi:
            ap.error(f"argument --{what}-min: must be <= --{what}-max ({hi}), got {lo}")
    return WorkloadConfig(**fields)


def chosen_configs(ap: argparse.ArgumentParser, args) -> list[RunConfig]:
    every = configs_for(args.policy, args.eviction)
    if args.configs is None:
        return list(every)
    wanted = {c.strip() for c in args.configs.split(",") if c.strip()} | {"off"}
    unknown = wanted - {c.name for c in every}
    if unknown:
        ap.error(f"argument --configs: unknown {sorted(unknown)}; choose from {[c.name for c in every]}")
    return [c for c in every if c.name in wanted]


def build_study(ap: argparse.ArgumentParser, args, wcfg: WorkloadConfig) -> tuple[MultiturnSetup, SyntheticSessions, int]:
    """The model (or its FLOP model alone), the workload's requests, the shared settings; and the
    bytes of one snapshot."""
    model = shape = None
    if args.runner == "model":
        model = build_model_or_exit(ap, args.out, args.model, device=args.device, seed=args.seed)
        warm_up(model)
        vocab, flops = model.config.vocab_size, ModelCost(model.config).snapshot_flops
        snapshot_nbytes = model.allocate_cache(1, args.block_size, 1).state_bytes_per_slot
    else:
        # the model's FLOP model and shape without its weights (float32, as the model runs here): the
        # planner figures (not the TTFTs) match the model run's, on the same blocks
        config = model_config(args.model)
        vocab, flops, shape = 64, ModelCost(config).snapshot_flops, ModelShape.of(config, dtype_bytes=4)
        snapshot_nbytes = PlaceholderRunner(1, 1, args.block_size).snapshot_nbytes
    source = SyntheticSessions(wcfg, vocab)
    study = MultiturnSetup(list(source.requests()), args.block_size, args.prefill_budget, args.interval, args.concurrency,
                  args.snapshot_budget * snapshot_nbytes, flops, args.flop_alpha, model, vocab, shape)
    d = source.describe()
    log(f"workload: {d['n_requests']} requests, {len(source.sessions)} sessions, system prompt "
        f"{d['system_prompt_tokens']} tokens, {d['n_branch_sessions']} branches, {d['n_regenerations']} "
        f"regenerations; KV pool {study.kv_pool_blocks} blocks")
    return study, source, snapshot_nbytes


# what the figure reads (checked before `--replot` draws)
SUMMARY_COLUMNS = ("config", "policy", "eviction", "token_hit_rate", "ssm_restore_depth", "replayed_tokens",
                   "ttft_median_s", "ttft_p90_s", "snapshot_bytes_held_peak", "snapshot_bytes_saved",
                   "snapshot_bytes_evicted")
REQUEST_COLUMNS = ("config", "ttft_s")
META_KEYS = ("workload", "config", "environment", "n_requests", "system_prompt_tokens", "n_branch_sessions",
             "n_regenerations", "snapshot_budget_bytes")


def check_replot_files(out: Path) -> None:
    """The CSVs and JSON `plot` reads; an InputError naming the first that is wrong."""
    read_csv(out / "summary.csv", SUMMARY_COLUMNS, what="the multi-turn summary CSV")
    read_csv(out / REQUESTS, REQUEST_COLUMNS, what="the multi-turn per-request CSV")
    read_json(out / "multiturn.json", META_KEYS, what="the multi-turn JSON")


def replot(out: Path) -> list[Path]:
    check_replot_files(out)
    try:
        return [plot(out)]
    except (KeyError, ValueError, TypeError, IndexError) as e:  # well-formed files whose values do not plot
        raise InputError(f"{out / 'summary.csv'}: cannot be plotted ({type(e).__name__}: {e})") from None


def written_files(out: Path, shard: tuple[int, int] | None) -> list[Path]:
    files = [out / f for f in OUTPUTS if (out / f).is_file()]
    if shard is not None:
        files.insert(0, sweep_parts.part_path(out, NAME, shard))
    return files


class Multiturn(Study):
    record = NAME
    prog = "python -m experiments.multiturn"
    description = "Multi-turn chat sessions through one engine, per policy and eviction."
    merge = True

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        add_model_flags(ap, dtypes=(), backend=False)
        ap.add_argument("--runner", default="model", choices=("model", "placeholder"),
                        help="the real model, or the model-free placeholder runner (planner figures only, no TTFT "
                             "meaning)")
        ap.add_argument("--quick", action="store_true",
                        help="tiny workload (4 short sessions) for tests; the workload flags below override it")
        for f in dataclasses.fields(WorkloadConfig):
            if f.name == "seed":  # the study's --seed
                continue
            ap.add_argument("--" + f.name.replace("_", "-"), type=WORKLOAD_TYPES.get(f.name, int_in_range(1)),
                            default=None, help=f"workload: {f.name.replace('_', ' ')} (default {f.default}; "
                                               f"--quick: {QUICK.get(f.name, f.default)})")
        ap.add_argument("--block-size", type=int_in_range(1), default=16, help="KV block size")
        add_prefill_budget_flag(ap, 512)
        ap.add_argument("--interval", type=int_in_range(0), default=32,
                        help="snapshot interval in blocks (0 = off; 32 blocks = one 512-token budget)")
        ap.add_argument("--concurrency", type=int_in_range(1), default=2, help="requests in flight (= max_batch_size)")
        ap.add_argument("--snapshot-budget", type=int_in_range(1), default=6,
                        help="snapshot byte budget of the bounded configurations, in snapshots of this model")
        add_policy_flag(ap, "compared with legacy (and the one with decode snapshots)")
        ap.add_argument("--eviction", type=name_list(EVICTION_POLICIES), default=["lru", "flop_aware"],
                        help=f"comma-separated snapshot evictions of the bounded configurations "
                             f"({', '.join(EVICTION_POLICIES)}; the first also bounds the decode-snapshot one; "
                             "default: lru,flop_aware)")
        ap.add_argument("--flop-alpha", type=float_in_range(0), default=1.0,
                        help="FLOP-aware eviction: weight of FLOPs/byte vs recency")
        ap.add_argument("--configs", default=None,
                        help="comma-separated configurations to run (default all; 'off' is the reference and always "
                             "runs)")
        ap.add_argument("--shard", type=shard_spec, default=(0, 1),
                        help="run the configurations whose index %% n == i (i/n); combine the parts with --merge "
                             "(default: 0/1)")

    def check(self, ctx: Context) -> None:
        if ctx.reading:
            return
        ap, args = ctx.ap, ctx.args
        require_block_of_budget(ap, args.prefill_budget, args.block_size, args.concurrency,
                                budget_flag="--prefill-budget")
        workload_config(ap, args)
        chosen_configs(ap, args)

    def run(self, ctx: Context) -> Ran:
        ap, args, out = ctx.ap, ctx.args, ctx.out
        if args.merge:
            status = finalize(out)
            return Ran(written_files(out, None), status, finished=status == 0)
        wcfg, configs = workload_config(ap, args), chosen_configs(ap, args)
        set_threads(args.threads)
        study, source, snapshot_nbytes = build_study(ap, args, wcfg)
        config = ctx.config(("out", "shard", "configs", "quick")) | {
            "preset": args.model, "configs": [c.name for c in configs],
            "snapshot_budget_bytes": study.snapshot_budget_bytes,
            "snapshot_nbytes": snapshot_nbytes, "kv_pool_blocks": study.kv_pool_blocks,
            "workload_meta": source.describe()}
        part = run_configs(study, configs, config, out, args.shard, args.device)
        if args.shard[1] > 1:
            log(f"merge when every shard is done: python -m experiments.multiturn --merge --out {out}")
            return Ran(written_files(out, args.shard)[:1], 1 if part["failed"] else 0, finished=False)
        status = finalize(out)
        return Ran(written_files(out, args.shard), status, finished=status == 0)

    def figures(self, ctx: Context) -> list[Path]:
        return replot(ctx.out)

    def headline(self, ctx: Context) -> list[tuple]:
        """Replayed tokens and median TTFT of legacy and --policy beside the committed results/multiturn/."""
        path = self.committed("summary.csv")
        if path is None or not (ctx.out / "summary.csv").is_file():
            return []
        committed = {r["config"]: r for r in read_csv(path, ("config", "replayed_tokens", "ttft_median_s"))}
        ours = {r["config"]: r for r in read_csv(ctx.out / "summary.csv", ("config", "replayed_tokens", "ttft_median_s"))}
        num = lambda r, k, f: f(r[k]) if r and r.get(k) not in (None, "") else None  # noqa: E731
        rows = []
        for name in dict.fromkeys(("legacy", ctx.args.policy)):
            if name in ours:
                rows += [(f"{name} replayed tokens", num(ours[name], "replayed_tokens", int),
                          num(committed.get(name), "replayed_tokens", int)),
                         (f"{name} TTFT median (s)", num(ours[name], "ttft_median_s", float),
                          num(committed.get(name), "ttft_median_s", float))]
        return rows


STUDY = Multiturn()
parser = STUDY.parser
main = STUDY.main
