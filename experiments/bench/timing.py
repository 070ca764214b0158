"""One timer for every bench, with `triton.testing.do_bench`'s signature: on CUDA it is do_bench
(CUDA events, median); on a CPU (the GPU script's `--dry-run`, Triton through its interpreter) a
`time.perf_counter` median, so the same bench code runs in both places."""

from __future__ import annotations

import statistics
import time


def cpu_do_bench(fn, warmup: float = 25, rep: float = 100, return_mode: str = "median") -> float:
    """Median (or min) wall ms of `fn()`: one warm-up call, then calls until `rep` ms have passed
    (at least one, at most 50). `warmup` is accepted for do_bench's signature; one call warms up."""
    if return_mode not in ("median", "min"):
        raise ValueError(f"return_mode: expected 'median' or 'min', got {return_mode!r}")
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while not times or (len(times) < 50 and (time.perf_counter() - start) * 1e3 < rep):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times) if return_mode == "median" else min(times)


def bench_fn(device: str):
    """`do_bench` for a CUDA device, else `cpu_do_bench`."""
    if str(device).startswith("cuda"):
        from triton.testing import do_bench

        return do_bench
    return cpu_do_bench


def synchronize(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
