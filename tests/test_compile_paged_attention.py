"""The paged-attention and KV-write kernels compile for sm_90 and sm_80 with no spills, under the
current Triton and Triton 3.6 (the GPU machine's; `tests/compile_pythons.py`). One tile rule
serves both: `choose_config`'s builds spill under neither.

`kernels.compile_check` needs the real Triton JIT, so it runs in a subprocess with TRITON_INTERPRET
removed from the environment. About 80 s from a cold Triton cache on two cores, seconds warm.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from compile_pythons import PYTHONS, REPO, check_version, usable

FILTERS = ("paged_attention", "kv_cache_write")  # "paged_attention" also matches its merge kernel

SCRIPT = f"""
import dataclasses, json, sys
from kernels.compile_check import check_all, format_table
rows = [r for f in {FILTERS!r} for r in check_all(f)]
print(format_table(rows), file=sys.stderr)
print(json.dumps([dataclasses.asdict(r) for r in rows]))
"""


@pytest.fixture(scope="module", params=PYTHONS)
def rows(request):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([usable(request.param), "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    check_version(request.param, results)
    return results, proc.stderr


def test_every_variant_compiles_for_sm90_and_sm80_without_spills(rows):
    results, table = rows
    by_variant: dict[str, set[str]] = {}
    for r in results:
        assert r["ok"], f"{r['variant']} {r['arch']}: {r['error'][:500]}\n{table}"
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, f"{r['variant']} {r['arch']} spills\n{table}"
        assert r["local_bytes"] == 0, f"{r['variant']} {r['arch']} uses local memory\n{table}"
        assert r["registers"] > 0 and r["shared_bytes"] >= 0, f"{r['variant']} {r['arch']}: no resource usage read"
        by_variant.setdefault(r["variant"], set()).add(r["arch"])
    assert all(archs == {"sm_90", "sm_80"} for archs in by_variant.values()), by_variant


def test_registry_covers_what_the_model_launches(rows):
    names = {r["variant"] for r in rows[0]}

    def has(*parts):
        return any(all(p in n for p in parts) for n in names)

    for mode in ("prefill", "decode", "split"):  # bamba-9b: 32/8 heads of 128
        assert has(f"paged_attention/{mode}/bf16/d128/g4/bs16/"), mode
    for head_dim in (64, 128, 80):  # 80: not a power of two, masked to 128
        assert has("paged_attention/prefill/bf16", f"/d{head_dim}/")
        assert has("paged_attention/split/bf16", f"/d{head_dim}/")
        assert has("kv_cache_write/bf16", f"/d{head_dim}/")
    for dtype in ("bf16", "fp16", "fp32"):
        assert has(f"paged_attention/prefill/{dtype}/d128") and has(f"paged_attention/split/{dtype}/d128")
        assert has(f"kv_cache_write/{dtype}/d128")
    assert has("paged_attention/prefill/fp32/d64/g4/") and has("paged_attention/prefill/fp32/d16/g2/")  # small, tiny
    assert has("/bs256/") and has("paged_attention_merge/")


def test_prefill_variants_use_wgmma_on_sm90(rows):
    """bf16/fp16 prefill tiles (128 or 64 rows) are Hopper warpgroup MMAs on sm_90; every attention
    variant uses tensor cores (mma.sync on sm_80 and for the 16-row decode tiles)."""
    results, table = rows
    prefill = [r for r in results if r["variant"].startswith(("paged_attention/prefill/bf16/",
                                                              "paged_attention/prefill/fp16/"))]
    assert prefill
    for r in prefill:
        if r["arch"] == "sm_90":
            assert r["wgmma"], f"{r['variant']}: no wgmma on sm_90\n{table}"
    for r in results:
        if r["variant"].startswith("paged_attention/"):
            assert r["mma"], f"{r['variant']} {r['arch']}: no tensor-core MMA\n{table}"
