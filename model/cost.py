"""One cost model per model config (`ModelCost`): the FLOPs of a prefill chunk, the bytes of a
snapshot, of a token's KV and of the weights, for every family, from `HybridConfig` alone.

Every term is read off how `model.hybrid.HybridLM` builds its layers (a multiply-add is 2 FLOPs):

* Mamba-2 mixer (`model/mamba2.py`): in_proj H x (d_inner + conv_dim + heads) = H x (2 d_inner +
  2 G N + heads), depthwise conv taps conv_dim x d_conv, out_proj d_inner x H, where d_inner =
  heads x head dim (`HybridConfig.mamba_d_inner`; Nemotron-H's is not expand x hidden);
* attention (`model/attention.py`): q, k, v, o = H x (q + 2 kv) + q x H, q = heads x head_dim;
  gated attention (Qwen3-Next, `model/gated_attention.py`) doubles q_proj's rows (the output gate):
  H x (2 q + 2 kv) + q x H;
* Gated DeltaNet mixer (`model/gated_deltanet.py`): in_proj_qkvz H x (2 HK K + 2 HV V), in_proj_ba
  H x 2 HV, depthwise conv taps (2 HK K + HV V) x kernel, out_proj HV V x H;
* the feed-forward after each layer is the family's (`Family.feed_forward_cost`, in the family's
  module beside the `feed_forward` it counts): Bamba a SwiGLU (3 x H x I, `model/mlp.py`) after
  every layer; Granite-4.0-H its `shared_mlp` (fused SwiGLU, 3 x H x I) after every layer, plus,
  with experts, a softmax router (H x E) and E gated experts (3 x H x I_e each, `model/moe.py`);
  Nemotron-H none after a mixer, a relu^2 MLP (2 x H x I) as a "-" layer, and as an "E" layer a
  sigmoid router (H x E), E relu^2 experts (2 x H x I_e) and one shared relu^2 expert (2 x H x I_s)
  (`model/families/nemotron_h_moe.py`);
* a token passes through the dense matrices, the router and its top-k experts (`active_params`);
  the weights held are every matrix, all experts, the embedding and an untied head
  (`weight_bytes`); the vectors (norms, biases, A, D, dt bias: 0.07% of "small") are left out.

FLOPs of a chunk of n new tokens after c cached ones (`prefill_flops`, broken down in `Flops`):

    matmuls    2 x projection params x n     mixer projections, feed-forward (top-k experts + router)
    conv       2 x conv taps x n
    scan       per Mamba layer and token, chunk Q: 4 H P N (B^T x and C h) + Q (G N + H P) (the
               causal intra-chunk C B^T and its product with x, lower triangle of a Q x Q block:
               the Triton kernel's tiles); `ScanKernel` describes another implementation.
               Plus per Gated DeltaNet layer and token, chunk L = 64 (`kernels/gated_delta_rule.py`,
               16-bit inputs), per value head: 6 K V (w S, the state update k^T v_new, q S) +
               L (3 K + 2 V) (lower triangles of k k^T, T (beta k), T (beta v), q k^T, (q k^T) v_new)
               + L^2 / 3 (the forward substitution of an L x L triangle, per token)
    attention  per attention layer 4 x q width x keys, keys = n c + n (n + 1) / 2 (token c + i
               attends to c + i + 1 keys: Q K^T and P V)
    head       2 x vocab x H per logit row: once per chunk (its last token) unless told otherwise

A snapshot at position p spares a prefill of [0, p): `snapshot_flops(p)` is that chunk with no
head (the request still runs its head on its last token either way); pass it as
`Engine(snapshot_flops=)`. For preset "small": 6,022,144 active parameters a token, the scan
2,129,920 FLOPs a token, one attention layer of width 256; a snapshot at 1,024 spares 1.51e10
FLOPs (attention 4% of it), at 4,096 6.66e10 (13%), at 16,368 3.69e11 (37%; 25x the one at
1,024), at 32,752 1.01e12 (54%).

Bytes, given the element size: a snapshot holds every Mamba layer's conv state (conv_dim x
(d_conv - 1)) and SSM state (heads x P x N; the model keeps it fp32: `ssm_dtype_bytes`), and every
Gated DeltaNet layer's conv state ((2 HK K + HV V) x (kernel - 1)) and delta-rule state (HV x K x V,
fp32 too); a token's KV is K and V of every attention layer (2 x kv heads x head_dim).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from kernels.checks import require
from model.config import HybridConfig
from model.families import FAMILIES
from model.families.base import FeedForward

__all__ = ["FeedForward", "Flops", "ModelCost", "ScanKernel", "TRITON_SCAN"]


@dataclasses.dataclass(frozen=True)
class ScanKernel:
    """How an SSD scan implementation spends its FLOPs.

    `chunk`: its chunk (None: the config's `mamba_chunk_size`); `causal`: the intra-chunk products
    cover the lower triangle of each chunk's Q x Q block (False: the whole block); `padded`: a
    row's short last chunk costs a whole chunk. The default is the Triton kernel (`kernels/ssd_scan.py`:
    the config's chunk, lower-triangular tiles, work that ends with the chunk)."""

    chunk: int | None = None
    causal: bool = True
    padded: bool = False


TRITON_SCAN = ScanKernel()
# The chunk of the Triton delta-rule scan for 16-bit inputs (kernels.gated_delta_rule.default_chunk_size;
# not imported: the cost model never imports Triton).
DELTA_RULE_CHUNK = 64


class Flops(NamedTuple):
    """The FLOPs of one prefill chunk, term by term (module docstring)."""

    matmuls: float
    conv: float
    scan: float
    attention: float
    head: float

    @property
    def total(self) -> float:
        return self.matmuls + self.conv + self.scan + self.attention + self.head


def _check_count(name: str, value) -> None:
    if not (isinstance(value, int) and value >= 0):  # the message is built only on failure: a hot path
        require(False, name, f"must be an int >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """FLOPs and bytes of one model config (module docstring): `ModelCost(config)`. The derived
    counts are computed once (the trace simulator asks for a row's FLOPs millions of times)."""

    config: HybridConfig

    def __post_init__(self):
        family = FAMILIES.get(self.config.model_type)
        if family is None or family.feed_forward_cost is None:
            known = sorted(t for t, f in FAMILIES.items() if f.feed_forward_cost is not None)
            require(False, "model_type", f"no cost rule for family {self.config.model_type!r}; known: {known}")

    # ---------------------------------------------------------------- parameters
    @functools.cached_property
    def mamba_params(self) -> int:
        """One Mamba-2 mixer's matrices: in_proj and out_proj (conv taps apart: `conv_taps`)."""
        c = self.config
        return c.hidden_size * (c.mamba_d_inner + c.conv_dim + c.mamba_n_heads) + c.mamba_d_inner * c.hidden_size

    @functools.cached_property
    def attention_params(self) -> int:
        """One attention mixer's q, k, v, o."""
        c = self.config
        kv_width = c.num_key_value_heads * c.head_dim
        q_rows = self.attention_width * (2 if c.attention_output_gate else 1)  # the gate: q_proj's second half
        return c.hidden_size * (q_rows + 2 * kv_width) + self.attention_width * c.hidden_size

    @functools.cached_property
    def linear_attention_params(self) -> int:
        """One Gated DeltaNet mixer's in_proj_qkvz, in_proj_ba and out_proj (conv taps apart)."""
        c = self.config
        value_dim = c.linear_num_value_heads * c.linear_value_head_dim
        qkvz = 2 * c.linear_num_key_heads * c.linear_key_head_dim + 2 * value_dim
        return c.hidden_size * (qkvz + 2 * c.linear_num_value_heads) + value_dim * c.hidden_size

    def feed_forward(self, layer_index: int) -> FeedForward:
        c = self.config
        return FAMILIES[c.model_type].feed_forward_cost(c, c.layer_types[layer_index])

    def _projections(self, held: bool) -> int:
        mixer = {"mamba": self.mamba_params, "attention": self.attention_params}
        if self.linear_attention_layers:
            mixer["linear_attention"] = self.linear_attention_params
        total = 0
        for i, kind in enumerate(self.config.layer_types):
            ff = self.feed_forward(i)
            total += mixer.get(kind, 0) + (ff.held if held else ff.active)
        return total

    @functools.cached_property
    def projection_params(self) -> int:
        """The matrices a token multiplies through (top-k experts), embedding and head excluded."""
        return self._projections(held=False)

    @functools.cached_property
    def conv_taps(self) -> int:
        c = self.config
        return (self.mamba_layers * c.conv_dim * c.mamba_d_conv
                + self.linear_attention_layers * c.linear_conv_dim * c.linear_conv_kernel_dim)

    @functools.cached_property
    def active_params(self) -> int:
        """Projection matrices and conv taps a token passes through; embedding and head excluded."""
        return self.projection_params + self.conv_taps

    @functools.cached_property
    def held_params(self) -> int:
        """Every matrix and conv tap held (all experts), the embedding, and the head unless tied."""
        c = self.config
        embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        return self._projections(held=True) + self.conv_taps + embeddings

    def weight_bytes(self, dtype_bytes: int) -> int:
        return self.held_params * dtype_bytes

    # ---------------------------------------------------------------- layer counts
    @functools.cached_property
    def mamba_layers(self) -> int:
        return len(self.config.mamba_layer_indices)

    @functools.cached_property
    def linear_attention_layers(self) -> int:
        return len(self.config.linear_attn_layer_indices)

    @functools.cached_property
    def attention_layers(self) -> int:
        return len(self.config.attn_layer_indices)

    @functools.cached_property
    def attention_width(self) -> int:
        """Query heads x head_dim."""
        return self.config.num_attention_heads * self.config.head_dim

    # ---------------------------------------------------------------- FLOPs
    def scan_flops_per_token(self, scan: ScanKernel = TRITON_SCAN) -> int:
        """All Mamba layers' SSD FLOPs for one token of a full chunk, plus every Gated DeltaNet
        layer's chunked delta rule (its own chunk, `DELTA_RULE_CHUNK`: `scan` describes the SSD scan)."""
        c = self.config
        chunk = scan.chunk or c.mamba_chunk_size
        states = 4 * c.mamba_n_heads * c.mamba_d_head * c.mamba_d_state
        intra = chunk * (c.mamba_n_groups * c.mamba_d_state + c.mamba_d_inner) * (1 if scan.causal else 2)
        return self.mamba_layers * (states + intra) + self.linear_attention_layers * self._delta_rule_per_token

    @functools.cached_property
    def _delta_rule_per_token(self) -> int:
        """One Gated DeltaNet layer's delta-rule FLOPs for one token of a full chunk (module docstring)."""
        c, L = self.config, DELTA_RULE_CHUNK
        K, V = c.linear_key_head_dim, c.linear_value_head_dim
        return c.linear_num_value_heads * (6 * K * V + L * (3 * K + 2 * V) + L * L // 3)

    @functools.cached_property
    def head_flops(self) -> int:
        """The LM head on one row."""
        return 2 * self.config.vocab_size * self.config.hidden_size

    @functools.cached_property
    def flops_per_token(self) -> int:
        """Weights, conv taps and scan for one token (attention and head apart)."""
        return 2 * self.active_params + self._triton_scan_per_token

    def prefill_flops(self, n: int, cached: int = 0, *, head_rows: int = 1,
                      scan: ScanKernel = TRITON_SCAN) -> Flops:
        """A chunk of `n` new tokens after `cached` ones (one row), its head on `head_rows` rows."""
        _check_count("n", n)
        _check_count("cached", cached)
        if scan is TRITON_SCAN:  # the common case, computed once
            scan_flops = self._triton_scan_per_token * n
        else:
            chunk = scan.chunk or self.config.mamba_chunk_size
            scan_flops = self.scan_flops_per_token(scan) * (-(-n // chunk) * chunk if scan.padded else n)
        keys = n * cached + n * (n + 1) // 2
        return Flops(2.0 * self.projection_params * n, 2.0 * self.conv_taps * n, float(scan_flops),
                     4.0 * self.attention_layers * self.attention_width * keys, float(self.head_flops * head_rows))

    @functools.cached_property
    def _triton_scan_per_token(self) -> int:
        return self.scan_flops_per_token(TRITON_SCAN)

    def snapshot_flops(self, position: int) -> float:
        """What a hit on a snapshot at `position` spares: the prefill of [0, position), no head."""
        _check_count("position", position)
        return self.prefill_flops(position, head_rows=0).total

    # ---------------------------------------------------------------- bytes
    def state_bytes_per_layer(self, dtype_bytes: int, ssm_dtype_bytes: int | None = None) -> int:
        """One recurrent layer's states, what vLLM's padded hybrid block is sized by: a Mamba layer's,
        or, in a model whose recurrent layers are all Gated DeltaNet (Qwen3-Next), a DeltaNet layer's."""
        if self.linear_attention_layers and not self.mamba_layers:
            return self.linear_attention_state_bytes_per_layer(dtype_bytes, ssm_dtype_bytes)
        return self.mamba_state_bytes_per_layer(dtype_bytes, ssm_dtype_bytes)

    def mamba_state_bytes_per_layer(self, dtype_bytes: int, ssm_dtype_bytes: int | None = None) -> int:
        """One Mamba layer's conv state (d_conv - 1 inputs) and SSM state (H x P x N)."""
        c = self.config
        ssm = c.mamba_n_heads * c.mamba_d_head * c.mamba_d_state
        return c.conv_dim * (c.mamba_d_conv - 1) * dtype_bytes + ssm * (ssm_dtype_bytes or dtype_bytes)

    def linear_attention_state_bytes_per_layer(self, dtype_bytes: int, ssm_dtype_bytes: int | None = None) -> int:
        """One Gated DeltaNet layer's conv state (kernel - 1 inputs) and delta-rule state (HV x K x V)."""
        c = self.config
        state = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
        return c.linear_conv_dim * (c.linear_conv_kernel_dim - 1) * dtype_bytes + state * (ssm_dtype_bytes or dtype_bytes)

    def snapshot_bytes(self, dtype_bytes: int, ssm_dtype_bytes: int | None = None) -> int:
        """One snapshot: every Mamba and Gated DeltaNet layer's states."""
        return (self.mamba_layers * self.mamba_state_bytes_per_layer(dtype_bytes, ssm_dtype_bytes)
                + self.linear_attention_layers * self.linear_attention_state_bytes_per_layer(dtype_bytes,
                                                                                            ssm_dtype_bytes))

    def kv_bytes_per_token_layer(self, dtype_bytes: int) -> int:
        return 2 * self.config.num_key_value_heads * self.config.head_dim * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every attention layer."""
        return self.attention_layers * self.kv_bytes_per_token_layer(dtype_bytes)
