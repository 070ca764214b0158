"""Measure the device's two ceilings in this run: a large device copy's GB/s (bytes read + written)
and a large GEMM's TFLOP/s on random data (bf16 on CUDA), the rates every bench's floor divides by.

METHOD.md's rule: datasheet rates are leads; measure the two once per run, on the card as found.
The seen H200 figures (KINDS.md, 2026-11): copy ~4.3 TB/s, bf16 8192^3 GEMM 769-798 TFLOP/s.

    python -m experiments.bench.ceilings --out DIR                      # CUDA: 4 GiB copy, 8192^3 bf16 GEMM
    python -m experiments.bench.ceilings --device cpu --copy-mib 16 --gemm-size 256 --out DIR   # a dry run

Writes ``ceilings.json`` (device, versions, sizes, copy_gbps, gemm_tflops, dtype) into --out (or a
new ``runs/bench_ceilings/<timestamp>/``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from experiments.common.results_io import environment, log, write_json
from experiments.common.study import Context, Study, run_study

RECORD = "bench_ceilings"
JSON_NAME = "ceilings.json"


def copy_gbps(device: str, total_bytes: int, bench, warmup: int, rep: int) -> float:
    """GB/s of dst.copy_(src), src and dst together `total_bytes`, counting read + write."""
    src = torch.empty(total_bytes // 4, dtype=torch.bfloat16, device=device).normal_()  # random: METHOD.md
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), warmup=warmup, rep=rep, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def gemm_tflops(device: str, n: int, dtype, bench, warmup: int, rep: int) -> float:
    """TFLOP/s of an n x n x n matmul on random inputs (2 n^3 flops), the output preallocated."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    ms = bench(lambda: torch.matmul(a, b, out=c), warmup=warmup, rep=rep, return_mode="median")
    return 2 * n**3 / (ms * 1e-3) / 1e12


def measure(args) -> dict:
    from experiments.bench.timing import bench_fn

    device = args.device
    bench = bench_fn(device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32  # CPU bf16 GEMMs are not the ceiling
    total = args.copy_mib * 2**20
    copy = copy_gbps(device, total, bench, args.warmup, args.rep)
    log(f"copy: {copy:.1f} GB/s ({args.copy_mib} MiB src + dst, read + write)")
    gemm = gemm_tflops(device, args.gemm_size, dtype, bench, args.warmup, args.rep)
    log(f"gemm: {gemm:.2f} TFLOP/s ({args.gemm_size}^3, {str(dtype).split('.')[-1]}, random inputs)")
    return dict(environment=environment(device), copy_bytes=total, copy_gbps=float(f"{copy:.4g}"),
                gemm_size=args.gemm_size, gemm_dtype=str(dtype).split(".")[-1], gemm_tflops=float(f"{gemm:.4g}"))


class Ceilings(Study):
    record = RECORD
    prog = "python -m experiments.bench.ceilings"
    description = __doc__.splitlines()[0]
    replot = False

    def add_flags(self, p) -> None:
        from experiments.common.flags import device_name, int_in_range

        p.add_argument("--device", type=device_name, default=None, help="cuda or cpu (absent: cuda if present)")
        p.add_argument("--copy-mib", type=int_in_range(1), default=4096,
                       help="bytes in the copy's source + destination together, MiB")
        p.add_argument("--gemm-size", type=int_in_range(16), default=8192, help="M = N = K of the GEMM")
        p.add_argument("--warmup", type=int_in_range(1), default=25, help="do_bench warm-up, ms")
        p.add_argument("--rep", type=int_in_range(1), default=200, help="do_bench repetition time, ms")

    def check(self, ctx: Context) -> None:
        args = ctx.args
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            ctx.error("argument --device: cuda asked for, but torch sees no CUDA device")

    def run(self, ctx: Context) -> list[Path]:
        return [write_json(ctx.out / JSON_NAME, measure(ctx.args))]


STUDY = Ceilings()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
