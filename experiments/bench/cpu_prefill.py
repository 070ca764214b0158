"""CPU prefill against the machine's matmul ceiling: ours, transformers and vLLM in one run.

One checkpoint (a preset with seeded random weights; GraniteMoeHybrid presets through the peer
study's `write_checkpoint`, which vLLM loads) is read by all three systems, at each `--dtype`,
with `--threads` threads each (1 by default: the reading least moved by other jobs). Each repeat
sends every system the same fresh `--tokens`-token prompt (no prefix hit anywhere), the systems
alternating and the order flipping per repeat; a figure is the median over repeats of the
process's CPU time (`time.process_time`: on shared cores the wall time also holds other jobs'
turns), the wall time beside it.

* ours: `Engine.for_model` with the peer study's settings (`OUR_ENGINE`), one request with one
  output token (`runs.serve`), the torch backend: its TTFT as the rematch measures it;
* transformers: `model(ids, use_cache=False, logits_to_keep=1)` on the same folder (extra `bench`);
* vLLM: `LLM.generate` of one token in its own process (`experiments.peer_vllm.worker`, the
  study's `default` settings), when a python that imports vllm is found the way the study finds
  one (`--vllm-python`, $PEER_VLLM_PYTHON, /work/venv-vllm); absent, the record says so and the
  comparison is ours against transformers.

Rates: GFLOP/s = the prefill's FLOP floor over the CPU time. The floor is `model.cost.ModelCost`'s
count of the least work a prefill of T tokens from position 0 is (matmuls 2 x projection
parameters x T, conv taps, the SSD scan's causal chunked products at the config's chunk, causal
attention 4 x width x T (T + 1) / 2 a layer, the head on the last row): the same count for every
system, whatever it executes. The ceiling is measured in the same run: one-thread torch matmuls
at the model's own GEMM shapes (recorded by the profiler from our prefill, counted as often as
they ran), fp32 through `torch.mm` (MKL) and oneDNN's linear, bf16 through `torch.mm` and
oneDNN's linear natively, the faster route per shape; the dtype's ceiling is their FLOPs over the
sum of those best times. `floor_s` = FLOP floor / ceiling: no prefill at this dtype can take less.

Where our time goes: one profiled prefill (torch.profiler, self CPU time per op) split into GEMM
(mm / addmm / oneDNN linear, outside the scan), attention (the paged-attention and KV-write ops),
SSM scan (the SSD scan op: its bmm, exp, cumsum), conv, elementwise (every other op: norms,
gates, activations, embedding) and unattributed (the profiled call's CPU time minus its ops':
Python and dispatch).

Warm (ours): after each cold request, `--warm-repeats` times, the byte-identical repeat (one output token: restore + one
token's forward, `warm_cpu_s`) and then the same prompt with three output tokens, whose second
tick is one decode step at the prompt's context: the floor (`decode_step_cpu_s`; its forward alone
`decode_forward_cpu_s`). Issue 35's goal: warm TTFT <= 1.2x the floor.

    python -m experiments.bench.cpu_prefill                                  # granite-dense-cpu, 4096 tokens, fp32 + bf16
    python -m experiments.bench.cpu_prefill --tokens 16384 --repeats 3 --publish   # results/bench/cpu_prefill/<cpu>/
    python -m experiments.bench.cpu_prefill --model granite-tiny --tokens 64 --repeats 1 --peers transformers

Writes rows.csv (one row per timed call, with the config, machine and routes), ceilings.csv (per
GEMM shape, dtype and route), summary.json (medians, GFLOP/s, ceilings, breakdown, warm floor,
machine) and cpu_prefill.png (drawn from summary.json) into a new runs/bench_cpu_prefill/<timestamp>/
(`--publish`: results/bench/cpu_prefill/<cpu-slug>/).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from experiments.common.results_io import RESULTS, environment, log, write_csv, write_json
from experiments.common.study import Context, Ran, Study, run_study

RECORD = "bench_cpu_prefill"
PUBLISHED = RESULTS / "bench" / "cpu_prefill"  # one folder per CPU (`cpu_slug`)
PEERS = ("transformers", "vllm")
OURS = "ours"
WARM_GOAL = 1.2  # issue 35 item 4: warm TTFT within 1.2x one decode step at the same context
CATEGORIES = ("gemm", "attention", "ssm_scan", "conv", "elementwise", "unattributed")
GEMM_OPS = ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise")
GEMM_PARENTS = ("aten::linear", "aten::matmul")  # their self time (views, transposes) counts as GEMM too
# The backend ops whose whole time is one category: a profiler scope is wrapped around each.
SCOPED_OPS = {"ssd_scan": "ssm_scan", "causal_conv1d": "conv", "paged_attention": "attention",
              "write_kv_cache": "attention", "kv_block_copy": "attention", "gated_delta_rule": "ssm_scan"}
SCOPE_PREFIX = "cpu_prefill::"
CATEGORY_COLORS = {"gemm": "#8c6d31", "attention": "#393b79", "ssm_scan": "#d6616b", "conv": "#7b4173",
                   "elementwise": "#8ca252", "unattributed": "#bdbdbd"}


# ------------------------------------------------------------------------------------------ flags
def add_flags(p) -> None:
    from experiments.common.flags import float_in_range, int_in_range, name_list
    from experiments.bench import preset_name

    p.add_argument("--model", type=preset_name, default="granite-dense-cpu", help="a model preset")
    p.add_argument("--tokens", type=int_in_range(2), default=4096, help="prompt tokens")
    p.add_argument("--dtype", type=name_list(("float32", "bfloat16")), default="float32,bfloat16",
                   help="dtypes, comma-separated (float32, bfloat16)")
    p.add_argument("--repeats", type=int_in_range(1), default=3, help="timed prompts per system and dtype")
    p.add_argument("--warm-repeats", type=int_in_range(1), default=5,
                   help="warm requests (each with its decode-step floor) after each cold prompt of ours")
    p.add_argument("--peers", type=name_list(PEERS), default=",".join(PEERS),
                   help=f"peers beside ours, comma-separated ({', '.join(PEERS)})")
    p.add_argument("--vllm-python", default=None,
                   help="python of the vLLM venv (absent: as experiments.peer_vllm finds one; none found: "
                        "the record says so and vLLM is left out)")
    p.add_argument("--threads", type=int_in_range(1), default=1, help="torch threads of every system")
    p.add_argument("--seed", type=int_in_range(0, 2**32 - 1), default=0, help="weights and prompt seed")
    p.add_argument("--ceiling-min-s", type=float_in_range(0, lo_open=True), default=0.05,
                   help="CPU seconds each ceiling sample runs at least (calls repeated until then)")


def cpu_slug(machine: dict) -> str:
    """`amd-epyc-avx512bf16`: the CPU model's words and its widest matmul ISA, for the record's folder."""
    model = re.sub(r"\(r\)|\(tm\)|cpu|processor|\d+-core|@.*", " ", (machine.get("cpu_model") or "cpu").lower())
    words = re.findall(r"[a-z0-9]+", model)[:4] or ["cpu"]
    isa = machine.get("isa") or {}
    widest = next((tag for flag, tag in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"),
                                         ("avx2", "avx2")) if isa.get(flag)), "noavx2")
    return "-".join(words + [widest])


# ------------------------------------------------------------------------------------------ timing
def cpu_and_wall(fn) -> tuple[float, float, object]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - t0, out


def per_call_cpu_s(fn, min_s: float, repeats: int = 5) -> float:
    """Median over `repeats` samples of CPU seconds per call, each sample calling `fn` until it has
    run `min_s` CPU seconds (a short call is timed over many)."""
    fn()
    samples = []
    for _ in range(repeats):
        calls, c0 = 0, time.process_time()
        while True:
            fn()
            calls += 1
            spent = time.process_time() - c0
            if spent >= min_s:
                break
        samples.append(spent / calls)
    return statistics.median(samples)


# ------------------------------------------------------------------------------------------ FLOPs
def flop_floor(config, tokens: int) -> dict:
    """The prefill's least work (module docstring), term by term, from the cost model."""
    from model.cost import ModelCost

    f = ModelCost(config).prefill_flops(tokens)
    return dict(f._asdict(), total=f.total)


# ------------------------------------------------------------------------------------------ ceilings
def gemm_routes(dtype: torch.dtype) -> dict:
    """name -> fn(a (M, K), w (N, K)) for the one-thread matmuls the ceiling takes the best of."""
    routes = {"torch_mm": lambda a, w: torch.mm(a, w.t())}
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        routes["onednn_linear"] = lambda a, w: torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
    return routes


def measure_ceiling(shapes: dict[tuple[int, int, int], int], dtype: torch.dtype, min_s: float) -> tuple[dict, list]:
    """The dtype's ceiling over the model's GEMM shapes ((M, K, N) -> calls): per shape and route
    the one-thread GFLOP/s, and the count-weighted best (module docstring)."""
    g = torch.Generator().manual_seed(0)
    rows, best_s, flops = [], 0.0, 0.0
    for (m, k, n), calls in sorted(shapes.items()):
        a = torch.randn(m, k, generator=g).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        times = {}
        for route, fn in gemm_routes(dtype).items():
            try:
                times[route] = per_call_cpu_s(lambda: fn(a, w), min_s)
            except RuntimeError as err:  # a route this build lacks for the dtype: a row saying so
                rows.append({"dtype": str(dtype).split(".")[-1], "m": m, "k": k, "n": n, "calls": calls,
                             "route": route, "error": str(err).splitlines()[0][:200]})
                continue
            rows.append({"dtype": str(dtype).split(".")[-1], "m": m, "k": k, "n": n, "calls": calls, "route": route,
                         "cpu_s": times[route], "gflops": 2 * m * k * n / times[route] / 1e9})
        if times:
            best_s += calls * min(times.values())
            flops += calls * 2 * m * k * n
    return {"gflops": flops / best_s / 1e9 if best_s else None, "gemm_flops": flops, "best_cpu_s": best_s,
            "shapes": len(shapes)}, rows


# ------------------------------------------------------------------------------------------ breakdown
@dataclasses.dataclass
class Breakdown:
    seconds: dict  # category -> profiled self CPU seconds
    gemm_shapes: dict  # (M, K, N) -> calls
    total_cpu_s: float


def _scoped_ops(ops):
    """The backend with a profiler scope around each op of `SCOPED_OPS`."""
    def scoped(fn, label):
        def run(*args, **kwargs):
            with torch.profiler.record_function(SCOPE_PREFIX + label):
                return fn(*args, **kwargs)
        return run

    wrapped = {name: scoped(getattr(ops, name), label) for name, label in SCOPED_OPS.items()
               if getattr(ops, name, None) is not None}
    return dataclasses.replace(ops, **wrapped)


def _gemm_shape(event) -> tuple[int, int, int] | None:
    shapes = [s for s in event.input_shapes if s]
    if event.name == "aten::addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1][-2:], shapes[2][-2:]
    elif event.name == "aten::mm" and len(shapes) >= 2:
        (m, k), (_, n) = shapes[0][-2:], shapes[1][-2:]
    elif event.name == "mkldnn::_linear_pointwise" and len(shapes) >= 2:
        m, k, n = shapes[0][0], shapes[0][-1], shapes[1][0]
    else:
        return None
    return int(m), int(k), int(n)


def categorize(events) -> tuple[dict, dict]:
    """Self CPU seconds per category and the GEMM shapes (outside the scan) of profiler events."""
    seconds = {c: 0.0 for c in CATEGORIES}
    shapes: dict[tuple[int, int, int], int] = {}
    for ev in events:
        if ev.name.startswith(SCOPE_PREFIX):
            seconds[ev.name[len(SCOPE_PREFIX):]] += ev.self_cpu_time_total / 1e6
            continue
        scope, gemm, parent = None, ev.name in GEMM_OPS or ev.name in GEMM_PARENTS, ev.cpu_parent
        while parent is not None:
            if parent.name.startswith(SCOPE_PREFIX):
                scope = parent.name[len(SCOPE_PREFIX):]
                break
            gemm = gemm or parent.name in GEMM_OPS or parent.name in GEMM_PARENTS
            parent = parent.cpu_parent
        category = scope or ("gemm" if gemm else "elementwise")
        seconds[category] += ev.self_cpu_time_total / 1e6
        if scope is None and ev.name in GEMM_OPS:
            shape = _gemm_shape(ev)
            if shape is not None:
                shapes[shape] = shapes.get(shape, 0) + 1
    return seconds, shapes


def profile_prefill(model, run, repeats: int = 3) -> Breakdown:
    """Prefills (`run(k)` for k < `repeats`: each its own fresh prompt, or the second would be a warm hit) under torch.profiler with the backend's ops scoped
    (`categorize`). The profiler's op times are wall times (on shared cores they hold other jobs'
    turns), so each call's categories are taken as shares of its wall time (unattributed: the wall
    no op event covers, Python and dispatch) and scaled to the call's process CPU time; per category
    the median over the calls."""
    from torch.profiler import ProfilerActivity, profile

    ops = model.ops
    model.ops = _scoped_ops(ops)
    per_call, shapes, totals = [], {}, []
    try:
        for k in range(repeats):
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                cpu, wall, _ = cpu_and_wall(lambda: run(k))
            seconds, shapes = categorize(prof.events())
            seconds["unattributed"] = max(0.0, wall - sum(seconds.values()))
            covered = sum(seconds.values()) or 1.0
            per_call.append({k: v / covered * cpu for k, v in seconds.items()})
            totals.append(cpu)
    finally:
        model.ops = ops
    return Breakdown({c: statistics.median(call[c] for call in per_call) for c in CATEGORIES}, shapes,
                     statistics.median(totals))


# ------------------------------------------------------------------------------------------ systems
class Ours:
    """Our engine over the checkpoint (the peer study's settings); one request, one output token."""

    def __init__(self, folder: str, dtype: str, tokens: int):
        from experiments.common.runs import build_model
        from experiments.peer_vllm.study import OUR_ENGINE
        from model.engine import Engine

        self.model = build_model(folder, dtype=dtype)
        blocks = 4 * (-(-(tokens + 16) // OUR_ENGINE["block_size"])) + 64  # cold + warm requests' leases
        self.engine = Engine.for_model(self.model, num_kv_blocks=blocks, capture_mode="in_pass", **OUR_ENGINE)
        self.count = 0

    def _id(self) -> str:
        self.count += 1
        return f"r{self.count}"

    def prefill(self, ids: list[int]) -> dict:
        from experiments.common.runs import serve

        cpu, wall, req = cpu_and_wall(lambda: serve(self.engine, ids, self._id()))
        return {"cpu_s": cpu, "wall_s": wall, "output_tokens": list(req.output_token_ids), "cached_tokens": req.metrics.restore_at}

    def warm(self, ids: list[int]) -> dict:
        """The byte-identical repeat (TTFT), then one decode step at the same context (the floor)."""
        from experiments.common.runs import serve

        cpu, wall, req = cpu_and_wall(lambda: serve(self.engine, ids, self._id()))
        out = {"warm_cpu_s": cpu, "warm_wall_s": wall, "warm_replayed_tokens": req.metrics.replayed_tokens,
               "warm_tokens": list(req.output_token_ids)}
        # three output tokens: tick 1 restores and runs the prompt's last token, tick 2 is a decode step
        # that does not finish the request (tick 3 does, with the finish bookkeeping)
        req = self.engine.add_request(ids, 3, self._id())
        forward = self.engine.runner.forward
        spent = []

        def timed_forward(rows):
            c0 = time.process_time()
            try:
                return forward(rows)
            finally:
                spent.append(time.process_time() - c0)

        self.engine.runner.forward = timed_forward
        try:
            ticks = []
            while self.engine.has_work:
                ticks.append(cpu_and_wall(self.engine.step)[:2])
        finally:
            del self.engine.runner.forward  # the instance attribute: the class's method again
        require_ticks = len(ticks) == 3 and len(spent) == 3
        out |= {"decode_step_cpu_s": ticks[1][0] if require_ticks else None,
                "decode_step_wall_s": ticks[1][1] if require_ticks else None,
                "decode_forward_cpu_s": spent[1] if require_ticks else None}
        return out


class Transformers:
    def __init__(self, folder: str, dtype: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()

    @torch.no_grad()
    def prefill(self, ids: list[int]) -> dict:
        x = torch.tensor([ids])
        cpu, wall, out = cpu_and_wall(lambda: self.model(x, use_cache=False, logits_to_keep=1))
        return {"cpu_s": cpu, "wall_s": wall, "output_tokens": [int(out.logits[0, -1].argmax())], "cached_tokens": 0}


class Vllm:
    def __init__(self, python: str, folder: Path, dtype: str, tokens: int, threads: int, workdir: Path):
        from experiments.peer_vllm.study import VllmPeer, vllm_settings

        self.peer = VllmPeer(python, folder, vllm_settings("default", tokens + 64, dtype), threads, workdir,
                             f"vllm_{dtype}")
        self.ready = self.peer.start()

    def prefill(self, ids: list[int]) -> dict:
        from experiments.peer_vllm.study import request

        (rec,) = self.peer.run([request(ids)])
        if "error" in rec:
            return {"error": rec["error"]}
        return {"cpu_s": rec["cpu_s"], "wall_s": rec["wall_s"], "output_tokens": rec["tokens"],
                "cached_tokens": rec.get("num_cached_tokens")}

    def stop(self) -> None:
        self.peer.stop()


def find_vllm(args) -> tuple[str | None, str]:
    """(python, why): the interpreter that imports vllm, found as the peer study finds it; None
    and the reason when there is none."""
    from experiments.peer_vllm.study import DEFAULT_VLLM_VENV_PYTHON, default_vllm_python, has_vllm

    python = args.vllm_python or default_vllm_python()
    if python is None:
        return None, (f"vLLM absent: vllm does not import in {sys.executable}, $PEER_VLLM_PYTHON is unset and "
                      f"{DEFAULT_VLLM_VENV_PYTHON} does not exist (the `peers` extra, README)")
    if not has_vllm(python):
        return None, f"vLLM absent: {python} cannot import vllm"
    return python, f"vLLM run by {python}"


# ------------------------------------------------------------------------------------------ checkpoint
def write_folder(preset: str, seed: int, folder: Path, tokens: int) -> dict:
    """The checkpoint every system reads: the peer study's (perturbed norms, `architectures` for
    vLLM) for a GraniteMoeHybrid preset, else the preset saved as it is built."""
    from experiments.peer_vllm.study import write_checkpoint
    from model.families import PRESETS
    from model.loading import from_preset, save_pretrained

    if PRESETS[preset].model_type == "granitemoehybrid":
        return write_checkpoint(preset, seed, folder, tokens + 64)
    save_pretrained(from_preset(preset, seed=seed), folder)
    return {"folder": str(folder), "preset": preset, "seed": seed}


# ------------------------------------------------------------------------------------------ measure
def measure_dtype(args, dtype: str, folder: Path, vllm_python: str | None, workdir: Path, flops: dict) -> dict:
    """Every system at one dtype: rows per timed call, medians, our breakdown, the ceiling, warm."""
    from experiments.common.runs import random_prompt

    ours = Ours(str(folder), dtype, args.tokens)
    vocab = ours.model.config.vocab_size
    systems: dict = {OURS: ours}
    vllm_ready = None
    if "transformers" in args.peers:
        systems["transformers"] = Transformers(str(folder), dtype)
    if "vllm" in args.peers and vllm_python is not None:
        log(f"{dtype}: starting vLLM")
        peer = Vllm(vllm_python, folder, dtype, args.tokens, args.threads, workdir)
        vllm_ready = {k: v for k, v in peer.ready.items() if k in ("ok", "error", "vllm", "torch", "resolved", "start_s")}
        if peer.ready.get("ok"):
            systems["vllm"] = peer
        else:
            log(f"{dtype}: vLLM did not start: {peer.ready.get('error')}")
    try:
        warm_up = random_prompt(min(args.tokens, 512), vocab, args.seed + 999)
        for s in systems.values():  # first-call costs (oneDNN primitives, lazy init) out of the timing
            s.prefill(warm_up)
        # the profiled prefill (untimed): the breakdown and the GEMM shapes the ceiling is taken at
        breakdown = profile_prefill(ours.model, lambda k: ours.prefill(random_prompt(args.tokens, vocab, args.seed + 900 + k)))
        rows, warm_rows = [], []
        for r in range(args.repeats):
            prompt = random_prompt(args.tokens, vocab, args.seed + 1000 + r)
            names = list(systems) if r % 2 == 0 else list(systems)[::-1]
            for name in names:
                rec = systems[name].prefill(prompt)
                rows.append({"system": name, "dtype": dtype, "repeat": r, "tokens": args.tokens, **rec})
                if "error" not in rec:
                    log(f"{dtype} repeat {r} {name:>12}: cpu {rec['cpu_s']:.3f} s, wall {rec['wall_s']:.3f} s")
                if name == OURS:
                    for j in range(args.warm_repeats):  # milliseconds each: more samples than the cold prompts
                        w = ours.warm(prompt)
                        warm_rows.append({"dtype": dtype, "repeat": r, "warm_repeat": j, "tokens": args.tokens, **w})
                    log(f"{dtype} repeat {r}   warm: {w['warm_cpu_s'] * 1e3:.2f} ms, one decode step "
                        f"{(w['decode_step_cpu_s'] or float('nan')) * 1e3:.2f} ms (cpu, the last of {args.warm_repeats})")
    finally:
        if "vllm" in systems:
            systems["vllm"].stop()
    ceiling, ceiling_rows = measure_ceiling(breakdown.gemm_shapes, getattr(torch, dtype), args.ceiling_min_s)
    log(f"{dtype}: ceiling {ceiling['gflops']:.1f} GFLOP/s over {ceiling['shapes']} GEMM shapes")
    return {"rows": rows, "warm_rows": warm_rows, "ceiling": ceiling, "ceiling_rows": ceiling_rows,
            "breakdown": breakdown, "vllm_ready": vllm_ready,
            "agreement": agreement(rows)}


def agreement(rows: list[dict]) -> dict:
    """Per peer, on how many prompts its greedy token equals ours."""
    by = {}
    for r in rows:
        by.setdefault(r["repeat"], {})[r["system"]] = r.get("output_tokens")
    out = {}
    for peer in {r["system"] for r in rows} - {OURS}:
        pairs = [(d[OURS][:1], d[peer][:1]) for d in by.values() if d.get(OURS) and d.get(peer)]
        out[peer] = {"same_first_token": sum(a == b for a, b in pairs), "prompts": len(pairs)}
    return out


def summarize(dtype: str, got: dict, flops: dict) -> dict:
    """Medians, GFLOP/s against the ceiling, the breakdown and the warm floor of one dtype."""
    ceiling = got["ceiling"]["gflops"]
    systems = {}
    for name in dict.fromkeys(r["system"] for r in got["rows"]):
        ok = [r for r in got["rows"] if r["system"] == name and "error" not in r]
        if not ok:
            systems[name] = {"errors": len([r for r in got["rows"] if r["system"] == name])}
            continue
        cpu, wall = statistics.median(r["cpu_s"] for r in ok), statistics.median(r["wall_s"] for r in ok)
        gflops = flops["total"] / cpu / 1e9
        systems[name] = {"median_cpu_s": cpu, "median_wall_s": wall, "gflops_by_cpu": gflops,
                         "share_of_ceiling": gflops / ceiling if ceiling else None,
                         "cached_tokens_max": max(r.get("cached_tokens") or 0 for r in ok), "repeats": len(ok)}
    ours_cpu = systems.get(OURS, {}).get("median_cpu_s")
    for name, s in systems.items():
        if name != OURS and ours_cpu and s.get("median_cpu_s"):
            s["ours_over_peer_cpu"] = ours_cpu / s["median_cpu_s"]
    b = got["breakdown"]
    total = sum(b.seconds.values()) or 1.0
    gemm_flops = got["ceiling"]["gemm_flops"]
    breakdown = {"profiled_cpu_s": b.total_cpu_s, "seconds": b.seconds,
                 "gemm_shapes": {f"{m}x{k}x{n}": c for (m, k, n), c in sorted(b.gemm_shapes.items())},
                 "share": {k: v / total for k, v in b.seconds.items()},
                 # the GEMMs' own rate: their FLOPs over their profiled time (profiler overhead included)
                 "gemm_gflops": gemm_flops / b.seconds["gemm"] / 1e9 if b.seconds["gemm"] else None}
    w = got["warm_rows"]
    warm = {}
    if w and all(r["decode_step_cpu_s"] is not None for r in w):
        wcpu = statistics.median(r["warm_cpu_s"] for r in w)
        step = statistics.median(r["decode_step_cpu_s"] for r in w)
        fwd = statistics.median(r["decode_forward_cpu_s"] for r in w)
        warm = {"warm_cpu_s": wcpu, "decode_step_cpu_s": step, "decode_forward_cpu_s": fwd,
                "warm_over_decode_step": wcpu / step, "warm_over_decode_forward": wcpu / fwd,
                "goal": WARM_GOAL, "goal_met": wcpu / step <= WARM_GOAL,
                "warm_replayed_tokens_max": max(r["warm_replayed_tokens"] for r in w)}
    return {"systems": systems, "ceiling": got["ceiling"],
            "floor_s": flops["total"] / (ceiling * 1e9) if ceiling else None,
            "breakdown": breakdown, "warm": warm, "agreement": got["agreement"], "vllm_ready": got["vllm_ready"]}


def measure(args) -> tuple[dict, list, list, list]:
    from experiments.common.runs import machine_load, set_threads
    from model.families import PRESETS

    loadavg_start = os.getloadavg()
    set_threads(args.threads)
    vllm_python, vllm_note = (find_vllm(args) if "vllm" in args.peers else (None, "vLLM not asked for (--peers)"))
    log(vllm_note)
    flops = flop_floor(PRESETS[args.model], args.tokens)
    log(f"FLOP floor of a {args.tokens}-token prefill: {flops['total'] / 1e9:.2f} GFLOP "
        f"(matmuls {flops['matmuls'] / 1e9:.2f}, scan {flops['scan'] / 1e9:.2f}, attention {flops['attention'] / 1e9:.2f})")
    rows, warm_rows, ceiling_rows, by_dtype = [], [], [], {}
    with tempfile.TemporaryDirectory(prefix="cpu_prefill_") as tmp:
        folder = Path(tmp) / "checkpoint"
        checkpoint = write_folder(args.model, args.seed, folder, args.tokens)
        for dtype in args.dtype:
            got = measure_dtype(args, dtype, folder, vllm_python, Path(tmp), flops)
            rows += got["rows"]
            warm_rows += got["warm_rows"]
            ceiling_rows += got["ceiling_rows"]
            by_dtype[dtype] = summarize(dtype, got, flops)
    env = environment("cpu")
    summary = {"model": args.model, "tokens": args.tokens, "repeats": args.repeats, "threads": args.threads,
               "peers": args.peers, "vllm": vllm_note, "flop_floor": flops, "by_dtype": by_dtype,
               "checkpoint": {k: v for k, v in checkpoint.items() if k != "folder"},
               "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "environment": env, "machine_load": machine_load(loadavg_start)}
    flat = {k: env[k] for k in ("device_name", "torch") if k in env} | {
        "cpu_model": env.get("machine", {}).get("cpu_model") if isinstance(env.get("machine"), dict) else None,
        "model": args.model, "threads": args.threads}
    return summary, [r | flat for r in rows], [r | flat for r in warm_rows], [r | flat for r in ceiling_rows]


# ------------------------------------------------------------------------------------------ report
def plot(summary: dict, png: Path) -> Path:
    """Left: GFLOP/s (by CPU time) per system and dtype, the measured ceiling as a line over each
    dtype; middle: where our prefill's CPU time goes; right: warm TTFT against one decode step."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    dtypes = list(summary["by_dtype"])
    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(13, 4.6))
    names = list(dict.fromkeys(n for d in dtypes for n in summary["by_dtype"][d]["systems"]))
    width = 0.8 / max(len(names), 1)
    for j, d in enumerate(dtypes):
        s = summary["by_dtype"][d]
        for k, n in enumerate(names):
            g = s["systems"].get(n, {}).get("gflops_by_cpu")
            if g is not None:
                ax.bar(j + (k - (len(names) - 1) / 2) * width, g, width, color=fs.color(n), label=n if j == 0 else None)
        if s["ceiling"]["gflops"]:
            ax.hlines(s["ceiling"]["gflops"], j - 0.45, j + 0.45, color="black", linestyle="--",
                      label="matmul ceiling (1 thread, model's GEMM shapes)" if j == 0 else None)
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_ylabel("GFLOP/s (FLOP floor / median CPU time)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the ceilings
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    bottom = [0.0] * len(dtypes)
    for c in CATEGORIES:
        vals = [summary["by_dtype"][d]["breakdown"]["seconds"][c] for d in dtypes]
        bx.bar(range(len(dtypes)), vals, 0.6, bottom=bottom, label=c, color=CATEGORY_COLORS[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    bx.set_xticks(range(len(dtypes)), dtypes)
    bx.set_ylabel("our prefill, profiled CPU s")
    bx.legend(fontsize=7)
    warm = [(d, summary["by_dtype"][d]["warm"]) for d in dtypes if summary["by_dtype"][d]["warm"]]
    for j, (d, w) in enumerate(warm):
        cx.bar(j - 0.2, w["warm_cpu_s"] * 1e3, 0.4, color=fs.color(OURS), label="warm TTFT" if j == 0 else None)
        cx.bar(j + 0.2, w["decode_step_cpu_s"] * 1e3, 0.4, color="gray", label="one decode step" if j == 0 else None)
        fs.goal_marks(cx, [j - 0.2], [w["decode_step_cpu_s"] * 1e3 * WARM_GOAL],
                      f"<= {WARM_GOAL}x a decode step" if j == 0 else None)
    cx.set_xticks(range(len(warm)), [d for d, _ in warm])
    cx.set_ylabel("ours, median CPU ms")
    cx.set_ylim(0, cx.get_ylim()[1] * 1.3)
    cx.legend(fontsize=7, loc="upper right")
    env = summary["environment"]
    fs.title(fig, "CPU prefill: GFLOP/s against the measured matmul ceiling",
             workload=f"one {summary['tokens']}-token prompt, {summary['repeats']} repeats",
             model=summary["model"], device=env.get("device_name"),
             extra=[f"{summary['threads']} thread(s)", summary["vllm"]])
    return fs.save(fig, png)


def headline(summary: dict) -> list[tuple]:
    from experiments.common.inputs import InputError, read_json

    try:
        committed = read_json(PUBLISHED / cpu_slug(summary["environment"].get("machine") or {}) / "summary.json",
                              ("by_dtype",))["by_dtype"]
    except InputError:
        committed = {}
    rows = []
    for d, s in summary["by_dtype"].items():
        c = committed.get(d, {})
        rows.append((f"{d} ours GFLOP/s", s["systems"].get(OURS, {}).get("gflops_by_cpu"),
                     c.get("systems", {}).get(OURS, {}).get("gflops_by_cpu")))
        rows.append((f"{d} ceiling GFLOP/s", s["ceiling"]["gflops"], c.get("ceiling", {}).get("gflops")))
        rows.append((f"{d} warm / decode step", s["warm"].get("warm_over_decode_step"),
                     c.get("warm", {}).get("warm_over_decode_step")))
    return rows


class CpuPrefillBench(Study):
    record = RECORD
    prog = "python -m experiments.bench.cpu_prefill"
    description = __doc__.splitlines()[0]

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        from experiments.common.inputs import require_extra
        from experiments.common.machine import machine_info

        args = ctx.args
        if args.publish:  # the record keeps one folder per CPU
            args.out, args.publish = PUBLISHED / cpu_slug(machine_info()), False
        if not ctx.reading and "transformers" in args.peers:
            require_extra("transformers", "bench", "experiments.bench.cpu_prefill (the transformers side)")

    def run(self, ctx: Context) -> Ran:
        out = ctx.out
        summary, rows, warm_rows, ceiling_rows = measure(ctx.args)
        summary = json.loads(json.dumps(summary, default=_jsonable))
        return Ran([write_csv(out / "rows.csv", [_flat(r) for r in rows + warm_rows]),
                    write_csv(out / "ceilings.csv", ceiling_rows), write_json(out / "summary.json", summary)],
                   result=summary)

    def figures(self, ctx: Context) -> list[Path]:
        from experiments.common.inputs import read_json

        summary = ctx.result or read_json(ctx.out / "summary.json", ("by_dtype", "environment"))
        return [plot(summary, ctx.out / "cpu_prefill.png")]

    def headline(self, ctx: Context) -> dict:
        """Beside the committed folder of this CPU (results/bench/cpu_prefill/<cpu>/)."""
        record = PUBLISHED / cpu_slug(ctx.result["environment"].get("machine") or {})
        return {str(record.relative_to(RESULTS)): headline(ctx.result)}


STUDY = CpuPrefillBench()
parser = STUDY.parser
main = STUDY.main


def _flat(row: dict) -> dict:
    return {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in row.items()}


def _jsonable(x):
    if isinstance(x, Breakdown):
        return {"seconds": x.seconds, "total_cpu_s": x.total_cpu_s,
                "gemm_shapes": {f"{m}x{k}x{n}": c for (m, k, n), c in x.gemm_shapes.items()}}
    return str(x)


if __name__ == "__main__":
    run_study(STUDY)
