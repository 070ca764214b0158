"""Presets: shapes as documented, deterministic random weights, the 9B shapes, bf16 runs."""

from __future__ import annotations

import pytest
import torch

from model import PRESETS, HybridLM, SequenceChunk, from_preset
from model_helpers import one_thread  # noqa: F401  (autouse: tiny shapes run single-threaded)



def test_small_preset_has_the_experiment_shape():
    cfg = PRESETS["small"]
    kinds = cfg.layer_types
    assert kinds.count("mamba") >= 2 and kinds.count("attention") >= 1
    assert (cfg.head_dim, cfg.mamba_d_head, cfg.mamba_d_conv, cfg.mamba_chunk_size) == (64, 64, 4, 256)
    assert cfg.mamba_d_state in (64, 128)
    assert cfg.num_attention_heads * cfg.head_dim == cfg.hidden_size


def test_bamba_9b_shapes():
    with torch.device("meta"):
        model = HybridLM(PRESETS["bamba-9b"])
    params = sum(p.numel() for p in model.parameters())
    assert 9.7e9 < params < 9.9e9  # Bamba-9B: 9.78B
    assert PRESETS["bamba-9b"].attn_layer_indices == (9, 18, 27)
    assert model.layers[0].mamba.in_proj.weight.shape == (2 * 8192 + 2 * 128 + 128, 4096)


def test_random_weights_are_seeded():
    a, b, c = (from_preset("tiny", seed=s) for s in (3, 3, 4))
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if pa.numel() > 1 and not name.endswith(("norm.weight", "layernorm.weight", ".D", ".bias")):
            assert not torch.equal(pa, pc), name
    A = -torch.exp(a.layers[0].mamba.A_log)
    dt = torch.nn.functional.softplus(a.layers[0].mamba.dt_bias)
    assert (A <= -1).all() and (A >= -16).all() and (dt >= 1e-3 - 1e-6).all() and (dt <= 0.1 + 1e-6).all()


def test_unknown_preset_and_backend_fail_naming_the_field():
    with pytest.raises(ValueError, match="^preset:"):
        from_preset("huge")
    with pytest.raises(ValueError, match="^backend:"):
        from_preset("tiny", backend="cuda-graphs")


@pytest.mark.parametrize("preset", ["tiny", "granite-tiny"])
def test_bf16_chunked_equals_whole_and_tracks_fp32(preset):
    """bf16 weights and activations, fp32 SSM state. Chunked == whole within the bf16 kernel
    tolerance (kernels.testing); against the fp32 model only a sanity bound: 5% of the logit range
    (~6 bf16 ulps at the top; three layers of bf16 rounding measured 2.4%)."""
    from kernels.testing import assert_close

    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0))
    fp32 = from_preset(preset, seed=0).logits(ids)
    model = from_preset(preset, seed=0, dtype=torch.bfloat16)
    cache = model.allocate_cache(4, 16, 1)
    assert cache.ssm_pool[0].dtype == torch.float32 and cache.conv_pool[0].dtype == torch.bfloat16
    got = torch.cat([model.forward_batch([SequenceChunk(ids[a:b], a, [0, 1, 2], 0, all_logits=True)], cache).logits[0]
                     for a, b in ((0, 23), (23, 40))])
    assert got.dtype == torch.bfloat16
    assert_close(got, model.logits(ids), torch.bfloat16, "bf16 chunked vs whole")
    err = (got.float() - fp32).abs().max().item()
    assert err <= 0.05 * fp32.abs().max().item(), err


@pytest.mark.parametrize("name, total, active", [
    ("granite-4.0-h-micro", (3.0e9, 3.4e9), (3.0e9, 3.4e9)),  # published: 3B dense
    ("granite-4.0-h-tiny", (6.8e9, 7.1e9), (1.3e9, 1.6e9)),  # published: 7B total, 1B active
    ("granite-4.0-h-small", (3.1e10, 3.3e10), (8.5e9, 9.2e9)),  # published: 32B total, 9B active
    ("granite-small-cpu", (1e7, 3e7), (5e6, 3e7)),  # reduced CPU layouts: 10-30 M parameters
    ("granite-dense-cpu", (1e7, 3e7), (1e7, 3e7)),
])
def test_granite_shapes(name, total, active):
    cfg = PRESETS[name]
    with torch.device("meta"):
        model = HybridLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    idle = 0 if cfg.moe is None else (cfg.num_hidden_layers * 3 * cfg.hidden_size * cfg.moe.intermediate_size
                                      * (cfg.moe.num_experts - cfg.moe.top_k))
    assert total[0] < params < total[1] and active[0] < params - idle < active[1], (params, params - idle)
    assert cfg.model_type == "granitemoehybrid" and cfg.tie_word_embeddings
    if name.startswith("granite-4.0"):
        assert cfg.attn_layer_indices == (5, 15, 25, 35) and cfg.position_embedding == "none"
