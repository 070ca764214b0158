"""The gated delta rule oracle against its source (transformers' Qwen3-Next functions), and the CPU
path (`kernels.torch_cpu.gated_delta`) against the oracle: captures on and off chunk boundaries,
offset 1, the last token, empty sequences, GQA heads, bit-identical o and final states with and
without captures, and the CPU decode step."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.reference.gated_delta import gated_delta_decode_step_ref, gated_delta_rule_sequential
from kernels.testing import assert_close
from kernels.torch_cpu.gated_delta import gated_delta_decode_step_cpu, gated_delta_rule_chunked
from gated_delta_inputs import make_gdn_inputs

hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def hf_per_sequence(fn, inp, lens, use_norm, **kw):
    """transformers' function run on each sequence alone (batch 1, its initial state), concatenated."""
    outs, finals, tok = [], [], 0
    for s, n in enumerate(lens):
        rows = slice(tok, tok + n)
        args = [inp[key][rows][None] for key in ("q", "k", "v", "g", "beta")]
        o, final = fn(*args, initial_state=inp["initial_states"][s:s + 1], output_final_state=True,
                      use_qk_l2norm_in_kernel=use_norm, **kw)
        outs.append(o[0])
        finals.append(final[0])
        tok += n
    return torch.cat(outs), torch.stack(finals)


@pytest.mark.parametrize("use_norm", [True, False], ids=["l2norm", "no-norm"])
@pytest.mark.parametrize("which", ["recurrent", "chunk16", "chunk64"])
def test_oracle_matches_transformers(which, use_norm):
    """HF's functions compute in fp32; the oracle in fp64: agreement within the fp32 tolerance.
    Two key heads over four value heads (HF repeats each key head over consecutive value heads),
    K != V (the default scale is K^-0.5), lengths off the chunk grid."""
    lens, HK, HV, K, V = [37, 5, 70], 2, 4, 12, 20
    inp = make_gdn_inputs(lens, HK, HV, K, V, seed=21)
    if not use_norm:
        inp["q"], inp["k"] = inp["q"] * 0.3, inp["k"] * 0.3
    if which == "recurrent":
        want_o, want_final = hf_per_sequence(hf.torch_recurrent_gated_delta_rule, inp, lens, use_norm)
    else:
        want_o, want_final = hf_per_sequence(hf.torch_chunk_gated_delta_rule, inp, lens, use_norm,
                                             chunk_size=int(which[5:]))
    ref = gated_delta_rule_sequential(**inp, use_qk_l2norm=use_norm)
    assert_close(ref.o, want_o, torch.float32, f"{which} o")
    assert_close(ref.final_states, want_final, torch.float32, f"{which} final")


def test_oracle_tiny_by_hand():
    """One head, K = V = 1, no norm, scale 1: s = e^g s + k beta (v - k e^g s), o = q s."""
    q, k, v = torch.tensor([[[2.0]], [[-1.0]]]), torch.tensor([[[0.5]], [[3.0]]]), torch.tensor([[[4.0]], [[1.0]]])
    g, beta = torch.tensor([[-0.5], [0.0]]), torch.tensor([[0.25], [1.0]])
    s0 = 1.5
    decayed = math.exp(-0.5) * s0
    s1 = decayed + 0.5 * 0.25 * (4.0 - 0.5 * decayed)
    s2 = s1 + 3.0 * 1.0 * (1.0 - 3.0 * s1)
    out = gated_delta_rule_sequential(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
                                      initial_states=torch.full((1, 1, 1, 1), s0), capture_offsets=[[1]],
                                      scale=1.0, use_qk_l2norm=False)
    torch.testing.assert_close(out.o.flatten(), torch.tensor([2.0 * s1, -1.0 * s2]))
    torch.testing.assert_close(out.captured_states.flatten(), torch.tensor([s1]))
    torch.testing.assert_close(out.final_states.flatten(), torch.tensor([s2]))


CPU_CASES = [
    # id, lens, HK, HV, K, V, offsets, chunk
    ("T63-boundaries-L16", [63], 2, 4, 12, 20, [[1, 15, 16, 17, 32, 33, 62]], 16),
    ("lens-63-1-130-L64", [63, 1, 130], 1, 2, 16, 16, [[16, 40, 62], [], [1, 63, 64, 65, 128, 129]], 64),
    ("empty-seqs-L16", [0, 37, 0, 5], 2, 2, 32, 8, [[], [16, 36], [], [1, 4]], 16),
    ("no-capture-L32", [40, 9], 1, 3, 8, 24, None, 32),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("lens,HK,HV,K,V,offsets,chunk", [c[1:] for c in CPU_CASES], ids=[c[0] for c in CPU_CASES])
def test_cpu_path_matches_oracle(lens, HK, HV, K, V, offsets, chunk, dtype):
    inp = make_gdn_inputs(lens, HK, HV, K, V, dtype=dtype, seed=len(lens) + K)
    out = gated_delta_rule_chunked(**inp, capture_offsets=offsets, chunk_size=chunk)
    ref = gated_delta_rule_sequential(**inp, capture_offsets=offsets)
    assert out.o.dtype == dtype
    assert_close(out.o, ref.o, dtype, "o")
    assert_close(out.final_states, ref.final_states, dtype, "final")
    assert_close(out.captured_states, ref.captured_states, dtype, "captured")
    plain = gated_delta_rule_chunked(**inp, chunk_size=chunk)
    assert torch.equal(plain.o, out.o) and torch.equal(plain.final_states, out.final_states), \
        "captures changed the CPU path's chunking"


def test_cpu_path_options():
    inp = make_gdn_inputs([50, 7], 1, 2, 16, 8, seed=4, with_init=False)
    inp["q"], inp["k"] = inp["q"] * 0.3, inp["k"] * 0.3
    kw = dict(capture_offsets=[[3, 49], [6]], use_qk_l2norm=False, scale=0.5)
    out = gated_delta_rule_chunked(**inp, **kw, chunk_size=16)
    ref = gated_delta_rule_sequential(**inp, **kw)
    for got, want, what in zip(out, ref, ("o", "final", "captured")):
        assert_close(got, want, torch.float32, what)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_decode_matches_oracle(dtype):
    S, HK, HV, K, V = 3, 2, 4, 12, 20
    inp = make_gdn_inputs([1] * S, HK, HV, K, V, dtype=dtype, seed=2)
    pool = torch.randn(5, HV, K, V)
    ref_pool = pool.clone()
    slots = torch.tensor([3, 0, 4], dtype=torch.int32)
    args = [inp[key] for key in ("q", "k", "v", "g", "beta")]
    o = gated_delta_decode_step_cpu(*args, state_pool=pool, slot_idx=slots)
    o_ref = gated_delta_decode_step_ref(*args, state_pool=ref_pool, slot_idx=slots)
    assert o.dtype == dtype
    assert_close(o, o_ref, dtype, "o")
    assert_close(pool, ref_pool, dtype, "pool")
    assert torch.equal(pool[[1, 2]], ref_pool[[1, 2]]), "a slot no sequence owns changed"
