"""Every gated delta rule kernel variant (chunked scan stages and decode step) compiles for sm_90 and
sm_80 with no spills, under the current Triton and under Triton 3.6 (the GPU machine's;
`tests/compile_pythons.py` says when that case skips).

Runs `python -m kernels.compile_check --filter gated_delta/` in a subprocess without
TRITON_INTERPRET (the interpreter replaces the JIT at import, so it cannot compile for a GPU).
About 4 min from a cold Triton cache on two busy cores."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from compile_pythons import PYTHONS, REPO, check_version, usable

STAGES = ("qk_prep", "chunk_wy", "state", "output", "decode")
MATMUL_STAGES = ("chunk_wy", "state", "output")


def compile_rows(python: str, tmp_path) -> tuple[list[dict], str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = tmp_path / "rows.json"
    proc = subprocess.run([usable(python), "-m", "kernels.compile_check", "--filter", "gated_delta/", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.exists(), f"compile check wrote nothing:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text()), proc.stdout, proc.returncode


@pytest.mark.parametrize("python", PYTHONS)
def test_gated_delta_kernels_compile_without_spills(python, tmp_path):
    rows, table, returncode = compile_rows(python, tmp_path)
    check_version(python, rows)
    for stage in STAGES:
        for arch in ("sm_90", "sm_80"):
            for dtype in ("fp32", "bf16", "fp16"):
                assert any(r["variant"].startswith(f"gated_delta/{stage}/{dtype}/") and r["arch"] == arch
                           for r in rows), f"{stage} {dtype} {arch} missing\n{table}"
    # built at the chunk a launch without chunk_size runs (fp32: 32, else 64)
    for r in rows:
        if not r["variant"].startswith("gated_delta/decode/"):
            want = "/L32/" if "/fp32/" in r["variant"] else "/L64/"
            assert want in r["variant"], f"{r['variant']}: not the default chunk"
    for r in rows:
        assert r["ok"], f"{r['variant']} {r['arch']} failed: {r['error'][:500]}"
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, f"{r['variant']} {r['arch']} spills\n{table}"
        assert r["local_bytes"] == 0, f"{r['variant']} {r['arch']} uses local memory\n{table}"
    for stage in MATMUL_STAGES:
        for dtype in ("bf16", "fp16"):
            hits = [r for r in rows if r["variant"].startswith(f"gated_delta/{stage}/{dtype}/")]
            assert hits and all(r["mma"] for r in hits), f"{stage} {dtype}: no tensor-core MMA\n{table}"
            assert all(r["wgmma"] for r in hits if r["arch"] == "sm_90"), f"{stage} {dtype}: no wgmma on sm_90\n{table}"
    assert returncode == 0, f"the compile check's own verdict (spills, wgmma: kernels.compile_check.main)\n{table}"
