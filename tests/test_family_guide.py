"""docs/add_a_family.md followed once: its toy family (`relu2_hybrid`: Mamba-2 and attention layers,
each followed by Nemotron-H's relu^2 MLP, built only from shared pieces), written as the guide's
step 1 says and registered the way step 2 says (here with `register` for the test's length, the
call the registry makes for each line of `REGISTERED`, so the real registry stays the three). It
then runs like any family: its preset builds through `from_preset`, round-trips through its
config.json mapping and its checkpoint names, runs chunked like whole, and is costed."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from kernels.checks import require
from model import HybridConfig, HybridLM, SequenceChunk, from_preset, load_pretrained, save_pretrained
from model.cost import ModelCost
from model.families import FAMILIES, PRESETS, REGISTERED, config_from_hf, config_to_hf, register
from model.families.base import (Family, FeedForward, mamba_hf_fields, parse_int, parse_time_step_limit,
                                 reject_unknown_fields, require_model_type)
from model.mlp import ReluSquaredMLP
from model_helpers import max_abs, one_thread, tokens  # noqa: F401  (one_thread: autouse)

# ---- step 1 of the guide: the family's module (model/families/relu2_hybrid.py) -----------------------

MODEL_TYPE = "relu2_hybrid"

_MAMBA = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
          "mamba_chunk_size")
_READ = frozenset({"model_type", "vocab_size", "hidden_size", "intermediate_size", "layer_types",
                   "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "mamba_conv_bias",
                   "mamba_proj_bias", "time_step_limit", *_MAMBA})


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """config.json -> HybridConfig; a field it does not read raises naming the field."""
    require_model_type(hf, MODEL_TYPE)
    reject_unknown_fields(hf, _READ, frozenset(), "Relu2Hybrid")
    types = hf.get("layer_types")
    require(isinstance(types, list) and set(types) <= {"mamba", "attention"} and types, "layer_types",
            f"expected a non-empty list of 'mamba' / 'attention', got {types!r}")
    return HybridConfig(
        model_type=MODEL_TYPE, num_hidden_layers=len(types), layer_types=tuple(types), position_embedding="none",
        **{k: parse_int(hf, k, None) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                               "num_attention_heads", "num_key_value_heads", "head_dim", *_MAMBA)},
        mamba_conv_bias=bool(hf["mamba_conv_bias"]), mamba_proj_bias=bool(hf["mamba_proj_bias"]),
        time_step_limit=parse_time_step_limit(hf["time_step_limit"]), rms_norm_eps=float(hf["rms_norm_eps"]))


def config_to_hf(c: HybridConfig) -> dict[str, Any]:
    """The inverse: what config_from_hf reads back to the same config."""
    return {"model_type": MODEL_TYPE, "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "layer_types": list(c.layer_types),
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, **mamba_hf_fields(c)}


def feed_forward(c: HybridConfig, layer_index: int) -> ReluSquaredMLP:
    """After every layer: relu^2 MLP (up, down), no gate."""
    return ReluSquaredMLP(c.hidden_size, c.intermediate_size, c.mlp_bias)


def feed_forward_cost(c: HybridConfig, kind: str) -> FeedForward:
    """The two matrices of that MLP, after every layer."""
    return FeedForward(dense=2 * c.hidden_size * c.intermediate_size)


def checkpoint_name(c: HybridConfig, name: str) -> str:
    """`layers.0.mamba.A_log` -> `model.layers.0.mamba.A_log`; the head keeps its name."""
    return name if name.startswith("lm_head.") else f"model.{name}"


PRESETS_OF_THE_FAMILY = {
    # Tests: interpreter-fast, both mixer kinds, two groups, a 16-token scan chunk, 2:1 GQA.
    "relu2-hybrid-tiny": HybridConfig(
        model_type=MODEL_TYPE, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        layer_types=("mamba", "attention", "mamba"), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        position_embedding="none", mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
        mamba_chunk_size=16,
    ),
}

FAMILY = Family(model_type=MODEL_TYPE, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                feed_forward=feed_forward, checkpoint_name=checkpoint_name, feed_forward_cost=feed_forward_cost,
                presets=PRESETS_OF_THE_FAMILY)


# ---- step 2: register it ----------------------------------------------------------------------------

@pytest.fixture
def registered():
    """What the guide's registry line does (`register(FAMILY)`, as model/families/__init__.py does for
    each entry of REGISTERED), undone afterwards so the other tests see the real three families."""
    saved = dict(FAMILIES), dict(PRESETS)
    register(FAMILY)
    yield FAMILY
    for table, before in zip((FAMILIES, PRESETS), saved):
        table.clear()
        table.update(before)


def test_the_registry_is_its_lines():
    assert list(FAMILIES.values()) == list(REGISTERED)
    assert list(PRESETS) == [name for family in REGISTERED for name in family.presets]
    assert MODEL_TYPE not in FAMILIES and "relu2-hybrid-tiny" not in PRESETS


# ---- step 3: it runs like any family ----------------------------------------------------------------

def test_the_toy_family_round_trips_and_runs_chunked_like_whole(registered, tmp_path):
    cfg = PRESETS["relu2-hybrid-tiny"]
    assert config_from_hf(json.loads(json.dumps(config_to_hf(cfg)))) == cfg
    model = from_preset("relu2-hybrid-tiny", seed=0)
    ids = tokens(40, 0)
    whole = model.logits(ids)
    assert whole.shape == (40, 256) and torch.isfinite(whole).all()
    # the engine's batched paged forward, in two chunks with a capture, matches the plain one
    cache = model.allocate_cache(4, 16, 2)
    out = [model.forward_batch([SequenceChunk(ids[a:b], a, [0, 1, 2], 1, capture_offsets=caps, all_logits=True)],
                               cache) for a, b, caps in ((0, 17, (5,)), (17, 40, ()))]
    assert len(out[0].captured[0]) == 1
    assert max_abs(torch.cat([o.logits[0] for o in out]), whole) <= 1e-4
    # checkpoint names both ways: save, then load through config.json's model_type
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == MODEL_TYPE
    assert torch.equal(load_pretrained(tmp_path).logits(ids), whole)
    # the cost rule counts the matrices the family builds (embedding and head apart)
    matrices = {n: p.numel() for n, p in HybridLM(cfg).named_parameters() if p.dim() >= 2}
    embeddings = sum(n for name, n in matrices.items() if name.startswith(("embed_tokens", "lm_head")))
    assert ModelCost(cfg).active_params == sum(matrices.values()) - embeddings


def test_the_registry_refuses_a_second_family_or_preset_of_the_same_name(registered):
    with pytest.raises(ValueError, match="^model_type:"):
        register(FAMILY)
    clash = Family(model_type="relu2_hybrid_2", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                   feed_forward=feed_forward, checkpoint_name=checkpoint_name,
                   presets={"tiny": PRESETS_OF_THE_FAMILY["relu2-hybrid-tiny"]})
    with pytest.raises(ValueError, match="^presets:"):
        register(clash)
    assert "relu2_hybrid_2" not in FAMILIES
