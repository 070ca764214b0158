"""Qwen3-Next-80B-A3B as a trace-study shape (issue 36 item 3): its states, FLOPs, vLLM block and
kernel chunk derived by hand from the HF config, against Bamba-9B's.

The fields, from Qwen3-Next-80B-A3B's config.json (= transformers' `Qwen3NextConfig()` defaults, checked
below): hidden 2048, 48 layers, full attention every 4th (12 attention, 36 Gated DeltaNet),
16 attention heads of 256 over 2 KV heads, the output gate doubling q_proj; DeltaNet 16 key heads and
32 value heads, key_head_dim = value_head_dim = 128, conv kernel 4; 512 experts of 512, top 10, a
shared expert of 512; vocab 151,936, untied. Bamba-9B's (ibm-ai-platform/Bamba-9B config.json):
hidden 4096, 32 layers, attention at 9, 18, 27 (29 Mamba), 32 heads of 128 over 8 KV heads; Mamba
128 heads of 64, 1 group, d_state 128, d_conv 4, expand 2, chunk 256.

The trace study counts every element in bf16 (2 B), the recurrent states too (vLLM 0.32's
`mamba_ssm_cache_dtype` "auto"); this codebase's engine keeps the recurrent state in fp32
(`model.cache.ModelCache`), checked against the cache's own tensors at the end.
"""

from __future__ import annotations

import pytest
import torch

from experiments.traces.cost import SHAPES, ShapeCost
from model.cache import ModelCache
from model.cost import ModelCost
from model.engine.settings import ModelShape
from model.families import PRESETS

BF16 = 2

# ---- by hand, Qwen3-Next-80B: one Gated DeltaNet layer -----------------------------------------------
Q_HK, Q_HV, Q_K, Q_V, Q_KERNEL, Q_HIDDEN = 16, 32, 128, 128, 4, 2048
Q_CONV_CHANNELS = 2 * Q_HK * Q_K + Q_HV * Q_V  # q, k and v go through the conv: 4096 + 4096 = 8192
Q_CONV = Q_CONV_CHANNELS * (Q_KERNEL - 1)  # the last 3 inputs: 24,576 elements
Q_STATE = Q_HV * Q_K * Q_V  # one K x V matrix per value head: 524,288 elements
Q_LAYER_BF16 = (Q_CONV + Q_STATE) * BF16  # 49,152 + 1,048,576 = 1,097,728 B
Q_DELTANET_LAYERS, Q_ATTENTION_LAYERS = 36, 12
Q_KV_LAYER = 2 * 2 * 256 * BF16  # K and V, 2 KV heads of 256: 2,048 B a token and layer

# ---- by hand, Bamba-9B: one Mamba-2 layer --------------------------------------------------------------
B_D_INNER, B_GROUPS, B_N, B_HEADS, B_P, B_D_CONV = 2 * 4096, 1, 128, 128, 64, 4
B_CONV = (B_D_INNER + 2 * B_GROUPS * B_N) * (B_D_CONV - 1)  # x, B and C: 8,448 channels x 3
B_STATE = B_HEADS * B_P * B_N  # 1,048,576 elements
B_LAYER_BF16 = (B_CONV + B_STATE) * BF16  # 50,688 + 2,097,152 = 2,147,840 B
B_MAMBA_LAYERS, B_ATTENTION_LAYERS = 29, 3
B_KV_LAYER = 2 * 8 * 128 * BF16  # 4,096 B


def test_the_hand_figures():
    """The derivation's arithmetic, written out once (so a slip in a constant above shows here)."""
    assert (Q_CONV_CHANNELS, Q_CONV, Q_STATE, Q_LAYER_BF16) == (8192, 24_576, 524_288, 1_097_728)
    assert (B_CONV, B_STATE, B_LAYER_BF16) == (25_344, 1_048_576, 2_147_840)


def test_the_80b_preset_is_the_hf_config():
    from transformers import Qwen3NextConfig

    hf = Qwen3NextConfig()
    assert (hf.hidden_size, hf.num_hidden_layers, hf.linear_num_key_heads, hf.linear_num_value_heads,
            hf.linear_key_head_dim, hf.linear_value_head_dim, hf.linear_conv_kernel_dim) == (
        Q_HIDDEN, 48, Q_HK, Q_HV, Q_K, Q_V, Q_KERNEL)
    assert (hf.num_key_value_heads, hf.head_dim, hf.layer_types.count("full_attention")) == (2, 256, 12)
    c = PRESETS[SHAPES["qwen3-next-80b"]]
    assert c.layer_types.count("linear_attention") == Q_DELTANET_LAYERS and c.layer_types.count("attention") == 12


def test_state_bytes_per_layer_qwen3_next_80b_vs_bamba_9b():
    qwen, bamba = ShapeCost.from_preset("qwen3-next-80b"), ShapeCost.from_preset("bamba-9b")
    assert qwen.state_bytes_layer == Q_LAYER_BF16
    assert bamba.state_bytes_layer == B_LAYER_BF16
    # a DeltaNet layer holds half a Mamba layer's state: 128 x 128 a head over 32 heads vs 64 x 128 over 128
    assert Q_LAYER_BF16 / B_LAYER_BF16 == pytest.approx(0.5111, abs=1e-4)
    # one snapshot: 36 DeltaNet layers vs 29 Mamba layers
    assert qwen.state_bytes == Q_DELTANET_LAYERS * Q_LAYER_BF16 == 39_518_208
    assert bamba.state_bytes == B_MAMBA_LAYERS * B_LAYER_BF16 == 62_287_360
    # a GB of snapshot budget holds 1.58x as many Qwen3-Next snapshots
    assert bamba.state_bytes / qwen.state_bytes == pytest.approx(1.5761, abs=1e-4)
    # while a token's KV is twice Bamba's: 12 attention layers of 2 KV heads x 256 vs 3 of 8 x 128
    assert qwen.kv_bytes_per_token == Q_ATTENTION_LAYERS * Q_KV_LAYER == 24_576
    assert bamba.kv_bytes_per_token == B_ATTENTION_LAYERS * B_KV_LAYER == 12_288


def test_flops_per_token_by_hand():
    """Weights a token passes through (2 FLOPs a multiply-add) and the chunked delta rule, chunk 64,
    per value head 6 K V + 64 (3 K + 2 V) + 64^2 / 3 (model/cost.py's rule, its terms counted here)."""
    H = Q_HIDDEN
    deltanet = H * (2 * Q_HK * Q_K + 2 * Q_HV * Q_V) + H * 2 * Q_HV + Q_HV * Q_V * H + Q_CONV_CHANNELS * Q_KERNEL
    attention = H * (2 * 16 * 256 + 2 * 2 * 256) + 16 * 256 * H  # q_proj with its gate, k, v, o
    expert = 3 * H * 512
    moe = H * 512 + 10 * expert + expert + H  # router, top 10, the shared expert and its gate
    active = Q_DELTANET_LAYERS * deltanet + Q_ATTENTION_LAYERS * attention + 48 * moe
    delta_rule = Q_DELTANET_LAYERS * Q_HV * (6 * Q_K * Q_V + 64 * (3 * Q_K + 2 * Q_V) + 64 * 64 // 3)
    qwen = ShapeCost.from_preset("qwen3-next-80b")
    assert qwen.counts.active_params == active == 3_252_387_840
    assert qwen.flops_per_token == 2 * active + delta_rule
    assert delta_rule == 162_004_608  # 2.4% of a token's 6.67 GFLOPs
    assert qwen.head_flops == 2 * 151_936 * H
    # attention to one key: QK^T and PV over 12 layers of 16 x 256 queries
    assert qwen.row_flops(10, 1) - qwen.row_flops(9, 1) == 4 * 12 * 16 * 256


def test_vllm_block_and_kernel_chunk():
    """vLLM 0.32's padded block: the smallest multiple of 16 tokens whose attention page (a layer's
    K and V) holds one recurrent layer's state; the chunk is the delta-rule scan's, not mamba_chunk_size."""
    qwen, bamba = ShapeCost.from_preset("qwen3-next-80b"), ShapeCost.from_preset("bamba-9b")
    assert qwen.vllm_block == 16 * -(-Q_LAYER_BF16 // (16 * Q_KV_LAYER)) == 544  # 536 tokens, rounded up
    assert bamba.vllm_block == 16 * -(-B_LAYER_BF16 // (16 * B_KV_LAYER)) == 528
    assert (qwen.kernel_chunk, bamba.kernel_chunk) == (64, 256)
    assert qwen.summary()["kernel_chunk"] == 64 and qwen.model_shape == ModelShape(544, 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_model_shape_chunk_is_the_delta_rule_kernels(dtype):
    from kernels.gated_delta_rule import default_chunk_size

    for preset in ("qwen3-next-80b-a3b", "qwen3-next-tiny"):
        shape = ModelShape.of(PRESETS[preset], dtype.itemsize)
        assert shape.kernel_chunk == default_chunk_size(dtype) != PRESETS[preset].mamba_chunk_size
    assert ModelShape.of(PRESETS["bamba-9b"], dtype.itemsize).kernel_chunk == 256  # a Mamba model keeps its own


def test_the_engine_holds_the_states_the_cost_model_counts():
    """The code's cache: bf16 conv state, fp32 delta-rule state: 2,146,304 B a layer, 77.3 MB a slot."""
    config = PRESETS["qwen3-next-80b-a3b"]
    cache = ModelCache(config, num_blocks=1, block_size=16, num_state_slots=1, dtype=torch.bfloat16, device="cpu")
    per_layer = Q_CONV * BF16 + Q_STATE * 4
    assert cache.state_bytes_per_slot == Q_DELTANET_LAYERS * per_layer == ModelCost(config).snapshot_bytes(2, 4)
    assert cache.state_bytes_per_slot == 77_266_944


def test_traces_command_takes_the_shape(tmp_path):
    """`--model qwen3-next-80b` runs a point and the summary records the shape's cost model."""
    import json

    from experiments.traces.__main__ import main
    from test_traces import _scaled_trace

    out = tmp_path / "out"
    assert main(["--trace", "mooncake-conversation", "--trace-file", str(_scaled_trace(tmp_path, n=8)),
                 "--policy", "vllm-align,sglang", "--budget-gb", "inf", "--limit", "8", "--kv-pool-gb", "0.2",
                 "--prefill-budget", "1024", "--max-batch-size", "4", "--model", "qwen3-next-80b",
                 "--out", str(out), "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["shape"] == "qwen3-next-80b" and s["cost_model"]["state_bytes"] == 39_518_208
    assert s["cost_model"]["kernel_chunk"] == 64
    assert s["policies"]["vllm-align"]["effective_settings"]["block_size"] == 544
    assert s["policies"]["sglang"]["effective_settings"]["kernel_chunk"] == 64
