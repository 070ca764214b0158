"""`HybridConfig`: the shapes every supported family maps onto, plus named presets.

One dataclass for all families: each field is read by a shared layer (the Mamba-2 mixer,
attention, the gated MLP, the MoE, the decoder loop). A family's module under `model/families/`
maps its `config.json` onto these fields (`HybridConfig.from_hf_dict` picks the family by
`model_type`) and refuses, naming the field, anything it does not implement, so a checkpoint never
loads into a model that silently computes something else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from kernels.checks import require

# Per-layer types. A sequence-mixer layer ("mamba", "attention") is followed by its family's
# feed-forward (if the family has one); a feed-forward-only layer ("mlp", "moe": Nemotron-H's
# "-" and "E") has no sequence mixer and holds no cache state.
MIXER_LAYER_TYPES = ("mamba", "attention")
FEED_FORWARD_LAYER_TYPES = ("mlp", "moe")
LAYER_TYPES = MIXER_LAYER_TYPES + FEED_FORWARD_LAYER_TYPES
POSITION_EMBEDDINGS = ("rope", "none")
# How router logits become top-k expert weights: "softmax_topk" (Granite, model.moe), "sigmoid_grouped_topk"
# (Nemotron-H, DeepSeek-V3 style: sigmoid scores plus a selection-only bias, top groups, then top-k;
# model.moe_nemotron).
MOE_ROUTERS = ("softmax_topk", "sigmoid_grouped_topk")


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
    means what it means to transformers); the presets below are what the project runs."""

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
    tie_word_embeddings: bool = False

    def __post_init__(self):
        _positive_ints(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "mamba_n_heads",
                              "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                              "mamba_chunk_size"))
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

    # HF interop (per family: model.families) ------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> "HybridConfig":
        """Map an HF `config.json` dict through the family its `model_type` names; unsupported
        fields or values raise naming the field."""
        from model.families import config_from_hf  # the families import this module

        return config_from_hf(hf)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "HybridConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers config kwargs (with `model_type`) that build the same model there."""
        from model.families import get_family

        return get_family(self.model_type).config_to_hf(self)


# Granite-4.0-H layer pattern (ibm-granite/granite-4.0-h-tiny config.json, also reported for -small):
# 40 layers, attention at 5, 15, 25, 35, Mamba-2 elsewhere (9:1).
_GRANITE_4_H_LAYERS = tuple("attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40))
# Shared by the Granite-4.0-H configs: NoPE, tied embeddings, vocab 100352, Mamba P = 64,
# N = 128, one group, d_conv 4, chunk 256, rms eps 1e-5, muP embedding 12 / residual 0.22 /
# attention 1/128 (= 1/head_dim). logits_scaling differs per model and is given with each.
_GRANITE_4_H = dict(
    model_type="granitemoehybrid", vocab_size=100352, num_hidden_layers=40, layer_types=_GRANITE_4_H_LAYERS,
    position_embedding="none", partial_rotary_factor=1.0, head_dim=128, mamba_d_head=64, mamba_n_groups=1,
    mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, rms_norm_eps=1e-5,
    tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22, attention_scale=0.0078125,
)
# The reduced CPU layouts: Granite's ratios at hidden 256 in six layers (MMMAMM, as "small"),
# head_dim 64 (attention scale 1/64), the same multipliers.
_GRANITE_CPU = dict(
    model_type="granitemoehybrid", vocab_size=16384, hidden_size=256, num_hidden_layers=6,
    layer_types=("mamba", "mamba", "mamba", "attention", "mamba", "mamba"), num_attention_heads=4,
    num_key_value_heads=1, head_dim=64, position_embedding="none", partial_rotary_factor=1.0,
    mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, rms_norm_eps=1e-5, tie_word_embeddings=True, embedding_multiplier=12.0,
    residual_multiplier=0.22, attention_scale=0.015625, logits_scaling=6.0,
)


PRESETS: dict[str, HybridConfig] = {
    # ---- Bamba ----------------------------------------------------------------------------------
    # Tests: small enough for the Triton interpreter (a 40-token forward in ~1 s); two groups, a
    # 16-token scan chunk and 2:1 GQA keep every kernel path (multi-chunk, grouped B/C, GQA) live.
    "tiny": HybridConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, attn_layer_indices=(1,),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=16,
    ),
    # The main experiment's default on 2 CPU cores: Bamba's ratios at hidden 256 (attention
    # heads x head_dim = hidden, 4:1 GQA, Mamba P = 64, N = 128, d_conv 4, chunk 256, MLP 3x),
    # one attention layer in six (Bamba-9B: 3 in 32). 14.4 M parameters (8.4 M of them embedding
    # and head). A cold 32772-token prefill in 8192-token chunks took 24 s (2 threads) and 28 s
    # (1 thread) on the shared 2-core CPU; attention grows with the cached prefix, so the last
    # chunk (32K keys) costs 3x the first, which is why there is one attention layer.
    "small": HybridConfig(
        vocab_size=16384, hidden_size=256, intermediate_size=768, num_hidden_layers=6, attn_layer_indices=(3,),
        num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=256,
    ),
    # Bamba-9B's shapes (ibm-fms/Bamba-9B config.json), random weights: GPU timing only.
    "bamba-9b": HybridConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        attn_layer_indices=(9, 18, 27), num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mamba_n_heads=128, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    # ---- GraniteMoeHybrid (Granite-4.0-H) -----------------------------------------------------------
    # Tests (as "tiny"): MoE with 4 experts, top 2, beside the shared MLP; full-head RoPE so the
    # chunked paths see rotated keys (the real models are NoPE, covered by the parity tests);
    # non-trivial multipliers so a dropped one shows.
    "granite-tiny": HybridConfig(
        model_type="granitemoehybrid", vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        layer_types=("mamba", "attention", "mamba"), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        position_embedding="rope", partial_rotary_factor=1.0, attention_scale=0.125,
        moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=32),
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=16, embedding_multiplier=4.0, residual_multiplier=0.5, logits_scaling=2.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    # CPU experiments, MoE layout: Granite-4.0-H-Tiny's ratios (64 experts of width H/3, top 6,
    # shared MLP 2H/3) scaled to 32 experts of width 96, top 6, shared 192. 21.8 M parameters
    # (4.2 M of them the tied embedding), 10.3 M active per token.
    "granite-small-cpu": HybridConfig(
        **_GRANITE_CPU, intermediate_size=192, moe=MoEConfig(num_experts=32, top_k=6, intermediate_size=96),
    ),
    # CPU experiments, dense layout (as granite-4.0-h-micro): shared MLP 4H, no experts. 11.4 M parameters.
    "granite-dense-cpu": HybridConfig(**_GRANITE_CPU, intermediate_size=1024),
    # The published shapes, random weights: GPU timing only. Totals here: micro 3.19 B, tiny 6.94 B
    # (1.47 B active), small 32.2 B (8.8 B active), as published (3 B; 7 B / 1 B; 32 B / 9 B).
    # ibm-granite/granite-4.0-h-micro config.json (3B dense): hidden 2048, 16 heads of 128, 4 KV heads,
    # 64 Mamba heads, shared MLP 8192, no experts. From memory of the published file, not confirmed
    # here: hidden/heads/KV heads, shared width, logits_scaling 8.
    "granite-4.0-h-micro": HybridConfig(
        **_GRANITE_4_H, hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=4,
        mamba_n_heads=64, logits_scaling=8.0,
    ),
    # ibm-granite/granite-4.0-h-tiny config.json (7B, 1B active): hidden 1536, 12 heads, 4 KV heads,
    # 48 Mamba heads, 64 experts of 512, top 6, shared MLP 1024 (confirmed against a copy of the
    # published file). logits_scaling 6: from memory, not confirmed here.
    "granite-4.0-h-tiny": HybridConfig(
        **_GRANITE_4_H, hidden_size=1536, intermediate_size=1024, num_attention_heads=12, num_key_value_heads=4,
        mamba_n_heads=48, moe=MoEConfig(num_experts=64, top_k=6, intermediate_size=512), logits_scaling=6.0,
    ),
    # ibm-granite/granite-4.0-h-small config.json (32B, 9B active): hidden 4096, 32 heads, 8 KV heads,
    # 72 experts of 768, top 10, shared MLP 1536 (confirmed against a copy of the published file);
    # 128 Mamba heads follow from expand 2 and P = 64. logits_scaling 8: not confirmed here.
    "granite-4.0-h-small": HybridConfig(
        **_GRANITE_4_H, hidden_size=4096, intermediate_size=1536, num_attention_heads=32, num_key_value_heads=8,
        mamba_n_heads=128, moe=MoEConfig(num_experts=72, top_k=10, intermediate_size=768), logits_scaling=8.0,
    ),
}


# ---- Nemotron-H (model.families.nemotron_h) -------------------------------------------------------
def layer_types_from_pattern(pattern: str) -> tuple[str, ...]:
    """Nemotron-H's `hybrid_override_pattern`: M Mamba-2, * attention, - MLP, E MoE, one symbol per layer."""
    symbols = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    require(isinstance(pattern, str) and pattern, "hybrid_override_pattern", f"expected a non-empty string, "
            f"got {pattern!r}")
    bad = sorted(set(pattern) - set(symbols))
    require(not bad, "hybrid_override_pattern", f"unknown layer symbol(s) {bad} in {pattern!r} (supported: "
            f"{', '.join(f'{k} {v}' for k, v in symbols.items())})")
    return tuple(symbols[ch] for ch in pattern)


def _nemotron_h(pattern: str, **shapes) -> HybridConfig:
    """What every Nemotron-H shares: NoPE attention, no biases, relu^2 MLPs (set by the family), fp32
    norm-weight multiply, eps 1e-5, dt clamped below at time_step_min = 0.001, untied head."""
    fixed = dict(model_type="nemotron_h", num_hidden_layers=len(pattern), layer_types=layer_types_from_pattern(pattern),
                 position_embedding="none", time_step_limit=(0.001, math.inf), rms_norm_eps=1e-5,
                 rms_norm_weight_in_fp32=True, tie_word_embeddings=False)
    return HybridConfig(**fixed, **shapes)


PRESETS.update({
    # Tests: every layer kind ("ME*M-E": Mamba, MoE, attention, Mamba, MLP, MoE) at interpreter-fast
    # shapes. head_dim 24 != hidden / heads and Mamba d_inner 4 x 16 = 64 != expand * hidden, as
    # Nemotron-H allows; 8 experts in 4 groups, 2 groups and 2 experts per token, so the grouped
    # routing is live (the published models use one group).
    "nemotron-h-tiny": _nemotron_h(
        "ME*M-E", vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16,
        moe=MoEConfig(num_experts=8, top_k=2, intermediate_size=32, router="sigmoid_grouped_topk", n_group=4,
                      topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, shared_expert_intermediate_size=48),
    ),
    # The CPU experiment size of the Nemotron-H layout (15.6 M parameters, 8.4 M of them embedding and
    # head), at the "small" preset's hidden 256 and vocabulary: Nemotron 3 Nano's alternation of
    # Mamba and MoE layers plus Nemotron-H-8B's dense relu^2 MLP layers, one attention layer in ten.
    # Nemotron's Mamba shapes scaled down (head dim 64, N = 128, d_conv 4, chunk 128, grouped B/C),
    # Nano's routing (one group, sigmoid, normalized top-k times 2.5) over 16 experts, top 4.
    "nemotron-h-small-cpu": _nemotron_h(
        "MEM-M*MEM-", vocab_size=16384, hidden_size=256, intermediate_size=768, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=128,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
        moe=MoEConfig(num_experts=16, top_k=4, intermediate_size=192, router="sigmoid_grouped_topk",
                      norm_topk_prob=True, routed_scaling_factor=2.5, shared_expert_intermediate_size=384),
    ),
    # nvidia/Nemotron-H-8B-Base-8K, random weights (GPU timing only). Shapes are transformers'
    # NemotronHConfig defaults, which are this model's (hidden 4096, MLP 21504, 32/8 heads of 128,
    # Mamba 128 heads x 64, 8 groups, N = 128), and the 52-layer pattern of NVIDIA's configuration
    # file (24 Mamba-2, 24 MLP, 4 attention, as the Nemotron-H paper, arXiv 2504.03624, lists).
    # Not confirmed against the config.json itself (no network here): the pattern, the 131072
    # vocabulary and chunk 128; the parameter count, 8,100,852,736, matches a published
    # per-tensor breakdown of the checkpoint.
    "nemotron-h-8b": _nemotron_h(
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", vocab_size=131072, hidden_size=4096,
        intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8, head_dim=128, mamba_n_heads=128,
        mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
    ),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json (as quoted in public code; the model
    # card: 52 layers = 23 Mamba-2 + 23 MoE + 6 attention, 128 experts + 1 shared, 6 per token,
    # 31.6 B total / ~3.5 B active parameters: this preset has 31.58 B / 3.58 B). Random weights:
    # GPU timing only. Mamba d_inner = 64 x 64 = 4096, not expand * hidden.
    "nemotron-3-nano": _nemotron_h(
        "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", vocab_size=131072, hidden_size=2688,
        intermediate_size=1856, num_attention_heads=32, num_key_value_heads=2, head_dim=128, mamba_n_heads=64,
        mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
        moe=MoEConfig(num_experts=128, top_k=6, intermediate_size=1856, router="sigmoid_grouped_topk", n_group=1,
                      topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                      shared_expert_intermediate_size=3712),
    ),
})
