"""The Triton SSD scan (interpreter on CPU) against the fp32 oracle: y, final and captured states,
captures at and around internal chunk boundaries, resumes from captures, poisoned buffers, and
argument checks before launch. Internal chunk 16 so chunk-boundary cases stay cheap."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.ssd_scan as ssd_mod
from kernels.reference.ssd import ssd_scan_sequential
from kernels.ssd_scan import ssd_scan
from kernels.testing import assert_close, nan_filled
from kernels.torch_cpu.ssd import ssd_scan_chunked
from ssm_inputs import make_ssd_inputs, slice_seq

from conftest import DEVICE

L = 16  # internal chunk in these tests
SEQ_KEYS = ("x", "dt", "B", "C")


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer ssd_scan allocates (outputs and intermediates) starts as NaN."""
    monkeypatch.setattr(ssd_mod, "_empty", nan_filled)


def check_against_oracle(out, ref, dtype, what=""):
    assert out.y.dtype == dtype
    assert out.final_states.dtype == torch.float32 and out.captured_states.dtype == torch.float32
    assert_close(out.y, ref.y, dtype, f"{what} y")
    assert_close(out.final_states, ref.final_states, dtype, f"{what} final states")
    assert_close(out.captured_states, ref.captured_states, dtype, f"{what} captured states")


CASES = [
    # id, lens, H, P, G, N, offsets
    ("T63-one-seq-boundaries", [63], 4, 8, 1, 16,
     [[1, 15, 16, 17, 31, 32, 33, 62]]),  # o=1, around chunk ends 16 and 32, o=len-1
    ("three-seqs-G2", [37, 5, 21], 4, 8, 2, 16, [[16, 20], [1, 4], [15, 17]]),
    ("P-N-not-pow2", [29, 18], 3, 12, 3, 24, [[1, 28], [16]]),
    ("no-capture", [40, 9], 4, 8, 1, 16, None),
    ("empty-lists", [20, 20], 2, 8, 1, 16, [[], [3]]),
]


@pytest.mark.parametrize("lens,H,P,G,N,offsets", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_scan_matches_oracle(lens, H, P, G, N, offsets, dtype):
    inp = make_ssd_inputs(lens, H, P, G, N, dtype=dtype, seed=sum(lens), device=DEVICE)
    out = ssd_scan(**inp, capture_offsets=offsets, chunk_size=L)
    ref = ssd_scan_sequential(**inp, capture_offsets=offsets)
    check_against_oracle(out, ref, dtype)
    assert out.captured_states.shape == (sum(len(o) for o in offsets or []), H, P, N)


def test_options_no_softplus_limit_no_D_no_bias_zero_init():
    inp = make_ssd_inputs([30, 17], H=4, P=8, G=2, N=16, seed=7, with_init=False, device=DEVICE)
    inp["D"] = None
    inp["dt_bias"] = None
    inp["dt"] = inp["dt"].abs() * 0.2
    kw = dict(dt_softplus=False, dt_limit=(0.02, 0.08), capture_offsets=[[16], [8]])
    out = ssd_scan(**inp, **kw, chunk_size=L)
    check_against_oracle(out, ssd_scan_sequential(**inp, **kw), torch.float32)


def test_softplus_with_upper_limit():
    inp = make_ssd_inputs([25], H=4, P=8, G=1, N=16, seed=8, device=DEVICE)
    kw = dict(dt_limit=(0.0, 0.01), capture_offsets=[[16]])
    out = ssd_scan(**inp, **kw, chunk_size=L)
    check_against_oracle(out, ssd_scan_sequential(**inp, **kw), torch.float32)


def test_strided_views_like_the_model():
    """x, B, C, dt sliced out of one projection, as the model's mixer does (no copies)."""
    T, H, P, G, N = 45, 4, 8, 1, 16
    inp = make_ssd_inputs([30, 15], H, P, G, N, seed=9, device=DEVICE)
    zxbcdt = torch.randn(T, H * P + 2 * G * N + H + 3, device=DEVICE)
    o = 0
    for k, width in (("x", H * P), ("B", G * N), ("C", G * N), ("dt", H)):
        zxbcdt[:, o:o + width] = inp[k].reshape(T, -1)
        inp[k] = zxbcdt[:, o:o + width].view(T, *inp[k].shape[1:])
        o += width
    assert not inp["x"].is_contiguous()
    kw = dict(capture_offsets=[[17], [2]])
    out = ssd_scan(**inp, **kw, chunk_size=L)
    check_against_oracle(out, ssd_scan_sequential(**inp, **kw), torch.float32)


def test_chunk_size_32_and_zero_length_sequence():
    inp = make_ssd_inputs([0, 70, 0, 3], H=2, P=16, G=1, N=16, seed=10, device=DEVICE)
    kw = dict(capture_offsets=[[], [31, 32, 33, 64], [], [1]])
    out = ssd_scan(**inp, **kw, chunk_size=32)
    ref = ssd_scan_sequential(**inp, **kw)
    check_against_oracle(out, ref, torch.float32)
    assert torch.equal(out.final_states[0], inp["initial_states"][0]), "empty sequence keeps its initial state"


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_capture_is_prefix_final_and_resume_matches(data):
    """For random offsets: the captured state at o equals the final state of a scan over [0, o),
    and a scan resumed from it reproduces the uninterrupted scan's y and final state."""
    lens = data.draw(st.lists(st.integers(2, 50), min_size=1, max_size=3), label="lens")
    offsets = [sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=1, max_size=3), label=f"offs{s}"))
               for s, n in enumerate(lens)]
    inp = make_ssd_inputs(lens, H=2, P=8, G=1, N=16, seed=data.draw(st.integers(0, 999), label="seed"),
                          device=DEVICE)
    out = ssd_scan(**inp, capture_offsets=offsets, chunk_size=L)
    k = 0
    for s, offs in enumerate(offsets):
        start = sum(lens[:s])
        for o in offs:
            prefix = ssd_scan_chunked(**slice_seq(inp, SEQ_KEYS, lens, s, 0, o), chunk_size=L)
            assert_close(out.captured_states[k], prefix.final_states[0], torch.float32, f"seq {s} capture at {o}")
            rest = slice_seq(inp, SEQ_KEYS, lens, s, o, lens[s])
            rest["initial_states"] = out.captured_states[k:k + 1]
            resumed = ssd_scan(**rest, chunk_size=L)
            assert_close(resumed.y, out.y[start + o:start + lens[s]], torch.float32, f"seq {s} resumed at {o}: y")
            assert_close(resumed.final_states[0], out.final_states[s], torch.float32, f"seq {s} resumed at {o}")
            k += 1


def test_resume_from_capture_bf16():
    lens, o = [50], 17
    inp = make_ssd_inputs(lens, H=4, P=8, G=1, N=16, dtype=torch.bfloat16, seed=11, device=DEVICE)
    out = ssd_scan(**inp, capture_offsets=[[o]], chunk_size=L)
    rest = slice_seq(inp, SEQ_KEYS, lens, 0, o, 50)
    rest["initial_states"] = out.captured_states
    resumed = ssd_scan(**rest, chunk_size=L)
    assert_close(resumed.y, out.y[o:], torch.bfloat16, "resumed y")
    assert_close(resumed.final_states, out.final_states, torch.bfloat16, "resumed final")


def test_capture_does_not_change_y():
    """A cut at an offset changes the chunking, not the math: y with and without captures agree."""
    inp = make_ssd_inputs([61], H=2, P=8, G=1, N=16, seed=12, device=DEVICE)
    plain = ssd_scan(**inp, chunk_size=L)
    cut = ssd_scan(**inp, capture_offsets=[[5, 21, 40]], chunk_size=L)
    assert_close(cut.y, plain.y, torch.float32, "y with captures")
    assert_close(cut.final_states, plain.final_states, torch.float32, "final with captures")


BAD = [
    ("offset-0", {"capture_offsets": [[0], []]}, "capture_offsets"),
    ("offset-eq-len", {"capture_offsets": [[20], []]}, "capture_offsets"),
    ("offset-negative", {"capture_offsets": [[-1], []]}, "capture_offsets"),
    ("offset-unsorted", {"capture_offsets": [[9, 4], []]}, "capture_offsets"),
    ("offset-duplicated", {"capture_offsets": [[4, 4], []]}, "capture_offsets"),
    ("offset-wrong-count", {"capture_offsets": [[4]]}, "capture_offsets"),
    ("G-not-dividing-H", {"B": torch.randn(31, 3, 8), "C": torch.randn(31, 3, 8)}, "B"),
    ("C-dtype", {"C": torch.randn(31, 2, 8).bfloat16()}, "C"),
    ("x-shape", {"x": torch.randn(30, 4, 4)}, "dt"),
    ("A-shape", {"A": torch.randn(3)}, "A"),
    ("D-shape", {"D": torch.randn(5)}, "D"),
    ("init-fp16", {"initial_states": torch.zeros(2, 4, 4, 8).half()}, "initial_states"),
    ("cu-not-ending-at-T", {"cu_seqlens": torch.tensor([0, 20, 30], dtype=torch.int32)}, "cu_seqlens"),
    ("chunk-not-pow2", {"chunk_size": 24}, "chunk_size"),
    ("chunk-under-16", {"chunk_size": 8}, "chunk_size"),
]


@pytest.mark.parametrize("change,arg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_rejects_before_launch(change, arg, monkeypatch):
    inp = make_ssd_inputs([20, 11], H=4, P=4, G=2, N=8, seed=0)

    def no_launch(*a, **k):
        raise AssertionError("allocated/launched before validating")

    monkeypatch.setattr(ssd_mod, "_empty", no_launch)
    with pytest.raises(ValueError, match=arg):
        ssd_scan(**{**inp, **change})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_states_through_pool_slots(dtype):
    """Initial states read from and final states written to a state pool through slots, in the
    launch: equal to the scan with gathered initial states; no other slot touched."""
    lens, H, P, G, N = [37, 0, 20, 5], 4, 8, 2, 16
    inp = make_ssd_inputs(lens, H, P, G, N, dtype=dtype, seed=7, device=DEVICE)
    offs = [[16, 30], [], [3], []]
    ref = ssd_scan_sequential(**inp, capture_offsets=offs)
    pool = torch.full((7, H, P, N), float("nan"), device=DEVICE)
    slots = torch.tensor([5, 0, 2, 6], dtype=torch.int32, device=DEVICE)
    pool[slots.long()] = inp["initial_states"]
    kw = {k: v for k, v in inp.items() if k != "initial_states"}
    out = ssd_scan(**kw, capture_offsets=offs, chunk_size=16, state_pool=pool, state_slots=slots)
    assert out.final_states is pool
    assert_close(out.y, ref.y, dtype, "y")
    assert_close(pool[slots.long()], ref.final_states, dtype, "final states in their slots")
    assert_close(out.captured_states, ref.captured_states, dtype, "captured")
    assert torch.isnan(pool[[1, 3, 4]]).all(), "a slot no sequence owns was written"
    with pytest.raises(ValueError, match="initial_states"):
        ssd_scan(**inp, chunk_size=16, state_pool=pool, state_slots=slots)
