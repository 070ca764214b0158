"""Benchmark: the SSD prefill scan with in-pass state capture vs. no capture vs. two passes.

For each shape and prefill length it times, in one run and interleaved round by round:

* ``none``       one scan, no capture (the public call: checks, chunk table built and uploaded)
* ``capture1``   one scan that also emits the state at the prompt-tail split point
* ``capture4``   one scan emitting 4 states (3 block-aligned interior offsets + the tail)
* ``two_pass``   the fallback: scan [0, o), then scan [o, T) from the state it returned
* ``none_kernel``, ``capture1_kernel``, ``capture4_kernel`` (Triton only): the same scans with the
  plan (`plan_ssd_scan`: chunk table, uploaded once) built before timing, as the model's step holds
  it: the launches alone, no table build, no upload, no host sync. Their overhead column is
  against ``none_kernel``.
* peers (``experiments.bench.peers``, fetched by ``bash scripts/fetch_peers.sh``; Triton only):
  ``mamba_ssm`` (``mamba_chunk_scan_combined``) and ``fla`` (``chunk_simple_gla`` on B/C expanded
  per head, prepared outside the timing), each checked against the oracle first; ``peer_over_ours``
  is a peer's time over ``none_kernel``'s (above 1: ours is faster)
* ``sequential`` the token-by-token oracle (CPU, at a short length: it is slow by design)

On CUDA the Triton ``ssd_scan`` is timed with ``triton.testing.do_bench`` medians (bf16 inputs);
on a CPU the ``torch`` backend's ``ssd_scan_chunked`` is timed with ``time.perf_counter`` medians
(fp32 inputs); ``--impl triton`` on a CPU runs the Triton scan through the interpreter
(TRITON_INTERPRET=1: slow, tiny shapes only; the GPU script's ``--dry-run``). GB/s is against the
bytes the scan must move at least (the ``bytes_model`` column):
x and y, dt, B and C once each in the input dtype, plus the fp32 states read (initial) and written
(final and captured); ``pct_copy_bw`` is GB/s over the copy ceiling of ``--ceilings`` (a
``python -m experiments.bench.ceilings`` JSON). Correctness is checked before anything is reported:
the timed path against
the oracle on a short prefix, and the in-pass capture against the two-pass state at full length.

The mixer shapes are the model presets' (``model.config.PRESETS``: heads, head dim, state, groups).
Writes ``bench_ssd_scan.csv`` (device, versions, config, numbers) and a PNG drawn from the CSV into a
new ``runs/bench_ssd_scan/<timestamp>/`` (``--publish``: the record, ``results/bench_ssd_scan/``).

    python -m experiments.bench.ssd_scan                       # CPU default: a few minutes
    python -m experiments.bench.ssd_scan --tokens 8192,32768 --model bamba-9b,nemotron-h-8b
    python -m experiments.bench.ssd_scan --replot --publish    # redraw the PNG from the committed CSV
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from pathlib import Path

import torch

from experiments.bench.ratios import load_ceilings
from experiments.bench.scan_variants import (MIN_TOKENS, ScanBench, add_round_flags, add_scan_flags, capture_offsets,
                                             check_impl, gate_each, replot_csv, rows_at, time_cpu, time_variants)
from experiments.common.results_io import environment, log, read_csv, write_csv
from experiments.common.study import Context, Ran, Study, run_study
from kernels.reference.ssd import ssd_scan_sequential
from kernels.testing import assert_close
from kernels.torch_cpu.ssd import ssd_scan_chunked
from model.families import PRESETS


@dataclasses.dataclass(frozen=True)
class Shape:
    H: int
    P: int
    N: int
    G: int


def shape_of(preset: str) -> Shape:
    """The Mamba-2 mixer shape of a model preset."""
    c = PRESETS[preset]
    return Shape(H=c.mamba_n_heads, P=c.mamba_d_head, N=c.mamba_d_state, G=c.mamba_n_groups)


BYTES_MODEL = "es*(2*T*H*P + T*H + 2*T*G*N) + 4*H*P*N*(S + S + K)"


def make_inputs(T: int, shape: Shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    H, P, N, G = shape.H, shape.P, shape.N, shape.G
    x = torch.randn(T, H, P, generator=g).to(device, dtype)
    B = torch.randn(T, G, N, generator=g).to(device, dtype)
    C = torch.randn(T, G, N, generator=g).to(device, dtype)
    dt = (torch.randn(T, H, generator=g) * 0.5).to(device, dtype)
    dt_init = torch.exp(torch.rand(H, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = (dt_init + torch.log(-torch.expm1(-dt_init))).to(device)
    A = -torch.empty(H).uniform_(1.0, 16.0, generator=g).to(device)
    D = torch.randn(H, generator=g).to(device)
    init = (torch.randn(1, H, P, N, generator=g) * 0.5).to(device)
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, initial_states=init, cu_seqlens=cu)


def bytes_moved(T: int, shape: Shape, es: int, k: int, S: int = 1) -> int:
    H, P, N, G = shape.H, shape.P, shape.N, shape.G
    return es * (2 * T * H * P + T * H + 2 * T * G * N) + 4 * H * P * N * (S + S + k)


def two_pass(scan, inp: dict, o: int, **kw):
    """The fallback: [0, o) then [o, T) resumed from the first pass's final state."""
    T = inp["x"].shape[0]
    dev = inp["x"].device
    first = {**inp, **{k: inp[k][:o] for k in ("x", "dt", "B", "C")},
             "cu_seqlens": torch.tensor([0, o], dtype=torch.int32, device=dev)}
    a = scan(**first, **kw)
    second = {**inp, **{k: inp[k][o:] for k in ("x", "dt", "B", "C")}, "initial_states": a.final_states,
              "cu_seqlens": torch.tensor([0, T - o], dtype=torch.int32, device=dev)}
    b = scan(**second, **kw)
    return a, b


def check_correctness(scan, shape: Shape, dtype, device, chunk: int) -> None:
    """The timed path against the oracle on a short varlen batch with captures; refuses to go on."""
    lens = [300, 211]
    g = torch.Generator().manual_seed(1)
    parts = [make_inputs(n, shape, dtype, device, seed=i) for i, n in enumerate(lens)]
    inp = {k: torch.cat([p[k] for p in parts]) for k in ("x", "dt", "B", "C", "initial_states")}
    inp.update(A=parts[0]["A"], D=parts[0]["D"], dt_bias=parts[0]["dt_bias"],
               cu_seqlens=torch.tensor([0, 300, 511], dtype=torch.int32, device=device))
    offs = [[1, chunk - 1, chunk, chunk + 1, 299], [int(torch.randint(1, 211, (1,), generator=g))]]
    out = scan(**inp, capture_offsets=offs, chunk_size=chunk)
    ref = ssd_scan_sequential(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inp.items()},
                              capture_offsets=offs)
    assert_close(out.y.cpu(), ref.y, dtype, "correctness gate: y")
    assert_close(out.final_states.cpu(), ref.final_states, dtype, "correctness gate: final states")
    assert_close(out.captured_states.cpu(), ref.captured_states, dtype, "correctness gate: captured states")


SCAN = ScanBench(module="kernels.ssd_scan", scan="ssd_scan", plan="plan_ssd_scan", cpu_scan=ssd_scan_chunked,
                 tokens_key="x", two_pass=two_pass, capture_word="in-pass")
scan_under_test, kernel_only, variants_at, gate_capture = (SCAN.under_test, SCAN.kernel_only, SCAN.variants_at,
                                                           SCAN.gate_capture)


PEERS = ("mamba_ssm", "fla")


def load_peers(cuda: bool) -> dict:
    """name -> (make(inp, chunk) -> call, or None; note): the fetched peers (experiments.bench.peers)."""
    from experiments.bench import peers

    ver = peers.versions()
    mamba, why_m = peers.load_mamba_ssd()
    fla, why_f = peers.load_fla_simple_gla()
    out = {"mamba_ssm": ((lambda inp, chunk: peers.mamba_call(mamba, inp, chunk)) if mamba else None,
                         why_m or f"mamba_chunk_scan_combined ({ver.get('mamba-ssm', '?')})")}
    if fla is not None and not cuda:
        fla, why_f = None, "fla: its kernels do not run under the Triton interpreter (chunk_h.py: .to on a program id)"
    out["fla"] = ((lambda inp, chunk: peers.fla_call(fla, inp, peers.fla_inputs(inp))) if fla else None,
                  why_f or f"chunk_simple_gla on B/C expanded per head, prepared untimed ({ver.get('fla-core', '?')})")
    return out


def gate_peers(loaded: dict, shape: Shape, dtype, device, chunk: int) -> dict:
    """Each loadable peer checked against the oracle at T=300 before any timing; a failing one
    keeps only its note (the bench reports no time for it)."""
    from experiments.bench.peers import check_against_oracle

    inp = make_inputs(300, shape, dtype, device, seed=3)
    return gate_each(loaded, lambda make: check_against_oracle(make(inp, chunk), inp, dtype))


def bench_length(scan, gated: dict, shape_name: str, T: int, chunk: int, dtype, device, es: int, cuda: bool,
                 base: dict, args) -> list[dict]:
    """Gate the in-pass capture against two passes at full length, then time every variant and peer."""
    shape = shape_of(shape_name)
    inp = make_inputs(T, shape, dtype, device)
    variants = variants_at(scan, inp, T, chunk, base["impl"])
    gate_capture(variants, T, dtype)
    from experiments.bench.peers import shimmed

    variants.update({name: (0, shimmed(make(inp, chunk))) for name, (make, _) in gated.items() if make is not None})
    wall = time_variants(variants, cuda, args)
    common = dict(shape=shape_name, H=shape.H, P=shape.P, N=shape.N, G=shape.G, T=T)
    return rows_at(variants, wall, gated, base, common, T, lambda k: bytes_moved(T, shape, es, k), args, PEERS,
                   ms_digits=2)


def bench_sequential(scan, shape_name: str, chunk: int, dtype, device, es: int, base: dict, args) -> list[dict]:
    """Chunked vs the sequential oracle at one short length (the oracle costs ~ms a token here)."""
    shape = shape_of(shape_name)
    T = args.sequential_tokens
    inp = make_inputs(T, shape, dtype, device)
    rows = []
    for name, fn in (("chunked_short", lambda: scan(**inp, chunk_size=chunk)),
                     ("sequential", lambda: ssd_scan_sequential(**inp))):
        ts = [time_cpu(fn) for _ in range(max(1, args.repeats // 2))]
        ms = statistics.median(ts)
        nbytes = bytes_moved(T, shape, es, 0)
        rows.append(dict(base, loadavg_1m=round(os.getloadavg()[0], 2),
                         impl="torch-sequential" if name == "sequential" else base["impl"], shape=shape_name,
                         H=shape.H, P=shape.P, N=shape.N, G=shape.G, T=T, variant=name, captures=0, offsets="",
                         median_ms=round(ms, 4), min_ms=round(min(ts), 4), repeats=len(ts), bytes=nbytes,
                         gbps=round(nbytes / ms / 1e6, 3), overhead_vs_none_pct="",
                         min_overhead_vs_none_pct=""))
        log(f"  {shape_name} T={T:>6} {name:<13} {ms:10.2f} ms")
    return rows


def run(args) -> list[dict]:
    cuda, device, dtype, scan, impl = scan_under_test(args)
    es = torch.finfo(dtype).bits // 8
    env = environment(device)
    device_name = env["device_name"] if cuda else f"{env['device_name']}, {env['torch_threads']} threads"
    chunk = args.chunk_size or (256 if cuda else 128)
    peers = load_peers(cuda) if impl == "triton" and not args.no_peers else {}
    # the CSV's column order, as in earlier runs: environment, config, then loadavg_1m and impl (set per row)
    base = dict(device=device_name, torch=env["torch"], triton=env["triton"], dtype=str(dtype).split(".")[-1],
                chunk_size=chunk, bytes_model=BYTES_MODEL, loadavg_1m=None, impl=impl)
    rows = []
    for shape_name in args.model:
        check_correctness(scan, shape_of(shape_name), dtype, device, chunk)
        log(f"{shape_name}: correctness gate passed ({impl}, {dtype})")
        gated = gate_peers(peers, shape_of(shape_name), dtype, device, chunk)
        for T in args.tokens:
            rows += bench_length(scan, gated, shape_name, T, chunk, dtype, device, es, cuda, base, args)
        if not cuda and args.sequential_tokens:
            rows += bench_sequential(scan, shape_name, chunk, dtype, device, es, base, args)
    return rows


CAPTURE_GOAL_PCT = 3.0  # README: the GPU goal, SSD capture <= 3% overhead


def plot(csv_path: Path, png_path: Path) -> None:
    """Reads the CSV (not the in-memory rows) and draws median time and median overhead per variant (the
    statistic the README quotes), the min over rounds as a dot beside it, and the capture goal."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    rows = read_csv(csv_path)
    main = [r for r in rows if r["overhead_vs_none_pct"] != ""]
    has_min = bool(main) and all(r.get("min_overhead_vs_none_pct", "") != "" for r in main)
    groups = sorted({(r["shape"], int(r["T"])) for r in main}, key=lambda g: (g[0], g[1]))
    variants = list(dict.fromkeys(r["variant"] for r in main))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / max(1, len(variants))

    def at(g, v, key):
        return next((float(r[key]) for r in main if (r["shape"], int(r["T"])) == g and r["variant"] == v), 0.0)

    for i, v in enumerate(variants):
        c = fs.color(v)
        xs = [j + i * width for j in range(len(groups))]
        axes[0].bar(xs, [at(g, v, "median_ms") for g in groups], width, color=c, label=v)
        ov = [at(g, v, "overhead_vs_none_pct") for g in groups]
        b = axes[1].bar(xs, ov, width, color=c, label=f"{v} (median)")
        axes[1].bar_label(b, [f"{o:+.1f}" for o in ov], fontsize=7, padding=2,
                          bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.3))
        if has_min:
            axes[1].plot([x + 0.35 * width for x in xs], [at(g, v, "min_overhead_vs_none_pct") for g in groups],
                         linestyle="none",
                         marker="o", mfc="white", mec="k", ms=4, label="min over rounds" if i == 0 else None)
    labels = [f"{s}\nT={t}" for s, t in groups]
    for ax in axes:
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(groups))], labels)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("median time (ms)")
    axes[1].set_ylabel("overhead vs. no capture (%, median of rounds)")
    axes[1].axhline(0, color="k", lw=0.8)
    fs.goal_line(axes[1], CAPTURE_GOAL_PCT, f"capture <= {CAPTURE_GOAL_PCT:g}% (a GPU goal)")
    lo, hi = axes[1].get_ylim()
    axes[1].set_ylim(lo, max(hi, CAPTURE_GOAL_PCT) * 1.25)
    axes[0].legend(fontsize=8)
    fs.legend_outside(axes[1])
    dev = rows[0]["device"] if rows else ""
    extra = []
    seq = {r["variant"]: r for r in rows if r["variant"] in ("sequential", "chunked_short")}
    if len(seq) == 2:
        speedup = float(seq["sequential"]["median_ms"]) / float(seq["chunked_short"]["median_ms"])
        extra.append(f"chunked vs sequential oracle at T={seq['sequential']['T']}: {speedup:.1f}x faster")
    r0 = rows[0] if rows else {}
    fs.title(fig, "SSD prefill scan: in-pass capture vs two passes",
             model=f"mixer shape {', '.join(sorted({g[0] for g in groups}))} (H={r0.get('H')}, P={r0.get('P')}, "
                   f"N={r0.get('N')}), {r0.get('dtype', '')}, {r0.get('impl', '')}",
             device=f"{dev}, measured", extra=[f"medians of {r0.get('repeats', '?')} rounds"] + extra)
    fs.save(fig, png_path)


CSV_NAME, PNG_NAME = "bench_ssd_scan.csv", "bench_ssd_scan.png"
RECORD = "bench_ssd_scan"
CSV_COLUMNS = ("device", "impl", "shape", "T", "variant", "median_ms", "min_ms", "overhead_vs_none_pct",
               "min_overhead_vs_none_pct")


def add_flags(p) -> None:
    from experiments.bench import preset_names
    from experiments.common.flags import int_in_range, int_list

    p.add_argument("--model", type=preset_names, default=None,
                   help="model presets whose mixer shapes to time, comma-separated (absent: bamba-9b,nemotron-h-8b "
                        "on CUDA; small on CPU, where bamba-9b at 32K takes ~8 s a call)")
    p.add_argument("--tokens", type=int_list(MIN_TOKENS), default="8192,32768",
                   help="prefill lengths, comma-separated")
    p.add_argument("--chunk-size", type=int_in_range(1), default=None,
                   help="internal chunk (absent: 256 on CUDA, 128 on CPU; Triton needs a power of 2 >= 16)")
    add_round_flags(p)
    p.add_argument("--sequential-tokens", type=int_in_range(0), default=512,
                   help="CPU: length of the chunked-vs-sequential comparison (0 skips it)")
    add_scan_flags(p, "mamba_ssm, fla")


def check_args(p, args) -> None:
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = args.device.startswith("cuda")
    if args.model is None:
        args.model = ["bamba-9b", "nemotron-h-8b"] if cuda else ["small"]
    check_impl(p, args, cuda)
    ceilings = load_ceilings(args.ceilings)
    args.copy_gbps = ceilings["copy_gbps"] if ceilings else None
    chunk = args.chunk_size
    if args.impl == "triton" and chunk is not None and (chunk < 16 or chunk & (chunk - 1)):
        p.error(f"argument --chunk-size: the Triton scan needs a power of 2 >= 16, got {args.chunk_size}")


def replot(out: Path) -> list[Path]:
    """The PNG again from the CSV in `out` (checked first: a bad CSV is an InputError naming it)."""
    return replot_csv(out, CSV_NAME, PNG_NAME, CSV_COLUMNS, "bench_ssd_scan", plot)


def headline(rows: list[dict]) -> list[tuple]:
    """Min-of-rounds capture overheads at the longest length of the first shape, beside the record's."""
    from experiments.common.inputs import InputError, read_csv as read_rows
    from experiments.common.outputs import record_folder

    try:
        committed = read_rows(record_folder(RECORD) / CSV_NAME, CSV_COLUMNS)
    except InputError:
        committed = []
    main_rows = [r for r in rows if r["overhead_vs_none_pct"] != ""]
    if not main_rows:
        return []
    shape, T = main_rows[0]["shape"], max(r["T"] for r in main_rows if r["shape"] == main_rows[0]["shape"])
    out = []
    for variant in ("capture1", "capture4", "two_pass"):
        mine = next((r for r in main_rows if (r["shape"], r["T"], r["variant"]) == (shape, T, variant)), None)
        theirs = next((r for r in committed if (r["shape"], r["T"], r["variant"]) == (shape, str(T), variant)), None)
        if mine is not None:
            out.append((f"{shape} T={T} {variant} overhead % (min)", mine["min_overhead_vs_none_pct"],
                        None if theirs is None else float(theirs["min_overhead_vs_none_pct"])))
    return out


class SsdScanBench(Study):
    record = RECORD
    prog = "python -m experiments.bench.ssd_scan"
    description = __doc__.splitlines()[0]

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        if not ctx.reading:
            check_args(ctx.ap, ctx.args)

    def run(self, ctx: Context) -> Ran:
        rows = run(ctx.args)
        return Ran([write_csv(ctx.out / CSV_NAME, rows)], result=rows)

    def figures(self, ctx: Context) -> list[Path]:
        return replot(ctx.out)

    def headline(self, ctx: Context) -> list[tuple]:
        return headline(ctx.result)


STUDY = SsdScanBench()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
