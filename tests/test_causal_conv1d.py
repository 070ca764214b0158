"""The Triton causal conv1d (width 4, SiLU) against the reference: y, final and captured conv
states, resumes from captures, initial states shorter than the window, states through pool slots,
poisoned buffers, and argument checks before launch."""

from __future__ import annotations

import pytest
import torch

import kernels.causal_conv1d as conv_mod
from kernels.causal_conv1d import causal_conv1d, plan_causal_conv1d
from kernels.contracts.packed import IntTables
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


POOL_CASES = [
    # id, lens, D, offsets, slots (into a 9-slot pool; -1 = pad row)
    # lengths 0, 1, 2 keep part of the initial state in the final one; 65 and 130 span 2 and 3 tiles
    ("short-and-tiled", [2, 65, 0, 1, 130, 3], 515, [[1], [1, 2, 64], [], [], [2, 63, 64, 129], [1, 2]],
     [4, 0, 7, 2, 8, 5]),
    ("pad-rows", [5, 2, 1, 70], 40, [[1, 3], [1], [], [66]], [3, -1, 6, -1]),
    ("one-seq-no-capture", [9], 8, None, [1]),
]


@pytest.mark.parametrize("lens,D,offsets,slots", [c[1:] for c in POOL_CASES], ids=[c[0] for c in POOL_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("planned", [False, True], ids=["cu_seqlens", "plan"])
def test_conv_states_through_pool_slots(lens, D, offsets, slots, dtype, planned):
    """Initial states read from and final states written to a conv-state pool through slots (the
    finals by a second launch): equal to the gather/scatter mode and to the reference; pad rows
    (-1) start from zeros and write nothing; no slot nobody owns is touched."""
    inp = make_conv_inputs(lens, D, dtype=dtype, seed=len(lens) + D, device=DEVICE)
    g = torch.Generator().manual_seed(11)
    # a NaN guard row before the pool: a pad row that read or wrote slot -1 would hit it
    base = torch.full((10, D, 3), float("nan"), dtype=dtype, device=DEVICE)
    pool = base[1:]
    real = [i for i, s in enumerate(slots) if s >= 0]
    real_slots = [slots[i] for i in real]
    pool[real_slots] = torch.randn(len(real), D, 3, generator=g).to(dtype).to(DEVICE)
    before = pool.clone()
    slot_t = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    init = torch.zeros(len(lens), D, 3, dtype=dtype, device=DEVICE)  # pad rows: zero state
    init[real] = before[real_slots]
    kw = {k: v for k, v in inp.items() if k != "initial_states"}
    plan = {}
    if planned:
        tables = IntTables()
        plan["plan"] = plan_causal_conv1d(lens, offsets, tables)
        tables.upload(DEVICE)

    out = causal_conv1d(**kw, capture_offsets=offsets, state_pool=pool, state_slots=slot_t,
                        pad_slots=-1 in slots, **plan)
    gathered = causal_conv1d(**kw, initial_states=init, capture_offsets=offsets)
    ref = causal_conv1d_ref(**kw, initial_states=init, capture_offsets=offsets)

    assert out.final_states is pool
    assert torch.equal(out.y, gathered.y), "y: pool mode differs from the gather/scatter mode"
    assert_close(out.y, ref.y, dtype, "y")
    assert torch.equal(out.captured_states, ref.captured_states), "captured states"
    assert torch.equal(pool[real_slots], ref.final_states[real]), "final states in their slots"
    assert torch.equal(pool[real_slots], gathered.final_states[real]), "final states vs gather/scatter mode"
    untouched = [i for i in range(9) if i not in real_slots]
    assert torch.isnan(pool[untouched]).all(), "a slot no sequence owns was written"
    assert torch.isnan(base[0]).all(), "a pad row read or wrote slot -1 (the guard row)"


def test_conv_pool_rejects_bad_slots():
    """Slot checks (the debug switch is on in the suite) and the pool's arguments, before launch."""
    inp = make_conv_inputs([4, 3], 16, seed=1, device=DEVICE)
    init = inp.pop("initial_states")
    pool = torch.zeros(3, 16, 3, device=DEVICE)
    slots = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    bad = [
        (dict(state_pool=pool, state_slots=torch.tensor([1, 1], device=DEVICE)), "state_slots", "distinct"),
        (dict(state_pool=pool, state_slots=torch.tensor([0, 3], device=DEVICE)), "state_slots", "0 .. 2"),
        (dict(state_pool=pool, state_slots=torch.tensor([0, -1], device=DEVICE)), "state_slots", "0 .. 2"),
        (dict(state_pool=pool, state_slots=torch.tensor([0, 1, 2], device=DEVICE)), "state_slots", "shape"),
        (dict(state_pool=pool), "state_slots", "needed"),
        (dict(state_slots=slots), "state_slots", "without state_pool"),
        (dict(state_pool=pool, state_slots=slots, initial_states=init), "initial_states", "None"),
        (dict(state_pool=pool.half(), state_slots=slots), "state_pool", "dtype"),
        (dict(state_pool=torch.zeros(3, 3, 16, device=DEVICE).transpose(1, 2), state_slots=slots), "state_pool",
         "contiguous"),
        (dict(state_pool=torch.zeros(3, 16, 4, device=DEVICE), state_slots=slots), "state_pool", "shape"),
    ]
    for change, arg, words in bad:
        with pytest.raises(ValueError, match=f"{arg}: .*{words}"):
            causal_conv1d(**inp, **change)
    assert torch.equal(pool, torch.zeros_like(pool)), "a rejected call wrote the pool"


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
