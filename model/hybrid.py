"""`HybridLM`: the shared hybrid decoder (Mamba-2 or Gated DeltaNet mixers and GQA attention, each
followed by its family's feed-forward, RMSNorm pre-norms) with two forwards:

* `logits(input_ids)`: one sequence from position 0, no cache, causal SDPA for attention and the
  varlen scan with zero initial state: the path everything else is compared with;
* `forward_batch(rows, cache)`: the engine's batched chunk forward over a paged KV cache and
  the SSM/conv state pools, with in-pass state captures.

The family (`config.model_type`, see `model.families`) supplies each layer's feed-forward and the
checkpoint's tensor names; everything the engine touches (caches, state pools, captures) depends
only on the config's attention and Mamba layer indices. Parameter names follow transformers'
Bamba with its `model.` prefix dropped.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from kernels.checks import require
from kernels.torch_cpu.capability import cpu_routes
from model.attention import Attention, PagedAttentionInputs
from model.backends import Backend, get_backend
from model.batch import BatchOutput, SequenceChunk, StepPlanners, pack_rows, validate_rows
from model.cache import ModelCache, SSMState
from model.config import MIXER_LAYER_TYPES, HybridConfig
from model.families import get_family
from model.gated_attention import GatedAttention
from model.gated_deltanet import GatedDeltaNet
from model.linear import Linear
from model.mamba2 import Mamba2Mixer, MixerStates
from model.norms import RMSNorm
from model.rope import rope_cos_sin


class DecoderLayer(nn.Module):
    """Pre-norm residual blocks: the sequence mixer (kind "mamba", "attention" or "linear_attention"), then the
    feed-forward; a feed-forward-only layer (kind None) has no mixer, and a family may give a
    mixer layer no feed-forward. Each block adds residual_multiplier * block(norm(h))."""

    def __init__(self, config: HybridConfig, layer_type: str, feed_forward: nn.Module | None):
        super().__init__()
        self.kind = layer_type if layer_type in MIXER_LAYER_TYPES else None
        self.residual_multiplier = config.residual_multiplier
        # Registration order is the parameter order `init_random_weights` draws in (the seeded presets).
        norm = (config.hidden_size, config.rms_norm_eps, config.rms_norm_weight_in_fp32, config.rms_norm_zero_centred)
        if self.kind is not None:
            self.input_layernorm = RMSNorm(*norm)
        if feed_forward is not None:
            self.pre_ff_layernorm = RMSNorm(*norm)
        self.feed_forward = feed_forward
        if self.kind == "mamba":
            self.mamba = Mamba2Mixer(config)
        elif self.kind == "attention":
            # Qwen3-Next's gate and q/k norms (HybridConfig requires both or neither)
            self.self_attn = GatedAttention(config) if config.attention_output_gate else Attention(config)
        elif self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)

    def _add(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return h + (out if self.residual_multiplier == 1.0 else out * self.residual_multiplier)

    def forward(self, h: torch.Tensor, mix: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
        """`mix` is the sequence mixer applied to the normed input (None for a feed-forward-only layer)."""
        if self.kind is not None:
            h = self._add(h, mix(self.input_layernorm(h)))
        if self.feed_forward is not None:
            h = self._add(h, self.feed_forward(self.pre_ff_layernorm(h)))
        return h


def check_backend_supports(config: HybridConfig, ops: Backend) -> None:
    """Shapes a backend's kernels cannot run fail here, naming the config field, before any weight is used."""
    require(ops.conv_widths is None or not config.mamba_layer_indices or config.mamba_d_conv in ops.conv_widths,
            "mamba_d_conv", f"the {ops.name} backend's conv kernels take width {list(ops.conv_widths or ())}, "
            f"got {config.mamba_d_conv}")
    require(ops.conv_widths is None or not config.linear_attn_layer_indices
            or config.linear_conv_kernel_dim in ops.conv_widths, "linear_conv_kernel_dim",
            f"the {ops.name} backend's conv kernels take width {list(ops.conv_widths or ())}, "
            f"got {config.linear_conv_kernel_dim}")


class HybridLM(nn.Module):
    """A hybrid Mamba-2/attention language model of any registered family (the layer kinds and
    feed-forwards come from its config and family). `logits` is the whole-sequence reference;
    `forward_batch` runs prefill chunks and decode rows of many requests over the paged KV cache
    and state slots of `allocate_cache`, capturing states at requested offsets; `set_backend`
    switches between the torch and Triton kernels."""

    def __init__(self, config: HybridConfig, backend: str = "torch"):
        super().__init__()
        self.config = config
        self.ops: Backend = get_backend(backend)
        check_backend_supports(config, self.ops)
        # The CPU routes are decided once a process, here when the first model is built: their start-up
        # probe (0.5-0.9 s of matmuls on the 2-core EPYC) would otherwise run inside the first forward,
        # in its TTFT and in a FLOP count (tests/test_cost_model.py counted the probe's products)
        cpu_routes()
        family = get_family(config.model_type)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, kind, family.feed_forward(config, i))
                                    for i, kind in enumerate(config.layer_types))
        self.final_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.rms_norm_weight_in_fp32,
                                       config.rms_norm_zero_centred)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def set_backend(self, name: str) -> "HybridLM":
        ops = get_backend(name)
        check_backend_supports(self.config, ops)
        self.ops = ops
        return self

    @property
    def backend(self) -> str:
        return self.ops.name

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        if self.config.position_embedding == "none":
            return None, None
        return rope_cos_sin(positions, self.config.rotary_dim, self.config.rope_theta, dtype)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        m = self.config.embedding_multiplier
        return h if m == 1.0 else h * m

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.final_layernorm(h))
        s = self.config.logits_scaling
        return logits if s == 1.0 else logits / s

    # the reference path ----------------------------------------------------------------------
    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(T,) token ids of one sequence -> (T, vocab) logits; a plain forward with no cache."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.numel() < 1:
            raise ValueError(f"input_ids: expected a non-empty 1-D LongTensor, got {getattr(input_ids, 'shape', input_ids)}")
        input_ids = input_ids.to(self.device)
        T = input_ids.numel()
        h = self._embed(input_ids)
        cos, sin = self._rope(torch.arange(T, device=self.device), h.dtype)
        cu_seqlens = torch.tensor([0, T], dtype=torch.int32, device=self.device)
        for layer in self.layers:
            if layer.kind == "attention":
                h = layer(h, lambda x: layer.self_attn(x, cos, sin))
            elif layer.kind == "mamba":
                h = layer(h, lambda x: layer.mamba(x, self.ops, cu_seqlens=cu_seqlens)[0])
            elif layer.kind == "linear_attention":
                h = layer(h, lambda x: layer.linear_attn(x, self.ops, cu_seqlens=cu_seqlens)[0])
            else:
                h = layer(h, None)
        return self._head(h)

    # the engine path -------------------------------------------------------------------------
    def allocate_cache(self, num_blocks: int, block_size: int, num_state_slots: int) -> ModelCache:
        return ModelCache(self.config, num_blocks, block_size, num_state_slots, self.dtype, self.device)

    @torch.no_grad()
    def forward_batch(self, rows: list[SequenceChunk], cache: ModelCache) -> BatchOutput:
        """One forward over rows at any stage; see `model.batch.SequenceChunk` for the row contract.

        A row with start_pos == 0 starts from zero SSM/conv state, any other from its slot; after
        the call each row's slot holds its state after its last token. Captured states come back
        per row in capture_offsets order.
        """
        if cache.config != self.config or cache.device != self.device or cache.dtype != self.dtype:
            raise ValueError("cache: allocated for another model, dtype or device (use model.allocate_cache)")
        validate_rows(rows, cache, self.config.vocab_size)
        batch = pack_rows(rows, cache.block_size, self.device, self._step_planners(cache))
        for row in batch.rows:
            if row.start_pos == 0:
                cache.reset_state(row.state_slot)

        h = self._embed(batch.token_ids)
        cos, sin = self._rope(batch.positions, h.dtype)
        captured: dict[int, MixerStates] = {}
        for i, layer in enumerate(self.layers):
            if layer.kind == "attention":
                h = layer(h, lambda x: layer.self_attn.forward_paged(
                    x, cos, sin, cache.key_cache[i], cache.value_cache[i], batch.attention, self.ops))
            elif layer.kind == "mamba":
                h = layer(h, lambda x: self._mamba_rows(i, layer.mamba, x, batch, cache, captured))
            elif layer.kind == "linear_attention":
                h = layer(h, lambda x: self._deltanet_rows(i, layer.linear_attn, x, batch, cache, captured))
            else:
                h = layer(h, None)

        logits = self._head(h[batch.logit_index])
        per_row = list(logits.split(batch.logit_counts))
        per_row = [lg if row.all_logits else lg[0] for lg, row in zip(per_row, batch.rows)]
        snapshots = self._snapshots(batch, captured)
        out = BatchOutput(logits=[None] * len(rows), captured=[[] for _ in rows])
        for internal, caller in enumerate(batch.order):
            out.logits[caller] = per_row[internal]
            out.captured[caller] = snapshots[internal]
        return out

    @torch.no_grad()
    def forward_decode_rows(self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                            attention: PagedAttentionInputs, cache: ModelCache) -> torch.Tensor:
        """One token a row, every row a decode: (B,) ids, positions, state slots -> (B, vocab) logits.

        The fixed-shape step a CUDA graph captures (`model.decode_graph`): nothing here reads a
        tensor on the host or allocates by data. A row with slot -1 (and slot_mapping -1, seq_len 0)
        is a pad row: it reads and writes no state. Needs the triton backend (pad slots)."""
        h = self._embed(token_ids)
        cos, sin = self._rope(positions, h.dtype)
        for i, layer in enumerate(self.layers):
            if layer.kind == "attention":
                h = layer(h, lambda x: layer.self_attn.forward_paged(
                    x, cos, sin, cache.key_cache[i], cache.value_cache[i], attention, self.ops))
            elif layer.kind == "mamba":
                h = layer(h, lambda x: layer.mamba.forward_decode(
                    x, self.ops, conv_pool=cache.conv_pool[i], ssm_pool=cache.ssm_pool[i], slot_idx=slots,
                    check_slots=False, pad_slots=True))
            elif layer.kind == "linear_attention":
                h = layer(h, lambda x: layer.linear_attn.forward_decode(
                    x, self.ops, conv_pool=cache.conv_pool[i], ssm_pool=cache.ssm_pool[i], slot_idx=slots,
                    check_slots=False, pad_slots=True))
            else:
                h = layer(h, None)
        return self._head(h)

    def _step_planners(self, cache: ModelCache) -> StepPlanners:
        """The backend's kernel plans for one step, over the step's host integers (once per step,
        shared by every layer)."""
        ops, cfg = self.ops, self.config
        ssd = conv = delta = attn = None
        if ops.plan_ssd_scan is not None and cfg.mamba_layer_indices:
            chunk = cfg.mamba_chunk_size if ops.capabilities.scan_chunk_from_config else None

            def ssd(seqlens, offsets, tables):
                return ops.plan_ssd_scan(seqlens, offsets, chunk, tables)
        if ops.plan_causal_conv1d is not None:
            conv = ops.plan_causal_conv1d
        if ops.plan_gated_delta_rule is not None and cfg.linear_attn_layer_indices:
            # the chunk the op picks itself for the mixer's q, in the model's dtype (fp32: 32, else 64)
            delta_chunk = ops.plan_gated_delta_chunk(self.dtype)

            def delta(seqlens, offsets, tables):
                return ops.plan_gated_delta_rule(seqlens, offsets, delta_chunk, tables)
        if ops.plan_paged_attention is not None and cfg.attn_layer_indices:
            def attn(q_lens, seq_lens, max_blocks):
                return ops.plan_paged_attention(
                    q_lens, seq_lens, num_q_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                    head_dim=cfg.head_dim, block_size=cache.block_size, max_blocks=max_blocks, dtype=self.dtype,
                    device=self.device, scale=cfg.softmax_scale)
        return StepPlanners(ssd_scan=ssd, causal_conv1d=conv, gated_delta_rule=delta, paged_attention=attn)

    def _mamba_rows(self, i: int, mixer: Mamba2Mixer, x: torch.Tensor, batch, cache: ModelCache,
                    captured: dict[int, MixerStates]) -> torch.Tensor:
        """A Mamba-2 layer's rows (`_recurrent_rows`): the backend's kernels may read and write the
        pools themselves (`scan_state_pool`, `conv_state_pool`), with the step's SSD-scan plan."""
        caps = self.ops.capabilities
        return self._recurrent_rows(i, mixer, x, batch, cache, captured, caps.scan_state_pool, caps.conv_state_pool,
                                    {"ssd_plan": batch.ssd_plan})

    def _deltanet_rows(self, i: int, mixer: GatedDeltaNet, x: torch.Tensor, batch, cache: ModelCache,
                       captured: dict[int, MixerStates]) -> torch.Tensor:
        """A Gated DeltaNet layer's rows (`_recurrent_rows`): states gathered from the pools and the
        finals written back (no kernel reads a pool in place), with the step's delta-rule plan."""
        return self._recurrent_rows(i, mixer, x, batch, cache, captured, False, False,
                                    {"delta_plan": batch.delta_plan})

    def _recurrent_rows(self, i: int, mixer, x: torch.Tensor, batch, cache: ModelCache,
                        captured: dict[int, MixerStates], ssm_in_pool: bool, conv_in_pool: bool,
                        plan: dict) -> torch.Tensor:
        """Prefill rows through the mixer's varlen conv and scan (states from and back to the pools,
        or read and written there by the kernels where `*_in_pool`), decode rows through the
        one-token steps; tokens are packed prefill first, so both are slices."""
        Tp = batch.num_prefill_tokens
        conv_pool, ssm_pool = cache.conv_pool[i], cache.ssm_pool[i]
        parts = []
        if batch.num_prefill_rows:
            slots = batch.prefill_slots
            initial = None
            if not batch.prefill_all_fresh and not (ssm_in_pool and conv_in_pool):
                initial = MixerStates(None if conv_in_pool else conv_pool[slots],
                                      None if ssm_in_pool else ssm_pool[slots])
            pool = dict(ssm_pool=ssm_pool, ssm_slots=slots) if ssm_in_pool else {}
            if conv_in_pool:
                pool.update(conv_pool=conv_pool, conv_slots=slots)
            y, final, caps = mixer(x[:Tp], self.ops, cu_seqlens=batch.prefill_cu_seqlens, initial=initial,
                                   capture_offsets=batch.capture_offsets, conv_plan=batch.conv_plan,
                                   **plan, **pool)
            if not conv_in_pool:
                conv_pool[slots] = final.conv.to(conv_pool.dtype)
            if not ssm_in_pool:
                ssm_pool[slots] = final.ssm
            captured[i] = caps
            parts.append(y)
        if Tp < x.shape[0]:
            parts.append(mixer.forward_decode(x[Tp:], self.ops, conv_pool=conv_pool, ssm_pool=ssm_pool,
                                              slot_idx=batch.decode_slots, check_slots=False))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _snapshots(self, batch, captured: dict[int, MixerStates]) -> list[list[SSMState]]:
        """Per internal row, its captured states as SSMState (captures are packed row by row)."""
        layers = self.config.state_layer_indices
        out, k = [], 0
        for r, row in enumerate(batch.rows):
            states = []
            for _ in (row.capture_offsets if r < batch.num_prefill_rows else ()):
                states.append(SSMState([captured[i].conv[k] for i in layers], [captured[i].ssm[k] for i in layers]))
                k += 1
            out.append(states)
        return out
