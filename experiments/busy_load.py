"""Background load for a robustness run: a PyTorch matmul loop on its own threads, for a bounded time.

    python -m experiments.busy_load --threads 2 --seconds 300 &
    python -m experiments.warm_restore --out /tmp/warm_restore_busy

It stands for "another PyTorch job on the same cores" (its own OpenMP threads, busy the whole
time) while an experiment measures; it writes nothing and stops by itself after `--seconds`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from experiments.flags import int_in_range


def busy(threads: int, seconds: float, size: int) -> int:
    """Multiply two size x size fp32 matrices on `threads` torch threads until `seconds` pass;
    returns the number of products."""
    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, b)
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int_in_range(1), default=os.cpu_count() or 1,
                    help="torch threads of the load (default: every core)")
    ap.add_argument("--seconds", type=int_in_range(1, 24 * 3600), default=600, help="how long to run, then stop")
    ap.add_argument("--size", type=int_in_range(16, 8192), default=512,
                    help="matrix side (512: ~0.27 GFLOP per product, short enough to stop on time)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    n = busy(args.threads, args.seconds, args.size)
    dt = time.perf_counter() - t0
    print(f"busy_load: {n} products of {args.size}x{args.size} on {args.threads} thread(s) in {dt:.0f} s "
          f"({2 * args.size**3 * n / dt / 1e9:.1f} GFLOP/s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
