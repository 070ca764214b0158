"""What this CPU can do, and the CPU routes chosen from it: decided once per process, then cached.

The CPU path used to hard-code one machine's trade-offs (every bf16 matmul as an fp32 product,
because bf16 ran 60x slower on a CPU without AVX512-BF16). Here the routes come from the machine:

* `fp32_matmul`: "onednn" (`torch.ops.mkldnn._linear_pointwise`) where a short start-up probe
  times it faster than "mkl" (`F.linear`, torch's BLAS) by `ONEDNN_MARGIN`, else "mkl". Both are
  IEEE fp32 products (no TF32/bf16: oneDNN runs only while torch's fp32 matmul precision is
  "highest"). On the AMD EPYC (AVX-512, AVX512-BF16) of issue 35, MKL took 55 ms for a
  (512 x 256) @ (256 x 2048) product and oneDNN 3.2 ms, one thread (MKL's fastest paths are
  known to check for an Intel CPU); vLLM's CPU backend also runs its unquantized linears through
  oneDNN (one prepacked handle per weight). On an Intel Xeon with AMX (2026-12-07) the two tie
  (probe 2.6 vs 2.7 ms; 16K prefills of granite-dense-cpu pinned to each: 4.60 / 4.60 s MKL, 4.34 /
  4.61 s oneDNN CPU), and MKL, torch's default, is kept.
* `bf16_matmul`: "native" (torch's bf16 GEMM, oneDNN, fp32 accumulation) where the CPU has
  AVX512-BF16 or AMX-BF16 and torch's oneDNN says it supports bf16; "fp32_products" elsewhere (the
  upcast operands' fp32 product rounded once: 15 ms against 963 ms native on the AVX2 laptop).
  On the EPYC: 1.7 ms native against 56 ms as fp32 products for (512 x 256) @ (256 x 2048).
* `fp16_matmul`: "native" only with AVX512-FP16 or AMX-FP16, else "fp32_products".
* `bf16_attention`: "native" (SDPA's CPU flash kernel on bf16 inputs, fp32 accumulation) where
  the CPU has AMX-BF16 (its tile GEMMs), else "fp32" (inputs upcast). AVX512-BF16 alone does not
  pay: on the EPYC a decode step at 16K context took 18-23 ms of CPU native against 13-17 ms
  upcast (6 alternating pairs), and a 4096-token causal prefill 398 ms against 404 ms. On the
  Intel Xeon with AMX, granite-dense-cpu bf16, a decode step at 16K took 8.2 / 11.4 ms native
  against 14.6 / 15.0 ms upcast (two alternating pairs, load ~3; since the decode row reads its
  blocks in place, which only the native route can: the EPYC figures predate that).
* `allocator`: "reuse" (glibc keeps freed memory: no mmap per large tensor, no trim) where the
  probe finds first-touching a fresh 40 MiB tensor `PAGE_FAULT_RATIO` times slower than
  rewriting a held one; else "default". On the EPYC VM a fresh 32 MiB output cost 100 ms of page
  faults against 2.3 ms for the `silu` that filled it (vLLM's CPU platform preloads tcmalloc).

`cpu_routes()` is the one entry point: it detects, probes (~0.2 s), applies the allocator route
and caches the result; `KERNELS_CPU_ROUTES="fp32_matmul=mkl,bf16_matmul=fp32_products"` overrides
any route (for paired comparisons), and `routes_record()` is what every result records.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from kernels.checks import require

ONEDNN_MARGIN = 0.9  # oneDNN wins only if its probe time is below 0.9x MKL's: a tie keeps torch's default
PAGE_FAULT_RATIO = 2.0  # fresh/held first-touch time above which freed memory is kept for reuse
ENV_OVERRIDE = "KERNELS_CPU_ROUTES"

ROUTE_CHOICES: dict[str, tuple[str, ...]] = {
    "fp32_matmul": ("mkl", "onednn"),
    "bf16_matmul": ("native", "fp32_products"),
    "fp16_matmul": ("native", "fp32_products"),
    "bf16_attention": ("native", "fp32"),
    "allocator": ("default", "reuse"),
}


@dataclass(frozen=True)
class CpuCapabilities:
    """What the CPU and this torch build can do (detected, not measured)."""

    avx2: bool = False
    avx512: bool = False
    avx512_bf16: bool = False
    avx512_fp16: bool = False
    amx_bf16: bool = False
    amx_fp16: bool = False
    onednn: bool = False  # torch built with oneDNN and `torch.ops.mkldnn._linear_pointwise` present
    onednn_bf16: bool = False  # torch's oneDNN reports bf16 support
    glibc: bool = False  # `mallopt` reachable (the allocator route)


@dataclass(frozen=True)
class CpuProbe:
    """Start-up timings (seconds, min over alternating repeats, one call each)."""

    fp32_mkl_s: float | None = None
    fp32_onednn_s: float | None = None
    fresh_touch_s: float | None = None
    held_touch_s: float | None = None


@dataclass(frozen=True)
class CpuRoutes:
    fp32_matmul: str = "mkl"
    bf16_matmul: str = "fp32_products"
    fp16_matmul: str = "fp32_products"
    bf16_attention: str = "fp32"
    allocator: str = "default"

    def __post_init__(self):
        for name, allowed in ROUTE_CHOICES.items():
            value = getattr(self, name)
            require(value in allowed, name, f"must be one of {', '.join(allowed)}, got {value!r}")


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _torch_cpu_flag(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)  # private helpers (torch >= 2.3); absent: fall back to cpuinfo
    try:
        return bool(fn()) if fn is not None else False
    except RuntimeError:
        return False


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


@functools.cache
def detect() -> CpuCapabilities:
    """The CPU's ISA extensions (cpuinfo flags, or torch's own cpuinfo where /proc is absent) and
    what this torch build offers."""
    flags = _cpuinfo_flags()
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    try:
        onednn_bf16 = onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn_bf16 = False
    return CpuCapabilities(
        avx2="avx2" in flags or _torch_cpu_flag("_is_avx2_supported"),
        avx512="avx512f" in flags or _torch_cpu_flag("_is_avx512_supported"),
        avx512_bf16="avx512_bf16" in flags or _torch_cpu_flag("_is_avx512_bf16_supported"),
        avx512_fp16="avx512_fp16" in flags,
        amx_bf16="amx_bf16" in flags or _torch_cpu_flag("_is_amx_tile_supported"),
        amx_fp16="amx_fp16" in flags or _torch_cpu_flag("_is_amx_fp16_supported"),
        onednn=onednn, onednn_bf16=onednn_bf16, glibc=_libc() is not None)


def _min_time(fns: dict, repeats: int, warm: bool = True) -> dict[str, float]:
    """Min wall time of each callable over `repeats` rounds, the order flipping each round (a
    machine shared with other jobs: alternation spreads their load over both sides)."""
    for f in fns.values() if warm else ():
        f()  # first call: oneDNN primitive creation, lazy init
    best = {k: float("inf") for k in fns}
    items = list(fns.items())
    for r in range(repeats):
        for k, f in (items if r % 2 == 0 else items[::-1]):
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def probe(caps: CpuCapabilities, repeats: int = 5) -> CpuProbe:
    """Time fp32 products through MKL and oneDNN at two transformer shapes (256 rows; hidden 256
    to an up-projection of 2048 and back from 1024), and first-touching a fresh 40 MiB tensor
    against rewriting a held one. One thread, ~0.2 s (0.6 s at load 10 on 2 cores)."""
    # On the CPU whatever the caller's default device: a checkpoint load builds the first model under
    # torch.device("meta") (model/loading.py), where every product took 4-22 us and the routes fell by chance
    with torch.device("cpu"):
        return _probe_on_cpu(caps, repeats)


def _probe_on_cpu(caps: CpuCapabilities, repeats: int) -> CpuProbe:
    g = torch.Generator().manual_seed(0)
    shapes = ((256, 256, 2048), (256, 1024, 256))  # (rows, in, out)
    xs = [(torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)) for m, k, n in shapes]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fns = {"mkl": lambda: [torch.nn.functional.linear(x, w) for x, w in xs]}
        if caps.onednn:
            fns["onednn"] = lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for x, w in xs]
        mm = _min_time(fns, repeats)
        n = 10 * 2**20  # 40 MiB of fp32, above glibc's largest mmap threshold (32 MiB)
        held = torch.ones(n)
        touch = _min_time({"fresh": lambda: torch.empty(n).fill_(1.0), "held": lambda: held.fill_(1.0)}, 2, warm=False)
    finally:
        torch.set_num_threads(threads)
    return CpuProbe(fp32_mkl_s=mm["mkl"], fp32_onednn_s=mm.get("onednn"),
                    fresh_touch_s=touch["fresh"], held_touch_s=touch["held"])


def choose_routes(caps: CpuCapabilities, measured: CpuProbe | None = None) -> CpuRoutes:
    """The documented rule (module docstring); without a probe, the measured routes keep torch's
    defaults (MKL, glibc's allocator)."""
    half_bf16 = caps.onednn_bf16 and (caps.avx512_bf16 or caps.amx_bf16)
    half_fp16 = caps.avx512_fp16 or caps.amx_fp16
    onednn_faster = (caps.onednn and measured is not None and measured.fp32_onednn_s is not None
                     and measured.fp32_mkl_s is not None
                     and measured.fp32_onednn_s < ONEDNN_MARGIN * measured.fp32_mkl_s)
    faults_costly = (caps.glibc and measured is not None and measured.fresh_touch_s is not None
                     and measured.held_touch_s is not None
                     and measured.fresh_touch_s > PAGE_FAULT_RATIO * measured.held_touch_s)
    return CpuRoutes(
        fp32_matmul="onednn" if onednn_faster else "mkl",
        bf16_matmul="native" if half_bf16 else "fp32_products",
        fp16_matmul="native" if half_fp16 else "fp32_products",
        bf16_attention="native" if caps.onednn_bf16 and caps.amx_bf16 else "fp32",
        allocator="reuse" if faults_costly else "default")


def parse_override(text: str) -> dict[str, str]:
    """`"fp32_matmul=mkl,allocator=default"` -> {"fp32_matmul": "mkl", "allocator": "default"}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        require(bool(eq) and name in ROUTE_CHOICES, ENV_OVERRIDE,
                f"expected name=value with name one of {', '.join(ROUTE_CHOICES)}, got {part!r}")
        require(value in ROUTE_CHOICES[name], ENV_OVERRIDE,
                f"{name} must be one of {', '.join(ROUTE_CHOICES[name])}, got {value!r}")
        out[name] = value
    return out


def _apply_allocator(route: str) -> None:
    """glibc: serve every allocation from the heap (M_MMAP_MAX 0) and never trim it
    (M_TRIM_THRESHOLD 16 GiB, M_TOP_PAD 256 MiB), so a freed activation's pages are reused instead
    of unmapped and faulted in again. A process-wide setting: the process keeps its peak memory."""
    libc = _libc()
    if route == "reuse" and libc is not None:
        M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
        libc.mallopt(M_MMAP_MAX, 0)
        libc.mallopt(M_TRIM_THRESHOLD, 16 * 2**30)
        libc.mallopt(M_TOP_PAD, 256 * 2**20)


_DECIDED: list[tuple[CpuRoutes, CpuProbe | None, dict[str, str]]] = []
_FORCED: list[CpuRoutes] = []  # `forced_routes` blocks, innermost last


@contextlib.contextmanager
def forced_routes(**routes: str) -> Iterator[CpuRoutes]:
    """These routes (the rest as decided) inside the block: a paired comparison or a test of one
    route on any machine. The allocator route is not re-applied."""
    forced = dataclasses.replace(cpu_routes(), **routes)
    _FORCED.append(forced)
    try:
        yield forced
    finally:
        _FORCED.pop()


def cpu_routes() -> CpuRoutes:
    """The routes for this process: detected, probed and applied on the first call, then cached."""
    if _FORCED:
        return _FORCED[-1]
    if not _DECIDED:
        override = parse_override(os.environ.get(ENV_OVERRIDE, ""))
        caps = detect()
        measured = probe(caps)
        routes = dataclasses.replace(choose_routes(caps, measured), **override)
        _apply_allocator(routes.allocator)
        _DECIDED.append((routes, measured, override))
    return _DECIDED[0][0]


def routes_record() -> dict:
    """The routes, the capabilities and the probe they came from: recorded beside every result."""
    routes = cpu_routes()
    _, measured, override = _DECIDED[0]
    return {"routes": dataclasses.asdict(routes), "capabilities": dataclasses.asdict(detect()),
            "probe_s": dataclasses.asdict(measured) if measured is not None else None,
            "overridden": sorted(override)}
