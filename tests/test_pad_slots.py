"""Pad rows (slot -1, as a CUDA-graph batch bucket filled up) in every decode kernel: nothing read
or written outside the pools, real rows as the references give them, the pad row's output finite.

Each pool is a view one slot into a NaN-filled buffer, so slot -1 is the buffer's first (guard)
slot: a kernel that read it would return NaN, one that wrote it would leave the guard changed.
"""

from __future__ import annotations

import torch

import kernels.conv1d_decode as conv_dec_mod
import kernels.ssd_decode as ssd_dec_mod
from kernels.conv1d_decode import causal_conv1d_decode_step
from kernels.ssd_decode import ssd_decode_step
from kernels.kv_cache_write import write_kv_cache
from kernels.paged_attention import PagedAttentionPlan, choose_config, is_decode, launch
from kernels.contracts.paged_attention import PagedAttentionMeta
from kernels.reference.conv1d import causal_conv1d_decode_step_ref
from kernels.reference.paged_attention import paged_attention_ref
from kernels.reference.ssd import ssd_decode_step_ref
from kernels.testing import assert_close, nan_filled

from conftest import DEVICE


def _guarded_pool(shape, dtype):
    """A NaN buffer of (guard slot, pool slots...) and the pool view after the guard."""
    base = torch.full((shape[0] + 1, *shape[1:]), float("nan"), dtype=dtype, device=DEVICE)
    return base, base[1:]


def test_ssd_decode_pad_slot(monkeypatch):
    monkeypatch.setattr(ssd_dec_mod, "_empty", nan_filled)
    g = torch.Generator().manual_seed(0)
    S, H, P, G, N = 4, 3, 12, 1, 20
    x, dt = torch.randn(S, H, P, generator=g), torch.randn(S, H, generator=g) * 0.5
    B, C = torch.randn(S, G, N, generator=g), torch.randn(S, G, N, generator=g)
    A, D, dt_bias = -torch.rand(H, generator=g) * 4 - 1, torch.randn(H, generator=g), torch.randn(H, generator=g)
    base, pool = _guarded_pool((5, H, P, N), torch.float32)
    slot_idx = torch.tensor([3, -1, 0, -1], device=DEVICE)
    pool[[3, 0]] = torch.randn(2, H, P, N, generator=g)
    ref_pool = pool.clone()
    args = [t.to(DEVICE) for t in (x, dt, A, B, C)]
    kw = dict(D=D.to(DEVICE), dt_bias=dt_bias.to(DEVICE))
    y = ssd_decode_step(*args, state_pool=pool, slot_idx=slot_idx, pad_slots=True, **kw)
    real = torch.tensor([0, 2])
    y_ref = ssd_decode_step_ref(*[a[real] if a.dim() > 1 else a for a in args], state_pool=ref_pool,
                                slot_idx=slot_idx[real], **kw)
    assert_close(y[real], y_ref, torch.float32, "real rows")
    zero = torch.zeros(1, H, P, N, device=DEVICE)
    for pad in (1, 3):
        y_pad = ssd_decode_step_ref(*[a[pad:pad + 1] if a.dim() > 1 else a for a in args], state_pool=zero.clone(),
                                    slot_idx=torch.tensor([0], device=DEVICE), **kw)
        assert_close(y[pad:pad + 1], y_pad, torch.float32, f"pad row {pad}: y from a zero state")
    assert torch.isnan(base[0]).all(), "the pad row wrote the guard slot (slot -1)"
    assert_close(pool[[3, 0]], ref_pool[[3, 0]], torch.float32, "real slots")
    assert torch.isnan(pool[[1, 2, 4]]).all(), "a slot no row owns was written"


def test_conv_decode_pad_slot(monkeypatch):
    monkeypatch.setattr(conv_dec_mod, "_empty", nan_filled)
    g = torch.Generator().manual_seed(1)
    S, D = 3, 700  # two channel blocks, the second ragged
    x, w, b = torch.randn(S, D, generator=g), torch.randn(D, 4, generator=g), torch.randn(D, generator=g)
    base, pool = _guarded_pool((4, D, 3), torch.float32)
    pool[[2, 0]] = torch.randn(2, D, 3, generator=g)
    ref_pool = pool.clone()
    slot_idx = torch.tensor([-1, 2, 0], device=DEVICE)
    x, w, b = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    y = causal_conv1d_decode_step(x, conv_state_pool=pool, weight=w, bias=b, slot_idx=slot_idx, pad_slots=True)
    y_ref = causal_conv1d_decode_step_ref(x[1:], conv_state_pool=ref_pool, weight=w, bias=b, slot_idx=slot_idx[1:])
    assert_close(y[1:], y_ref, torch.float32, "real rows")
    y_pad = causal_conv1d_decode_step_ref(x[:1], conv_state_pool=torch.zeros(1, D, 3, device=DEVICE), weight=w,
                                          bias=b, slot_idx=torch.tensor([0], device=DEVICE))
    assert_close(y[:1], y_pad, torch.float32, "pad row: y from a zero state")
    assert torch.isnan(base[0]).all(), "the pad row wrote the guard slot (slot -1)"
    assert_close(pool[[2, 0]], ref_pool[[2, 0]], torch.float32, "real slots")
    assert torch.isnan(pool[[1, 3]]).all(), "a slot no row owns was written"


def test_kv_cache_write_pad_slot():
    g = torch.Generator().manual_seed(2)
    nb, bs, hk, d = 3, 4, 2, 16
    base = torch.full((nb + 1, bs, hk, d), float("nan"), device=DEVICE)
    kc, vc = base[1:], torch.full((nb, bs, hk, d), float("nan"), device=DEVICE)
    k, v = torch.randn(3, hk, d, generator=g).to(DEVICE), torch.randn(3, hk, d, generator=g).to(DEVICE)
    write_kv_cache(k, v, kc, vc, torch.tensor([5, -1, 0], device=DEVICE))
    assert torch.isnan(base[0]).all(), "slot -1 wrote before the cache"
    assert torch.equal(kc.view(-1, hk, d)[[5, 0]], k[[0, 2]]) and torch.equal(vc.view(-1, hk, d)[[5, 0]], v[[0, 2]])
    assert int((~torch.isnan(kc)).sum()) == 2 * hk * d, "only the two real tokens were written"


def _pad_attention(num_splits):
    """Decode rows (q_len 1) beside pad rows (q_len 1, seq_len 0, block-table row -1): launched
    without the checks (a captured graph's rows are not checked), real rows match the reference and
    pad rows are 0."""
    g = torch.Generator().manual_seed(3)
    bs, hk, group, d = 4, 2, 2, 16
    seq_lens = [9, 0, 30, 0]
    nb = 12
    kc = torch.randn(nb, bs, hk, d, generator=g).to(DEVICE)
    vc = torch.randn(nb, bs, hk, d, generator=g).to(DEVICE)
    table = torch.full((4, 8), -1, dtype=torch.int32)
    table[0, :3] = torch.tensor([4, 1, 7], dtype=torch.int32)
    table[2, :8] = torch.tensor([0, 2, 3, 5, 6, 8, 9, 10], dtype=torch.int32)
    q = torch.randn(4, hk * group, d, generator=g).to(DEVICE)
    cu = torch.arange(5, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    table = table.to(DEVICE)
    meta = PagedAttentionMeta(4, [1] * 4, seq_lens, list(range(5)), 1, max(seq_lens))
    cfg = choose_config(torch.float32, d, group, decode=is_decode(1, group), num_seqs=4, num_kv_heads=hk,
                        max_seq_len=max(seq_lens), sm_count=132, num_splits=num_splits)
    out = nan_filled(q.shape, q.dtype, DEVICE)
    launch(PagedAttentionPlan(meta, d ** -0.5, cfg), q, kc, vc, table, lens, cu, out)
    real = [0, 2]
    want = paged_attention_ref(q[real], kc, vc, table[real], lens[real],
                               torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE))
    assert_close(out[real], want, torch.float32, f"real rows, {num_splits} splits")
    assert torch.equal(out[[1, 3]], torch.zeros_like(out[[1, 3]])), "pad rows are 0"


def test_paged_attention_pad_rows():
    _pad_attention(1)


def test_paged_attention_pad_rows_split_k():
    _pad_attention(4)
