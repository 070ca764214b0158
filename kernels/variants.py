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
    num_stages: int = 2
    divisible_by_16: tuple[str, ...] = ()  # args the launcher guarantees are multiples of 16
