"""The SSD scan's tile tables: which table a Triton version gets and which entry a device gets,
how entries clamp to small shapes, and that the compile check builds the entry each target's
launches use."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import ssd_configs
from kernels.ssd_configs import (DEFAULT, TUNED_BY_TRITON, device_capability, parse_triton_version, running_triton,
                                 tile_config, tiles_for, tuned_table)
from kernels.ssd_scan import DEFAULT_CHUNK_SIZE, compile_variants

TRITON36, TRITON39 = (3, 6), (3, 9)


@pytest.mark.parametrize("triton_version", [TRITON36, TRITON39], ids=["triton3.6", "triton3.9"])
@pytest.mark.parametrize("capability,dtype,key", [
    ((9, 0), torch.bfloat16, (9, 0)),
    ((8, 0), torch.float16, (8, 0)),
    ((8, 9), torch.bfloat16, (8, 0)),  # an sm_89 takes its major's entry
    ((12, 0), torch.bfloat16, None),  # no entry for the major: the default
    (None, torch.float32, None),  # the CPU interpreter
], ids=["sm90", "sm80", "sm89", "sm120", "cpu"])
def test_entry_per_device(capability, dtype, key, triton_version):
    table = TUNED_BY_TRITON[triton_version]
    want = DEFAULT[dtype] if key is None else table[(key, dtype)]
    assert tiles_for(capability, dtype, triton_version) is want


@pytest.mark.parametrize("version,table", [
    ((3, 6), TRITON36), ((3, 7), TRITON36), ((3, 8), TRITON36),  # 3.7, 3.8: never compiled here, the older table
    ((3, 9), TRITON39), ((3, 10), TRITON39), ((4, 0), TRITON39),
    ((3, 2), TRITON36),  # older than every table (pyproject's floor): the oldest
])
def test_table_per_triton_version(version, table):
    assert tuned_table(version) is TUNED_BY_TRITON[table]


@pytest.mark.parametrize("text,want", [("3.6.0", (3, 6)), ("3.9.0", (3, 9)), ("3.10.0", (3, 10)),
                                       ("3.10.0+git1a2b3c", (3, 10)), ("4.0.0rc1", (4, 0))])
def test_triton_version_parses_as_numbers(text, want):
    """(3, 10) sorts above (3, 9), where "3.10" < "3.9" as text."""
    assert parse_triton_version(text) == want


def test_unreadable_triton_version_is_named():
    with pytest.raises(ValueError, match=r"^triton.__version__: .*'dev'"):
        parse_triton_version("dev")


def test_running_triton_is_the_imported_one():
    import triton

    assert running_triton() == tuple(int(x) for x in triton.__version__.split(".")[:2])
    assert tiles_for((9, 0), torch.bfloat16) is tiles_for((9, 0), torch.bfloat16, running_triton())


@pytest.mark.parametrize("triton_version", [TRITON36, TRITON39], ids=["triton3.6", "triton3.9"])
def test_sm90_16bit_runs_one_warpgroup_sm80_two(triton_version):
    for dtype in (torch.bfloat16, torch.float16):
        hopper = tile_config(256, 128, 64, 128, dtype, (9, 0), triton_version)
        ampere = tile_config(256, 128, 64, 128, dtype, (8, 0), triton_version)
        assert (hopper["bmm_warps"], hopper["state_warps"], hopper["scan_warps"]) == (4, 4, 4)
        assert (ampere["bmm_warps"], ampere["state_warps"], ampere["scan_warps"]) == (8, 8, 8)


@pytest.mark.parametrize("triton_version,sm90_16bit", [(TRITON36, 2), (TRITON39, 3)], ids=["triton3.6", "triton3.9"])
def test_chunk_scan_stages_per_version(triton_version, sm90_16bit):
    """The stages the module docstring's register counts pick: sm_90 16-bit at 2 under 3.6 (126
    registers; 168 at 3) and 3 under 3.9 (128); fp32 at 3 on sm_90 (2 spills under 3.6) and 2 on
    sm_80 (3 spills under 3.9) under both; every other kernel at 3."""
    def stages(dtype, cap):
        cfg = tile_config(256, 128, 64, 128, dtype, cap, triton_version)
        assert cfg["stages"] == 3
        return cfg["scan_stages"]
    assert stages(torch.bfloat16, (9, 0)) == stages(torch.float16, (9, 0)) == sm90_16bit
    assert stages(torch.float32, (9, 0)) == 3
    assert stages(torch.float32, (8, 0)) == 2
    assert stages(torch.bfloat16, (8, 0)) == stages(torch.float16, (8, 0)) == 3


def test_tables_differ_only_in_sm90_16bit_chunk_scan_stages():
    old, new = TUNED_BY_TRITON[TRITON36], TUNED_BY_TRITON[TRITON39]
    assert old.keys() == new.keys()
    for key in old:
        if key[0] == (9, 0) and key[1] != torch.float32:
            assert dataclasses.replace(old[key], scan_stages=new[key].scan_stages) == new[key], key
        else:
            assert old[key] == new[key], key


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
