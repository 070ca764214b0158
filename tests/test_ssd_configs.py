"""The SSD scan's per-device tile table: which entry a device gets, how entries clamp to small
shapes, and that the compile check builds the entry each target's launches use."""

from __future__ import annotations

import pytest
import torch

from kernels import ssd_configs
from kernels.ssd_configs import DEFAULT, TUNED, device_capability, tile_config, tiles_for
from kernels.ssd_scan import DEFAULT_CHUNK_SIZE, compile_variants


@pytest.mark.parametrize("capability,dtype,want", [
    ((9, 0), torch.bfloat16, TUNED[((9, 0), torch.bfloat16)]),
    ((8, 0), torch.float16, TUNED[((8, 0), torch.float16)]),
    ((8, 9), torch.bfloat16, TUNED[((8, 0), torch.bfloat16)]),  # an sm_89 takes its major's entry
    ((12, 0), torch.bfloat16, DEFAULT[torch.bfloat16]),  # no entry for the major: the default
    (None, torch.float32, DEFAULT[torch.float32]),  # the CPU interpreter
], ids=["sm90", "sm80", "sm89", "sm120", "cpu"])
def test_entry_per_device(capability, dtype, want):
    assert tiles_for(capability, dtype) is want


def test_sm90_16bit_runs_one_warpgroup_sm80_two():
    for dtype in (torch.bfloat16, torch.float16):
        hopper = tile_config(256, 128, 64, 128, dtype, (9, 0))
        ampere = tile_config(256, 128, 64, 128, dtype, (8, 0))
        assert (hopper["bmm_warps"], hopper["state_warps"], hopper["scan_warps"]) == (4, 4, 4)
        assert (ampere["bmm_warps"], ampere["state_warps"], ampere["scan_warps"]) == (8, 8, 8)
    assert tile_config(256, 128, 64, 128, torch.float32, (9, 0))["scan_stages"] == 2


def test_small_shapes_clamp_tiles_and_warps():
    """The interpreter tests' shapes (chunk 16, P=8, N=16): every dot side >= 16 and <= the
    shape's power of 2, 4 warps under 64 rows."""
    cfg = tile_config(16, 4, 8, 16, torch.float32, (9, 0))
    for key in ("bmm_block_m", "bmm_block_k", "state_block_p", "state_block_n", "state_block_k", "scan_block_m",
                "scan_block_p", "scan_block_n", "scan_block_k"):
        assert cfg[key] == 16, key
    assert (cfg["bmm_warps"], cfg["state_warps"], cfg["scan_warps"]) == (4, 4, 4)
    assert cfg["cumsum_block_h"] == 4 and cfg["pass_block"] == 128


def test_compile_check_builds_the_runtime_entries():
    """Per target, each SSD variant has the warps, stages and tiles the launch picks there."""
    by_target = {}
    for v in compile_variants():
        assert len(v.targets) == 1, f"{v.name}: built for {v.targets}"
        by_target.setdefault(v.targets[0], []).append(v)
    assert sorted(by_target) == [80, 90]
    for cc, variants in by_target.items():
        for v in variants:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[v.name.split("/")[3]]
            cfg = tile_config(DEFAULT_CHUNK_SIZE, 128, 64, 128, dtype, (cc // 10, cc % 10))
            stage = v.name.split("/")[2]
            if stage == "chunk_scan":
                assert (v.num_warps, v.num_stages) == (cfg["scan_warps"], cfg["scan_stages"]), v.name
                assert (v.constexprs["BLOCK_M"], v.constexprs["BLOCK_N"]) == (cfg["scan_block_m"], cfg["scan_block_n"])
            elif stage == "bmm":
                assert (v.num_warps, v.constexprs["BLOCK_M"]) == (cfg["bmm_warps"], cfg["bmm_block_m"]), v.name
            elif stage == "chunk_state":
                assert (v.num_warps, v.constexprs["BLOCK_N"]) == (cfg["state_warps"], cfg["state_block_n"]), v.name


def test_capability_asked_once_and_none_on_cpu(monkeypatch):
    assert device_capability(torch.device("cpu")) is None
    calls = []
    ssd_configs._cuda_capability.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: calls.append(i) or (9, 0))
    try:
        assert device_capability(torch.device("cuda", 1)) == (9, 0)
        assert device_capability(torch.device("cuda", 1)) == (9, 0)
    finally:
        ssd_configs._cuda_capability.cache_clear()
    assert calls == [1]
