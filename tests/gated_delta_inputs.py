"""Seeded inputs for the gated delta rule tests (shared by the kernel, CPU-path and reference tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssm_inputs import cu_seqlens_of

TINY_TOKEN = 3  # its q and k rows are scaled by 1e-3: sum of squares ~1e-5, so the l2norm's eps (1e-6) shows


def make_gdn_inputs(lens, HK, HV, K, V, dtype=torch.float32, seed=0, device="cpu", with_init=True):
    """Model-like gates: g = -A softplus(a + dt_bias) with A in [0.02, 0.5] (g mostly in [-1, 0]:
    the state keeps a chunk's worth of memory; Qwen3-Next's init draws A up to 16), beta = sigmoid(b)."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    q, k = rnd(T, HK, K), rnd(T, HK, K)
    if T > TINY_TOKEN:
        q[TINY_TOKEN] *= 1e-3
        k[TINY_TOKEN] *= 1e-3
    v = rnd(T, HV, V)
    A = torch.empty(HV).uniform_(0.02, 0.5, generator=gen)
    g = -A * F.softplus(rnd(T, HV) + 0.5)
    beta = torch.sigmoid(rnd(T, HV))
    init = rnd(len(lens), HV, K, V, scale=0.5) if with_init else None
    out = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta, cu_seqlens=cu_seqlens_of(lens),
               initial_states=init)
    return {key: (t.to(device) if t is not None else None) for key, t in out.items()}


def slice_gdn(inputs: dict, lens, s: int, lo: int, hi: int) -> dict:
    """Inputs for tokens [lo, hi) of sequence s alone, as a one-sequence batch."""
    start = sum(lens[:s])
    out = dict(inputs)
    for key in ("q", "k", "v", "g", "beta"):
        out[key] = inputs[key][start + lo:start + hi]
    out["cu_seqlens"] = torch.tensor([0, hi - lo], dtype=torch.int32, device=inputs["q"].device)
    init = inputs.get("initial_states")
    out["initial_states"] = init[s:s + 1] if init is not None else None
    return out
