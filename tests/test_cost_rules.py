"""The cost model (`model.cost.ModelCost`, the counts) and the trace roofline over it
(`experiments.traces.cost.ShapeCost`), term by term, against hand arithmetic.

Where each rule comes from: the docstrings of `model/cost.py` and `experiments/traces/cost.py`
(a multiply-add is 2 FLOPs; bf16 = 2 bytes; the SSD scan 4 H P N + Q (G N + H P) per Mamba layer and
token; attention 4 x width x keys; the LM head once per row; weights once per forward; a save or
restore copies a state twice, a capture once) and the layer shapes the models build
(`model/mamba2.py`: in_proj to [z | xBC | dt] = 2 d_inner + 2 G N + H, conv taps conv_dim x d_conv,
out_proj; `model/mlp.py`: SwiGLU 3 matrices, Nemotron-H's relu^2 MLP 2; `model/moe*.py`: experts,
a shared one, a router of hidden x experts; `model/families/granite.py`: Granite's `shared_mlp` of
width `intermediate_size` beside its routed experts).

Three hand-made configs with tiny numbers, one per family kind. Shared shapes: hidden H = 4,
vocabulary V = 10, 2 query heads x head_dim 4 = width 8, 1 KV head (KV width 4), so one attention
layer's q/k/v/o are 4*8 + 2*4*4 + 8*4 = 96 parameters.
"""

import dataclasses

import pytest

from experiments.traces.cost import Roofline, ShapeCost
from model.config import HybridConfig, MoEConfig
from model.families.nemotron_h import layer_types_from_pattern
from model.cost import FeedForward, ModelCost, ScanKernel
from model.hybrid import HybridLM

ATTENTION = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=4)
# Mamba for BAMBA and GRANITE: 2 heads x P 4 = d_inner 8 (= expand 2 x hidden 4), G 1, N 5, d_conv 4,
# chunk Q 7; conv_dim = 8 + 2*1*5 = 18.
MAMBA_8 = dict(mamba_n_heads=2, mamba_d_head=4, mamba_n_groups=1, mamba_d_state=5, mamba_d_conv=4,
               mamba_expand=2, mamba_chunk_size=7)
# One such Mamba layer: in_proj 4 x (2*8 + 2*1*5 + 2) = 4 x 28 = 112, conv taps 18 x 4 = 72,
# out_proj 8 x 4 = 32: 216 parameters. SSD: 4*2*4*5 + 7*(1*5 + 2*4) = 160 + 91 = 251 FLOPs a token.
# State: conv (4 - 1) x 18 = 54 + SSM 2*4*5 = 40 = 94 values = 188 bytes.
MAMBA_8_PARAMS, MAMBA_8_SSD, MAMBA_8_STATE_BYTES = 216, 251, 188

# Bamba-like dense: layers M * M, each followed by a SwiGLU of 3 x 4 x 6 = 72.
BAMBA = HybridConfig(model_type="bamba", vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=3,
                     attn_layer_indices=(1,), tie_word_embeddings=False, **ATTENTION, **MAMBA_8)
# active = 2*216 + 96 + 3*72 = 744; embedding + head untied = 2 x 10 x 4 = 80.
BAMBA_ACTIVE, BAMBA_WEIGHT_BYTES = 744, (744 + 80) * 2  # 1648
BAMBA_FLOPS_PER_TOKEN = 2 * 744 + 2 * 251  # 1488 + 502 = 1990
BAMBA_STATE_BYTES = 2 * 188  # two Mamba layers: 376


def granite(top_k=2, num_experts=5):
    """Granite MoE: layers M * M, each followed by shared_mlp (SwiGLU 3 x 4 x 6 = 72) plus routed
    SwiGLU experts of width 3 (3 x 4 x 3 = 36 each) and a router 4 x num_experts; tied embedding."""
    return HybridConfig(model_type="granitemoehybrid", vocab_size=10, hidden_size=4, intermediate_size=6,
                        num_hidden_layers=3, layer_types=("mamba", "attention", "mamba"), tie_word_embeddings=True,
                        moe=MoEConfig(num_experts=num_experts, top_k=top_k, intermediate_size=3),
                        **ATTENTION, **MAMBA_8)


# Nemotron-H "M-*E": Mamba, relu^2 MLP, attention, MoE; no feed-forward after a mixer.
# Mamba: 3 heads x P 2 = d_inner 6 (not expand x hidden = 8), G 1, N 5, d_conv 3, chunk 7;
# conv_dim = 6 + 2*5 = 16.
NEMOTRON = HybridConfig(
    model_type="nemotron_h", vocab_size=10, hidden_size=4, intermediate_size=6, num_hidden_layers=4,
    layer_types=layer_types_from_pattern("M-*E"), position_embedding="none", tie_word_embeddings=False,
    mamba_n_heads=3, mamba_d_head=2, mamba_n_groups=1, mamba_d_state=5, mamba_d_conv=3, mamba_expand=2,
    mamba_chunk_size=7, **ATTENTION,
    moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=3, router="sigmoid_grouped_topk",
                  shared_expert_intermediate_size=5),
)
# Mamba: in_proj 4 x (2*6 + 2*1*5 + 3) = 100, conv taps 16 x 3 = 48, out_proj 6 x 4 = 24: 172.
# MLP: 2 x 4 x 6 = 48. MoE: expert 2 x 4 x 3 = 24, shared 2 x 4 x 5 = 40, router 4 x 4 = 16:
# active 2*24 + 40 + 16 = 104, total 4*24 + 40 + 16 = 152.
NEMOTRON_ACTIVE = 172 + 48 + 96 + 104  # 420
NEMOTRON_TOTAL = 172 + 48 + 96 + 152  # 468
NEMOTRON_SSD = 4 * 3 * 2 * 5 + 7 * (1 * 5 + 3 * 2)  # 120 + 77 = 197
NEMOTRON_STATE_BYTES = ((3 - 1) * 16 + 3 * 2 * 5) * 2  # (32 + 30) x 2 = 124

SLOW_MEMORY = Roofline("test: bytes bind", flops_per_s=1000.0, bytes_per_s=100.0)
SLOW_MATH = Roofline("test: FLOPs bind", flops_per_s=1000.0, bytes_per_s=1000.0)


def cost(config, roofline=SLOW_MEMORY):
    return ShapeCost.from_config("hand", config, roofline)


# ---------------------------------------------------------------- per-token terms, per family
def test_dense_bamba_terms():
    c = cost(BAMBA)
    assert c.flops_per_token == BAMBA_FLOPS_PER_TOKEN == 1990
    assert c.head_flops == 2 * 10 * 4  # 80: one LM head, V x H
    assert c.weight_bytes == BAMBA_WEIGHT_BYTES == 1648
    assert (c.attention_layers, c.attention_width) == (1, 8)
    assert c.kv_bytes_per_token_layer == 2 * 4 * 2 == c.kv_bytes_per_token  # K and V, width 4, bf16: 16
    assert c.state_bytes_layer == MAMBA_8_STATE_BYTES and c.state_bytes == BAMBA_STATE_BYTES  # d_conv - 1 taps
    assert c.kernel_chunk == 7


def test_nemotron_layer_kinds():
    c = cost(NEMOTRON)
    # relu^2 MLPs (2 matrices), MoE counted by its top-2 experts + shared + router, mixers without a feed-forward
    assert c.flops_per_token == 2 * NEMOTRON_ACTIVE + NEMOTRON_SSD == 840 + 197
    assert c.weight_bytes == (NEMOTRON_TOTAL + 2 * 10 * 4) * 2 == 1096  # all 4 experts held; untied head
    assert c.head_flops == 80 and (c.attention_layers, c.attention_width) == (1, 8)
    assert c.state_bytes_layer == c.state_bytes == NEMOTRON_STATE_BYTES  # one Mamba layer; the MLP/MoE hold none
    assert c.kv_bytes_per_token == 16  # one attention layer


def test_granite_moe_terms_include_the_shared_mlp():
    c = cost(granite())
    # per layer FFN: shared 72 + top-2 experts 2*36 + router 4*5 = 164 active; 72 + 5*36 + 20 = 272 held
    active, total = 2 * 216 + 96 + 3 * 164, 2 * 216 + 96 + 3 * 272  # 1020, 1344
    assert c.flops_per_token == 2 * active + 2 * MAMBA_8_SSD == 2542
    assert c.weight_bytes == (total + 10 * 4) * 2 == 2768  # tied: one V x H matrix


def test_granite_moe_counts_active_experts_in_flops_and_all_of_them_in_bytes():
    base, wider_k, more_experts = cost(granite(2, 5)), cost(granite(3, 5)), cost(granite(2, 6))
    # one more expert per token: +36 params in each of 3 layers -> +2 x 108 FLOPs, held bytes unchanged
    assert wider_k.flops_per_token - base.flops_per_token == 2 * 3 * 36
    assert wider_k.weight_bytes == base.weight_bytes
    # one more expert held: +36 expert and +4 router params per layer held; only the router is run
    assert more_experts.weight_bytes - base.weight_bytes == 3 * (36 + 4) * 2
    assert more_experts.flops_per_token - base.flops_per_token == 2 * 3 * 4


def test_tied_embedding_is_held_once():
    untied, tied = cost(BAMBA), cost(dataclasses.replace(BAMBA, tie_word_embeddings=True))
    assert untied.weight_bytes - tied.weight_bytes == 10 * 4 * 2  # one V x H matrix fewer
    assert tied.head_flops == untied.head_flops == 80  # the head still runs


@pytest.mark.parametrize("config,expected_matrices", [
    (BAMBA, 744 + 80), (NEMOTRON, 468 + 80),
    (granite(), 1344 + 40),
])
def test_held_weights_match_the_models_matrices(config, expected_matrices):
    """Independent of the hand count: the model built from the config holds those matrices (a few
    hundred parameters: built on the CPU, the meta device's first use costs seconds)."""
    model = HybridLM(config)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    assert matrices == expected_matrices
    assert cost(config).weight_bytes == 2 * expected_matrices


# ---------------------------------------------------------------- a row: prefix attention, head, bytes
@pytest.mark.parametrize("start,n,keys", [
    (5, 3, 21),  # tokens at 5, 6, 7 attend to 6 + 7 + 8 = 21 keys = 3*5 + 3*4/2
    (0, 1, 1),  # a first token attends to itself
    (0, 4, 10),  # 1 + 2 + 3 + 4
    (9, 1, 10),  # a decode token after 9
])
def test_row_flops_terms(start, n, keys):
    c = cost(BAMBA)
    # weights and scan per token + the head once + 4 x 1 layer x width 8 x keys
    assert c.row_flops(start, n) == 1990 * n + 80 + 4 * 1 * 8 * keys


def test_row_flops_at_bamba_9b_keeps_the_prefix_attention():
    """The issue's survivor: 16 tokens after 4096 at Bamba-9B's preset shapes (3.2e9 attention FLOPs)."""
    c = ShapeCost.from_preset("bamba-9b")
    # Mamba layer: 4096 x (2*8192 + 2*1*128 + 128) + 8448 x 4 + 8192 x 4096 = 102,269,952
    # attention layer: 4096 x (4096 + 2*1024) + 4096 x 4096 = 41,943,040; SwiGLU 3 x 4096 x 14336 = 176,160,768
    active = 29 * 102_269_952 + 3 * 41_943_040 + 32 * 176_160_768  # 8,728,802,304
    ssd = 4 * 128 * 64 * 128 + 256 * (128 + 128 * 64)  # 6,324,224 per Mamba layer
    per_token = 2 * active + 29 * ssd  # 17,641,007,104
    head = 2 * 128_256 * 4096  # 1,050,673,152
    keys = 16 * 4096 + 16 * 17 // 2  # 65,672
    attention = 4 * 3 * (32 * 128) * keys  # 3,227,910,144
    assert attention == 3_227_910_144
    assert c.flops_per_token == per_token
    assert c.row_flops(4096, 16) == 16 * per_token + head + attention == 286_534_696_960
    assert c.weight_bytes == 2 * (active + 2 * 128_256 * 4096)  # 9,779,475,456 parameters, as the model's


def test_row_bytes():
    c = cost(BAMBA)
    # KV of 1 attention layer, 16 bytes a token, over [0, 8) + the state read and written (2 x 376)
    assert c.row_bytes(5, 3) == 16 * 8 + 2 * 376 == 880
    assert c.row_bytes(0, 2) == 16 * 2 + 2 * 376 == 784


# ---------------------------------------------------------------- the roofline
def test_forward_s_is_the_roofline_with_weights_once():
    rows = [(5, 3), (0, 2)]
    flops = (1990 * 3 + 80 + 32 * 21) + (1990 * 2 + 80 + 32 * 3)  # 6722 + 4156 = 10,878
    moved = 1648 + 880 + 784  # weights once per forward, then each row's bytes: 3312
    assert cost(BAMBA, SLOW_MEMORY).forward_s(rows) == pytest.approx(max(flops / 1000, moved / 100)) \
        == pytest.approx(33.12)
    assert cost(BAMBA, SLOW_MATH).forward_s(rows) == pytest.approx(max(flops / 1000, moved / 1000)) \
        == pytest.approx(10.878)
    assert cost(BAMBA, SLOW_MEMORY).forward_s([(5, 3)]) == pytest.approx((1648 + 880) / 100)  # 25.28


def test_copy_and_capture_seconds():
    c = cost(BAMBA, SLOW_MEMORY)
    assert c.copy_s == pytest.approx(2 * 376 / 100)  # read + write: 7.52
    assert c.capture_s == pytest.approx(376 / 100)  # written once: 3.76
    n = cost(NEMOTRON, SLOW_MEMORY)
    assert (n.copy_s, n.capture_s) == (pytest.approx(2 * 124 / 100), pytest.approx(124 / 100))


def test_vllm_block_from_the_state_and_kv_pages():
    # 188-byte state, 16 bytes a token: one 16-token page (256 bytes) holds it -> 16
    assert cost(BAMBA).vllm_block == 16
    # nemotron-h-8b: conv 3 x (8192 + 2*8*128) = 30,720 + SSM 128*64*128 = 1,048,576 values = 2,158,592 bytes;
    # KV 2 x 8 x 128 x 2 = 4096 bytes a token, 65,536 a page: ceil(32.94) = 33 pages of 16 = 528
    c = ShapeCost.from_preset("nemotron-h-8b")
    assert (c.state_bytes_layer, c.kv_bytes_per_token_layer, c.vllm_block) == (2_158_592, 4096, 528)


# ---------------------------------------------------------------- the FLOPs a snapshot spares
def test_prefill_flops_of_the_dense_config():
    f = ModelCost(BAMBA)
    assert (f.active_params, f.attention_layers, f.attention_width, f.scan_flops_per_token()) == (744, 1, 8, 502)
    # p = 5: (2*744 + 502) x 5 + 1 layer x 2 x 8 x 5 x 6 = 9950 + 480
    assert f.snapshot_flops(5) == 10_430
    # the same count as the cost model's row from 0, less its head
    assert f.snapshot_flops(5) == cost(BAMBA).row_flops(0, 5) - 80


def test_prefill_flops_of_nemotron_counts_its_layer_kinds():
    """d_inner = heads x head dim = 6 (not expand x hidden = 8), no feed-forward after a mixer, a relu^2
    MLP and a MoE layer of top-2 experts + shared + router: NEMOTRON_ACTIVE = 420, scan 197 (above)."""
    f = ModelCost(NEMOTRON)
    assert (f.active_params, f.attention_layers, f.attention_width, f.scan_flops_per_token()) == (420, 1, 8, 197)


@pytest.mark.parametrize("shape", ["bamba-9b", "granite-4.0-h-small", "nemotron-h-8b"])
def test_row_flops_is_the_cost_models_prefill(shape):
    # The simulator's one-expression form must stay the cost model's definition, term for term.
    c = ShapeCost.from_preset(shape)
    for start, n in ((0, 1), (0, 8192), (4096, 16), (31_000, 1), (12_345, 777)):
        assert c.row_flops(start, n) == pytest.approx(c.counts.prefill_flops(n, start).total, rel=1e-12)


def test_scan_kernel_chunk_causal_and_padding():
    # BAMBA's Mamba layers (2 of them): 4 H P N = 160 and G N + d_inner = 5 + 8 = 13 per chunk row.
    counts = ModelCost(BAMBA)
    n = 5
    # the default (the Triton kernel): the config's chunk 7, lower triangle, no padding: 2 (160 + 7 x 13) x 5
    assert counts.prefill_flops(n, scan=ScanKernel()).scan == 2 * (160 + 7 * 13) * 5 == 2510
    # its own chunk 3, unpadded: 2 (160 + 3 x 13) = 398 a token, x 5
    assert counts.prefill_flops(n, scan=ScanKernel(chunk=3)).scan == 398 * 5
    # padded to whole chunks of 3: ceil(5 / 3) x 3 = 6 tokens' worth
    assert counts.prefill_flops(n, scan=ScanKernel(chunk=3, padded=True)).scan == 398 * 6
    # the full Q x Q block instead of its lower triangle doubles the intra-chunk term: 2 (160 + 2 x 91) x 5
    assert counts.prefill_flops(n, scan=ScanKernel(causal=False)).scan == 2 * (160 + 2 * 91) * 5


def test_cost_objects_are_immutable_values():
    # Their derived counts are computed once (cached): a field changed afterwards would leave them stale.
    for obj, field in ((ModelCost(BAMBA), "config"), (ScanKernel(), "chunk"), (FeedForward(dense=1), "dense"),
                       (cost(BAMBA), "roofline")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)
