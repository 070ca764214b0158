"""The fixed-shape decode step (`model.decode_graph`): on the CPU it runs eagerly and equals
`forward_batch`'s decode (logits, SSM/conv pools, KV) with pad rows that touch no state; on CUDA
the captured graph's replays equal the eager step."""

from __future__ import annotations

import copy

import pytest
import torch

from model import SequenceChunk, from_preset
from conftest import DEVICE
from model.decode_graph import DecodeGraphs
from model_helpers import max_abs, one_thread, prefilled  # noqa: F401  (one_thread: autouse)

LOGIT_ATOL = 1e-4  # fp32 logits, max abs (as tests/test_model_forward_batch.py)
BLOCK = 4


def _decode_rows(ids, tables, slots, lens, step):
    return [SequenceChunk(i[n + step:n + step + 1], n + step, t, sl) for i, t, sl, n in zip(ids, tables, slots, lens)]


@pytest.fixture(scope="module")
def model():
    return from_preset("tiny", backend="triton", seed=0, device=DEVICE)


def test_bucket_step_equals_forward_batch(model):
    lens, slots = [9, 14, 5], [4, 0, 2]  # 3 rows in bucket 4: one pad row
    cache, ids, tables = prefilled(model, lens, slots, BLOCK)
    ref_cache = copy.deepcopy(cache)
    for i in (1, 3, 5):  # slots no row owns: a pad row must leave them as they are
        cache.conv_pool[0][i].fill_(float("nan"))
        cache.ssm_pool[0][i].fill_(float("nan"))
    graphs = DecodeGraphs(model, cache, max_blocks=8, use_graphs=False)
    assert graphs.bucket_for(3) == 4
    for step in range(3):
        rows = _decode_rows(ids, tables, slots, lens, step)
        got = graphs.forward(rows)
        want = model.forward_batch(rows, ref_cache).logits
        for r, (g, w) in enumerate(zip(got, want)):
            assert max_abs(g, w) <= LOGIT_ATOL, f"step {step}, row {r}"
    for layer in cache.ssm_pool:
        assert max_abs(cache.ssm_pool[layer][slots], ref_cache.ssm_pool[layer][slots]) <= 1e-5, f"ssm pool {layer}"
        assert max_abs(cache.conv_pool[layer][slots], ref_cache.conv_pool[layer][slots]) <= 1e-5, f"conv pool {layer}"
    assert torch.isnan(cache.ssm_pool[0][[1, 3, 5]]).all() and torch.isnan(cache.conv_pool[0][[1, 3, 5]]).all()
    for layer in cache.key_cache:
        # 4-row vs 3-row projections round differently: the states' tolerance
        assert max_abs(cache.key_cache[layer], ref_cache.key_cache[layer]) <= 1e-5, f"key cache {layer}"


def test_rejects_what_a_bucket_cannot_hold(model):
    cache, ids, tables = prefilled(model, [6], [0], BLOCK)
    graphs = DecodeGraphs(model, cache, max_blocks=2, buckets=(1, 2), use_graphs=False)
    with pytest.raises(ValueError, match="start_pos"):
        graphs.forward([SequenceChunk(ids[0][6:7], 8, tables[0], 0)])  # 9 tokens > 2 blocks of 4
    with pytest.raises(ValueError, match="token_ids"):
        graphs.forward([SequenceChunk(ids[0][6:8], 6, tables[0], 0)])  # two tokens: not a decode row
    with pytest.raises(ValueError, match="backend"):
        DecodeGraphs(from_preset("tiny", backend="torch", seed=0), cache, max_blocks=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("max_blocks,splits", [(8, 1), (300, 2)], ids=["one-split", "split-k-workspace"])
def test_graph_replay_equals_eager_on_cuda(max_blocks, splits):
    """Graph replays == the eager bucket step, bit for bit; with 300 pages of 4 the bucket's plan
    splits K and the graph replays into the plan's preallocated workspace."""
    model = from_preset("tiny", backend="triton", seed=0).to("cuda")
    lens, slots = [9, 14, 5], [4, 0, 2]
    cache, ids, tables = prefilled(model, lens, slots, BLOCK)
    eager_cache = copy.deepcopy(cache)
    graphs = DecodeGraphs(model, cache, max_blocks=max_blocks, use_graphs=True)
    eager = DecodeGraphs(model, eager_cache, max_blocks=max_blocks, use_graphs=False)
    assert graphs._bucket(4).attention.plan.config.num_splits == splits
    for step in range(3):
        rows = _decode_rows(ids, tables, slots, lens, step)
        for r, (g, e) in enumerate(zip(graphs.forward(rows), eager.forward(rows))):
            assert max_abs(g, e) == 0.0, f"step {step}, row {r}: graph != eager"
    for layer in cache.ssm_pool:
        assert torch.equal(cache.ssm_pool[layer], eager_cache.ssm_pool[layer]), f"ssm pool {layer}"


def test_split_k_bucket_runs_in_its_own_workspace(model, monkeypatch):
    """Block tables of 300 pages of 4 (1200 tokens): the bucket's plan splits K in 2 and owns its
    workspace; the eager bucket step equals forward_batch and allocates no workspace."""
    import kernels.paged_attention as pa

    lens, slots = [9, 14], [1, 0]
    cache, ids, tables = prefilled(model, lens, slots, BLOCK)
    ref_cache = copy.deepcopy(cache)
    graphs = DecodeGraphs(model, cache, max_blocks=300, buckets=(2,), use_graphs=False)
    plan = graphs._bucket(2).attention.plan
    assert plan.config.num_splits == 2 and tuple(plan.workspace.acc.shape) == (2, 4, 2, 16)
    plan.workspace.acc.fill_(float("nan"))
    monkeypatch.setattr(pa, "allocate_split_workspace", lambda *a, **k: pytest.fail("allocated a workspace"))
    for step in range(2):
        rows = _decode_rows(ids, tables, slots, lens, step)
        for r, (g, w) in enumerate(zip(graphs.forward(rows), model.forward_batch(rows, ref_cache).logits)):
            assert max_abs(g, w) <= LOGIT_ATOL, f"step {step}, row {r}"
    assert not torch.isnan(plan.workspace.acc).any(), "the kernel wrote its partials elsewhere"
