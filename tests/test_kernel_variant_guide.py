"""docs/add_a_kernel_variant.md followed once: a toy KV-cache write by `index_copy_` (step 1),
checked against the op's oracle on NaN-poisoned caches (step 2), put in a backend of its own (step 3,
on a copy of the backends table) and run through the model: logits and captured states equal
the `torch` backend's, whose write differs only in how it indexes."""

import pytest
import torch

from kernels.contracts.paged_attention import check_kv_cache_write_args
from kernels.reference.paged_attention import write_kv_cache_ref
from model import backends
from model.batch import SequenceChunk
from model.loading import from_preset


# ---- step 1: the variant, one function with the op's signature ---------------------------------
def write_kv_cache_index_copy(key, value, key_cache, value_cache, slot_mapping, *, check_slots=True):
    """Token t's K/V into flat slot slot_mapping[t] (-1 skips), by index_copy_ on the flattened caches."""
    check_kv_cache_write_args(key, value, key_cache, value_cache, slot_mapping, check_slots)
    keep = (slot_mapping >= 0).nonzero().flatten()
    slots = slot_mapping.index_select(0, keep).long()
    heads, dim = key_cache.shape[2:]
    key_cache.view(-1, heads, dim).index_copy_(0, slots, key.index_select(0, keep))
    value_cache.view(-1, heads, dim).index_copy_(0, slots, value.index_select(0, keep))


# ---- step 2: against the oracle, ugly sizes, NaN-poisoned -----------------------------------------
@pytest.mark.parametrize("tokens,blocks,block_size,heads,dim,dtype", [
    (63, 9, 16, 2, 64, torch.bfloat16), (130, 3, 128, 3, 80, torch.float32), (1, 2, 256, 8, 128, torch.float16),
    (17, 5, 32, 1, 96, torch.float32),
])
def test_variant_matches_the_oracle(tokens, blocks, block_size, heads, dim, dtype):
    g = torch.Generator().manual_seed(tokens)
    fused = torch.randn(tokens, 3, heads, dim, generator=g).to(dtype)  # strided K/V, as in the model
    key, value = fused[:, 1], fused[:, 2]
    slots = torch.randperm(blocks * block_size, generator=g)[:tokens]
    slot_mapping = torch.where(torch.rand(tokens, generator=g) < 0.25, -1, slots)
    poisoned = torch.full((blocks, block_size, heads, dim), float("nan"), dtype=dtype)
    got_k, got_v, want_k, want_v = (poisoned.clone() for _ in range(4))
    write_kv_cache_index_copy(key, value, got_k, got_v, slot_mapping)
    write_kv_cache_ref(key, value, want_k, want_v, slot_mapping)
    # a copy is exact; NaN where nothing was written, in both (equal_nan)
    assert torch.equal(got_k.isnan(), want_k.isnan()) and torch.equal(got_v.isnan(), want_v.isnan())
    assert torch.allclose(got_k, want_k, atol=0, rtol=0, equal_nan=True)
    assert torch.allclose(got_v, want_v, atol=0, rtol=0, equal_nan=True)


# ---- step 3: a backend that runs it, and the model through it ------------------------------------
@pytest.fixture
def variant_backend(monkeypatch):
    ops = dict(backends._SPECS["torch"].ops, write_kv_cache=(__name__, "write_kv_cache_index_copy"))
    specs = dict(backends._SPECS, **{"torch-index-copy": backends.BackendSpec(ops=ops)})
    monkeypatch.setattr(backends, "_SPECS", specs)
    monkeypatch.setattr(backends, "_loaded", {})
    return "torch-index-copy"


def test_the_model_runs_the_variant(variant_backend):
    ref = from_preset("tiny", seed=0)
    ours = from_preset("tiny", seed=0).set_backend(variant_backend)
    assert ours.ops.write_kv_cache is write_kv_cache_index_copy
    ids = torch.arange(3, 40)
    outs = []
    for model in (ref, ours):
        cache = model.allocate_cache(8, 16, 1)
        first = model.forward_batch([SequenceChunk(ids[:21], 0, [0, 1], 0, capture_offsets=(9,), all_logits=True)], cache)
        second = model.forward_batch([SequenceChunk(ids[21:], 21, [0, 1, 2], 0, all_logits=True)], cache)
        outs.append((first, second))
    (r1, r2), (o1, o2) = outs
    assert torch.equal(r1.logits[0], o1.logits[0]) and torch.equal(r2.logits[0], o2.logits[0])
    for a, b in zip(r1.captured[0], o1.captured[0]):
        assert all(torch.equal(x, y) for x, y in zip(a.conv + a.ssm, b.conv + b.ssm))
