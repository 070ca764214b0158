"""`model.cost.ModelCost` against what the model runs: `torch.utils.flop_counter.FlopCounterMode`
over a prefill chunk of each family's small preset on the torch backend, the parameters of the
built model, the bytes of its cache; and the numbers quoted in `model/cost.py`'s docstring.

What FlopCounterMode sees on the torch backend (CPU), and so what is compared:
* `mm`/`addmm` (or oneDNN's `_linear_pointwise`, where `model.linear` routes fp32 there): every nn.Linear / F.linear: the Mamba in/out projections, attention q/k/v/o,
  the MLPs, routers and each expert's slice of tokens (`model.moe.weighted_expert_rows` loops over
  experts on a CPU), and the LM head on the chunk's last token -> `Flops.matmuls + Flops.head`;
* `bmm`: the SSD scan's four products (`kernels/torch_cpu/ssd.py`: B^T x, C h, C B^T and its
  product with x). That implementation has its own chunk (64, its default: the torch backend
  does not pass the config's, `scan_chunk_from_config` False), pads a row's last chunk to a
  whole one and multiplies whole Q x Q blocks, so it is compared with the cost model's scan
  term for `ScanKernel(chunk=64, causal=False, padded=True)`; the default (`TRITON_SCAN`:
  the config's chunk, lower triangle, no padding) counts the Triton kernel's work instead;
* attention: torch has no FLOP formula for the CPU flash op (`_scaled_dot_product_flash_attention_for_cpu`
  counts 0), so the test gives it one: 4 x head_dim per (query head, visible query-key pair)
  (Q K^T and P V), the pairs read off the mask or causal flag the model passed -> `Flops.attention`;
* not seen: the depthwise conv (elementwise multiply-adds) -> `Flops.conv` is the one term
  FlopCounterMode misses (0.3% of a chunk here), and norms, gates, activations, RoPE.
Each seen term must match exactly, and the whole count within 5% (issue 19's criterion).
"""

from __future__ import annotations

import inspect
import sys
from unittest import mock

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import model.linear as linear_mod
from model import PRESETS, HybridLM, SequenceChunk, init_random_weights
from model.backends import get_backend
from model.cache import ModelCache
from model.cost import ModelCost, ScanKernel
from model.engine import Engine
from model_helpers import one_thread, tokens  # noqa: F401  (one_thread: autouse)

aten = torch.ops.aten
# One a family: Bamba, Granite-4.0-H with experts (its shared MLP is also all of the dense layout,
# granite-dense-cpu, whose parameters are checked below), Nemotron-H (every layer kind).
SMALL_PRESETS = ("small", "granite-small-cpu", "nemotron-h-small-cpu")
NEW_TOKENS = 140  # not a multiple of the scan's chunk: the torch scan pads 140 to 192


def torch_scan_kernel() -> ScanKernel:
    backend = get_backend("torch")
    assert not backend.capabilities.scan_chunk_from_config  # the torch scan keeps its own chunk
    chunk = inspect.signature(backend.ssd_scan).parameters["chunk_size"].default
    assert chunk == 64
    return ScanKernel(chunk=chunk, causal=False, padded=True)


def attended_pairs_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, attn_mask=None, out_val=None,
                         **kwargs) -> int:
    """SDPA: 4 x head_dim FLOPs per query head and visible (query, key) pair."""
    batch, heads, rows, head_dim = query.shape
    keys = key.shape[-2]
    if attn_mask is not None:  # bool, or additive (0 visible, -inf hidden) as SDPA hands it to the CPU op
        visible = attn_mask if attn_mask.dtype == torch.bool else attn_mask != float("-inf")
        pairs = int(visible.expand(batch, heads, rows, keys).sum())
    elif is_causal:  # top-left causal: row i sees keys 0 .. i
        pairs = batch * heads * sum(min(i + 1, keys) for i in range(rows))
    else:
        pairs = batch * heads * rows * keys
    return 4 * head_dim * pairs


attended_pairs_flops._get_raw = True  # FlopCounterMode passes the tensors, not their shapes


def onednn_linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """The oneDNN fp32 linear (`model.linear`'s route where the start-up probe picks it,
    kernels/torch_cpu/capability.py): x (M, K) times weight (N, K)^T, 2 M N K, as aten.mm counts it."""
    rows = 1
    for d in x_shape[:-1]:
        rows *= d
    return 2 * rows * x_shape[-1] * w_shape[0]


ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise


def counted_prefill(model: HybridLM, cached: int, n: int) -> dict:
    """FlopCounterMode's counts, by op, of a chunk of n tokens after `cached` ones run first."""
    seq = tokens(cached + n, seed=1, vocab=model.config.vocab_size)
    num_blocks = -(-(cached + n) // 16)
    cache, blocks = model.allocate_cache(num_blocks, 16, 1), list(range(num_blocks))
    if cached:
        model.forward_batch([SequenceChunk(seq[:cached], 0, blocks, 0)], cache)
    counter = FlopCounterMode(display=False,
                              custom_mapping={aten._scaled_dot_product_flash_attention_for_cpu: attended_pairs_flops,
                                              ONEDNN_LINEAR: onednn_linear_flops})
    # oneDNN products pad their rows (model.linear.padded_rows, a CPU kernel-reuse detail the
    # model's FLOPs do not hold): counted unpadded. The fp32 route is the start-up probe's, and
    # where MKL and oneDNN time level (the Intel Xeon with AMX) it can draw either.
    with counter, mock.patch.object(linear_mod, "EXACT_ROWS", sys.maxsize):
        model.forward_batch([SequenceChunk(seq[cached:], cached, blocks, 0)], cache)
    return counter.get_flop_counts()["Global"]


@pytest.fixture(scope="module", params=SMALL_PRESETS)
def small_model(request) -> HybridLM:
    # built on the CPU: `from_preset` goes through the meta device, whose first use costs seconds
    return init_random_weights(HybridLM(PRESETS[request.param]), seed=0).eval()


@pytest.mark.parametrize("cached", [0, 60])
def test_prefill_flops_match_flop_counter(small_model, cached):
    counts = counted_prefill(small_model, cached, NEW_TOKENS)
    assert set(counts) <= {aten.mm, aten.addmm, aten.bmm, aten._scaled_dot_product_flash_attention_for_cpu,
                           ONEDNN_LINEAR}
    expected = ModelCost(small_model.config).prefill_flops(NEW_TOKENS, cached, scan=torch_scan_kernel())
    linear = counts.get(aten.mm, 0) + counts.get(aten.addmm, 0) + counts.get(ONEDNN_LINEAR, 0)
    assert linear == expected.matmuls + expected.head
    assert counts[aten.bmm] == expected.scan
    assert counts[aten._scaled_dot_product_flash_attention_for_cpu] == expected.attention
    assert sum(counts.values()) == pytest.approx(expected.total, rel=0.05)
    assert expected.conv < 0.01 * expected.total  # the one term the counter misses


def test_the_torch_scan_count_is_its_whole_chunk_squares_padded():
    """"small" (5 Mamba layers, H=8, P=64, N=128, one group; chunk 256): a token's states term is
    4 H P N = 262,144 a layer in both; the intra-chunk term is a whole 64 x 64 square in the torch
    scan (2 x 64 x (G N + H P) = 81,920) against the lower triangle of a 256-chunk in the Triton
    kernel's count (256 x 640 = 163,840); the torch scan pads a row's last chunk to 64 tokens."""
    cost = ModelCost(PRESETS["small"])
    torch_scan, triton = cost.prefill_flops(256, scan=torch_scan_kernel()).scan, cost.prefill_flops(256).scan
    assert triton == 256 * 5 * (262_144 + 163_840) == 256 * 2_129_920
    assert torch_scan == 256 * 5 * (262_144 + 81_920)
    assert cost.prefill_flops(200, scan=torch_scan_kernel()).scan == torch_scan  # 200 tokens padded to 256
    assert cost.prefill_flops(193, scan=torch_scan_kernel()).scan == torch_scan  # 193 too: 4 chunks of 64


# ---------------------------------------------------------------- parameters and bytes
CPU_PRESETS = ("tiny", "small", "granite-tiny", "granite-dense-cpu", "granite-small-cpu", "nemotron-h-tiny",
               "nemotron-h-small-cpu", "qwen3-next-tiny")  # every family and layer kind; the GPU shapes below by their published sizes


@pytest.mark.parametrize("preset", CPU_PRESETS)
def test_params_are_the_built_models_matrices(preset):
    model, cost = HybridLM(PRESETS[preset]), ModelCost(PRESETS[preset])
    matrices = {name: p.numel() for name, p in model.named_parameters() if p.dim() >= 2}  # a tied head is one
    assert cost.held_params == sum(matrices.values())
    experts = sum(n for name, n in matrices.items() if ".experts." in name)  # routed experts: top-k of them run
    moe = PRESETS[preset].moe
    idle_experts = experts // moe.num_experts * (moe.num_experts - moe.top_k) if experts else 0
    embeddings = sum(n for name, n in matrices.items() if name.startswith(("embed_tokens", "lm_head")))
    assert cost.active_params == sum(matrices.values()) - idle_experts - embeddings


@pytest.mark.parametrize("preset,total,active", [
    # the presets' comments (model/families/): Granite-4.0-H micro 3.19 B, tiny 6.94 B (1.47 B active), small 32.2 B (8.8 B
    # active), as IBM publishes (3 B; 7 B / 1 B; 32 B / 9 B); Nemotron 3 Nano 31.58 B / 3.58 B (the model
    # card: 31.6 B / ~3.5 B); Nemotron-H-8B 8,100,852,736 (a published per-tensor breakdown, vectors
    # included: 0.01% more than the matrices); Bamba-9B 9.78 B (tests/test_cost_rules.py by hand).
    ("granite-4.0-h-micro", 3.19e9, 3.19e9), ("granite-4.0-h-tiny", 6.94e9, 1.47e9),
    ("granite-4.0-h-small", 32.2e9, 8.8e9), ("nemotron-3-nano", 31.58e9, 3.58e9),
    ("nemotron-h-8b", 8_100_852_736, 8_100_852_736), ("bamba-9b", 9.78e9, 9.78e9),
])
def test_gpu_presets_have_their_published_sizes(preset, total, active):
    cost, c = ModelCost(PRESETS[preset]), PRESETS[preset]
    embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    assert cost.held_params == pytest.approx(total, rel=2e-3)  # to the digits quoted
    assert cost.active_params + embeddings == pytest.approx(active, rel=6e-3)


def test_moe_tokens_pass_through_their_top_k_experts():
    # granite-small-cpu: 32 experts of 3 x 256 x 96 = 73,728 in each of 6 layers, 6 a token
    granite = ModelCost(PRESETS["granite-small-cpu"])
    assert granite.held_params - granite.active_params == 6 * (32 - 6) * 73_728 + 16384 * 256  # + tied embedding
    # nemotron-h-small-cpu: 2 "E" layers of 16 relu^2 experts of 2 x 256 x 192 = 98,304, 4 a token
    nemotron = ModelCost(PRESETS["nemotron-h-small-cpu"])
    assert nemotron.held_params - nemotron.active_params == 2 * (16 - 4) * 98_304 + 2 * 16384 * 256  # + untied head


@pytest.mark.parametrize("preset", ("small", "granite-dense-cpu", "granite-small-cpu", "nemotron-h-small-cpu",
                                    "qwen3-next-tiny"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snapshot_and_kv_bytes_are_the_caches(preset, dtype):
    config, size = PRESETS[preset], torch.empty((), dtype=dtype).element_size()
    cache = ModelCache(config, 1, 16, 1, dtype, "cpu")
    cost = ModelCost(config)
    assert cache.state_bytes_per_slot == cost.snapshot_bytes(size, ssm_dtype_bytes=4)  # the SSM state stays fp32
    kv_per_token = sum(cache.key_cache[i][0, 0].nbytes + cache.value_cache[i][0, 0].nbytes for i in cache.key_cache)
    assert kv_per_token == cost.kv_bytes_per_token(size)


# ---------------------------------------------------------------- the FLOPs a snapshot spares
def test_snapshot_flops_is_a_prefill_from_zero_without_the_head():
    cost = ModelCost(PRESETS["small"])
    per_token, width, p = cost.flops_per_token, cost.attention_width, 37
    attention = sum(4 * width * (t + 1) for t in range(p))  # one attention layer; token t attends to t + 1 keys
    assert cost.snapshot_flops(p) == per_token * p + attention
    assert cost.prefill_flops(p).total == cost.snapshot_flops(p) + 2 * 16384 * 256  # the head: one row, V x H
    assert cost.snapshot_flops(0) == 0.0


def test_a_cached_prefix_adds_only_attention():
    cost = ModelCost(PRESETS["small"])
    cold, warm = cost.prefill_flops(10), cost.prefill_flops(10, 100)
    assert warm.attention - cold.attention == 4 * 256 * 10 * 100  # each of 10 tokens reads 100 more keys
    assert (warm.matmuls, warm.conv, warm.scan, warm.head) == (cold.matmuls, cold.conv, cold.scan, cold.head)


def test_small_preset_numbers_quoted_in_the_docstring():
    cost = ModelCost(PRESETS["small"])
    assert (cost.active_params, cost.scan_flops_per_token(), cost.attention_width) == (6_022_144, 2_129_920, 256)
    f = cost.snapshot_flops
    assert f"{f(1024):.2e}" == "1.51e+10" and f"{f(4096):.2e}" == "6.66e+10" and f"{f(32752):.2e}" == "1.01e+12"
    assert f"{f(16368):.2e}" == "3.69e+11" and round(f(16368) / f(1024)) == 25


def test_bad_counts_are_refused():
    cost = ModelCost(PRESETS["tiny"])
    with pytest.raises(ValueError, match="^position:"):
        cost.snapshot_flops(-1)
    with pytest.raises(ValueError, match="^n:"):
        cost.prefill_flops(-1)
    with pytest.raises(ValueError, match="^cached:"):
        cost.prefill_flops(1, -1)


def test_engine_for_model_stamps_the_cost_models_flops():
    model = HybridLM(PRESETS["tiny"])
    engine = Engine.for_model(model, block_size=16, prefill_budget=64, num_kv_blocks=8, max_batch_size=1)
    assert engine.snapshot_flops(48) == ModelCost(PRESETS["tiny"]).snapshot_flops(48)
