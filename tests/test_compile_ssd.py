"""Every SSD scan / conv1d / decode kernel variant compiles for sm_90 and sm_80 with no spills,
under the current Triton and Triton 3.6 (the GPU machine's; `tests/compile_pythons.py`), each
with its own tile table (`kernels.ssd_configs`).

Runs `python -m kernels.compile_check --filter ssm/` in a subprocess without TRITON_INTERPRET
(the interpreter replaces the JIT at import, so it cannot compile for a GPU)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from compile_pythons import PYTHONS, REPO, check_version, usable
from kernels.ssd_configs import parse_triton_version, tile_config
from kernels.ssd_scan import DEFAULT_CHUNK_SIZE

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

EXPECTED_STAGES = ("ssm/ssd_scan/chunk_cumsum/", "ssm/ssd_scan/bmm/", "ssm/ssd_scan/chunk_state/",
                   "ssm/ssd_scan/state_passing/", "ssm/ssd_scan/chunk_scan/", "ssm/causal_conv1d/",
                   "ssm/ssd_decode/", "ssm/conv1d_decode/")


@pytest.mark.parametrize("python", PYTHONS)
def test_ssm_kernels_compile_without_spills(python, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = tmp_path / "rows.json"
    proc = subprocess.run([usable(python), "-m", "kernels.compile_check", "--filter", "ssm/", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"compile check wrote nothing:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    rows = json.loads(out.read_text())
    table = proc.stdout
    check_version(python, rows)
    for stage in EXPECTED_STAGES:
        for arch in ("sm_90", "sm_80"):
            assert any(r["variant"].startswith(stage) and r["arch"] == arch for r in rows), f"{stage} {arch} missing"
    for dtype in ("fp32", "bf16", "fp16"):
        assert any(f"/{dtype}/" in r["variant"] for r in rows), f"no {dtype} variant"
    for r in rows:
        assert r["ok"], f"{r['variant']} {r['arch']} failed: {r['error'][:500]}"
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, f"{r['variant']} {r['arch']} spills\n{table}"
        assert r["local_bytes"] == 0, f"{r['variant']} {r['arch']} uses local memory\n{table}"
    # runtime-like builds: Hopper MMAs in the 16-bit matmul stages; the warps and stages of the
    # compiling Triton's table entry (below)
    for stage in ("bmm", "chunk_state", "chunk_scan"):
        for dtype in ("bf16", "fp16"):
            hits = [r for r in rows if r["variant"].startswith(f"ssm/ssd_scan/{stage}/{dtype}/")]
            assert hits and all(r["mma"] for r in hits), f"{stage} {dtype}: no tensor-core MMA\n{table}"
            assert all(r["wgmma"] for r in hits if r["arch"] == "sm_90"), f"{stage} {dtype}: no wgmma on sm_90\n{table}"
            assert not any(r["wgmma"] for r in hits if r["arch"] == "sm_80"), "wgmma on sm_80?"
            # one warpgroup on the 64x64 tiles (kernels.ssd_configs): full-width wgmmas, not 8 warps' m64n32k16
            assert all(r["mma_shapes"] == "m64n64k16" for r in hits if r["arch"] == "sm_90"), \
                f"{stage} {dtype}: sm_90 MMA shapes\n{table}"
    # each arch's rows are built with the warps and stages that the compiling Triton's table entry
    # gives the launches (3.6 and 3.9 differ: sm_90 16-bit chunk_scan at 2 / 3 stages)
    for r in rows:
        if not r["variant"].startswith("ssm/ssd_scan/"):
            assert r["num_stages"] == 3, f"{r['variant']}: built with {r['num_stages']} stages, launched with 3"
            continue
        stage, dtype = r["variant"].split("/")[2:4]
        cfg = tile_config(DEFAULT_CHUNK_SIZE, 128, 64, 128, DTYPES[dtype], (int(r["arch"][3]), int(r["arch"][4])),
                          parse_triton_version(r["triton_version"]))
        want = {"bmm": cfg["bmm_warps"], "chunk_state": cfg["state_warps"], "chunk_scan": cfg["scan_warps"]}.get(stage, 4)
        assert r["num_warps"] == want, f"{r['variant']} {r['arch']}: built with {r['num_warps']} warps, runs with {want}"
        want = cfg["scan_stages"] if stage == "chunk_scan" else cfg["stages"]
        assert r["num_stages"] == want, f"{r['variant']} {r['arch']}: built with {r['num_stages']} stages, runs with {want}"
    assert proc.returncode == 0, table
