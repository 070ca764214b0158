"""Decode steps (Triton, interpreter on CPU): they continue a prefill exactly, update only their
own slots of the state pools, match the decode references, and reject bad slots before launch."""

from __future__ import annotations

import pytest
import torch

import kernels.conv1d_decode as conv_dec_mod
import kernels.ssd_decode as ssd_dec_mod
from kernels.causal_conv1d import causal_conv1d
from kernels.conv1d_decode import causal_conv1d_decode_step
from kernels.reference.conv1d import causal_conv1d_decode_step_ref, causal_conv1d_ref
from kernels.reference.ssd import ssd_decode_step_ref, ssd_scan_sequential
from kernels.ssd_decode import ssd_decode_step
from kernels.ssd_scan import ssd_scan
from kernels.testing import assert_close, nan_filled
from ssm_inputs import cu_seqlens_of, make_conv_inputs, make_ssd_inputs

from conftest import DEVICE

SEQ_KEYS = ("x", "dt", "B", "C")
STEPS = 3


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(ssd_dec_mod, "_empty", nan_filled)
    monkeypatch.setattr(conv_dec_mod, "_empty", nan_filled)


def split_prefill_decode(lens):
    """Token rows of the prefill (each sequence minus its last STEPS tokens) and of decode step i."""
    starts = [sum(lens[:s]) for s in range(len(lens))]
    keep = torch.cat([torch.arange(st, st + n - STEPS) for st, n in zip(starts, lens)])
    steps = [torch.tensor([st + n - STEPS + i for st, n in zip(starts, lens)]) for i in range(STEPS)]
    return keep, steps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("H,P,G,N", [(4, 8, 2, 16), (3, 12, 1, 20)], ids=["H4-P8-G2-N16", "H3-P12-N20"])
def test_ssd_decode_continues_prefill(H, P, G, N, dtype):
    lens = [20, 9, 33]
    inp = make_ssd_inputs(lens, H, P, G, N, dtype=dtype, seed=N, device=DEVICE)
    full = ssd_scan_sequential(**inp)
    keep, steps = split_prefill_decode(lens)
    pre = ssd_scan(**{**inp, **{k: inp[k][keep] for k in SEQ_KEYS},
                      "cu_seqlens": cu_seqlens_of([n - STEPS for n in lens], DEVICE)}, chunk_size=16)
    pool = torch.full((6, H, P, N), float("nan"), device=DEVICE)
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    pool[slots] = pre.final_states
    ref_pool = pool.clone()
    for i, rows in enumerate(steps):
        args = [inp[k][rows] for k in ("x", "dt")] + [inp["A"]] + [inp[k][rows] for k in ("B", "C")]
        kw = dict(slot_idx=slots, D=inp["D"], dt_bias=inp["dt_bias"])
        y = ssd_decode_step(*args, state_pool=pool, **kw)
        y_ref = ssd_decode_step_ref(*args, state_pool=ref_pool, **kw)
        assert_close(y, full.y[rows], dtype, f"step {i} vs uninterrupted scan")
        assert_close(y, y_ref, dtype, f"step {i} vs decode reference")
    assert_close(pool[slots], full.final_states, dtype, "pool after decode")
    assert torch.isnan(pool[[1, 3, 5]]).all(), "decode wrote a slot it does not own"


def test_ssd_decode_options():
    S, H, P, G, N = 3, 4, 8, 4, 8
    inp = make_ssd_inputs([1] * S, H, P, G, N, seed=2, device=DEVICE)
    pool = torch.randn(4, H, P, N, device=DEVICE)
    ref_pool = pool.clone()
    args = [inp[k] for k in ("x", "dt", "A", "B", "C")]
    kw = dict(slot_idx=torch.tensor([3, 1, 0], dtype=torch.int32, device=DEVICE), D=None, dt_bias=None,
              dt_softplus=False, dt_limit=(0.01, 0.2))
    args[1] = args[1].abs()
    y = ssd_decode_step(*args, state_pool=pool, **kw)
    y_ref = ssd_decode_step_ref(*args, state_pool=ref_pool, **kw)
    assert_close(y, y_ref, torch.float32, "y")
    assert_close(pool, ref_pool, torch.float32, "pool")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("D", [40, 600], ids=["D40", "D600"])
def test_conv_decode_continues_prefill(D, dtype):
    lens = [4, 30, 5]  # the first prefill is 1 token: its conv state still holds initial-state columns
    inp = make_conv_inputs(lens, D, dtype=dtype, seed=D, device=DEVICE)
    full = causal_conv1d_ref(**inp)
    keep, steps = split_prefill_decode(lens)
    pre = causal_conv1d(**{**inp, "x": inp["x"][keep], "cu_seqlens": cu_seqlens_of([n - STEPS for n in lens], DEVICE)})
    pool = torch.full((5, D, 3), float("nan"), dtype=dtype, device=DEVICE)
    slots = torch.tensor([1, 4, 0], device=DEVICE)
    pool[slots] = pre.final_states
    ref_pool = pool.clone()
    for i, rows in enumerate(steps):
        kw = dict(weight=inp["weight"], bias=inp["bias"], slot_idx=slots)
        y = causal_conv1d_decode_step(inp["x"][rows], conv_state_pool=pool, **kw)
        y_ref = causal_conv1d_decode_step_ref(inp["x"][rows], conv_state_pool=ref_pool, **kw)
        assert_close(y, full.y[rows], dtype, f"step {i} vs uninterrupted conv")
        assert_close(y, y_ref, dtype, f"step {i} vs decode reference")
    assert torch.equal(pool[slots], full.final_states), "conv pool after decode"
    assert torch.isnan(pool[[2, 3]]).all(), "decode wrote a slot it does not own"


def test_conv_decode_no_bias_no_activation():
    x = torch.randn(2, 33, device=DEVICE)
    pool = torch.randn(3, 33, 3, device=DEVICE)
    ref_pool = pool.clone()
    w = torch.randn(33, 4, device=DEVICE)
    kw = dict(weight=w, slot_idx=torch.tensor([2, 0], device=DEVICE), activation=None)
    y = causal_conv1d_decode_step(x, conv_state_pool=pool, **kw)
    assert_close(y, causal_conv1d_decode_step_ref(x, conv_state_pool=ref_pool, **kw), torch.float32, "y")
    assert torch.equal(pool, ref_pool)


@pytest.mark.parametrize("slots,why", [([0, 4], "out of range"), ([1, 1], "duplicated"), ([-1, 0], "negative")],
                         ids=["out-of-range", "duplicated", "negative"])
def test_decode_rejects_bad_slots(slots, why, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("allocated/launched before validating")

    monkeypatch.setattr(ssd_dec_mod, "_empty", no_launch)
    monkeypatch.setattr(conv_dec_mod, "_empty", no_launch)
    inp = make_ssd_inputs([1, 1], 2, 4, 1, 8)
    pool = torch.zeros(4, 2, 4, 8)
    with pytest.raises(ValueError, match="slot_idx"):
        ssd_decode_step(*[inp[k] for k in ("x", "dt", "A", "B", "C")], state_pool=pool, slot_idx=torch.tensor(slots))
    with pytest.raises(ValueError, match="slot_idx"):
        causal_conv1d_decode_step(torch.randn(2, 8), conv_state_pool=torch.zeros(4, 8, 3), weight=torch.randn(8, 4),
                                  slot_idx=torch.tensor(slots))


def test_decode_rejects_bad_shapes():
    inp = make_ssd_inputs([1, 1], 4, 4, 2, 8)
    args = [inp[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(ValueError, match="state_pool"):
        ssd_decode_step(*args, state_pool=torch.zeros(4, 4, 4, 16), slot_idx=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="B"):
        ssd_decode_step(*args[:3], torch.randn(2, 3, 8), torch.randn(2, 3, 8), state_pool=torch.zeros(4, 4, 4, 8),
                        slot_idx=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="conv_state_pool"):
        causal_conv1d_decode_step(torch.randn(2, 8), conv_state_pool=torch.zeros(4, 8, 3).bfloat16(),
                                  weight=torch.randn(8, 4), slot_idx=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="weight"):
        causal_conv1d_decode_step(torch.randn(2, 8), conv_state_pool=torch.zeros(4, 8, 4),
                                  weight=torch.randn(8, 5), slot_idx=torch.tensor([0, 1]))
