"""docs/add_a_family.md followed once: its toy family (`relu2_hybrid`: Mamba-2 and attention layers,
each followed by Nemotron-H's relu^2 MLP, built only from shared pieces), written as the guide's
step 1 says and registered the way step 2 says (here with `register` for the test's length, the
call the registry makes for each line of `REGISTERED`, so the real registry stays as it is). It
then runs like any family: its preset builds through `from_preset`, round-trips through its
config.json mapping and its checkpoint names, runs chunked like whole, and is costed. The guide's
corrections from adding Qwen3-Next are checked against the code: the trace study's `--model` reads
`SHAPES`, transformers v5 writes experts one tensor each (the checkpoint names are the file's), and
every file and name section 5 lists for a new layer kind is where the Gated DeltaNet kind lives."""

from __future__ import annotations

import json
import re
from pathlib import Path
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
    each entry of REGISTERED), undone afterwards so the other tests see the real families."""
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


# ---- the guide's corrections, against the code ---------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "add_a_family.md"
ROOT = GUIDE.parents[1]


def test_the_trace_study_takes_only_the_shapes_the_guide_names():
    """Step 2: `python -m experiments.traces --model` reads SHAPES, not PRESETS (a registered tiny
    preset is refused there until its published shape is added)."""
    from experiments.traces.__main__ import parser
    from experiments.traces.cost import SHAPES

    model = next(a for a in parser()._actions if "--model" in a.option_strings)
    assert sorted(model.choices) == sorted(SHAPES) and set(SHAPES.values()) <= set(PRESETS)
    assert "qwen3-next-tiny" in PRESETS and "qwen3-next-tiny" not in model.choices
    assert "experiments/traces/cost.py" in GUIDE.read_text() and "SHAPES" in GUIDE.read_text()


def test_transformers_writes_qwen3_next_experts_one_tensor_each(tmp_path):
    """Step 1: its module holds experts fused, its file one tensor per expert, and our checkpoint
    names are the file's (every tensor, each once)."""
    from safetensors import safe_open
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    import model.families as registry  # this module's config_to_hf is the toy family's
    from model.loading import checkpoint_names

    cfg = PRESETS["qwen3-next-tiny"]
    hf = Qwen3NextForCausalLM(Qwen3NextConfig(**registry.config_to_hf(cfg)))
    module_names = set(hf.state_dict())
    assert "model.layers.0.mlp.experts.gate_up_proj" in module_names
    hf.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        file_names = set(f.keys())
    assert "model.layers.0.mlp.experts.gate_up_proj" not in file_names
    assert {f"model.layers.0.mlp.experts.{e}.{p}.weight" for e in range(cfg.moe.num_experts)
            for p in ("gate_proj", "up_proj", "down_proj")} <= file_names
    ours = [n for names in checkpoint_names(HybridLM(cfg)).values() for n in ((names,) if isinstance(names, str)
                                                                               else names)]
    assert len(ours) == len(set(ours)) and set(ours) == file_names


def _section_5_rows() -> list[tuple[str, str]]:
    text = GUIDE.read_text().split("## 5.", 1)[1]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= 10, "section 5's table of places a new layer kind touches"
    return [(where.strip(), what.strip()) for where, what in rows]


def _files_of(where: str) -> list[Path]:
    out = []
    for path in re.findall(r"`([^`]+)`", where):
        p = ROOT / path
        assert p.exists(), f"section 5 names {path}, which does not exist"
        out += sorted(p.glob("*.py")) if p.is_dir() else [p]
    return out


@pytest.mark.parametrize("where, what", _section_5_rows(), ids=lambda x: x.split("`")[1] if "`" in x else None)
def test_section_5_names_where_the_gated_deltanet_kind_lives(where, what):
    """Each place the table lists mentions the kind Qwen3-Next added, and each name it gives for the
    place is defined or used there (a renamed function or a moved rule fails here)."""
    files = _files_of(where)
    text = "\n".join(f.read_text() for f in files)
    assert re.search(r"linear_attention|gated_delta|deltanet|qwen3.next", text, re.IGNORECASE), where
    for name in re.findall(r"`([^`]+)`", what):
        name = name.removesuffix("()")
        if "/" in name:
            assert (ROOT / name).exists(), name
        elif re.fullmatch(r"[A-Za-z_][\w.]*", name) and len(name) > 1:
            assert name.split(".")[-1] in text, f"{where}: {name} not found there"
