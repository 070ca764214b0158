"""`HybridConfig`: the shapes every supported family maps onto (the config type only).

One dataclass for all families: each field is read by a shared layer (the Mamba-2 mixer,
attention, the gated MLP, the MoE, the decoder loop). What is family knowledge lives in the
family's module under `model/families/`: its `config.json` mapping (`model.families.config_from_hf`
and `config_to_hf` hand over to the family `model_type` names, which refuses, naming the field,
anything it does not implement, so a checkpoint never loads into a model that silently computes
something else; this module imports no family), its checkpoint tensor names, its feed-forward and
its cost, and its presets (gathered in `model.families.PRESETS`).
"""

from __future__ import annotations

import dataclasses
import math

from kernels.checks import require

# Per-layer types. A sequence-mixer layer ("mamba", "attention", "linear_attention": Qwen3-Next's
# Gated DeltaNet, model.gated_deltanet) is followed by its family's feed-forward (if the family has
# one); a feed-forward-only layer ("mlp", "moe": Nemotron-H's "-" and "E") has no sequence mixer and
# holds no cache state. "mamba" and "linear_attention" layers hold a recurrent state (a state slot).
MIXER_LAYER_TYPES = ("mamba", "attention", "linear_attention")
STATE_LAYER_TYPES = ("mamba", "linear_attention")
FEED_FORWARD_LAYER_TYPES = ("mlp", "moe")
LAYER_TYPES = MIXER_LAYER_TYPES + FEED_FORWARD_LAYER_TYPES
POSITION_EMBEDDINGS = ("rope", "none")
# How router logits become top-k expert weights: "softmax_topk" (Granite, model.moe), "sigmoid_grouped_topk"
# (Nemotron-H, DeepSeek-V3 style: sigmoid scores plus a selection-only bias, top groups, then top-k;
# model.families.nemotron_h_moe), "softmax_all_topk" (Qwen3-Next: softmax over every expert's logit,
# the top-k of those probabilities, renormalized if norm_topk_prob; model.families.qwen3_next_moe).
MOE_ROUTERS = ("softmax_topk", "sigmoid_grouped_topk", "softmax_all_topk")


def _positive_ints(obj, names) -> None:
    for name in names:
        value = getattr(obj, name)
        require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                f"must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Routed experts of a sparse feed-forward (`model.moe.SparseMoE`)."""

    num_experts: int
    top_k: int  # experts per token
    intermediate_size: int  # width of one expert's MLP
    router: str = "softmax_topk"  # Granite: softmax over the top-k router logits
    # "sigmoid_grouped_topk" only (other routers keep the defaults): the experts fall into n_group
    # equal groups, a token picks its topk_group best groups (each scored by its two best experts)
    # and its top_k experts inside them; weights are the picked sigmoid scores, divided by their
    # sum if norm_topk_prob, times routed_scaling_factor.
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    # A dense expert every token passes through besides the routed ones (0: none); its width.
    shared_expert_intermediate_size: int = 0

    def __post_init__(self):
        _positive_ints(self, ("num_experts", "top_k", "intermediate_size", "n_group", "topk_group"))
        require(self.top_k <= self.num_experts, "num_experts_per_tok",
                f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        require(self.router in MOE_ROUTERS, "router", f"expected one of {MOE_ROUTERS}, got {self.router!r}")
        require(isinstance(self.shared_expert_intermediate_size, int) and self.shared_expert_intermediate_size >= 0,
                "shared_expert_intermediate_size", f"must be an int >= 0, got {self.shared_expert_intermediate_size!r}")
        require(isinstance(self.routed_scaling_factor, (int, float)) and math.isfinite(self.routed_scaling_factor)
                and self.routed_scaling_factor > 0, "routed_scaling_factor",
                f"must be a positive finite number, got {self.routed_scaling_factor!r}")
        if self.router == "softmax_all_topk":
            require((self.n_group, self.topk_group, self.routed_scaling_factor) == (1, 1, 1.0), "router",
                    "'softmax_all_topk' takes no n_group, topk_group or routed_scaling_factor")
            return
        if self.router != "sigmoid_grouped_topk":
            require((self.n_group, self.topk_group, self.norm_topk_prob, self.routed_scaling_factor)
                    == (1, 1, False, 1.0), "router", f"{self.router!r} takes no n_group, topk_group, norm_topk_prob "
                    "or routed_scaling_factor")
            return
        require(self.num_experts % self.n_group == 0, "n_group",
                f"{self.n_group} must divide num_experts={self.num_experts}")
        per_group = self.num_experts // self.n_group
        require(per_group >= 2, "n_group", f"groups are scored by their two best experts: num_experts "
                f"{self.num_experts} / n_group {self.n_group} = {per_group} < 2")
        require(self.topk_group <= self.n_group, "topk_group",
                f"{self.topk_group} exceeds n_group={self.n_group}")
        require(self.top_k <= self.topk_group * per_group, "num_experts_per_tok",
                f"top_k {self.top_k} exceeds the {self.topk_group * per_group} experts of the topk_group best groups")


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Defaults are transformers' `BambaConfig()` defaults (so a Bamba config.json missing a field
    means what it means to transformers); the presets (`model.families.PRESETS`, each family's in
    its module) are what the project runs."""

    vocab_size: int = 128000
    hidden_size: int = 4096
    intermediate_size: int = 14336  # the dense gated MLP (Bamba: every layer's; Granite: shared_mlp)
    num_hidden_layers: int = 32
    attn_layer_indices: tuple[int, ...] = ()  # derived from layer_types when that is given
    # Per layer, one of LAYER_TYPES; empty: "attention" at attn_layer_indices, "mamba" elsewhere.
    layer_types: tuple[str, ...] = ()
    model_type: str = "bamba"  # the family (model.families) that composes the layers and names the weights
    # attention (GQA + RoPE on the first `partial_rotary_factor` of each head, or no position embedding)
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128  # hidden_size // num_attention_heads unless config.json says otherwise
    position_embedding: str = "rope"  # "rope" or "none" (NoPE)
    partial_rotary_factor: float = 0.5  # transformers hardcodes 0.5 for Bamba
    rope_theta: float = 10000.0
    attention_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    attention_bias: bool = False
    mlp_bias: bool = False
    # Mamba-2 mixer
    mamba_n_heads: int = 128
    mamba_d_head: int = 64  # "auto" in transformers: mamba_expand * hidden_size // mamba_n_heads
    mamba_n_groups: int = 1
    mamba_d_state: int = 256
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_chunk_size: int = 256
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    # Gated DeltaNet mixer ("linear_attention" layers; defaults: transformers' Qwen3NextConfig())
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32  # a multiple of the key heads (GQA-style)
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    # attention extras (Qwen3-Next): per-head RMSNorm of q and k before RoPE, and
    # o_proj(attn * sigmoid(gate)) with the gate a second half of q_proj's rows per head
    attention_qk_norm: bool = False
    attention_output_gate: bool = False
    # sparse feed-forward (None: dense only)
    moe: MoEConfig | None = None
    # scalings (Granite's multipliers; 1.0 = none, and then no op is spent on them)
    embedding_multiplier: float = 1.0  # embeddings * m
    residual_multiplier: float = 1.0  # h + m * sublayer(norm(h))
    logits_scaling: float = 1.0  # logits / s
    # norms, head
    rms_norm_eps: float = 1e-5
    # RMSNorm: multiply the weight in fp32 and round once (Nemotron-H) rather than round the
    # normalized input to the model dtype first (Bamba). Same result in fp32.
    rms_norm_weight_in_fp32: bool = False
    # RMSNorm weights stored as an offset from 1: x_normed * (1 + w) in fp32 (Qwen3-Next's every
    # RMSNorm but the Gated DeltaNet's gated one); implies the fp32 weight product.
    rms_norm_zero_centred: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self):
        _positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "mamba_n_heads",
                              "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                              "mamba_chunk_size", "linear_num_key_heads", "linear_num_value_heads",
                              "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"))
        require(self.linear_num_value_heads % self.linear_num_key_heads == 0, "linear_num_value_heads",
                f"{self.linear_num_value_heads} must be a multiple of linear_num_key_heads={self.linear_num_key_heads}")
        require(self.attention_qk_norm == self.attention_output_gate, "attention_output_gate",
                "gated attention (model.gated_attention) has both the output gate and the q/k norms, or neither; "
                f"got attention_output_gate={self.attention_output_gate}, attention_qk_norm={self.attention_qk_norm}")
        require(self.linear_conv_kernel_dim >= 2, "linear_conv_kernel_dim",
                f"must be >= 2 (the conv state holds kernel - 1 inputs), got {self.linear_conv_kernel_dim}")
        self._normalize_layer_types()
        object.__setattr__(self, "time_step_limit", tuple(float(v) for v in self.time_step_limit))
        require(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
                f"{self.num_key_value_heads} must divide num_attention_heads={self.num_attention_heads}")
        require(self.mamba_n_heads % self.mamba_n_groups == 0, "mamba_n_groups",
                f"{self.mamba_n_groups} must divide mamba_n_heads={self.mamba_n_heads}")
        require(self.mamba_d_conv >= 2, "mamba_d_conv", f"must be >= 2 (the conv state holds d_conv - 1 inputs), "
                f"got {self.mamba_d_conv}")
        require(self.position_embedding in POSITION_EMBEDDINGS, "position_embedding",
                f"expected one of {POSITION_EMBEDDINGS}, got {self.position_embedding!r}")
        require(0.0 < self.partial_rotary_factor <= 1.0 and self.rotary_dim % 2 == 0 and self.rotary_dim > 0,
                "partial_rotary_factor", f"{self.partial_rotary_factor} * head_dim {self.head_dim} must give a "
                "positive even rotary dim")
        require(self.attention_scale is None or (math.isfinite(self.attention_scale) and self.attention_scale > 0),
                "attention_scale", f"must be a positive finite float or None, got {self.attention_scale!r}")
        for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and math.isfinite(value) and value != 0, name,
                    f"must be a finite non-zero number, got {value!r}")
        require(self.moe is None or isinstance(self.moe, MoEConfig), "moe", f"expected a MoEConfig, got {self.moe!r}")
        lo, hi = self.time_step_limit
        require(len(self.time_step_limit) == 2 and 0.0 <= lo <= hi, "time_step_limit",
                f"expected (lo, hi) with 0 <= lo <= hi, got {self.time_step_limit}")

    def _normalize_layer_types(self) -> None:
        """Store both views: attn_layer_indices (sorted) and layer_types (one entry per layer)."""
        attn = tuple(sorted(int(i) for i in self.attn_layer_indices))
        require(all(0 <= i < self.num_hidden_layers for i in attn), "attn_layer_indices",
                f"must lie in 0 .. {self.num_hidden_layers - 1}, got {list(attn)}")
        require(len(set(attn)) == len(attn), "attn_layer_indices", "has duplicates")
        if not self.layer_types:
            types = tuple("attention" if i in attn else "mamba" for i in range(self.num_hidden_layers))
        else:
            types = tuple(self.layer_types)
            require(len(types) == self.num_hidden_layers, "layer_types",
                    f"{len(types)} entries for num_hidden_layers={self.num_hidden_layers}")
            bad = [t for t in types if t not in LAYER_TYPES]
            require(not bad, "layer_types", f"unknown layer type {bad[0]!r} (expected one of {LAYER_TYPES})"
                    if bad else "")
            from_types = tuple(i for i, t in enumerate(types) if t == "attention")
            require(not attn or attn == from_types, "attn_layer_indices",
                    f"{list(attn)} disagrees with layer_types' attention layers {list(from_types)}")
            attn = from_types
        object.__setattr__(self, "attn_layer_indices", attn)
        object.__setattr__(self, "layer_types", types)

    # derived shapes --------------------------------------------------------------------------
    @property
    def mamba_d_inner(self) -> int:
        """Channels of the SSM (x, the gate z, the gated norm): heads x head dim."""
        return self.mamba_n_heads * self.mamba_d_head

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: x, B and C (the gate and dt bypass it)."""
        return self.mamba_d_inner + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "mamba")

    @property
    def linear_attn_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")

    @property
    def state_layer_indices(self) -> tuple[int, ...]:
        """Layers with a recurrent state (Mamba-2 and Gated DeltaNet), in layer order: a snapshot's order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind in STATE_LAYER_TYPES)

    @property
    def linear_conv_dim(self) -> int:
        """Channels through a Gated DeltaNet layer's causal conv: q, k (key heads) and v (value heads)."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)
