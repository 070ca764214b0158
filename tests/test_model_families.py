"""The family seam: every registered family round-trips its presets through its config.json
mapping, mixer-less (feed-forward-only) layers run through both forwards, backend limits and
unknown layer types fail naming the field, and `save_pretrained` writes what both
`load_pretrained` and transformers read back."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from model import PRESETS, HybridConfig, HybridLM, SequenceChunk, from_preset, load_pretrained, save_pretrained
from model.families import FAMILIES, config_from_hf, config_to_hf, get_family
from model.loading import init_random_weights
from model_helpers import max_abs, one_thread, tokens  # noqa: F401  (one_thread: autouse)

LOGIT_ATOL = 1e-4  # fp32 logits, max abs


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_their_family_config(name):
    cfg = PRESETS[name]
    family = get_family(cfg.model_type)
    hf = json.loads(json.dumps(family.config_to_hf(cfg)))
    assert hf["model_type"] == cfg.model_type
    assert config_from_hf(hf) == cfg


def test_families_are_registered_by_model_type():
    assert FAMILIES and all(f.model_type == t for t, f in FAMILIES.items())
    with pytest.raises(ValueError, match="^model_type:"):
        get_family("mamba2")
    with pytest.raises(ValueError, match="^model_type:"):
        config_from_hf({"model_type": "llama"})


def test_layer_types_and_attn_layer_indices_agree():
    cfg = HybridConfig(num_hidden_layers=3, attn_layer_indices=(1,))
    assert cfg.layer_types == ("mamba", "attention", "mamba")
    assert HybridConfig(num_hidden_layers=3, layer_types=("mamba", "attention", "mamba")) == cfg
    with pytest.raises(ValueError, match="^layer_types:"):
        HybridConfig(num_hidden_layers=2, layer_types=("mamba", "sliding_attention"))
    with pytest.raises(ValueError, match="^layer_types:"):
        HybridConfig(num_hidden_layers=3, layer_types=("mamba", "attention"))
    with pytest.raises(ValueError, match="^attn_layer_indices:"):
        HybridConfig(num_hidden_layers=3, attn_layer_indices=(2,), layer_types=("mamba", "attention", "mamba"))


def test_feed_forward_only_layers_run_chunked_like_whole():
    """Layers without a sequence mixer (Nemotron-H's "-"/"E") hold no cache state; the engine's
    paths (pools, captures, snapshots) only see the Mamba and attention layer indices."""
    cfg = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=4, attn_layer_indices=(),
                              layer_types=("mamba", "mlp", "attention", "mamba"))
    model = init_random_weights(HybridLM(cfg).eval(), seed=0)
    assert model.layers[1].kind is None and not hasattr(model.layers[1], "input_layernorm")
    assert cfg.mamba_layer_indices == (0, 3) and cfg.attn_layer_indices == (2,)
    cache = model.allocate_cache(4, 16, 2)
    assert sorted(cache.key_cache) == [2] and sorted(cache.ssm_pool) == [0, 3]
    seq = tokens(40, 0)
    out = [model.forward_batch([SequenceChunk(seq[a:b], a, [0, 1, 2], 1, capture_offsets=caps, all_logits=True)],
                               cache) for a, b, caps in ((0, 17, (5,)), (17, 40, ()))]
    assert len(out[0].captured[0]) == 1 and len(out[0].captured[0][0].ssm) == 2
    err = max_abs(torch.cat([o.logits[0] for o in out]), model.logits(seq))
    assert err <= LOGIT_ATOL, err


def test_triton_backend_refuses_a_conv_width_its_kernels_do_not_take():
    cfg = dataclasses.replace(PRESETS["tiny"], mamba_d_conv=3)
    HybridLM(cfg, backend="torch")  # the torch references take any width
    with pytest.raises(ValueError, match="^mamba_d_conv:"):
        HybridLM(cfg, backend="triton")
    with pytest.raises(ValueError, match="^mamba_d_conv:"):
        HybridLM(cfg, backend="torch").set_backend("triton")


def test_save_pretrained_round_trips_and_transformers_reads_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = from_preset("tiny", seed=3)
    save_pretrained(model, tmp_path)
    ids = tokens(30, 1)
    again = load_pretrained(tmp_path)
    assert torch.equal(again.logits(ids), model.logits(ids))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        err = max_abs(model.logits(ids), theirs(ids[None]).logits[0])
    assert err <= LOGIT_ATOL, err


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_saved_checkpoint_names_its_transformers_architecture(tmp_path, model_type):
    """config.json's `architectures` is what vLLM picks its model class by; the expected name is
    transformers' own causal-LM class for the model_type (issue 37: saves omitted it)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    preset = min((name for name, c in PRESETS.items() if c.model_type == model_type),
                 key=lambda name: PRESETS[name].hidden_size * PRESETS[name].num_hidden_layers)  # its smallest
    model = from_preset(preset, seed=0)
    save_pretrained(model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    assert load_pretrained(tmp_path).config == model.config
