"""`HybridConfig`: the Bamba layout's shapes, read from an HF `config.json`, plus named presets.

Every field here changes the math; `from_hf_dict` maps transformers' `BambaConfig` fields onto
it and refuses (naming the field) anything it does not implement, so a checkpoint never loads
into a model that silently computes something else.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from kernels.checks import require


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """Defaults are transformers' `BambaConfig()` defaults (so a config.json missing a field means
    what it means to transformers); the presets below are what the project runs."""

    vocab_size: int = 128000
    hidden_size: int = 4096
    intermediate_size: int = 14336  # SwiGLU width
    num_hidden_layers: int = 32
    attn_layer_indices: tuple[int, ...] = ()  # the other layers are Mamba-2 mixers
    # attention (GQA + RoPE on the first `partial_rotary_factor` of each head)
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128  # hidden_size // num_attention_heads unless config.json says otherwise
    partial_rotary_factor: float = 0.5  # transformers hardcodes 0.5 for Bamba
    rope_theta: float = 10000.0
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
    # norms, head
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    def __post_init__(self):
        object.__setattr__(self, "attn_layer_indices", tuple(sorted(int(i) for i in self.attn_layer_indices)))
        object.__setattr__(self, "time_step_limit", tuple(float(v) for v in self.time_step_limit))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
                     "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                     f"must be a positive int, got {value!r}")
        require(all(0 <= i < self.num_hidden_layers for i in self.attn_layer_indices), "attn_layer_indices",
                 f"must lie in 0 .. {self.num_hidden_layers - 1}, got {list(self.attn_layer_indices)}")
        require(len(set(self.attn_layer_indices)) == len(self.attn_layer_indices), "attn_layer_indices",
                 "has duplicates")
        require(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
                 f"{self.num_key_value_heads} must divide num_attention_heads={self.num_attention_heads}")
        require(self.mamba_n_heads * self.mamba_d_head == self.mamba_d_inner, "mamba_d_head",
                 f"mamba_n_heads * mamba_d_head = {self.mamba_n_heads * self.mamba_d_head} must equal "
                 f"mamba_expand * hidden_size = {self.mamba_d_inner}")
        require(self.mamba_n_heads % self.mamba_n_groups == 0, "mamba_n_groups",
                 f"{self.mamba_n_groups} must divide mamba_n_heads={self.mamba_n_heads}")
        require(self.mamba_d_conv >= 2, "mamba_d_conv", f"must be >= 2 (the conv state holds d_conv - 1 inputs), "
                 f"got {self.mamba_d_conv}")
        require(0.0 < self.partial_rotary_factor <= 1.0 and self.rotary_dim % 2 == 0 and self.rotary_dim > 0,
                 "partial_rotary_factor", f"{self.partial_rotary_factor} * head_dim {self.head_dim} must give a "
                 "positive even rotary dim")
        lo, hi = self.time_step_limit
        require(len(self.time_step_limit) == 2 and 0.0 <= lo <= hi, "time_step_limit",
                 f"expected (lo, hi) with 0 <= lo <= hi, got {self.time_step_limit}")

    # derived shapes --------------------------------------------------------------------------
    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: x, B and C (the gate and dt bypass it)."""
        return self.mamba_d_inner + 2 * self.mamba_n_groups * self.mamba_d_state

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def layer_types(self) -> tuple[str, ...]:
        return tuple("attention" if i in self.attn_layer_indices else "mamba" for i in range(self.num_hidden_layers))

    @property
    def mamba_layer_indices(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == "mamba")

    # HF interop --------------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> "HybridConfig":
        """Map an HF Bamba `config.json` dict; unsupported fields or values raise naming the field."""
        require(hf.get("model_type") == "bamba", "model_type", f"expected 'bamba', got {hf.get('model_type')!r}")
        unknown = sorted(set(hf) - _HF_MATH_FIELDS - _HF_INERT_FIELDS)
        require(not unknown, unknown[0] if unknown else "", "config.json field not supported by HybridConfig "
                 f"(it may change the math); unsupported fields: {unknown}")
        require(hf.get("hidden_act", "silu") == "silu", "hidden_act",
                 f"only 'silu' is implemented (SwiGLU and the conv activation), got {hf.get('hidden_act')!r}")
        require(hf.get("quantization_config") is None, "quantization_config", "quantized checkpoints are not supported")
        require(hf.get("rope_scaling") is None, "rope_scaling", f"only plain RoPE is implemented, got {hf.get('rope_scaling')}")

        # RoPE: transformers v5 keeps `rope_parameters`; v4 files carry a top-level rope_theta.
        # Both versions hardcode partial_rotary_factor = 0.5 unless rope_parameters says otherwise.
        rope = hf.get("rope_parameters") or {}
        require(rope.get("rope_type", rope.get("type", "default")) == "default", "rope_parameters.rope_type",
                 f"only 'default' RoPE is implemented, got {rope.get('rope_type', rope.get('type'))!r}")
        unknown_rope = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
        require(not unknown_rope, f"rope_parameters.{unknown_rope[0]}" if unknown_rope else "",
                 f"RoPE field not supported: {unknown_rope}")
        top_partial = hf.get("partial_rotary_factor", 0.5)
        require(top_partial == 0.5, "partial_rotary_factor", "transformers' Bamba ignores a top-level value and uses "
                 f"0.5; put another value in rope_parameters (got {top_partial})")
        partial = float(rope.get("partial_rotary_factor", 0.5))
        rope_theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))

        d = cls()  # transformers' defaults for absent fields
        hidden = int(hf.get("hidden_size", d.hidden_size))
        heads = int(hf.get("num_attention_heads", d.num_attention_heads))
        kv_heads = hf.get("num_key_value_heads", d.num_key_value_heads)
        head_dim = int(hf.get("head_dim") or hidden // heads)
        expand = hf.get("mamba_expand", d.mamba_expand)
        require(float(expand).is_integer(), "mamba_expand", f"must be an integer, got {expand}")
        expand = int(expand)
        m_heads = int(hf.get("mamba_n_heads", d.mamba_n_heads))
        d_head = hf.get("mamba_d_head", "auto")
        d_head = expand * hidden // m_heads if d_head in ("auto", None) else int(d_head)
        rotary_dim = int(head_dim * partial)
        if "attn_rotary_emb" in hf:  # written by the original Bamba conversion; must agree with the rotary dim
            require(int(hf["attn_rotary_emb"]) == rotary_dim, "attn_rotary_emb",
                     f"{hf['attn_rotary_emb']} disagrees with head_dim * partial_rotary_factor = {rotary_dim}")
        return cls(
            vocab_size=int(hf.get("vocab_size", d.vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(hf.get("intermediate_size", d.intermediate_size)),
            num_hidden_layers=int(hf.get("num_hidden_layers", d.num_hidden_layers)),
            attn_layer_indices=tuple(hf.get("attn_layer_indices") or ()),
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads if kv_heads is not None else heads),
            head_dim=head_dim,
            partial_rotary_factor=partial,
            rope_theta=rope_theta,
            attention_bias=bool(hf.get("attention_bias", d.attention_bias)),
            mlp_bias=bool(hf.get("mlp_bias", d.mlp_bias)),
            mamba_n_heads=m_heads,
            mamba_d_head=d_head,
            mamba_n_groups=int(hf.get("mamba_n_groups", d.mamba_n_groups)),
            mamba_d_state=int(hf.get("mamba_d_state", d.mamba_d_state)),
            mamba_d_conv=int(hf.get("mamba_d_conv", d.mamba_d_conv)),
            mamba_expand=expand,
            mamba_chunk_size=int(hf.get("mamba_chunk_size", d.mamba_chunk_size)),
            mamba_conv_bias=bool(hf.get("mamba_conv_bias", d.mamba_conv_bias)),
            mamba_proj_bias=bool(hf.get("mamba_proj_bias", d.mamba_proj_bias)),
            time_step_limit=_parse_time_step_limit(hf.get("time_step_limit", d.time_step_limit)),
            rms_norm_eps=float(hf.get("rms_norm_eps", d.rms_norm_eps)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", d.tie_word_embeddings)),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "HybridConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_hf_dict(self) -> dict[str, Any]:
        """The `BambaConfig(**kwargs)` that builds the same model in transformers (benchmarks, tests)."""
        return {
            "model_type": "bamba",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "attn_layer_indices": list(self.attn_layer_indices),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "mamba_n_heads": self.mamba_n_heads,
            "mamba_d_head": self.mamba_d_head,
            "mamba_n_groups": self.mamba_n_groups,
            "mamba_d_state": self.mamba_d_state,
            "mamba_d_conv": self.mamba_d_conv,
            "mamba_expand": self.mamba_expand,
            "mamba_chunk_size": self.mamba_chunk_size,
            "mamba_conv_bias": self.mamba_conv_bias,
            "mamba_proj_bias": self.mamba_proj_bias,
            "time_step_limit": list(self.time_step_limit),
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
        }


def _parse_time_step_limit(value) -> tuple[float, float]:
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


# Fields of BambaConfig that HybridConfig reads (all of them change the forward pass).
_HF_MATH_FIELDS = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "attn_layer_indices",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters", "rope_theta", "rope_scaling",
    "partial_rotary_factor", "attn_rotary_emb", "attention_bias", "mlp_bias", "hidden_act", "mamba_n_heads",
    "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
    "mamba_conv_bias", "mamba_proj_bias", "time_step_limit", "rms_norm_eps", "tie_word_embeddings",
    "quantization_config",
}
# Fields that do not change an inference forward: training knobs, token ids, generation and
# bookkeeping (`mamba_dt_rank` and `use_mamba_kernels` are leftovers of the original conversion).
_HF_INERT_FIELDS = {
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "attention_dropout", "z_loss_coefficient", "num_logits_to_keep", "max_position_embeddings",
    "pad_token_id", "bos_token_id", "eos_token_id", "mamba_dt_rank", "use_mamba_kernels", "output_attentions",
    "output_hidden_states", "return_dict", "id2label", "label2id", "tokenizer_class", "chunk_size_feed_forward",
    "is_encoder_decoder", "problem_type", "task_specific_params", "tie_encoder_decoder", "sep_token_id",
    "decoder_start_token_id",
}


PRESETS: dict[str, HybridConfig] = {
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
}
