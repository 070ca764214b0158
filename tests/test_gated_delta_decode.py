"""The gated delta rule decode step (Triton, interpreter on CPU): it continues a chunked prefill
exactly, updates only its own slots of the state pool, matches the decode oracle, skips pad rows,
and rejects bad slots and shapes before launch."""

from __future__ import annotations

import pytest
import torch

import kernels.gated_delta_decode as dec_mod
from kernels.gated_delta_decode import gated_delta_decode_step
from kernels.gated_delta_rule import gated_delta_rule
from kernels.reference.gated_delta import gated_delta_decode_step_ref, gated_delta_rule_sequential
from kernels.testing import assert_close, nan_filled
from gated_delta_inputs import make_gdn_inputs
from ssm_inputs import cu_seqlens_of

from conftest import DEVICE

STEPS = 3
SEQ_KEYS = ("q", "k", "v", "g", "beta")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(dec_mod, "_empty", nan_filled)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("HK,HV,K,V", [(2, 4, 12, 20), (1, 1, 32, 8)], ids=["HK2-HV4-K12-V20", "K32-V8"])
def test_decode_continues_prefill(HK, HV, K, V, dtype):
    lens = [20, 4, 33]  # the second prefill is one token
    inp = make_gdn_inputs(lens, HK, HV, K, V, dtype=dtype, seed=K + V, device=DEVICE)
    full = gated_delta_rule_sequential(**inp)
    starts = [sum(lens[:s]) for s in range(len(lens))]
    keep = torch.cat([torch.arange(st, st + n - STEPS) for st, n in zip(starts, lens)])
    pre = gated_delta_rule(**{**inp, **{key: inp[key][keep] for key in SEQ_KEYS},
                              "cu_seqlens": cu_seqlens_of([n - STEPS for n in lens], DEVICE)}, chunk_size=16)
    pool = torch.full((6, HV, K, V), float("nan"), device=DEVICE)
    slots = torch.tensor([4, 0, 2], device=DEVICE)
    pool[slots] = pre.final_states
    ref_pool = pool.clone()
    for i in range(STEPS):
        rows = torch.tensor([st + n - STEPS + i for st, n in zip(starts, lens)])
        args = [inp[key][rows] for key in SEQ_KEYS]
        o = gated_delta_decode_step(*args, state_pool=pool, slot_idx=slots)
        o_ref = gated_delta_decode_step_ref(*args, state_pool=ref_pool, slot_idx=slots)
        assert o.dtype == dtype
        assert_close(o, full.o[rows], dtype, f"step {i} vs uninterrupted scan")
        assert_close(o, o_ref, dtype, f"step {i} vs decode oracle")
    assert_close(pool[slots], full.final_states, dtype, "pool after decode")
    assert torch.isnan(pool[[1, 3, 5]]).all(), "decode wrote a slot it does not own"


def test_decode_options_and_pad_rows():
    """No l2norm, a given scale, int32 slots, strided q/k/v (views of one projection); a pad row (-1)
    reads and writes no state: its o is a step from a zero state."""
    S, HK, HV, K, V = 3, 1, 2, 16, 24
    inp = make_gdn_inputs([1] * S, HK, HV, K, V, seed=6, device=DEVICE)
    proj = torch.randn(S, 2 * HK * K + HV * V + 3, device=DEVICE)
    col = 0
    for key, width in (("q", HK * K), ("k", HK * K), ("v", HV * V)):
        proj[:, col:col + width] = inp[key].reshape(S, -1) * (0.3 if key != "v" else 1.0)
        inp[key] = proj[:, col:col + width].view(S, *inp[key].shape[1:])
        col += width
    pool = torch.randn(4, HV, K, V, device=DEVICE)
    before = pool.clone()
    args = [inp[key] for key in SEQ_KEYS]
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)
    kw = dict(scale=0.6, use_qk_l2norm=False)
    o = gated_delta_decode_step(*args, state_pool=pool, slot_idx=slots, pad_slots=True, **kw)
    real = torch.tensor([0, 2])
    ref_pool = before.clone()
    o_ref = gated_delta_decode_step_ref(*[a[real] for a in args], state_pool=ref_pool, slot_idx=slots[real], **kw)
    assert_close(o[real], o_ref, torch.float32, "real rows")
    assert_close(pool, ref_pool, torch.float32, "pool")
    zero_pool = torch.zeros(1, HV, K, V, device=DEVICE)
    o_pad = gated_delta_decode_step_ref(*[a[1:2] for a in args], state_pool=zero_pool,
                                        slot_idx=torch.tensor([0], device=DEVICE), **kw)
    assert_close(o[1:2], o_pad, torch.float32, "pad row")


@pytest.mark.parametrize("slots,why", [([0, 4], "out of range"), ([1, 1], "duplicated"), ([-1, 0], "negative")],
                         ids=["out-of-range", "duplicated", "negative"])
def test_decode_rejects_bad_slots(slots, why, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("allocated/launched before validating")

    monkeypatch.setattr(dec_mod, "_empty", no_launch)
    inp = make_gdn_inputs([1, 1], 1, 2, 8, 4)
    with pytest.raises(ValueError, match="slot_idx"):
        gated_delta_decode_step(*[inp[key] for key in SEQ_KEYS], state_pool=torch.zeros(4, 2, 8, 4),
                                slot_idx=torch.tensor(slots))


def test_decode_rejects_bad_shapes():
    inp = make_gdn_inputs([1, 1], 1, 2, 8, 4)
    args = [inp[key] for key in SEQ_KEYS]
    with pytest.raises(ValueError, match="state_pool"):
        gated_delta_decode_step(*args, state_pool=torch.zeros(4, 2, 4, 8), slot_idx=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="state_pool"):
        gated_delta_decode_step(*args, state_pool=torch.zeros(4, 2, 8, 4).bfloat16(), slot_idx=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="beta"):
        gated_delta_decode_step(*args[:4], torch.rand(2, 1), state_pool=torch.zeros(4, 2, 8, 4),
                                slot_idx=torch.tensor([0, 1]))
