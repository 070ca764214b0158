"""Seeded inputs for the SSD scan and causal conv1d tests (shared by the reference and kernel tests)."""

from __future__ import annotations

import math

import torch


def cu_seqlens_of(lens, device="cpu") -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def make_ssd_inputs(lens, H, P, G, N, dtype=torch.float32, seed=0, device="cpu", with_init=True):
    """Model-like magnitudes: A in [-16, -1] and dt' in [1e-3, 0.1] as HF's Mamba2 init draws them."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    x = rnd(T, H, P).to(dtype)
    B = rnd(T, G, N).to(dtype)
    C = rnd(T, G, N).to(dtype)
    dt = rnd(T, H, scale=0.5).to(dtype)
    dt_init = torch.exp(torch.rand(H, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    dt_bias = (dt_init + torch.log(-torch.expm1(-dt_init))).to(device)  # inverse softplus
    A = -torch.empty(H).uniform_(1.0, 16.0, generator=g).to(device)
    D = rnd(H)
    init = rnd(len(lens), H, P, N, scale=0.5) if with_init else None
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, cu_seqlens=cu_seqlens_of(lens, device),
                initial_states=init)


def make_conv_inputs(lens, D, W=4, dtype=torch.float32, seed=0, device="cpu", with_init=True):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    x = torch.randn(T, D, generator=g).to(dtype).to(device)
    weight = (torch.randn(D, W, generator=g) / math.sqrt(W)).to(dtype).to(device)
    bias = torch.randn(D, generator=g).to(dtype).to(device)
    init = torch.randn(len(lens), D, W - 1, generator=g).to(dtype).to(device) if with_init else None
    return dict(x=x, weight=weight, bias=bias, cu_seqlens=cu_seqlens_of(lens, device), initial_states=init)


def slice_seq(inputs: dict, keys, lens, s: int, lo: int, hi: int) -> dict:
    """Inputs for tokens [lo, hi) of sequence s alone, as a one-sequence batch."""
    start = sum(lens[:s])
    out = dict(inputs)
    for k in keys:
        out[k] = inputs[k][start + lo:start + hi]
    out["cu_seqlens"] = torch.tensor([0, hi - lo], dtype=torch.int32, device=inputs["cu_seqlens"].device)
    init = inputs.get("initial_states")
    out["initial_states"] = init[s:s + 1] if init is not None else None
    return out


def check_conv_capture_and_resume(conv, inp: dict, lens, offsets):
    """A conv state captured at o is the final state over [0, o), and resuming from it gives the
    rest of the sequence's outputs and the same final state (`conv`: kernel or reference).
    Returns the capturing run's output."""
    from kernels.testing import assert_close

    out = conv(**inp, capture_offsets=offsets)
    k = 0
    for s, offs in enumerate(offsets):
        start = sum(lens[:s])
        for o in offs:
            prefix = conv(**slice_seq(inp, ("x",), lens, s, 0, o))
            assert torch.equal(out.captured_states[k], prefix.final_states[0]), f"seq {s} capture {o}"
            rest = slice_seq(inp, ("x",), lens, s, o, lens[s])
            rest["initial_states"] = out.captured_states[k:k + 1]
            resumed = conv(**rest)
            assert_close(resumed.y, out.y[start + o:start + lens[s]], torch.float32, f"seq {s} resumed at {o}")
            assert torch.equal(resumed.final_states[0], out.final_states[s])
            k += 1
    return out
