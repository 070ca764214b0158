"""Every SSD scan / conv1d / decode kernel variant compiles for sm_90 and sm_80 with no spills.

Runs `python -m kernels.compile_check --filter ssm/` in a subprocess without TRITON_INTERPRET
(the interpreter replaces the JIT at import, so it cannot compile for a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPECTED_STAGES = ("ssm/ssd_scan/chunk_cumsum/", "ssm/ssd_scan/bmm/", "ssm/ssd_scan/chunk_state/",
                   "ssm/ssd_scan/state_passing/", "ssm/ssd_scan/chunk_scan/", "ssm/causal_conv1d/",
                   "ssm/ssd_decode/", "ssm/conv1d_decode/")


def test_ssm_kernels_compile_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--filter", "ssm/", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.exists(), f"compile check wrote nothing:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    rows = json.loads(out.read_text())
    table = proc.stdout
    for stage in EXPECTED_STAGES:
        for arch in ("sm_90", "sm_80"):
            assert any(r["variant"].startswith(stage) and r["arch"] == arch for r in rows), f"{stage} {arch} missing"
    for dtype in ("fp32", "bf16", "fp16"):
        assert any(f"/{dtype}/" in r["variant"] for r in rows), f"no {dtype} variant"
    for r in rows:
        assert r["ok"], f"{r['variant']} {r['arch']} failed: {r['error'][:500]}"
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, f"{r['variant']} {r['arch']} spills\n{table}"
        assert r["local_bytes"] == 0, f"{r['variant']} {r['arch']} uses local memory\n{table}"
    # runtime-like builds: the stages the launches pass, and Hopper MMAs in the 16-bit matmul stages
    for r in rows:
        want = 2 if r["variant"].startswith("ssm/ssd_scan/chunk_scan/fp32/") else 3
        assert r["num_stages"] == want, f"{r['variant']}: built with {r['num_stages']} stages, runs with {want}"
    for stage in ("bmm", "chunk_state", "chunk_scan"):
        for dtype in ("bf16", "fp16"):
            hits = [r for r in rows if r["variant"].startswith(f"ssm/ssd_scan/{stage}/{dtype}/")]
            assert hits and all(r["mma"] for r in hits), f"{stage} {dtype}: no tensor-core MMA\n{table}"
            assert all(r["wgmma"] for r in hits if r["arch"] == "sm_90"), f"{stage} {dtype}: no wgmma on sm_90\n{table}"
            assert not any(r["wgmma"] for r in hits if r["arch"] == "sm_80"), "wgmma on sm_80?"
    assert proc.returncode == 0, table
