"""`Family`: what a model family provides to the shared model, and HF-config helpers they share.

A family is one module under `model/families/` exposing `FAMILY = Family(...)`, listed once in
the registry (`model/families/__init__.py`: `REGISTERED`). It owns all of its knowledge:

* `config_from_hf(hf_dict) -> HybridConfig`: map its transformers `config.json` onto the shared
  config, refusing (ValueError naming the field) any field or value the shared layers do not
  implement; `config_to_hf(config) -> dict` is the inverse (transformers' config kwargs with
  `model_type`), used to build the reference model in tests and benchmarks;
* `feed_forward(config, layer_index) -> nn.Module | None`: the module applied after the layer's
  sequence mixer (or alone, for a feed-forward-only layer), built from the shared layers
  (`model.mlp`, `model.moe`); None for a layer without one. `(T, hidden) -> (T, hidden)`;
* `checkpoint_name(config, name) -> str | tuple[str, ...]`: our parameter name -> the
  checkpoint's tensor name, or several names whose tensors stack along a new dim 0 (experts
  stored one tensor each);
* `feed_forward_cost(config, layer_kind) -> FeedForward`: the matrices of that feed-forward, for
  the cost model (`model.cost.ModelCost`); None: the family has no cost rule (ModelCost refuses it);
* `presets`: its named shapes (name -> HybridConfig of this `model_type`); the registry gathers
  every family's into `model.families.PRESETS`.

Everything else (embedding, the Mamba-2 and attention mixers with their caches and captures,
norms, residuals and multipliers, head) is shared: `model.hybrid.HybridLM` builds it from the
config, so the engine never needs to know the family.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from torch import nn

from kernels.checks import require
from model.config import HybridConfig


@dataclasses.dataclass(frozen=True)
class FeedForward:
    """The matrices of one layer's feed-forward, as the cost model counts them: `dense` ones every
    token passes through (an MLP, a shared expert, the router) and `num_experts` routed experts of
    `expert` parameters each, `top_k` of them per token."""

    dense: int = 0
    expert: int = 0
    num_experts: int = 0
    top_k: int = 0

    @property
    def active(self) -> int:
        return self.dense + self.top_k * self.expert

    @property
    def held(self) -> int:
        return self.dense + self.num_experts * self.expert


def routed_feed_forward(c: HybridConfig, dense: int, matrices_per_expert: int) -> FeedForward:
    """`dense` plus the router (H x E) and E experts of `matrices_per_expert` H x I_e matrices."""
    m, h = c.moe, c.hidden_size
    return FeedForward(dense=dense + h * m.num_experts, expert=matrices_per_expert * h * m.intermediate_size,
                       num_experts=m.num_experts, top_k=m.top_k)


@dataclasses.dataclass(frozen=True)
class Family:
    """Everything one model family knows: its config.json mapping both ways, its feed-forward module and
    that module's cost, its checkpoint tensor names and its presets. One instance per family module
    (`FAMILY`), listed once in the registry (`model.families`)."""

    model_type: str  # transformers' `model_type` in config.json
    config_from_hf: Callable[[dict[str, Any]], HybridConfig]
    config_to_hf: Callable[[HybridConfig], dict[str, Any]]
    feed_forward: Callable[[HybridConfig, int], nn.Module | None]
    checkpoint_name: Callable[[HybridConfig, str], "str | tuple[str, ...]"]
    # (config, layer kind) -> the matrices of that layer's feed-forward (`FeedForward`); None: no cost rule
    feed_forward_cost: Callable[[HybridConfig, str], FeedForward] | None = None
    # preset name -> shapes, in the order `model.families.PRESETS` lists them
    presets: Mapping[str, HybridConfig] = dataclasses.field(default_factory=dict, hash=False)
    # transformers' causal-LM class, written as config.json's `architectures` on save (vLLM picks its
    # model class by it; transformers' Auto classes read `model_type`); "": none is written
    architecture: str = ""


# Fields that never change an inference forward in any family: training knobs, token ids,
# generation and bookkeeping.
INERT_HF_FIELDS = frozenset({
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "attention_dropout", "max_position_embeddings", "pad_token_id", "bos_token_id",
    "eos_token_id", "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
    "tokenizer_class", "chunk_size_feed_forward", "is_encoder_decoder", "problem_type", "task_specific_params",
    "tie_encoder_decoder", "sep_token_id", "decoder_start_token_id",
})


def reject_unknown_fields(hf: dict[str, Any], read: frozenset[str] | set[str], inert: frozenset[str] | set[str],
                          family: str) -> None:
    """Every config.json field must be one the family reads or one known not to change the math."""
    unknown = sorted(set(hf) - set(read) - set(inert) - INERT_HF_FIELDS)
    require(not unknown, unknown[0] if unknown else "", f"config.json field not supported for {family} "
            f"(it may change the math); unsupported fields: {unknown}")


def require_model_type(hf: dict[str, Any], model_type: str) -> None:
    require(hf.get("model_type") == model_type, "model_type", f"expected {model_type!r}, got {hf.get('model_type')!r}")


def check_common_fields(hf: dict[str, Any], model_type: str, read: frozenset[str] | set[str],
                        inert: frozenset[str] | set[str], family: str) -> None:
    """What a family with a SiLU `hidden_act` refuses first, in this order: another model type, an
    unknown field, another activation (SwiGLU and the conv activation are SiLU), a quantized checkpoint."""
    require_model_type(hf, model_type)
    reject_unknown_fields(hf, read, inert, family)
    require(hf.get("hidden_act", "silu") == "silu", "hidden_act",
            f"only 'silu' is implemented (SwiGLU and the conv activation), got {hf.get('hidden_act')!r}")
    require(hf.get("quantization_config") is None, "quantization_config", "quantized checkpoints are not supported")


def parse_time_step_limit(value) -> tuple[float, float]:
    """(lo, hi); transformers v5 writes infinity as {"__float__": "Infinity"}, v4 as a bare Infinity."""
    if value is None:
        return (0.0, math.inf)
    out = []
    for v in value:
        if isinstance(v, dict) and "__float__" in v:
            v = v["__float__"]
        out.append(float(v))
    require(len(out) == 2, "time_step_limit", f"expected two values, got {value!r}")
    return (out[0], out[1])


def parse_int(hf: dict[str, Any], name: str, default) -> int:
    """An integer-valued field (JSON may hold 2.0); refuses a fractional value naming the field."""
    value = hf.get(name, default)
    require(isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer(), name,
            f"must be an integer, got {value!r}")
    return int(value)


def parse_mamba_d_head(hf: dict[str, Any], expand: int, hidden: int, m_heads: int) -> int:
    """`mamba_d_head` ("auto" or absent: expand * hidden / heads); the heads must span expand * hidden."""
    d_head = hf.get("mamba_d_head", "auto")
    d_head = expand * hidden // m_heads if d_head in ("auto", None) else int(d_head)
    require(m_heads * d_head == expand * hidden, "mamba_d_head",
            f"mamba_n_heads * mamba_d_head = {m_heads * d_head} must equal mamba_expand * hidden_size = "
            f"{expand * hidden}")
    return d_head


def mamba_hf_fields(c: HybridConfig) -> dict[str, Any]:
    """The Mamba-2 mixer's fields under the names Bamba's and GraniteMoeHybrid's configs share."""
    return {
        "mamba_n_heads": c.mamba_n_heads, "mamba_d_head": c.mamba_d_head, "mamba_n_groups": c.mamba_n_groups,
        "mamba_d_state": c.mamba_d_state, "mamba_d_conv": c.mamba_d_conv, "mamba_expand": c.mamba_expand,
        "mamba_chunk_size": c.mamba_chunk_size, "mamba_conv_bias": c.mamba_conv_bias,
        "mamba_proj_bias": c.mamba_proj_bias, "time_step_limit": list(c.time_step_limit),
    }
