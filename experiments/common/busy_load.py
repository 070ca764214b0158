"""Background load for a robustness run: a PyTorch matmul loop on its own threads, for a bounded time.

    python -m experiments.common.busy_load --threads 2 --seconds 300 &
    python -m experiments.warm_restore --out runs/warm_restore/busy

It stands for "another PyTorch job on the same cores" (its own OpenMP threads, busy the whole
time) while an experiment measures; it writes no file (so it has no --out), prints a progress
line every `--every` seconds and stops by itself after `--seconds`.
"""

from __future__ import annotations

import os
import time

import torch

from experiments.common.flags import int_in_range, new_parser
from experiments.common.results_io import log


def busy(threads: int, seconds: float, size: int, every_s: float = 60.0) -> int:
    """Multiply two size x size fp32 matrices on `threads` torch threads until `seconds` pass;
    returns the number of products. A progress line (seconds done, rate, ETA) every `every_s`."""
    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    n, start = 0, time.monotonic()
    end, next_line = start + seconds, start + every_s
    while (now := time.monotonic()) < end:
        torch.mm(a, b)
        n += 1
        if now >= next_line:
            next_line += every_s
            log(f"busy_load: {now - start:.0f}/{seconds:.0f} s, {n} products ({n / (now - start):.0f}/s), "
                f"{end - now:.0f} s left")
    return n


def main(argv=None) -> int:
    ap = new_parser(__doc__.splitlines()[0], prog="python -m experiments.common.busy_load")
    ap.add_argument("--threads", type=int_in_range(1), default=os.cpu_count() or 1,
                    help="torch threads of the load (default: every core of this machine)")
    ap.add_argument("--seconds", type=int_in_range(1, 24 * 3600), default=600, help="how long to run, then stop")
    ap.add_argument("--size", type=int_in_range(16, 8192), default=512,
                    help="matrix side (512: ~0.27 GFLOP per product, short enough to stop on time)")
    ap.add_argument("--every", type=int_in_range(1), default=60, help="seconds between progress lines")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    n = busy(args.threads, args.seconds, args.size, args.every)
    dt = time.perf_counter() - t0
    log(f"busy_load: {n} products of {args.size}x{args.size} on {args.threads} thread(s) in {dt:.0f} s "
        f"({2 * args.size**3 * n / dt / 1e9:.1f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
