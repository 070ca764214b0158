"""The one place a placement policy's engine defaults become the settings an engine runs under.

Every engine is built through `resolve_settings` (by `Engine.for_model`, `Engine.for_placeholder`
or `Engine.for_runner`), so one policy name runs the same engine in every study. From flat
settings (`SchedulerConfig` and `EngineConfig` fields, plus `eviction`) and the model's
`ModelShape`:

1. the policy (`policy`, default aligned: the object, or its name, resolved here once per engine and
   handed on as the object) sets, from its fields (`planner.policies.base.PlacementPolicy`):
   * the KV block: "kv" keeps `block_size`; "vllm" is vLLM's padded hybrid block
     (`ModelShape.vllm_block`) rounded up to a multiple of `block_size`; "vllm-state" keeps
     `block_size` and puts `state_block` on that padded block;
   * decode-time states (`decode_grid`): None off; "block" on the KV block (`decode_snapshot_grid`
     0); "state" on `state_block` (the KV block when it is 0); "kernel" on the SSD kernel chunk
     rounded up to a multiple of the KV block (at least one block), where a block-floored match
     can land; "exact" the match unit (1: the state after the last computed token; a
     unit of the block is the "block" grid);
   * `prefix_match_unit` (`match_unit`): "block" 0 (the KV block), "token" 1;
   * `eviction`: the policy's; `kernel_chunk`: the model's scan chunk (`ModelShape.kernel_chunk`: SSD or delta rule);
2. a setting given explicitly (not None) wins over 1: `state_block`, `kernel_chunk`,
   `decode_snapshots`, `decode_snapshot_grid`, `prefix_match_unit`, `eviction`. Rule 1 reads the values after this
   (an explicit `state_block` moves a "state" decode grid with it). `block_size` is always the
   base KV block (the attention kernel's): "kv" keeps it, "vllm" pads it;
3. `snapshot_dtype` (how snapshots are stored, `model.engine.snapshot_codec`): the given one, else
   the states' own, "float32" (no conversion); no policy sets it: a smaller dtype only when asked;
4. `num_kv_blocks` may be a function of the KV block rule 1 chose (a pool sized in tokens, or for
   a list of prompts), called with it.

`EFFECTIVE_KEYS` are the settings a study records per policy as `effective_settings`
(`Engine.effective_settings`: read back from the engine that ran).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kernels.checks import require
from model.config import HybridConfig
from model.cost import DELTA_RULE_CHUNK, ModelCost
from model.engine.snapshot_codec import DEFAULT_SNAPSHOT_DTYPE, check_snapshot_dtype
from planner.policies.base import PlacementPolicy
from planner.policies.registry import get_policy
from planner.policies.vllm import vllm_hybrid_block
from planner.scheduler import SchedulerConfig

EFFECTIVE_KEYS = ("policy", "block_size", "state_block", "kernel_chunk", "decode_snapshots", "decode_snapshot_grid",
                  "prefix_match_unit", "eviction", "snapshot_dtype")
_DEFAULTS = SchedulerConfig()
DELTA_RULE_CHUNK_FP32 = 32  # the delta-rule scan's chunk for fp32 inputs (kernels.gated_delta_rule.FP32_CHUNK_SIZE)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the policies' engine defaults read of a model, in tokens: vLLM's padded hybrid block
    (`planner.policies.vllm.vllm_hybrid_block`) and the chunk of its recurrent layers' scan kernel
    (Mamba-2: the SSD scan's `mamba_chunk_size`; Gated DeltaNet: the delta-rule scan's, `of`)."""

    vllm_block: int
    kernel_chunk: int

    def __post_init__(self):
        for name in ("vllm_block", "kernel_chunk"):
            require(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name,
                    f"must be an int >= 1, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, config: HybridConfig, dtype_bytes: int) -> "ModelShape":
        """A config's shape, its state and KV at `dtype_bytes` per element (vLLM keeps both at the
        model's dtype, so the padded block depends on their ratio only: the same in fp32 and bf16).
        The state and the chunk are a Mamba layer's, or in a model whose recurrent layers are all
        Gated DeltaNet (Qwen3-Next) a DeltaNet layer's: conv + HV x K x V state
        (`ModelCost.state_bytes_per_layer`), and the delta-rule scan's chunk at this dtype (64 for
        16-bit inputs, 32 for fp32: `kernels.gated_delta_rule.default_chunk_size`, not imported here:
        no Triton in the engine's settings), not the `mamba_chunk_size` such a config never uses."""
        cost = ModelCost(config)
        block = vllm_hybrid_block(cost.state_bytes_per_layer(dtype_bytes), cost.kv_bytes_per_token_layer(dtype_bytes))
        if cost.linear_attention_layers and not cost.mamba_layers:
            return cls(block, DELTA_RULE_CHUNK if dtype_bytes < 4 else DELTA_RULE_CHUNK_FP32)
        return cls(block, config.mamba_chunk_size)


def _given(settings: dict, name: str) -> bool:
    return settings.get(name) is not None


def _padded_block(policy: PlacementPolicy, block_size: int, shape: ModelShape | None) -> int:
    """vLLM's padded block rounded up to a multiple of the base KV block."""
    require(shape is not None, "shape",
            f"policy {policy.name!r} runs on vLLM's padded block, which depends on the model: pass its ModelShape")
    return -(-shape.vllm_block // block_size) * block_size


def _decode_grid(policy: PlacementPolicy, block: int, state_block: int, kernel_chunk: int, match_unit: int) -> int:
    """The policy's decode-state grid in tokens (0: the KV block), rule 1 of the module docstring."""
    exact = match_unit if 0 < match_unit < block else 0  # the finish position, as finely as a match lands
    return {None: 0, "block": 0, "state": state_block or block,
            "kernel": -(-max(kernel_chunk, block) // block) * block, "exact": exact}[policy.decode_grid]


def resolve_settings(shape: ModelShape | None, **settings: Any) -> dict:
    """The settings an engine runs under: `settings` with the policy's defaults filled in (module
    docstring) and `policy` the `PlacementPolicy` object (a name is resolved here, the engine's one
    resolution); other keys pass through unchanged (`EngineConfig.from_settings` checks them).
    `shape` None: no model behind the engine (a policy on vLLM's padded block then raises)."""
    out = dict(settings)
    policy = get_policy(out.get("policy", _DEFAULTS.policy))
    base = out.get("block_size", _DEFAULTS.block_size)
    require(isinstance(base, int) and base >= 1, "block_size", f"must be an int >= 1, got {base!r}")
    block = _padded_block(policy, base, shape) if policy.kv_block == "vllm" else base
    if not _given(out, "state_block"):
        out["state_block"] = _padded_block(policy, base, shape) if policy.kv_block == "vllm-state" else 0
    if not _given(out, "kernel_chunk"):
        out["kernel_chunk"] = shape.kernel_chunk if shape is not None else _DEFAULTS.kernel_chunk
    if not _given(out, "decode_snapshots"):
        out["decode_snapshots"] = policy.decode_grid is not None
    if not _given(out, "prefix_match_unit"):
        out["prefix_match_unit"] = {"block": 0, "token": 1}[policy.match_unit]
    if not _given(out, "decode_snapshot_grid"):
        grid = _decode_grid(policy, block, out["state_block"], out["kernel_chunk"], out["prefix_match_unit"])
        out["decode_snapshot_grid"] = grid if out["decode_snapshots"] else 0
    if not _given(out, "eviction"):
        out["eviction"] = policy.eviction
    out["snapshot_dtype"] = check_snapshot_dtype(out.get("snapshot_dtype") or DEFAULT_SNAPSHOT_DTYPE)
    if callable(out.get("num_kv_blocks")):
        out["num_kv_blocks"] = out["num_kv_blocks"](block)
    return out | {"policy": policy, "block_size": block}
