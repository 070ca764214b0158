"""Compile every Triton kernel variant the model uses for real GPU targets, on a CPU machine.

The interpreter (TRITON_INTERPRET=1) runs what a GPU compiler would reject (a `tl.dot`
under 16, a shared-memory overflow, a register spill), so the CPU test suite also builds
each variant with Triton's own compiler for sm_90 and sm_80 and reads the cubin's resource
usage with the bundled `cuobjdump` and `ptxas -v`.

Each kernel module in this package registers its variants with a module-level function
``compile_variants() -> list[KernelVariant]`` (`kernels.variants`); this file discovers them, so
adding a kernel file needs no edit here.

Run it in a process *without* TRITON_INTERPRET (the decorator picks interpreter or JIT at
import time):

    python -m kernels.compile_check            # table: registers, shared memory, spills
    python -m kernels.compile_check --json F   # also write the rows as JSON
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.variants import KernelVariant

TARGETS = ((90, "sm_90"), (80, "sm_80"))


@dataclasses.dataclass
class CompileResult:
    variant: str
    arch: str
    ok: bool
    registers: int = -1
    shared_bytes: int = -1
    local_bytes: int = -1  # per-thread local memory: stack frames and spills
    spill_store_bytes: int = -1
    spill_load_bytes: int = -1
    wgmma: bool = False  # the PTX has Hopper warpgroup MMAs (wgmma.mma_async)
    mma: bool = False  # ... any tensor-core MMA (mma.sync or wgmma)
    cp_async: bool = False  # ... asynchronous global-to-shared copies (cp.async / TMA bulk copies)
    mma_shapes: str = ""  # the MMA instruction shapes in the PTX, e.g. "m64n64k16" (wgmma) or "m16n8k16"
    num_stages: int = -1
    num_warps: int = -1
    triton_version: str = ""  # the compiler's: register counts differ between versions (kernels/ssd_configs.py)
    error: str = ""


def discover_variants() -> list[KernelVariant]:
    """All variants registered by the modules of the `kernels` package."""
    import kernels

    variants: list[KernelVariant] = []
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.ispkg or info.name == "compile_check":
            continue
        module = importlib.import_module(f"kernels.{info.name}")
        register = getattr(module, "compile_variants", None)
        if register is not None:
            variants.extend(register())
    return variants


def _nvidia_tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def _resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run(
            [_nvidia_tool("cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True, text=True, check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    usage = {key: int(val) for key, val in re.findall(r"\b(REG|SHARED|LOCAL|STACK):(\d+)", out)}
    return usage


def _spills_from_ptxas_log(log: str) -> tuple[int, int]:
    """Spill store/load bytes from the `ptxas -v` log Triton itself produced for this cubin."""
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def compile_variant(variant: KernelVariant, cc: int, arch: str) -> CompileResult:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(variant.fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in variant.divisible_by_16}
    src = ASTSource(fn=variant.fn, signature=variant.signature, constexprs=variant.constexprs, attrs=attrs)
    # Triton runs `ptxas -v` with its own flags (e.g. --regAllocOptLevel=2) and drops the log;
    # the dump knob prints it, and always_compile makes sure ptxas runs rather than a cache hit.
    # A second ptxas run with other flags once reported 32 B of spills the real cubin did not have.
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                src,
                target=GPUTarget("cuda", cc, 32),
                options={"num_warps": variant.num_warps, "num_stages": variant.num_stages},
            )
    except Exception as exc:  # the compiler's message is the useful part
        return CompileResult(variant.name, arch, ok=False, triton_version=triton.__version__,
                             error=f"{type(exc).__name__}: {exc}"[:2000])
    usage = _resource_usage(compiled.asm["cubin"])
    stores, loads = _spills_from_ptxas_log(log.getvalue())
    ptx = compiled.asm["ptx"]
    return CompileResult(
        variant.name, arch, ok=True,
        registers=usage.get("REG", -1),
        shared_bytes=int(compiled.metadata.shared),
        local_bytes=usage.get("LOCAL", -1),
        spill_store_bytes=stores,
        spill_load_bytes=loads,
        wgmma="wgmma.mma_async" in ptx,
        mma="wgmma.mma_async" in ptx or "mma.sync" in ptx,
        cp_async="cp.async" in ptx,
        mma_shapes=",".join(sorted(set(re.findall(r"(?:wgmma\.mma_async|mma)\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))),
        num_stages=variant.num_stages,
        num_warps=variant.num_warps,
        triton_version=triton.__version__,
    )


def check_all(name_filter: str = "") -> list[CompileResult]:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("kernels.compile_check needs TRITON_INTERPRET unset: the interpreter replaces the JIT")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    results = []
    for variant in discover_variants():
        if name_filter and name_filter not in variant.name:
            continue
        for cc, arch in TARGETS:
            if not variant.targets or cc in variant.targets:
                results.append(compile_variant(variant, cc, arch))
    return results


def format_table(results: list[CompileResult]) -> str:
    import triton

    head = (f"{'variant':<56} {'arch':<6} {'regs':>5} {'smem B':>8} {'local B':>8} {'spill st/ld B':>14} "
            f"{'st':>2} {'w':>2} ptx")
    lines = [f"Triton {triton.__version__}", head, "-" * len(head)]
    for r in results:
        if r.ok:
            feats = ",".join(f for f, on in (("wgmma", r.wgmma), ("mma", r.mma and not r.wgmma),
                                              ("cp.async", r.cp_async)) if on)
            lines.append(
                f"{r.variant:<56} {r.arch:<6} {r.registers:>5} {r.shared_bytes:>8} {r.local_bytes:>8} "
                f"{r.spill_store_bytes:>6}/{r.spill_load_bytes:<7} {r.num_stages:>2} {r.num_warps:>2} {feats}"
                f"{' ' + r.mma_shapes if r.mma_shapes else ''}"
            )
        else:
            lines.append(f"{r.variant:<56} {r.arch:<6} FAILED: {r.error.splitlines()[0] if r.error else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--filter", default="", help="only variants whose name contains this string")
    args = parser.parse_args(argv)
    results = check_all(args.filter)
    print(format_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1))
    # -1 means the count could not be read: as bad as a spill.
    bad = [r for r in results if not r.ok or r.spill_store_bytes != 0 or r.spill_load_bytes != 0 or r.local_bytes != 0]
    bad += missing_wgmma(results)
    return 1 if bad else 0


# The tensor-core variants: on sm_90 their 16-bit dots must be Hopper warpgroup MMAs (wgmma).
WGMMA_REQUIRED = ("paged_attention/prefill/bf16/", "paged_attention/prefill/fp16/", "ssm/ssd_scan/bmm/bf16/",
                  "ssm/ssd_scan/bmm/fp16/", "ssm/ssd_scan/chunk_state/bf16/", "ssm/ssd_scan/chunk_state/fp16/",
                  "ssm/ssd_scan/chunk_scan/bf16/", "ssm/ssd_scan/chunk_scan/fp16/",
                  *(f"gated_delta/{stage}/{dtype}/" for stage in ("chunk_wy", "state", "output")
                    for dtype in ("bf16", "fp16")))


def missing_wgmma(results: list[CompileResult]) -> list[CompileResult]:
    """The sm_90 builds of `WGMMA_REQUIRED` variants whose PTX has no wgmma."""
    return [r for r in results if r.ok and r.arch == "sm_90" and not r.wgmma
            and any(r.variant.startswith(p) for p in WGMMA_REQUIRED)]


if __name__ == "__main__":
    sys.exit(main())
