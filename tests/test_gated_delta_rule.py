"""The Triton chunked gated delta rule (interpreter on CPU) against the fp64 token-by-token oracle:
o, final and captured states, captures on and off internal chunk boundaries (offset 1, the last
token, a sequence with none, empty sequences), resumes from captures, state pools, plans, strided
views, poisoned buffers, and argument checks before launch. Internal chunk 16 so chunk-boundary
cases stay cheap (the interpreter runs ~5 s a call on the busy two cores; keep the calls few)."""

from __future__ import annotations

import pytest
import torch

import kernels.gated_delta_rule as gdn_mod
from kernels.contracts.packed import IntTables
from kernels.gated_delta_rule import default_chunk_size, gated_delta_rule, plan_gated_delta_rule
from kernels.reference.gated_delta import gated_delta_rule_sequential
from kernels.testing import assert_close, nan_filled
from gated_delta_inputs import make_gdn_inputs, slice_gdn

from conftest import DEVICE

L = 16  # internal chunk in these tests


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer gated_delta_rule allocates (outputs and intermediates) starts as NaN."""
    monkeypatch.setattr(gdn_mod, "_empty", nan_filled)


def check_against_oracle(out, ref, dtype, what=""):
    assert out.o.dtype == dtype
    assert out.final_states.dtype == torch.float32 and out.captured_states.dtype == torch.float32
    assert_close(out.o, ref.o, dtype, f"{what} o")
    assert_close(out.final_states, ref.final_states, dtype, f"{what} final states")
    assert_close(out.captured_states, ref.captured_states, dtype, f"{what} captured states")


CASES = [
    # id, lens, HK, HV, K, V, offsets, dtypes
    ("T63-boundaries", [63], 2, 4, 12, 20, [[1, 15, 16, 17, 32, 33, 62]],  # o=1, around chunk ends, o=len-1
     (torch.float32, torch.bfloat16, torch.float16)),
    ("lens-63-1-130", [63, 1, 130], 1, 2, 16, 16, [[16, 40], [], [1, 64, 65, 129]], (torch.float32, torch.bfloat16)),
    # K = 40 and 100: the state kernel holds K as 2 and 4 register slices in fp32 (2 in bf16 at K = 100)
    ("empty-seqs-K40-V8", [0, 37, 0, 5], 2, 2, 40, 8, [[], [20, 36], [], [1, 4]], (torch.float32,)),
    ("K100-slices", [21], 1, 1, 100, 16, [[5, 16]], (torch.float32, torch.bfloat16)),
    ("no-capture-V40", [40, 9], 1, 3, 8, 40, None, (torch.float32,)),  # fp32: 3 state and 2 output V tiles
]
PARAMS = [pytest.param(*c[1:6], c[6], dtype, id=f"{c[0]}-{str(dtype)[6:]}") for c in CASES for dtype in c[7]]


@pytest.mark.parametrize("lens,HK,HV,K,V,offsets,dtype", PARAMS)
def test_scan_matches_oracle(lens, HK, HV, K, V, offsets, dtype):
    inp = make_gdn_inputs(lens, HK, HV, K, V, dtype=dtype, seed=sum(lens) + K, device=DEVICE)
    out = gated_delta_rule(**inp, capture_offsets=offsets, chunk_size=L)
    ref = gated_delta_rule_sequential(**inp, capture_offsets=offsets)
    check_against_oracle(out, ref, dtype)
    assert out.captured_states.shape == (sum(len(o) for o in offsets or []), HV, K, V)
    if 0 in lens:
        s = lens.index(0)
        assert torch.equal(out.final_states[s], inp["initial_states"][s]), "an empty sequence keeps its initial state"


def test_chunk_64_no_norm_scale_zero_init():
    """Qwen3-Next's chunk (64) over a cut chunk, l2norm off, a given scale, no initial states."""
    lens = [70, 3]
    inp = make_gdn_inputs(lens, 1, 2, 16, 16, seed=5, device=DEVICE, with_init=False)
    inp["q"], inp["k"] = inp["q"] * 0.3, inp["k"] * 0.3  # un-normalised keys: keep |beta k k^T| moderate
    kw = dict(capture_offsets=[[30, 64], [2]], use_qk_l2norm=False, scale=0.7)
    out = gated_delta_rule(**inp, **kw, chunk_size=64)
    check_against_oracle(out, gated_delta_rule_sequential(**inp, **kw), torch.float32)


def test_default_chunk_per_dtype():
    """Without chunk_size a launch runs the compile-checked chunk: 64 for 16-bit inputs, 32 for fp32."""
    assert default_chunk_size(torch.bfloat16) == 64 and default_chunk_size(torch.float32) == 32
    inp = make_gdn_inputs([40], 1, 1, 16, 16, dtype=torch.bfloat16, seed=12, device=DEVICE)
    out = gated_delta_rule(**inp, capture_offsets=[[33]])
    check_against_oracle(out, gated_delta_rule_sequential(**inp, capture_offsets=[[33]]), torch.bfloat16)


def test_capture_resume_and_prefix():
    """A capture at o equals the final state of a scan over [0, o) (a launch of its own), and a scan
    resumed from it reproduces the uninterrupted scan's o and final state."""
    lens, offsets = [45, 20], [[7, 32], [16]]
    inp = make_gdn_inputs(lens, 2, 4, 8, 16, seed=3, device=DEVICE)
    out = gated_delta_rule(**inp, capture_offsets=offsets, chunk_size=L)
    plain = gated_delta_rule(**inp, chunk_size=L)
    assert_close(out.o, plain.o, torch.float32, "o with and without captures")
    assert_close(out.final_states, plain.final_states, torch.float32, "final with and without captures")
    s, o, kc = 0, 7, 0  # one prefix and one resume: each is a launch sequence of its own
    prefix = gated_delta_rule(**slice_gdn(inp, lens, s, 0, o), chunk_size=L)
    assert_close(out.captured_states[kc], prefix.final_states[0], torch.float32, "capture vs prefix final")
    s, o, kc = 1, 16, 2
    rest = slice_gdn(inp, lens, s, o, lens[s])
    rest["initial_states"] = out.captured_states[kc:kc + 1]
    resumed = gated_delta_rule(**rest, chunk_size=L)
    assert_close(resumed.o, out.o[lens[0] + o:], torch.float32, "resumed o")
    assert_close(resumed.final_states[0], out.final_states[s], torch.float32, "resumed final")


def test_states_through_pool_slots_and_plan():
    """Initial states read from and final states written to a pool through slots, in the launch,
    with a host-built plan (cu_seqlens not read); no other slot touched; a mismatched plan refused."""
    lens, HK, HV, K, V = [37, 0, 20], 1, 2, 8, 16
    offs = [[16, 30], [], [3]]
    inp = make_gdn_inputs(lens, HK, HV, K, V, seed=7, device=DEVICE)
    ref = gated_delta_rule_sequential(**inp, capture_offsets=offs)
    pool = torch.full((6, HV, K, V), float("nan"), device=DEVICE)
    slots = torch.tensor([5, 0, 2], dtype=torch.int32, device=DEVICE)
    pool[slots.long()] = inp["initial_states"]
    kw = {key: val for key, val in inp.items() if key != "initial_states"}
    tables = IntTables()
    plan = plan_gated_delta_rule(lens, offs, L, tables)
    tables.upload(DEVICE)
    out = gated_delta_rule(**kw, capture_offsets=offs, chunk_size=L, plan=plan, state_pool=pool, state_slots=slots)
    assert out.final_states is pool
    assert_close(out.o, ref.o, torch.float32, "o")
    assert_close(pool[slots.long()], ref.final_states, torch.float32, "final states in their slots")
    assert_close(out.captured_states, ref.captured_states, torch.float32, "captured")
    assert torch.isnan(pool[[1, 3, 4]]).all(), "a slot no sequence owns was written"
    with pytest.raises(ValueError, match="plan"):
        gated_delta_rule(**kw, capture_offsets=[[16], [], [3]], chunk_size=L, plan=plan, state_pool=pool,
                         state_slots=slots)
    with pytest.raises(ValueError, match="initial_states"):
        gated_delta_rule(**inp, chunk_size=L, state_pool=pool, state_slots=slots)


def test_strided_views_like_the_model():
    """q, k, v, g, beta sliced out of one projection (no copies), as a model's mixer passes them."""
    lens, HK, HV, K, V = [30, 9], 1, 2, 8, 16
    T = sum(lens)
    inp = make_gdn_inputs(lens, HK, HV, K, V, seed=9, device=DEVICE)
    proj = torch.randn(T, 2 * HK * K + HV * V + 2 * HV + 5, device=DEVICE)
    col = 0
    for key, width in (("q", HK * K), ("k", HK * K), ("v", HV * V), ("g", HV), ("beta", HV)):
        proj[:, col:col + width] = inp[key].reshape(T, -1)
        inp[key] = proj[:, col:col + width].view(T, *inp[key].shape[1:])
        col += width
    assert not inp["q"].is_contiguous() and not inp["g"].is_contiguous()
    kw = dict(capture_offsets=[[17], [2]])
    out = gated_delta_rule(**inp, **kw, chunk_size=L)
    check_against_oracle(out, gated_delta_rule_sequential(**inp, **kw), torch.float32)


BAD = [
    ("offset-0", {"capture_offsets": [[0], []]}, "capture_offsets"),
    ("offset-eq-len", {"capture_offsets": [[20], []]}, "capture_offsets"),
    ("offset-unsorted", {"capture_offsets": [[9, 4], []]}, "capture_offsets"),
    ("offset-wrong-count", {"capture_offsets": [[4]]}, "capture_offsets"),
    ("HK-not-dividing-HV", {"q": torch.randn(31, 3, 8), "k": torch.randn(31, 3, 8)}, "v"),
    ("k-dtype", {"k": torch.randn(31, 2, 8).bfloat16()}, "k"),
    ("v-dtype", {"v": torch.randn(31, 4, 6).half()}, "v"),
    ("g-shape", {"g": torch.randn(31, 2)}, "g"),
    ("beta-shape", {"beta": torch.randn(30, 4)}, "beta"),
    ("init-shape", {"initial_states": torch.zeros(2, 4, 6, 8)}, "initial_states"),
    ("init-bf16", {"initial_states": torch.zeros(2, 4, 8, 6).bfloat16()}, "initial_states"),
    ("cu-not-ending-at-T", {"cu_seqlens": torch.tensor([0, 20, 30], dtype=torch.int32)}, "cu_seqlens"),
    ("scale-negative", {"scale": -1.0}, "scale"),
    ("chunk-not-pow2", {"chunk_size": 24}, "chunk_size"),
    ("K-over-256", {"q": torch.randn(31, 2, 300), "k": torch.randn(31, 2, 300),
                    "initial_states": torch.zeros(2, 4, 300, 6)}, "q"),
    ("slots-without-pool", {"state_slots": torch.tensor([0, 1])}, "state_slots"),
]


@pytest.mark.parametrize("change,arg", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_rejects_before_launch(change, arg, monkeypatch):
    inp = make_gdn_inputs([20, 11], HK=2, HV=4, K=8, V=6, seed=0)

    def no_launch(*a, **k):
        raise AssertionError("allocated/launched before validating")

    monkeypatch.setattr(gdn_mod, "_empty", no_launch)
    with pytest.raises(ValueError, match=arg):
        gated_delta_rule(**{**inp, **change})
