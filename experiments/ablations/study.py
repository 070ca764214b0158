"""Ablations of the chunk plan on the hybrid model: what each knob does to the warm restore.

    python -m experiments.ablations prompt-len   # legacy vs aligned over prompt lengths 300 .. 32772
    python -m experiments.ablations block-size   # KV block size 16 .. 256 (16388-token prompt)
    python -m experiments.ablations budget       # prefill budget 512 .. 8192 (16388-token prompt)
    python -m experiments.ablations interval     # snapshot interval 0 / 64 / 512 blocks: bytes held vs reuse
    python -m experiments.ablations capture      # last-chunk capture in_pass / two_pass / none
    python -m experiments.ablations all          # every sweep above with its defaults
    python -m experiments.ablations budget --prefill-budget 1024,4096 --prompt-len 8196   # the swept knob: a list

The swept knob's flag takes a comma list (`--prompt-len` in prompt-len and capture, `--block-size`,
`--prefill-budget`, `--interval`, `--capture-mode`); the other knobs take one value.

Every point builds a fresh engine (`max_batch_size` 1, the seed's dense serve) over the real
model, runs a cold request, then a byte-identical warm request `--repeats` times (median TTFT),
and records chunk ends, snapshot positions and bytes, the warm KV match, restore point and
replayed tokens, cold and warm TTFT, and the warm-vs-cold max abs logit difference. A point
whose logits differ by more than 1e-4 (fp32) or whose first token differs is not reported: it
is listed under `failed_points` in the sweep's JSON and the command exits 1.

`--policy` (default aligned) is the chunk policy under study: the prompt-len, block-size and
budget sweeps compare it with legacy; the interval and capture sweeps run it alone. `--model`
is a preset name or a checkpoint folder.

Point-specific measurements:
* prompt-len: prompts shorter than the budget are one last chunk; its tail snapshot exists only
  because that chunk captures the split point in-pass, so the policy is also run with
  `capture_mode=none` there (the legacy policy cuts a last chunk the same way, so at those
  lengths legacy and aligned coincide).
* interval: besides the identical warm request, requests that share only the first k tokens of
  the cold prompt (plus a fresh `--suffix-len`-token suffix, one per repeat) measure how deep a
  partial match restores; their logits are checked against a prefix-caching-off engine.
* capture: the cold request is what the capture costs, so each repeat is a fresh engine (cold +
  warm) and both TTFTs are medians over `--repeats` engines.

The block size, budget and interval sweeps use a 16388-token prompt (16384 + 4, the incident's
shape at half length); `--prompt-len 32772` runs them at the incident's full length.

Output per sweep: `<out>/<sweep>.csv` (one row per measured request kind, with the settings its
engine ran under, `effective_settings`), `<out>/<sweep>.json` (config, environment per shard,
failures, `effective_settings` per policy), `<out>/<sweep>.png` plotted from the CSV
(`experiments.ablations.plots`). `<out>` is a new run folder, runs/ablations/<sweep>/<UTC timestamp>/,
unless `--out FOLDER` names one; `--publish` writes the committed record, results/ablations/<sweep>/.
`all` writes each sweep into `<out>/<sweep>/` (default runs/ablations/<timestamp>/<sweep>/;
`--publish`: results/ablations/<sweep>/). With `--shard i/n` a run measures every n-th point and
writes `<out>/parts/<sweep>.part<i>of<n>.json.gz`; `--merge` combines the parts and plots (a 1/1 run
merges by itself); `--replot` redraws the figures from the CSV and JSON. After a merge the
last point's replayed tokens and warm TTFT are printed beside the committed record's.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path
from typing import Callable

from experiments.ablations import plots as ablation_plots
from experiments.common import sweep_parts
from experiments.common.flags import (add_model_flags, add_policy_flag, int_in_range, int_list, name_list,
                                      require_block_of_budget, shard_spec)
from experiments.common.inputs import InputError, read_csv, read_json
from experiments.common.outputs import record_folder
from experiments.common.progress import Progress
from experiments.common.results_io import log
from experiments.common.runs import (FP32_LOGIT_TOL, build_model, cold_record, dense_serve, max_abs_diff,
                              random_prompt, serve, set_threads, warm_record, warm_up)
from experiments.common.study import Context, Ran, Study, run_study
from experiments.common.sweep_parts import PointFailed
from model.engine import CAPTURE_MODES, Engine
from model.hybrid import HybridLM


# ------------------------------------------------------------------------------------------ points
def point(sweep: str, label: str, policy: str, prompt_len: int, block_size: int, budget: int, interval: int,
          capture_mode: str = "in_pass", **extra) -> dict:
    return dict(sweep=sweep, label=label, policy=policy, capture_mode=capture_mode, prompt_len=prompt_len,
                block_size=block_size, budget=budget, interval_blocks=interval, **extra)


def compared_policies(a) -> tuple[str, ...]:
    """legacy and the policy under study (once, if that is legacy)."""
    return tuple(dict.fromkeys(("legacy", a.policy)))


def points_prompt_len(a) -> list[dict]:
    out = []
    for n in a.lengths:
        for policy in compared_policies(a):
            out.append(point("prompt_len", policy, policy, n, a.block_size, a.budget, a.interval))
        if n < a.budget:  # one last chunk: only its in-pass capture leaves a tail snapshot
            out.append(point("prompt_len", f"{a.policy}, no capture", a.policy, n, a.block_size, a.budget, a.interval,
                             capture_mode="none"))
    return out


def points_block_size(a) -> list[dict]:
    return [point("block_size", policy, policy, a.prompt_len, bs, a.budget, a.interval)
            for bs in a.block_sizes for policy in compared_policies(a)]


def points_budget(a) -> list[dict]:
    return [point("budget", policy, policy, a.prompt_len, a.block_size, b, a.interval)
            for b in a.budgets for policy in compared_policies(a)]


def points_interval(a) -> list[dict]:
    return [point("interval", f"interval {i}", a.policy, a.prompt_len, a.block_size, a.budget, i,
                  shared_prefixes=[k for k in a.shared_prefixes if k < a.prompt_len], suffix_len=a.suffix_len)
            for i in a.intervals]


def points_capture(a) -> list[dict]:
    return [point("capture", mode, a.policy, n, a.block_size, a.budget, a.interval, capture_mode=mode)
            for n in a.lengths for mode in a.modes]


# ------------------------------------------------------------------------------------------ measuring
class ReferenceLogits:
    """Last-prompt-token logits of prompts run with prefix caching off (cached per prompt)."""

    def __init__(self, model: HybridLM):
        self.model, self.cache = model, {}

    def __call__(self, prompt: list[int], block_size: int, budget: int):
        key = (tuple(prompt), block_size, budget)
        if key not in self.cache:
            settings = dense_serve(block_size, budget, [len(prompt)], enable_prefix_caching=False)
            engine = Engine.for_model(self.model, keep_prompt_logits=True, **settings)
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


def consistent(records: list[dict], keys: tuple[str, ...], what: str) -> dict:
    """The records' common value of each key (they must agree across repeats)."""
    return {k: one_value([r[k] for r in records], f"{what} {k}") for k in keys}


def point_engine(model: HybridLM, p: dict, prompt_lens: list[int]) -> Engine:
    """A fresh engine for one point: the seed's dense serve at the point's block, budget, policy,
    interval and capture mode (the policy's engine defaults applied by `Engine.for_model`), its KV
    pool holding every listed prompt."""
    settings = dense_serve(p["block_size"], p["budget"], prompt_lens, p["policy"], p["interval_blocks"])
    return Engine.for_model(model, capture_mode=p["capture_mode"], keep_prompt_logits=True, **settings)


def serve_identical(model: HybridLM, p: dict, args, prompt: list[int], prompt_lens: list[int]
                    ) -> tuple[dict, Engine, tuple, int]:
    """Cold request(s) and identical warm repeats: the point's row 0 fields, the last engine,
    (snapshots, bytes) held after the cold request, and the number of cold requests."""
    cold_repeats, warm_repeats = (args.repeats, 1) if p["sweep"] == "capture" else (1, args.repeats)
    colds, warms, held, engine = [], [], [], None
    for _ in range(cold_repeats):
        engine = point_engine(model, p, prompt_lens)
        cold = serve(engine, prompt, "cold")
        colds.append(cold)
        held.append((len(engine.snapshots), engine.snapshots.bytes_held))
        for w in range(warm_repeats):
            warm = serve(engine, prompt, f"warm{w}")
            diff = max_abs_diff(engine.prompt_logits[warm.request_id], engine.prompt_logits["cold"])
            check(diff, warm.output_token_ids == cold.output_token_ids, f"warm {w} vs cold")
            warms.append((warm, diff))
        last = warms[-1][0].metrics
        log(f"  {p['label']}: cold {cold.metrics.ttft_s:.2f} s, warm restore {last.restore_at} "
            f"replay {last.replayed_tokens} in {last.ttft_s * 1e3:.1f} ms")
    n_snap, bytes_held = one_value(held, "snapshots after the cold request")
    warm_fields = consistent([warm_record(w) for w, _ in warms], ("warm_kv_match", "warm_restore_at",
                                                                  "warm_replayed_tokens"), "warm")
    row = {"row": 0, "request": "identical", "shared_prefix": p["prompt_len"]} | consistent(
        [cold_record(c) for c in colds], ("chunk_ends", "snapshot_positions"), "cold") | {
        "n_snapshots": n_snap, "snapshot_bytes_each": engine.runner.snapshot_nbytes, "snapshot_bytes_held": bytes_held,
        "cold_prefill_passes": colds[0].metrics.prefill_passes,
        "cold_ttft_s": statistics.median(c.metrics.ttft_s for c in colds),
        "cold_ttft_s_all": [c.metrics.ttft_s for c in colds],
    } | warm_fields | {
        "warm_chunk_ends": warms[0][0].metrics.chunk_ends,
        "warm_ttft_s": statistics.median(w.metrics.ttft_s for w, _ in warms),
        "warm_ttft_s_all": [w.metrics.ttft_s for w, _ in warms],
        "warm_vs_cold_max_abs_logit_diff": max(d for _, d in warms),
    }
    return row, engine, (n_snap, bytes_held), cold_repeats


def serve_shared(engine, shared: list[tuple], p: dict, reference: ReferenceLogits, held: tuple) -> list[dict]:
    """The interval sweep's requests that share only the first k cold tokens: one row per k."""
    by_k: dict[int, list] = {}
    for k, r, sp in shared:
        req = serve(engine, sp, f"shared{k}-{r}")
        ref_logits, ref_token = reference(sp, p["block_size"], p["budget"])
        diff = max_abs_diff(engine.prompt_logits[req.request_id], ref_logits)
        check(diff, req.output_token_ids[0] == ref_token, f"shared prefix {k} repeat {r} vs caching off")
        by_k.setdefault(k, []).append((req, diff))
    rows = []
    for j, (k, reqs) in enumerate(sorted(by_k.items()), start=1):
        fields = consistent([warm_record(q) for q, _ in reqs], ("warm_kv_match", "warm_restore_at",
                                                                "warm_replayed_tokens"), f"shared {k}")
        rows.append({"row": j, "request": "shared_prefix", "shared_prefix": k, "request_len": k + p["suffix_len"],
                     "n_snapshots": held[0], "snapshot_bytes_each": engine.runner.snapshot_nbytes,
                     "snapshot_bytes_held": held[1]} | fields | {
            "warm_ttft_s": statistics.median(q.metrics.ttft_s for q, _ in reqs),
            "warm_ttft_s_all": [q.metrics.ttft_s for q, _ in reqs],
            "warm_vs_cold_max_abs_logit_diff": max(d for _, d in reqs),
        })
        log(f"  {p['label']}: shared prefix {k}: restore {rows[-1]['warm_restore_at']} replay "
            f"{rows[-1]['warm_replayed_tokens']} in {rows[-1]['warm_ttft_s'] * 1e3:.1f} ms")
    return rows


def measure(model: HybridLM, p: dict, args, reference: ReferenceLogits) -> list[dict]:
    """Every row of one point (see the module docstring); raises PointFailed on a wrong result."""
    vocab, total = model.config.vocab_size, p["prompt_len"]
    prompt = random_prompt(total, vocab, seed=args.seed * 1_000_003 + total)
    shared = [(k, r, prompt[:k] + random_prompt(p["suffix_len"], vocab, seed=args.seed * 7919 + k * 31 + r))
              for k in p.get("shared_prefixes", []) for r in range(args.repeats)]
    prompt_lens = [total, total] + [len(s[2]) for s in shared]
    row, engine, held, cold_repeats = serve_identical(model, p, args, prompt, prompt_lens)
    base = {k: v for k, v in p.items() if k != "shared_prefixes"} | {
        "preset": args.model, "dtype": args.dtype, "device": args.device, "seed": args.seed,
        "repeats": args.repeats, "cold_repeats": cold_repeats, "effective_settings": engine.effective_settings}
    return [base | r for r in [row] + serve_shared(engine, shared, p, reference, held)]


# ------------------------------------------------------------------------------------------ sweeps
@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    points: Callable
    config_keys: tuple[str, ...]  # the flags that define the sweep (recorded and fingerprinted)


SWEEPS = {
    "prompt-len": Sweep("prompt_len", points_prompt_len, ("lengths", "block_size", "budget", "interval")),
    "block-size": Sweep("block_size", points_block_size, ("block_sizes", "prompt_len", "budget", "interval")),
    "budget": Sweep("budget", points_budget, ("budgets", "prompt_len", "block_size", "interval")),
    "interval": Sweep("interval", points_interval,
                      ("intervals", "prompt_len", "block_size", "budget", "shared_prefixes", "suffix_len")),
    "capture": Sweep("capture", points_capture, ("lengths", "modes", "block_size", "budget", "interval")),
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


def measure_shard(sweep: Sweep, args, model: HybridLM, points: list[dict], config: dict, spec, out: Path) -> list:
    """This shard's points through `sweep_parts.run_shard`; returns the failures."""
    reference = ReferenceLogits(model)
    n_mine = len(range(spec[0], len(points), spec[1]))
    progress = Progress(n_mine, "points", every_s=0.0)

    def one(idx: int, p: dict) -> list[dict]:
        log(f"{sweep.name} point {idx} ({progress.done + 1}/{n_mine} of shard {spec[0]}/{spec[1]}): {p['label']}, "
            f"prompt {p['prompt_len']}, block {p['block_size']}, budget {p['budget']}, interval "
            f"{p['interval_blocks']}, capture {p['capture_mode']}")
        t0 = time.perf_counter()
        try:
            rows = measure(model, p, args, reference)
        finally:
            progress.advance(note=f"{sweep.name}")
        for r in rows:
            r["point"], r["point_wall_s"] = idx, time.perf_counter() - t0
        return rows

    part = sweep_parts.run_shard(out, sweep.name, points, config, spec, one, lambda p: {"label": p["label"]},
                                 args.device)
    return part["failed"]


# what the figures read from a sweep's CSV (beside each sweep's swept column) and JSON
PLOT_COLUMNS = ("label", "request", "policy", "capture_mode", "prompt_len", "block_size", "budget", "interval_blocks",
                "warm_replayed_tokens", "warm_restore_at", "warm_ttft_s", "cold_ttft_s")
PLOT_COLUMNS_BY_SWEEP = {"interval": ("n_snapshots", "snapshot_bytes_held", "shared_prefix"),
                         "capture": ("cold_prefill_passes",)}


def check_sweep_files(sweep: Sweep, out: Path) -> None:
    """The merged CSV and JSON a figure is drawn from; an InputError naming the file that is wrong."""
    read_csv(out / f"{sweep.name}.csv", PLOT_COLUMNS + PLOT_COLUMNS_BY_SWEEP.get(sweep.name, ()),
             what=f"the {sweep.name} sweep's merged CSV")
    meta = read_json(out / f"{sweep.name}.json", ("config", "environments"), what=f"the {sweep.name} sweep's JSON")
    cfg, envs = meta["config"], meta["environments"]
    missing = [k for k in sweep.config_keys + ("preset", "dtype", "repeats") if not isinstance(cfg, dict) or k not in cfg]
    if not missing and not (isinstance(envs, list) and envs and isinstance(envs[0], dict) and "device_name" in envs[0]):
        missing = ["environments[0].device_name"]
    if missing:
        raise InputError(f"{out / (sweep.name + '.json')}: not the {sweep.name} sweep's JSON "
                         f"(no {', '.join(repr(k) for k in missing)})")


def replot(sweep: Sweep, out: Path) -> list[Path]:
    check_sweep_files(sweep, out)
    try:
        return [ablation_plots.plot(sweep.name, out)]
    except (KeyError, ValueError, TypeError, IndexError) as e:  # well-formed files whose values do not plot
        raise InputError(f"{out / (sweep.name + '.csv')}: cannot be plotted ({type(e).__name__}: {e})") from None


BESIDE_KEY = ("label", "request", "prompt_len", "block_size", "budget", "interval_blocks", "capture_mode")


def beside_rows(sweep: Sweep, out: Path) -> list[tuple]:
    """The last point's warm replayed tokens and TTFT beside the committed results/ablations/<sweep>/."""
    path = record_folder(f"ablations/{sweep.name}") / f"{sweep.name}.csv"
    if not path.is_file() or not (out / f"{sweep.name}.csv").is_file():
        return []
    committed = {tuple(r.get(k) for k in BESIDE_KEY): r
                 for r in read_csv(path, BESIDE_KEY + ("warm_replayed_tokens", "warm_ttft_s"))}
    rows = [r for r in sweep_parts.load_rows(out / f"{sweep.name}.csv") if r.get("request") == "identical"]
    last = [r for r in rows if r["point"] == max(r["point"] for r in rows)] if rows else []
    lines = []
    for r in last[:2]:
        theirs = committed.get(tuple("" if r.get(k) is None else str(r.get(k)) for k in BESIDE_KEY), {})
        at = f"{r['label']} (prompt {r['prompt_len']}, block {r['block_size']}, budget {r['budget']})"
        lines += [(f"{at} replayed", r["warm_replayed_tokens"], theirs.get("warm_replayed_tokens")),
                  (f"{at} warm TTFT (s)", r["warm_ttft_s"],
                   float(theirs["warm_ttft_s"]) if theirs.get("warm_ttft_s") else None)]
    return lines


def measure_sweep(cmd: str, args, model: HybridLM | None, out: Path) -> tuple[int, list[Path], dict | None]:
    """One sweep into `out`: measure this shard (unless --merge), then merge. Returns the status, the
    files written and the merge's meta (None for one shard of several: merged later)."""
    sweep = SWEEPS[cmd]
    config = {k: getattr(args, k) for k in sweep.config_keys} | {
        "preset": args.model, "dtype": args.dtype, "device": args.device, "backend": args.backend,
        "repeats": args.repeats, "seed": args.seed, "policy": args.policy}
    points = sweep.points(args)
    written = []
    if not args.merge:
        failed = measure_shard(sweep, args, model, points, config, args.shard, out)
        written.append(sweep_parts.part_path(out, sweep.name, args.shard))
        if args.shard[1] > 1:
            log(f"merge when every shard is done: python -m experiments.ablations {cmd} --merge --out {out}")
            return (1 if failed else 0), written, None
    meta = sweep_parts.merge(out, sweep.name)
    written += [out / f"{sweep.name}.csv", out / f"{sweep.name}.json"]
    return (1 if meta["failed_points"] else 0), written, meta


# ------------------------------------------------------------------------------------------ command line
def add_common(ap: argparse.ArgumentParser) -> None:
    add_model_flags(ap, dtypes=("float32",), dtype_help="model dtype (fp32 only: the warm == cold check is stated "
                                                        "for fp32)")
    add_policy_flag(ap, "under study; the prompt-len, block-size and budget sweeps compare it with legacy")
    ap.add_argument("--repeats", type=int_in_range(1), default=3, help="warm requests per point (median TTFT)")
    ap.add_argument("--shard", type=shard_spec, default=(0, 1),
                    help="run the points whose index %% n == i (i/n); parts merge with --merge (default: 0/1)")


# per sweep key: its flag (the swept knob's flag takes a comma list), its help, its check
FLAG_NAME = {"lengths": "--prompt-len", "block_sizes": "--block-size", "budgets": "--prefill-budget",
             "intervals": "--interval", "modes": "--capture-mode"}
FLAG_HELP = {
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
FLAG_TYPE = {"modes": name_list(CAPTURE_MODES), "intervals": int_list(0), "interval": int_in_range(0)}


def flag_of(key: str) -> str:
    return FLAG_NAME.get(key, "--" + {"budget": "prefill_budget"}.get(key, key).replace("_", "-"))


def add_sweep_flags(ap: argparse.ArgumentParser, cmd: str) -> None:
    for key, value in DEFAULTS[cmd].items():
        conv = FLAG_TYPE.get(key, int_list(1) if isinstance(value, list) else int_in_range(1))
        if isinstance(value, list):  # shown as typed: a comma list
            ap.add_argument(flag_of(key), dest=key, type=conv, default=value, metavar="A,B,...",
                            help=f"{FLAG_HELP[key]} (default: {','.join(map(str, value))})")
        else:
            ap.add_argument(flag_of(key), dest=key, type=conv, default=value, help=FLAG_HELP[key])


def check_points(ap: argparse.ArgumentParser, cmd: str, args) -> None:
    """Flags that are fine alone but not together end in a usage error before anything runs."""
    for p in SWEEPS[cmd].points(args):
        require_block_of_budget(ap, p["budget"], p["block_size"], slots=1, budget_flag="--prefill-budget")


class Ablations(Study):
    """One subcommand per sweep (its own record folder, results/ablations/<sweep>/), and `all`."""
    record = "ablations"
    prog = "python -m experiments.ablations"
    description = "Chunk-plan ablations on the hybrid model (see the module docstring)."
    subcommands = True
    merge = True
    merge_help = "do not measure: merge the part files in --out and plot"

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        sub = ap.add_subparsers(dest="cmd", required=True)
        for cmd, sweep in SWEEPS.items():
            p = self.subparser(sub, cmd, f"the {cmd} sweep", f"ablations/{sweep.name}")
            add_common(p)
            add_sweep_flags(p, cmd)
        add_common(self.subparser(sub, "all", "every sweep with its default sizes (each into <out>/<sweep>/)",
                                  "ablations"))

    def cmds(self, args) -> list[str]:
        return list(SWEEPS) if args.cmd == "all" else [args.cmd]

    def sweep_args(self, args, cmd: str) -> argparse.Namespace:
        return argparse.Namespace(**(DEFAULTS[cmd] | vars(args))) if args.cmd == "all" else args

    def check(self, ctx: Context) -> None:
        for cmd in self.cmds(ctx.args):
            check_points(ctx.ap, cmd, self.sweep_args(ctx.args, cmd))

    def outs(self, ctx: Context) -> dict[str, Path]:
        """Each sweep's folder: the run folder, or its <sweep>/ below it for `all` (which must exist to be read)."""
        outs = {cmd: ctx.out / SWEEPS[cmd].name if ctx.args.cmd == "all" else ctx.out for cmd in self.cmds(ctx.args)}
        for folder in outs.values() if ctx.reading else ():
            if not folder.is_dir():
                ctx.error(f"argument {ctx.reading}: {folder} is not a folder")
        return outs

    def run(self, ctx: Context) -> Ran:
        args, outs = ctx.args, self.outs(ctx)
        model = None
        set_threads(args.threads)
        if not args.merge:
            model = build_model(args.model, device=args.device, seed=args.seed, dtype=args.dtype,
                                backend=args.backend)
            warm_up(model)
        status, written, merged = 0, [], {}
        for cmd in outs:
            t0 = time.perf_counter()
            code, files, meta = measure_sweep(cmd, self.sweep_args(args, cmd), model, outs[cmd])
            status |= code
            written += files
            if meta is not None:
                merged[cmd] = meta
            log(f"{cmd}: {time.perf_counter() - t0:.0f} s")
        return Ran(written, status, finished=bool(merged), result=merged)

    def figures(self, ctx: Context) -> list[Path]:
        """Each merged sweep's figure (a sweep none of whose points passed: none, and no stale one either)."""
        outs, drawn = self.outs(ctx), []
        for cmd in outs if ctx.replotting else ctx.result:
            sweep = SWEEPS[cmd]
            if ctx.replotting or ctx.result[cmd]["rows"]:
                drawn += replot(sweep, outs[cmd])
            else:
                (outs[cmd] / f"{sweep.name}.png").unlink(missing_ok=True)
                log(f"{sweep.name}: no point passed its correctness check; no figure")
        return drawn

    def headline(self, ctx: Context) -> dict:
        outs = self.outs(ctx)
        return {f"ablations/{SWEEPS[cmd].name}": beside_rows(SWEEPS[cmd], outs[cmd])
                for cmd, meta in ctx.result.items() if meta["rows"]}


STUDY = Ablations()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
