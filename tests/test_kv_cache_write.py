"""`write_kv_cache` (Triton) and the CPU path against the oracle `write_kv_cache_ref`, and their input checks."""

from __future__ import annotations

import pytest
import torch

from kernels.kv_cache_write import write_kv_cache
from kernels.reference.paged_attention import write_kv_cache_ref
from kernels.torch_cpu.paged_attention import write_kv_cache_cpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _case(num_tokens, num_blocks, block_size, num_kv_heads, head_dim, dtype, seed, index_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    # key/value as slices of a fused projection: token stride > num_kv_heads * head_dim
    fused = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=g).to(dtype)
    key, value = fused[:, 1], fused[:, 2]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    skip = torch.rand(num_tokens, generator=g) < 0.25
    slot_mapping = torch.where(skip, -1, slots).to(index_dtype)
    cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    return [t.to(DEVICE) for t in (key, value, cache, cache.clone(), slot_mapping)]


@pytest.mark.parametrize(
    "num_tokens,num_blocks,block_size,num_kv_heads,head_dim,dtype,index_dtype",
    [
        (63, 9, 16, 2, 64, "bf16", torch.int64),
        (63, 9, 16, 2, 64, "fp16", torch.int32),
        (130, 3, 128, 3, 80, "fp32", torch.int64),
        (1, 2, 256, 8, 128, "bf16", torch.int32),
        (17, 5, 32, 1, 96, "bf16", torch.int64),
    ],
    ids=["bf16-T63-bs16-d64", "fp16-T63-bs16-d64-i32", "fp32-T130-bs128-h3-d80", "bf16-T1-bs256-h8-d128-i32",
         "bf16-T17-bs32-h1-d96"],
)
def test_write_kv_cache_matches_reference(num_tokens, num_blocks, block_size, num_kv_heads, head_dim, dtype,
                                          index_dtype):
    key, value, kc, vc, slot_mapping = _case(num_tokens, num_blocks, block_size, num_kv_heads, head_dim,
                                             DTYPES[dtype], seed=num_tokens, index_dtype=index_dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv_cache(key, value, kc, vc, slot_mapping)
    write_kv_cache_ref(key, value, kc_ref, vc_ref, slot_mapping)
    # Exact: a copy. equal_nan: slots that nobody writes (and skipped tokens) must stay NaN.
    assert torch.equal(kc.isnan(), kc_ref.isnan()) and torch.equal(vc.isnan(), vc_ref.isnan())
    assert torch.equal(kc.nan_to_num(0.0), kc_ref.nan_to_num(0.0))
    assert torch.equal(vc.nan_to_num(0.0), vc_ref.nan_to_num(0.0))
    written = (slot_mapping >= 0).sum().item()
    assert (~kc.isnan()).sum().item() == written * num_kv_heads * head_dim
    kc_cpu, vc_cpu = kc_ref.clone().fill_(float("nan")), vc_ref.clone().fill_(float("nan"))
    write_kv_cache_cpu(key, value, kc_cpu, vc_cpu, slot_mapping)
    assert torch.equal(kc_cpu.nan_to_num(0.0), kc_ref.nan_to_num(0.0)) and torch.equal(kc_cpu.isnan(), kc_ref.isnan())
    assert torch.equal(vc_cpu.nan_to_num(0.0), vc_ref.nan_to_num(0.0)) and torch.equal(vc_cpu.isnan(), vc_ref.isnan())


def test_write_kv_cache_ref_places_tokens_by_slot():
    """The oracle itself: slot = block * block_size + offset, -1 skipped."""
    key = torch.arange(3, dtype=torch.float32).view(3, 1, 1) + 1
    kc = torch.zeros(2, 4, 1, 1)
    vc = torch.zeros(2, 4, 1, 1)
    write_kv_cache_ref(key, -key, kc, vc, torch.tensor([5, -1, 0]))
    assert kc.flatten().tolist() == [3, 0, 0, 0, 0, 1, 0, 0]
    assert vc.flatten().tolist() == [-3, 0, 0, 0, 0, -1, 0, 0]


def _bad(name):
    key, value, kc, vc, slots = _case(8, 2, 16, 2, 64, torch.float16, seed=0)
    args = dict(key=key, value=value, key_cache=kc, value_cache=vc, slot_mapping=slots)
    if name == "key-dtype-vs-cache":
        args.update(key=key.float(), value=value.float())
    elif name == "value-shape":
        args.update(value=value[:, :1])
    elif name == "heads-vs-cache":
        args.update(key=key[:, :1], value=value[:, :1])
    elif name == "slot-out-of-range":
        args["slot_mapping"] = slots.clone().fill_(2 * 16)
    elif name == "slot-below-minus-one":
        args["slot_mapping"] = slots.clone().fill_(-2)
    elif name == "slot-float":
        args["slot_mapping"] = slots.float()
    elif name == "slot-length":
        args["slot_mapping"] = slots[:-1]
    elif name == "cache-not-contiguous":
        # the same bytes viewed as (num_blocks, num_kv_heads, block_size, head_dim): not our layout
        args.update(key_cache=kc.transpose(1, 2).contiguous().transpose(1, 2),
                    value_cache=vc.transpose(1, 2).contiguous().transpose(1, 2))
    elif name == "device-mismatch":
        args["slot_mapping"] = torch.empty(slots.shape, dtype=slots.dtype, device="meta")
    return args


@pytest.mark.parametrize("name", ["key-dtype-vs-cache", "value-shape", "heads-vs-cache", "slot-out-of-range",
                                  "slot-below-minus-one", "slot-float", "slot-length", "cache-not-contiguous",
                                  "device-mismatch"])
def test_write_kv_cache_rejects_bad_input_before_writing(name):
    args = _bad(name)
    before = args["key_cache"].clone()
    with pytest.raises(ValueError):
        write_kv_cache(**args)
    assert torch.equal(args["key_cache"].isnan(), before.isnan()), "cache written before the error"
    with pytest.raises(ValueError):  # the oracle and the CPU path reject the same inputs
        write_kv_cache_ref(**args)
    with pytest.raises(ValueError):
        write_kv_cache_cpu(**args)
