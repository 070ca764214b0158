"""What a kernel file declares for the compile check: the specializations its launcher builds.

Each kernel module registers them with a module-level ``compile_variants() -> list[KernelVariant]``;
`kernels.compile_check` discovers those functions and compiles every variant for sm_90 and sm_80.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """One specialization of a `@triton.jit` function, as the launcher would build it."""

    name: str  # readable id, e.g. "paged_attention/decode/bf16/d128/bs16"
    fn: Any  # the triton.JITFunction
    signature: dict[str, str]  # arg name -> "*fp32", "i32", "constexpr", ...
    constexprs: dict[str, Any]  # constexpr arg name -> value
    num_warps: int = 4
    num_stages: int = 3  # what a launch without num_stages runs with (Triton's CUDA default)
    # Args the JIT would specialize as multiples of 16 at the model's shapes: pointers (16-byte
    # aligned torch allocations and the projection views the model passes) and int sizes/strides.
    divisible_by_16: tuple[str, ...] = ()
    # The compute capabilities (90, 80, ...) the launcher picks this variant for; () = every target.
    targets: tuple[int, ...] = ()


def aligned_args(fn, signature: dict[str, str], constexprs: dict, not_aligned: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every pointer argument of `fn` plus its int arguments named stride_* / H / P / N / D (multiples
    of 16 at Bamba-9B's shapes), minus `not_aligned`: the divisibility the runtime build would see."""
    sizes = {"H", "P", "N", "D", "PN"}
    out = []
    for a in fn.arg_names:
        if a in constexprs or a in not_aligned:
            continue
        t = signature.get(a, "")
        if t.startswith("*") or (t == "i32" and (a.startswith("stride_") or a in sizes)):
            out.append(a)
    return tuple(out)
