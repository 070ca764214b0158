"""Benchmark: the chunked gated delta rule (Qwen3-Next's Gated DeltaNet scan) with in-launch state
capture vs. no capture vs. two passes, and fla-core's `chunk_gated_delta_rule` beside it.

For each mixer shape and prefill length (one sequence from a given initial state) it times, in one
run and interleaved round by round:

* ``none``       one scan, no capture (the public call: checks, chunk table built and uploaded)
* ``capture1``   one scan that also emits the state at the prompt-tail split point
* ``capture4``   one scan emitting 4 states (3 block-aligned interior offsets, not on the 64-token
  chunk grid, + the tail)
* ``two_pass``   the fallback: scan [0, o), then scan [o, T) from the state it returned
* ``none_kernel``, ``capture1_kernel``, ``capture4_kernel`` (Triton only): the same scans with the
  plan (`plan_gated_delta_rule`) built and uploaded before timing: the launches alone. Their overhead
  column is against ``none_kernel``.
* ``fla`` (Triton on CUDA only): fla-core's ``chunk_gated_delta_rule`` (fetched into peers/ by
  ``bash scripts/fetch_peers.sh``) on the same q, k, v, g, beta and initial state, its L2 norm in the
  kernel, GVA over the key heads as ours; checked against our fp64 oracle before it is timed (a peer
  that fails is reported without a time); ``peer_over_ours`` is its time over ``none_kernel``'s.
  fla's kernels do not run under the Triton interpreter, so on a CPU the gate (and its test) runs
  fla's own ``naive_recurrent_gated_delta_rule`` through the same inputs.

On CUDA the Triton ``gated_delta_rule`` is timed with ``triton.testing.do_bench`` medians (bf16
inputs, chunk 64); on a CPU the ``torch`` backend's ``gated_delta_rule_chunked`` with
``time.perf_counter`` medians (fp32); ``--impl triton`` on a CPU runs the Triton scan through the
interpreter (TRITON_INTERPRET=1: tiny shapes only). GB/s is against the bytes the scan must move at
least (``bytes_model``): q, k, v and o once in the input dtype, g and beta in fp32, and the fp32
states read (initial) and written (final, captured). Correctness comes first: the timed path
against the fp64 token-by-token oracle (`kernels.reference.gated_delta`) on a short varlen batch with
captures on and off the chunk grid, and at full length the in-launch capture against the two-pass state.

Mixer shapes are the presets' (`model.families.PRESETS`: key/value heads and head dims). Writes
``bench_gated_delta_rule.csv`` (device, versions, config, numbers) and a PNG drawn from the CSV into
a new ``runs/bench_gated_delta_rule/<timestamp>/`` (``--publish``: ``results/bench_gated_delta_rule/``).

    python -m experiments.bench.gated_delta_rule                        # CPU: qwen3-next-tiny, seconds
    python -m experiments.bench.gated_delta_rule --tokens 8192,32768    # CUDA: qwen3-next-80b-a3b
    python -m experiments.bench.gated_delta_rule --replot --out DIR     # the PNG again from DIR's CSV
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.bench.ratios import load_ceilings
from experiments.bench.scan_variants import (MIN_TOKENS, ScanBench, add_round_flags, add_scan_flags, check_impl,
                                             gate_each, replot_csv, rows_at, time_variants)
from experiments.common.results_io import environment, log, read_csv, write_csv
from experiments.common.study import Context, Study, run_study
from kernels.contracts.gated_delta import L2NORM_EPS
from kernels.reference.gated_delta import gated_delta_rule_sequential
from kernels.testing import assert_close, tolerance
from kernels.torch_cpu.gated_delta import gated_delta_rule_chunked
from model.families import PRESETS

PEERS = ("fla",)
BYTES_MODEL = "es*(2*T*HK*K + 2*T*HV*V) + 4*2*T*HV + 4*HV*K*V*(S + S + k)"
GATE_TOKENS = 300  # the peer gate's length: the fp64 oracle is a Python loop over tokens


@dataclasses.dataclass(frozen=True)
class Shape:
    HK: int
    HV: int
    K: int
    V: int


def shape_of(preset: str) -> Shape:
    """The Gated DeltaNet mixer shape of a preset (one with `linear_attention` layers)."""
    c = PRESETS[preset]
    return Shape(HK=c.linear_num_key_heads, HV=c.linear_num_value_heads, K=c.linear_key_head_dim,
                 V=c.linear_value_head_dim)


def make_inputs(lens: list[int], shape: Shape, dtype, device, seed: int = 0) -> dict:
    """Model-like inputs (tests/gated_delta_inputs.py's rule): g = -A softplus(a + 0.5) with A in
    [0.02, 0.5], beta = sigmoid(b), an fp32 initial state of scale 0.5; q/k/v in `dtype`, g/beta fp32."""
    gen = torch.Generator().manual_seed(seed)
    T, HK, HV, K, V = sum(lens), shape.HK, shape.HV, shape.K, shape.V
    q, k, v = (torch.randn(T, HK, K, generator=gen), torch.randn(T, HK, K, generator=gen),
               torch.randn(T, HV, V, generator=gen))
    A = torch.empty(HV).uniform_(0.02, 0.5, generator=gen)
    g = -A * F.softplus(torch.randn(T, HV, generator=gen) + 0.5)
    beta = torch.sigmoid(torch.randn(T, HV, generator=gen))
    init = torch.randn(len(lens), HV, K, V, generator=gen) * 0.5
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return dict(q=q.to(device, dtype), k=k.to(device, dtype), v=v.to(device, dtype), g=g.to(device),
                beta=beta.to(device), initial_states=init.to(device), cu_seqlens=cu.to(device))


def bytes_moved(T: int, shape: Shape, es: int, k: int, S: int = 1) -> int:
    HK, HV, K, V = shape.HK, shape.HV, shape.K, shape.V
    return es * (2 * T * HK * K + 2 * T * HV * V) + 4 * 2 * T * HV + 4 * HV * K * V * (S + S + k)


def _span(inp: dict, lo: int, hi: int, initial) -> dict:
    """Tokens [lo, hi) of a one-sequence input, from `initial`."""
    out = {key: inp[key][lo:hi] for key in ("q", "k", "v", "g", "beta")}
    return dict(out, initial_states=initial, cu_seqlens=torch.tensor([0, hi - lo], dtype=torch.int32,
                                                                      device=inp["q"].device))


def two_pass(scan, inp: dict, o: int, **kw):
    """The fallback: [0, o) then [o, T) resumed from the first pass's final state."""
    T = inp["q"].shape[0]
    a = scan(**_span(inp, 0, o, inp["initial_states"]), **kw)
    b = scan(**_span(inp, o, T, a.final_states), **kw)
    return a, b


def check_correctness(scan, shape: Shape, dtype, device, chunk: int) -> None:
    """The timed path against the fp64 oracle on a varlen batch with captures at 1, around the chunk
    ends and at the last token; refuses to go on."""
    lens = [2 * chunk + 45, 1, chunk + 7]
    inp = make_inputs(lens, shape, dtype, device, seed=1)
    offs = [[1, chunk - 1, chunk, chunk + 1, lens[0] - 1], [], [chunk // 2 + 3]]
    out = scan(**inp, capture_offsets=offs, chunk_size=chunk)
    ref = gated_delta_rule_sequential(**{k: v.cpu() for k, v in inp.items()}, capture_offsets=offs)
    assert_close(out.o.cpu(), ref.o, dtype, "correctness gate: o")
    assert_close(out.final_states.cpu(), ref.final_states, dtype, "correctness gate: final states")
    assert_close(out.captured_states.cpu(), ref.captured_states, dtype, "correctness gate: captured states")


SCAN = ScanBench(module="kernels.gated_delta_rule", scan="gated_delta_rule", plan="plan_gated_delta_rule",
                 cpu_scan=gated_delta_rule_chunked, tokens_key="q", two_pass=two_pass, capture_word="in-launch")
scan_under_test, kernel_only, variants_at, gate_capture = (SCAN.under_test, SCAN.kernel_only, SCAN.variants_at,
                                                           SCAN.gate_capture)


# ---- the peer ------------------------------------------------------------------------------------

def load_fla(cuda: bool):
    """(make(inp) -> call, or None; note): fla's chunk kernel on CUDA, else why not."""
    from experiments.bench import peers

    fn, why = peers.load_fla_gated_delta()
    if fn is not None and not cuda:
        return None, "fla: its kernels do not run under the Triton interpreter (a CPU run times no peer)"
    version = peers.versions().get("fla-core", "?")
    return ((lambda inp: fla_call(fn, inp)) if fn else None,
            why or f"chunk_gated_delta_rule, l2norm in kernel, GVA ({version})")


def load_fla_naive():
    """fla's own token-by-token recurrence (the CPU stand-in for its kernel), or (None, why not)."""
    from experiments.bench import peers

    return peers.load_fla_gated_delta_naive()


def fla_call(fn, inp: dict):
    """A closure running fla's `chunk_gated_delta_rule` on our one-sequence inputs: batch axis of 1,
    g in log space, q/k normalised in the kernel; returns (o (T, HV, V), final (1, HV, K, V) fp32)."""
    q, k, v, g, beta = (inp[name][None] for name in ("q", "k", "v", "g", "beta"))

    def run():
        o, final = fn(q, k, v, g, beta, initial_state=inp["initial_states"], output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        return o[0], final.float()

    return run


def fla_naive_call(fn, inp: dict, l2norm: bool = True):
    """fla's naive recurrence on our inputs: it has no GVA and no L2 norm, so q/k are normalised (fla's
    rule: x * rsqrt(sum x^2 + 1e-6)) and each key head repeated over its HV / HK value heads here.
    `l2norm=False` feeds them raw (another function: the gate's test catches it)."""
    rep = inp["v"].shape[1] // inp["q"].shape[1]

    def prep(x):
        x = x.float()
        if l2norm:
            x = x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)
        return x.repeat_interleave(rep, dim=1)[None]

    def run():
        o, final = fn(prep(inp["q"]), prep(inp["k"]), inp["v"].float()[None], inp["beta"][None], inp["g"][None],
                      initial_state=inp["initial_states"], output_final_state=True)
        return o[0].to(inp["v"].dtype), final.float()

    return run


def check_peer(run, inp: dict, dtype) -> tuple[bool, str]:
    """Whether a peer's (o, final) equal the fp64 oracle's within `dtype`'s tolerance (NaN, a wrong
    shape fail), and its largest absolute errors as a note."""
    from experiments.bench.peers import interpreter_shims

    with interpreter_shims():
        o, final = run()
    ref = gated_delta_rule_sequential(**{k: v.cpu() for k, v in inp.items()})
    errs, ok = [], True
    for name, got, want in (("o", o, ref.o), ("final", final, ref.final_states)):
        got, want = got.float().cpu(), want.float()
        if got.shape != want.shape or torch.isnan(got).any():
            return False, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)} or NaN"
        ok &= bool(torch.allclose(got, want, **tolerance(dtype)))
        errs.append(f"{name} max abs err {(got - want).abs().max().item():.3g}")
    return ok, ", ".join(errs)


def gate_peers(loaded: dict, shape: Shape, dtype, device) -> dict:
    """Each loadable peer checked against the oracle at GATE_TOKENS tokens before any timing; a
    failing one keeps only its note (no time is reported for it)."""
    inp = make_inputs([GATE_TOKENS], shape, dtype, device, seed=3)
    return gate_each(loaded, lambda make: check_peer(make(inp), inp, dtype))


# ---- timing --------------------------------------------------------------------------------------

def bench_length(scan, gated: dict, shape_name: str, T: int, chunk: int, dtype, device, es: int, cuda: bool,
                 base: dict, args) -> list[dict]:
    """Gate the capture against two passes at full length, then time every variant and peer."""
    from experiments.bench.peers import shimmed

    shape = shape_of(shape_name)
    inp = make_inputs([T], shape, dtype, device)
    variants = variants_at(scan, inp, T, chunk, base["impl"])
    gate_capture(variants, T, dtype)
    variants.update({name: (0, shimmed(make(inp))) for name, (make, _) in gated.items() if make is not None})
    wall = time_variants(variants, cuda, args)
    common = dict(shape=shape_name, HK=shape.HK, HV=shape.HV, K=shape.K, V=shape.V, T=T)
    return rows_at(variants, wall, gated, base, common, T, lambda k: bytes_moved(T, shape, es, k), args, PEERS,
                   ms_digits=3)


def run(args) -> list[dict]:
    cuda, device, dtype, scan, impl = scan_under_test(args)
    es = torch.finfo(dtype).bits // 8
    env = environment(device)
    device_name = env["device_name"] if cuda else f"{env['device_name']}, {env['torch_threads']} threads"
    chunk = args.chunk_size or (64 if dtype != torch.float32 else 32)  # kernels.gated_delta_rule.default_chunk_size
    loaded = {"fla": load_fla(cuda)} if impl == "triton" and not args.no_peers else {}
    base = dict(device=device_name, torch=env["torch"], triton=env["triton"], dtype=str(dtype).split(".")[-1],
                chunk_size=chunk, bytes_model=BYTES_MODEL, loadavg_1m=None, impl=impl)
    rows = []
    for shape_name in args.model:
        check_correctness(scan, shape_of(shape_name), dtype, device, chunk)
        log(f"{shape_name}: correctness gate passed ({impl}, {dtype}, chunk {chunk})")
        gated = gate_peers(loaded, shape_of(shape_name), dtype, device)
        for T in args.tokens:
            rows += bench_length(scan, gated, shape_name, T, chunk, dtype, device, es, cuda, base, args)
    return rows


CAPTURE_GOAL_PCT = 3.0  # the SSD scan's GPU goal (README), the same bar for this scan's capture


def plot(csv_path: Path, png_path: Path) -> None:
    """Reads the CSV and draws median time and overhead per variant, per (shape, T), with the goal."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    rows = read_csv(csv_path)
    main = [r for r in rows if r["overhead_vs_none_pct"] != ""]
    groups = sorted({(r["shape"], int(r["T"])) for r in main})
    variants = list(dict.fromkeys(r["variant"] for r in main))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(variants))

    def at(g, v, key):
        return next((float(r[key]) for r in main if (r["shape"], int(r["T"])) == g and r["variant"] == v), 0.0)

    for i, v in enumerate(variants):
        xs = [j + i * width for j in range(len(groups))]
        axes[0].bar(xs, [at(g, v, "median_ms") for g in groups], width, color=fs.color(v), label=v)
        ov = [at(g, v, "overhead_vs_none_pct") for g in groups]
        bars = axes[1].bar(xs, ov, width, color=fs.color(v), label=v)
        axes[1].bar_label(bars, [f"{o:+.1f}" for o in ov], fontsize=7, padding=2)
    for ax in axes:
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(groups))],
                      [f"{s}\nT={t}" for s, t in groups])
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("median time (ms)")
    axes[1].set_ylabel("overhead vs. no capture (%, median of rounds)")
    axes[1].axhline(0, color="k", lw=0.8)
    fs.goal_line(axes[1], CAPTURE_GOAL_PCT, f"capture <= {CAPTURE_GOAL_PCT:g}% (a GPU goal)")
    axes[0].legend(fontsize=8)
    fs.legend_outside(axes[1])
    r0 = rows[0] if rows else {}
    fs.title(fig, "Gated delta rule scan: in-launch capture vs two passes",
             model=f"mixer shape {', '.join(sorted({g[0] for g in groups}))} (HK={r0.get('HK')}, HV={r0.get('HV')}, "
                   f"K={r0.get('K')}, V={r0.get('V')}), {r0.get('dtype', '')}, {r0.get('impl', '')}",
             device=f"{r0.get('device', '')}, measured", extra=[f"medians of {r0.get('repeats', '?')} rounds"])
    fs.save(fig, png_path)


CSV_NAME, PNG_NAME = "bench_gated_delta_rule.csv", "bench_gated_delta_rule.png"
RECORD = "bench_gated_delta_rule"
CSV_COLUMNS = ("device", "impl", "shape", "T", "variant", "median_ms", "min_ms", "overhead_vs_none_pct")


def add_flags(p) -> None:
    from experiments.bench import preset_names
    from experiments.common.flags import int_in_range, int_list

    p.add_argument("--model", type=preset_names, default=None,
                   help="presets with Gated DeltaNet layers whose mixer shapes to time, comma-separated "
                        "(absent: qwen3-next-80b-a3b on CUDA, qwen3-next-tiny on a CPU)")
    p.add_argument("--tokens", type=int_list(MIN_TOKENS), default=None,
                   help="prefill lengths, comma-separated (absent: 8192,32768 on CUDA, 1024 on a CPU)")
    p.add_argument("--chunk-size", type=int_in_range(16), default=None,
                   help="internal chunk (absent: 64 for bf16, 32 for fp32; Triton: a power of 2 >= 16)")
    add_round_flags(p)
    add_scan_flags(p, "fla")


def check_args(p, args) -> None:
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = args.device.startswith("cuda")
    args.model = args.model or (["qwen3-next-80b-a3b"] if cuda else ["qwen3-next-tiny"])
    args.tokens = args.tokens or ([8192, 32768] if cuda else [1024])
    no_deltanet = [m for m in args.model if "linear_attention" not in PRESETS[m].layer_types]
    if no_deltanet:
        p.error(f"argument --model: {no_deltanet[0]} has no Gated DeltaNet layer")
    check_impl(p, args, cuda)
    chunk = args.chunk_size
    if args.impl == "triton" and chunk is not None and chunk & (chunk - 1):
        p.error(f"argument --chunk-size: the Triton scan needs a power of 2 >= 16, got {chunk}")
    ceilings = load_ceilings(args.ceilings)
    args.copy_gbps = ceilings["copy_gbps"] if ceilings else None


def replot(out: Path) -> list[Path]:
    """The PNG again from the CSV in `out` (checked first: a bad CSV is an InputError naming it)."""
    return replot_csv(out, CSV_NAME, PNG_NAME, CSV_COLUMNS, "bench_gated_delta_rule", plot)


class GatedDeltaRuleBench(Study):
    record = RECORD
    prog = "python -m experiments.bench.gated_delta_rule"
    description = __doc__.splitlines()[0]

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        if not ctx.reading:
            check_args(ctx.ap, ctx.args)

    def run(self, ctx: Context) -> list[Path]:
        return [write_csv(ctx.out / CSV_NAME, run(ctx.args))]

    def figures(self, ctx: Context) -> list[Path]:
        return replot(ctx.out)


STUDY = GatedDeltaRuleBench()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
