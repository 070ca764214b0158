"""What the prefill-scan benches (`ssd_scan`, `gated_delta_rule`) share: the capture offsets, the scan
under test, the kernel-only calls (plan built and uploaded before timing) and the variants timed at
one length. A `ScanBench` names the scan: its Triton module, scan and plan builder, the CPU path, the
key of the token tensor in its inputs and its two-pass fallback.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from experiments.bench.ratios import add_peer_ratios, pct_of
from experiments.common.results_io import log
from kernels.testing import assert_close

BLOCK = 16  # KV block size: capture offsets are block-aligned like the planner's snapshots
MIN_TOKENS = 5 * BLOCK + 1  # room for 4 distinct block-aligned capture offsets below the tail


def capture_offsets(T: int, k: int) -> list[int]:
    """The prompt-tail split point ((T-1)//BLOCK - 1) * BLOCK, and for k=4 three interior block
    boundaries that are not multiples of the internal chunk (a worst case for a chunk cut)."""
    tail = ((T - 1) // BLOCK) * BLOCK - BLOCK
    if k == 1:
        return [tail]
    interior = [o for o in dict.fromkeys((T // 4 + 3 * BLOCK, T // 2 + 5 * BLOCK, 3 * T // 4 + 7 * BLOCK))
                if 0 < o < tail]
    fill = (o for o in range(tail - BLOCK, 0, -BLOCK) if o not in interior)  # short T: block boundaries
    while len(interior) < k - 1:
        interior.append(next(fill))
    return sorted({*interior, tail})[:k]


@dataclasses.dataclass(frozen=True)
class ScanBench:
    module: str  # the Triton scan's module, imported only when it is timed
    scan: str  # its scan function
    plan: str  # its plan builder: plan(lens, offsets, chunk, tables)
    cpu_scan: Callable  # the CPU path (fp32)
    tokens_key: str  # the input holding the (T, ...) token tensor
    two_pass: Callable  # two_pass(scan, inp, o, **kw): the fallback
    capture_word: str  # how the gate's messages name the one-scan capture ("in-pass", "in-launch")

    def triton(self, name: str):
        return getattr(importlib.import_module(self.module), name)

    def under_test(self, args) -> tuple:
        """(cuda, device, dtype, scan, impl): the Triton scan (bf16 on CUDA, fp32 through the interpreter
        on a CPU), else the CPU path in fp32."""
        cuda = args.device.startswith("cuda")
        if args.impl == "triton":
            return cuda, args.device, torch.bfloat16 if cuda else torch.float32, self.triton(self.scan), "triton"
        return False, "cpu", torch.float32, self.cpu_scan, "torch-chunked"

    def kernel_only(self, inp: dict, offsets, chunk: int):
        """The Triton scan with its plan built and uploaded once, here: each call is the launches alone."""
        from kernels.contracts.packed import IntTables

        scan, plan_of = self.triton(self.scan), self.triton(self.plan)
        tokens = inp[self.tokens_key]
        tables = IntTables()
        plan = plan_of([tokens.shape[0]], offsets, chunk, tables)
        tables.upload(tokens.device)
        return lambda: scan(**inp, capture_offsets=offsets, chunk_size=chunk, plan=plan)

    def variants_at(self, scan, inp: dict, T: int, chunk: int, impl: str) -> dict:
        """name -> (captures, call) for one prefill length (the bench adds its peers)."""
        o1, o4 = capture_offsets(T, 1), capture_offsets(T, 4)
        variants = {
            "none": (0, lambda: scan(**inp, chunk_size=chunk)),
            "capture1": (1, lambda: scan(**inp, capture_offsets=[o1], chunk_size=chunk)),
            "capture4": (4, lambda: scan(**inp, capture_offsets=[o4], chunk_size=chunk)),
            "two_pass": (1, lambda: self.two_pass(scan, inp, o1[0], chunk_size=chunk)),
        }
        if impl == "triton":
            variants.update(none_kernel=(0, self.kernel_only(inp, None, chunk)),
                            capture1_kernel=(1, self.kernel_only(inp, [o1], chunk)),
                            capture4_kernel=(4, self.kernel_only(inp, [o4], chunk)))
        return variants

    def gate_capture(self, variants: dict, T: int, dtype) -> None:
        """Full-length gate: the one-scan capture equals the two-pass boundary state."""
        c1 = variants["capture1"][1]()
        a, b = variants["two_pass"][1]()
        w = self.capture_word
        assert_close(c1.captured_states[0], a.final_states[0], dtype, f"T={T}: {w} capture vs two-pass")
        assert_close(c1.final_states, b.final_states, dtype, f"T={T}: final state, {w} vs two-pass")


def overhead_base(name: str, wall: dict, peers: tuple) -> str:
    """The variant a row's overhead is against: none_kernel for the kernel-only and peer rows (where timed)."""
    kernel_row = name.endswith("_kernel") or name in peers
    return "none_kernel" if kernel_row and "none_kernel" in wall else "none"


def gate_each(loaded: dict, check: Callable) -> dict:
    """Each loadable peer checked against the oracle before any timing (`check(make)` -> (ok, note)); a
    failing one keeps only its note (the bench reports no time for it)."""
    gated = {}
    for name, (make, note) in loaded.items():
        if make is None:
            gated[name] = (None, note)
            continue
        try:
            ok, err = check(make)
        except Exception as exc:  # noqa: BLE001  (a peer that cannot run this shape is recorded, not fatal)
            gated[name] = (None, f"failed: {type(exc).__name__}: {exc}"[:200])
            log(f"  peer {name}: {gated[name][1]}")
            continue
        log(f"  peer {name}: {'matches' if ok else 'WRONG vs'} the oracle ({err})")
        gated[name] = (make, f"{note}; {err}") if ok else (None, f"WRONG vs the oracle ({err}): not reported")
    return gated


def time_cpu(fn) -> float:
    """Wall ms of one call. (Process CPU time is no better under contention: torch's OpenMP
    threads spin at barriers while a sibling is descheduled, so it inflates with the wall clock.)"""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_variants(variants: dict, cuda: bool, args) -> dict[str, list[float]]:
    """Wall ms per variant: one do_bench median on CUDA; on a CPU, interleaved rotated rounds."""
    wall: dict[str, list[float]] = {v: [] for v in variants}
    if cuda:
        import triton.testing

        for name, (_, fn) in variants.items():
            wall[name] = [triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median")]
        return wall
    for name, (_, fn) in variants.items():  # warm-up
        fn()
    order = list(variants)
    for r in range(args.repeats):  # interleaved, rotated rounds: noise hits every variant alike
        for name in order[r % len(order):] + order[:r % len(order)]:
            wall[name].append(time_cpu(variants[name][1]))
    return wall


def rows_at(variants: dict, wall: dict, gated: dict, base: dict, common: dict, T: int, nbytes_of: Callable,
            args, peers: tuple, ms_digits: int) -> list[dict]:
    """One CSV row per timed variant at length T (overheads against `overhead_base`, GB/s against
    `nbytes_of(captures)`, the problem's bytes for peers too), one per peer that failed its gate, and the
    peer-over-ours ratios; logs each timed row (`ms_digits` decimals)."""
    o1, o4 = capture_offsets(T, 1), capture_offsets(T, 4)
    rows = []
    for name, (k, _) in variants.items():
        ms, ms_min = statistics.median(wall[name]), min(wall[name])
        ref = overhead_base(name, wall, peers)
        ref_ms, ref_min = statistics.median(wall[ref]), min(wall[ref])
        nbytes = nbytes_of(k)
        rows.append(dict(base, loadavg_1m=round(os.getloadavg()[0], 2), impl=name if name in peers else base["impl"],
                         **common, variant=name, captures=k,
                         offsets=" ".join(map(str, {0: [], 1: o1, 4: o4}[k])) if name != "two_pass" else str(o1[0]),
                         median_ms=round(ms, 4), min_ms=round(ms_min, 4), repeats=len(wall[name]),
                         bytes=nbytes, gbps=round(nbytes / ms / 1e6, 3),
                         pct_copy_bw=pct_of(nbytes / ms / 1e6, args.copy_gbps),
                         overhead_vs_none_pct=round(100 * (ms / ref_ms - 1), 2),
                         min_overhead_vs_none_pct=round(100 * (ms_min / ref_min - 1), 2), overhead_vs=ref,
                         note=gated.get(name, (None, ""))[1]))
        log(f"  {common['shape']} T={T:>6} {name:<16} median {ms:9.{ms_digits}f} ms {100 * (ms / ref_ms - 1):+6.2f}% "
            f"vs {ref:<11} min {ms_min:9.{ms_digits}f} ms  {nbytes / ms / 1e6:7.2f} GB/s")
    rows += [dict(base, impl=name, **common, variant=name, captures=0, overhead_vs_none_pct="",
                  min_overhead_vs_none_pct="", note=note) for name, (make, note) in gated.items() if make is None]
    return add_peer_ratios(rows, ("shape", "T"), "none_kernel" if base["impl"] == "triton" else "none",
                           impl="variant", ms="median_ms", peers=peers)


# ---- the command line and the figure's rerun -----------------------------------------------------

def add_round_flags(p) -> None:
    """How long each variant is timed: CPU rounds, CUDA do_bench windows."""
    from experiments.common.flags import int_in_range

    p.add_argument("--repeats", type=int_in_range(1), default=7, help="CPU: timed rounds per variant (median reported)")
    p.add_argument("--warmup-ms", type=int_in_range(1), default=100, help="CUDA: do_bench warm-up time")
    p.add_argument("--rep-ms", type=int_in_range(1), default=500, help="CUDA: do_bench measuring time")


def add_scan_flags(p, peer_names: str) -> None:
    """Where and which scan runs, the peers (`peer_names`, for the help), the copy ceiling."""
    from experiments.common.flags import device_name

    p.add_argument("--device", type=device_name, default=None,
                   help="cuda (the Triton scan, bf16) or cpu (the torch path, fp32); absent: cuda if present")
    p.add_argument("--impl", choices=("triton", "torch"), default=None,
                   help="the scan timed (absent: triton on CUDA, torch on a CPU; triton on a CPU needs "
                        "TRITON_INTERPRET=1)")
    p.add_argument("--no-peers", action="store_true", help=f"time no peer ({peer_names})")
    p.add_argument("--ceilings", type=Path, default=None,
                   help="a ceilings.json (python -m experiments.bench.ceilings) for the pct_copy_bw column")


def check_impl(p, args, cuda: bool) -> None:
    """--impl's default (triton on CUDA, torch on a CPU) and the two pairings that cannot run."""
    args.impl = args.impl or ("triton" if cuda else "torch")
    if cuda and args.impl == "torch":
        p.error("argument --impl: torch is the CPU path; on CUDA the bench times the Triton scan")
    if not cuda and args.impl == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("argument --impl: triton on a CPU runs only through the interpreter (set TRITON_INTERPRET=1)")


def replot_csv(out: Path, csv_name: str, png_name: str, columns: tuple, what: str, plot: Callable) -> list[Path]:
    """The PNG again from the CSV in `out` (checked first: a bad CSV is an InputError naming it and `what`)."""
    from experiments.common.inputs import InputError, read_csv as read_rows

    csv_path = out / csv_name
    read_rows(csv_path, columns, what=f"a {what} CSV")
    try:
        plot(csv_path, out / png_name)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InputError(f"{csv_path}: not a {what} CSV ({type(err).__name__}: {err})") from None
    return [out / png_name]
