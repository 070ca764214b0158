"""Triton helpers the chunked scans share (`ssd_scan`, `gated_delta_rule`): a 1-D grid's program id
split into tile, head and chunk indices, and a `tl.dot` that stays exact under the interpreter.

* `unflatten2` / `unflatten3`: every chunk-parallel stage runs on a 1-D grid, fastest index first, so
  the tiles of one (chunk, head) are adjacent programs and share what they read in L2
  (kernels/ssd_scan.py says what that saves at T=32K), and no grid axis meets the 65535 limit of
  axes 1 and 2. The slower indices come back as int64: they multiply strides.
* `dot`: Triton 3.9's interpreter multiplies bf16 `tl.dot` operands as raw 16-bit integers (1e10-sized
  garbage); fp32 operands built from the same values give the exact products, so under the
  interpreter the dot runs in fp32. Compiled kernels never take that branch.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET_DOT_FP32 = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


@triton.jit
def dot(a, b, DOT_PRECISION: tl.constexpr):
    if INTERPRET_DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def unflatten2(n_fast):
    """The flat program id as (fast index, slow index (int64))."""
    pid = tl.program_id(0)
    return pid % n_fast, (pid // n_fast).to(tl.int64)


@triton.jit
def unflatten3(n_fast, n_mid):
    """The flat program id as (fast index, middle index (int64), slow index (int64))."""
    pid = tl.program_id(0)
    rest = pid // n_fast
    return pid % n_fast, (rest % n_mid).to(tl.int64), (rest // n_mid).to(tl.int64)
