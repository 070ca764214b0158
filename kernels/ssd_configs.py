"""The SSD scan's tile configs: a small table per (Triton version, device capability, input dtype).

Each entry gives the tile sizes (caps: a launch clamps them to its chunk, P and N, and tl.dot
needs >= 16 a side), num_warps and num_stages of the five SSD kernels at the model's shapes
(chunk 256, P=64, N=64/128). A device without an entry uses its major version's (sm_86/89 ->
sm_80), else the default; the CPU interpreter, which ignores warps and stages, uses the default.
`kernels.compile_check` builds exactly the running Triton's entries for sm_90 and sm_80
(`ssd_scan.compile_variants`); tests/test_compile_ssd.py runs it under the current Triton (.venv,
3.9) and under 3.6, the GPU machine's (.venv-triton36, made by scripts/setup_triton36.sh).

Per Triton version, because the register counts differ: the same chunk_scan build takes 128
registers under 3.9 and 168 under 3.6 (16-bit, sm_90, 3 stages). A Triton takes the table of the
newest version at or below its own (3.7 and 3.8: 3.6's, never compiled here), an older one the oldest.

Chosen from compile-check builds (registers, spills, MMA shape in the PTX), not timed: no GPU was
at hand. Registers per thread below are sm_90 / sm_80, bf16 unless said, T-independent;
"3.9" is Triton 3.9.0 (ptxas 12.9), "3.6" Triton 3.6.0 (ptxas 12.8); an SM holds 65536:

* sm_90, 16-bit inputs: 4 warps (one warpgroup) on the 64x64 tiles. At 8 warps the two
  warpgroups split N, so every MMA was a wgmma m64n32k16; at 4 each is m64n64k16 (half the
  MMA instructions for the same FLOPs) with 0 spills: bmm 43 -> 64 registers (3.6: 64), chunk_state
  64 -> 72 (3.6: 72), chunk_scan 110 -> 128 (4 CTAs of 4 warps an SM by registers, the 16 warps
  that 2 CTAs of 8 gave). Rejected: chunk_scan BLOCK_N=64 (two K=64 dots for C.state instead of
  four K=32: 156 registers (3.6: 146), 3 CTAs an SM, 48 KB shared), BLOCK_M=128 at 8 warps (m64n64k16
  too, but 20% more MMA work in the masked diagonal blocks and 54 KB shared), chunk_state 64x128
  at 4 warps (m64n128k16, 130 registers; the stage is memory-bound).
  chunk_scan's stages are where the versions differ: 3.9 takes 128 / 128 / 127 registers at 2 / 3
  / 4 stages, so 3 (4 CTAs an SM, loads two tiles ahead); 3.6 takes 126 / 168 / 160, so 2 (4 CTAs
  an SM; 3 stages would fit only 3, 12 warps).
* sm_80: 8 warps, as before. mma.sync is m16n8k16 at any warp count; at 4 warps chunk_scan took
  159 registers (3.6: 168; 3 CTAs, 12 warps an SM, against 2 x 8 = 16 at 8 warps and 114
  registers, 3.6: 122). Same under both versions.
* fp32 inputs (the test path: ieee dots, no tensor cores): 8 warps; chunk_scan's stages by arch,
  the same under both versions. sm_90 at 3 stages: 116 registers (3.6: 153), no spill; at 2 (the
  table until 3.6 was checked) it took 148 under 3.9, but 3.6 allocated 128 and spilled (4 B
  stores, 8 B loads). sm_80 at
  2 stages: 178 (3.6: 128), no spill; at 3, 3.9 spills 8 B / 4 B at 128 registers (3.6: 118, none).
"""

from __future__ import annotations

import dataclasses
import functools
import re

import torch

from kernels.checks import require


@dataclasses.dataclass(frozen=True)
class SSDTiles:
    """Tile caps and launch options of the SSD kernels (cumsum and state passing: 4 warps)."""

    bmm_block_m: int = 64
    bmm_block_k: int = 32  # 32-wide K steps halve the live (rows x K) tiles of the 64-wide ones
    bmm_warps: int = 8
    state_block_p: int = 64
    state_block_n: int = 64
    state_block_k: int = 32
    state_warps: int = 8
    scan_block_m: int = 64
    scan_block_p: int = 64
    scan_block_n: int = 32
    scan_block_k: int = 32
    scan_warps: int = 8
    scan_stages: int = 3
    stages: int = 3  # every other kernel: Triton's default, passed so the compile check builds what runs


_SM80 = SSDTiles()
_FP32_SM80 = SSDTiles(scan_stages=2)
_FP32_SM90 = SSDTiles(scan_stages=3)
_SM90_16BIT = SSDTiles(bmm_warps=4, state_warps=4, scan_warps=4)  # chunk_scan at 3 stages: 128 registers (3.9)
_SM90_16BIT_TRITON36 = dataclasses.replace(_SM90_16BIT, scan_stages=2)  # 126 registers at 2, 168 at 3 (3.6)

Table = dict[tuple[tuple[int, int], torch.dtype], SSDTiles]


def _table(sm90_16bit: SSDTiles) -> Table:
    return {
        ((9, 0), torch.bfloat16): sm90_16bit,
        ((9, 0), torch.float16): sm90_16bit,
        ((9, 0), torch.float32): _FP32_SM90,
        ((8, 0), torch.bfloat16): _SM80,
        ((8, 0), torch.float16): _SM80,
        ((8, 0), torch.float32): _FP32_SM80,
    }


# Triton (major, minor) whose compile-check counts chose the table -> (capability, dtype) -> tiles
# (see the module docstring). Not timed.
TUNED_BY_TRITON: dict[tuple[int, int], Table] = {
    (3, 6): _table(_SM90_16BIT_TRITON36),
    (3, 9): _table(_SM90_16BIT),
}
DEFAULT = {torch.bfloat16: _SM80, torch.float16: _SM80, torch.float32: _FP32_SM80}  # CPU interpreter, other devices


def parse_triton_version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string: "3.6.0" -> (3, 6), "3.10.0+git1a2b" -> (3, 10)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    require(m is not None, "triton.__version__", f"expected 'major.minor...', got {version!r}")
    return int(m.group(1)), int(m.group(2))


@functools.lru_cache(maxsize=None)
def running_triton() -> tuple[int, int]:
    """(major, minor) of the Triton this process imports."""
    import triton  # here, not at the top: the table is plain data to a reader without Triton

    return parse_triton_version(triton.__version__)


def tuned_table(triton_version: tuple[int, int] | None = None) -> Table:
    """The table of the newest version at or below `triton_version` (default: the running
    Triton's), or the oldest table for a Triton older than every table."""
    version = running_triton() if triton_version is None else tuple(triton_version)
    at_or_below = [v for v in TUNED_BY_TRITON if v <= version]
    return TUNED_BY_TRITON[max(at_or_below) if at_or_below else min(TUNED_BY_TRITON)]


def tiles_for(capability: tuple[int, int] | None, dtype: torch.dtype,
              triton_version: tuple[int, int] | None = None) -> SSDTiles:
    """The entry for a device capability (None: the CPU interpreter) and input dtype, from the
    table of `triton_version` (default: the running Triton's, `tuned_table`)."""
    if capability is not None:
        table = tuned_table(triton_version)
        for key in (tuple(capability), (capability[0], 0)):
            if (key, dtype) in table:
                return table[(key, dtype)]
    return DEFAULT[dtype]


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device (asked once per device: no sync), None elsewhere."""
    if device.type != "cuda":
        return None
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_config(chunk: int, H: int, P: int, N: int, dtype: torch.dtype,
                capability: tuple[int, int] | None = None,
                triton_version: tuple[int, int] | None = None) -> dict[str, int]:
    """The entry's tiles clamped to these shapes (>= 16 a side for tl.dot on a GPU); tiles that
    shrink under 64 rows run at most 4 warps (fewer rows than 8 warps can share)."""
    t = tiles_for(capability, dtype, triton_version)
    bmm_m, scan_m = min(t.bmm_block_m, chunk), min(t.scan_block_m, chunk)
    state_p = max(16, min(t.state_block_p, _pow2(P)))

    def warps(w: int, rows: int) -> int:
        return w if rows >= 64 else min(w, 4)
    return dict(
        cumsum_block_h=min(_pow2(H), max(1, 2048 // chunk)),  # 2048 fp32 per program
        bmm_block_m=bmm_m,
        bmm_block_k=max(16, min(t.bmm_block_k, _pow2(N))),
        bmm_warps=warps(t.bmm_warps, bmm_m),
        state_block_p=state_p,
        state_block_n=max(16, min(t.state_block_n, _pow2(N))),
        state_block_k=min(t.state_block_k, chunk),
        state_warps=warps(t.state_warps, min(state_p, chunk)),
        pass_block=min(1024, _pow2(P * N)),
        scan_block_m=scan_m,
        scan_block_p=max(16, min(t.scan_block_p, _pow2(P))),
        scan_block_n=max(16, min(t.scan_block_n, _pow2(N))),
        scan_block_k=min(t.scan_block_k, chunk),
        scan_warps=warps(t.scan_warps, scan_m),
        stages=t.stages,
        scan_stages=t.scan_stages,
    )
