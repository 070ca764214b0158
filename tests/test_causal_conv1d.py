"""The Triton causal conv1d (width 4, SiLU) against the reference: y, final and captured conv
states, resumes from captures, initial states shorter than the window, poisoned buffers, and
argument checks before launch."""

from __future__ import annotations

import pytest
import torch

import kernels.causal_conv1d as conv_mod
from kernels.causal_conv1d import causal_conv1d
from kernels.reference.conv1d import causal_conv1d_ref
from kernels.testing import assert_close, nan_filled
from ssm_inputs import check_conv_capture_and_resume, make_conv_inputs

from conftest import DEVICE


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    monkeypatch.setattr(conv_mod, "_empty", nan_filled)


CASES = [
    # id, lens, D, offsets, with_init, activation
    ("T63-D300", [63], 300, [[1, 2, 3, 31, 32, 33, 62]], True, "silu"),  # tile = 64 tokens
    ("short-seqs-under-window", [1, 2, 3, 70], 40, [[], [1], [1, 2], [64, 65, 69]], True, "silu"),
    ("no-init-no-act", [66, 5], 515, [[64], [4]], False, None),
    ("no-capture", [20, 9], 8, None, True, "silu"),
]


@pytest.mark.parametrize("lens,D,offsets,with_init,activation", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_conv_matches_reference(lens, D, offsets, with_init, activation, dtype):
    inp = make_conv_inputs(lens, D, dtype=dtype, seed=D, device=DEVICE, with_init=with_init)
    out = causal_conv1d(**inp, capture_offsets=offsets, activation=activation)
    ref = causal_conv1d_ref(**inp, capture_offsets=offsets, activation=activation)
    assert_close(out.y, ref.y, dtype, "y")
    # states are copies of inputs: exact
    assert out.final_states.dtype == dtype and torch.equal(out.final_states, ref.final_states), "final states"
    assert torch.equal(out.captured_states, ref.captured_states), "captured states"
    assert out.captured_states.shape == (sum(len(o) for o in offsets or []), D, 3)


def test_conv_bias_none_and_strided_x():
    T, D = 40, 24
    inp = make_conv_inputs([25, 15], D, seed=3, device=DEVICE)
    big = torch.randn(T, 2 * D + 5, device=DEVICE)
    big[:, 5:5 + D] = inp["x"]
    inp["x"] = big[:, 5:5 + D]
    inp["bias"] = None
    kw = dict(capture_offsets=[[3], [14]])
    out = causal_conv1d(**inp, **kw)
    ref = causal_conv1d_ref(**inp, **kw)
    assert_close(out.y, ref.y, torch.float32, "y")
    assert torch.equal(out.captured_states, ref.captured_states)


def test_conv_resume_from_capture():
    lens = [50, 30]
    offsets = [[1, 33], [29]]
    inp = make_conv_inputs(lens, 64, seed=5, device=DEVICE)
    check_conv_capture_and_resume(causal_conv1d, inp, lens, offsets)


def test_conv_token_offsets_past_int32():
    """Row offsets past 2^31 elements (a 128K-token prefill of Bamba-9B's 16768-wide projection view).

    x holds 66 tokens 35.2M elements apart, so pos * stride passes 2^31 from position 61 on: the
    second tile's 3-row window, the capture at 65 and the final state all read there. The storage
    is 4.4G bf16 elements of address space of which only the 66 rows are touched; the 2^31 elements
    before x turn a wrapped int32 offset into a wrong read instead of a segfault.
    """
    T, D = 66, 8
    stride = 35_204_656  # 61 * stride = 2^31 + 368
    lead = 2**31 + 2**20
    storage = torch.empty(lead + (T - 1) * stride + D, dtype=torch.bfloat16, device=DEVICE)
    x = storage.as_strided((T, D), (stride, 1), lead)
    g = torch.Generator().manual_seed(7)
    x.copy_(torch.randn(T, D, generator=g))
    weight = torch.randn(D, 4, generator=g).to(device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(D, generator=g).to(device=DEVICE, dtype=torch.bfloat16)
    kw = dict(cu_seqlens=torch.tensor([0, T], dtype=torch.int32, device=DEVICE), capture_offsets=[[65]])
    out = causal_conv1d(x, weight, bias, **kw)
    ref = causal_conv1d_ref(x, weight, bias, **kw)
    assert_close(out.y, ref.y, torch.bfloat16, "y")
    assert torch.equal(out.final_states, ref.final_states), "final state"
    assert torch.equal(out.captured_states, ref.captured_states), "captured state"


BAD = [
    ("width-3", {"weight": torch.randn(16, 3), "initial_states": None}, "weight"),
    ("weight-shape", {"weight": torch.randn(15, 4)}, "weight"),
    ("bias-shape", {"bias": torch.randn(4)}, "bias"),
    ("activation", {"activation": "gelu"}, "activation"),
    ("init-dtype", {"initial_states": torch.zeros(2, 16, 3).half()}, "initial_states"),
    ("init-width", {"initial_states": torch.zeros(2, 16, 4)}, "initial_states"),
    ("offset-out-of-range", {"capture_offsets": [[10], []]}, "capture_offsets"),
    ("offset-unsorted", {"capture_offsets": [[5, 2], []]}, "capture_offsets"),
    ("cu-int16", {"cu_seqlens": torch.tensor([0, 10, 17], dtype=torch.int16)}, "cu_seqlens"),
]


@pytest.mark.parametrize("change,arg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_conv_rejects_before_launch(change, arg, monkeypatch):
    inp = make_conv_inputs([10, 7], 16, seed=0)

    def no_launch(*a, **k):
        raise AssertionError("allocated/launched before validating")

    monkeypatch.setattr(conv_mod, "_empty", no_launch)
    with pytest.raises(ValueError, match=arg):
        causal_conv1d(**{**inp, **change})
