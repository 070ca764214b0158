"""The ops table: which implementation runs each sequence-mixing op.

`torch` runs the PyTorch paths of `kernels.torch_cpu` (fast enough on a CPU to be the
experiment's backend); `triton` runs the Triton kernels of `kernels` (on a CPU through the
interpreter, so only for tests on tiny shapes). The model calls ops only through this table,
so both backends execute the same weights and the same model code; where the backends differ
beyond the ops' shared signatures, each declares it (`Capabilities`) and the model reads that,
never a backend's name. A new backend is one entry of `_SPECS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Capabilities:
    """What a backend's ops do beyond the shared signatures, declared with the backend (`_SPECS`);
    the model branches on these, never on a backend's name."""

    # Whether ssd_scan gets the checkpoint's mamba_chunk_size. The scan's chunk is a tiling choice,
    # not math (any chunk gives the same y and states up to rounding): the Triton kernels tile by
    # it (Bamba: 256); the CPU reference keeps its own default, 64, its fastest on the CPUs measured.
    scan_chunk_from_config: bool = False
    # Whether ssd_scan reads and writes the SSM states in the pool through slots (state_pool=,
    # state_slots=) instead of taking gathered initial states and returning finals to scatter.
    scan_state_pool: bool = False
    # The same for causal_conv1d's conv states (state_pool=, state_slots=).
    conv_state_pool: bool = False
    # Whether each conv op is specialized to one width, its module's `WIDTH` (`Backend.conv_widths`
    # is then that width, or () when the two conv ops disagree); False: any width >= 2.
    conv_width_per_kernel: bool = False


@dataclass(frozen=True)
class BackendSpec:
    """A backend's declaration: op name -> (module, function), and its capabilities. Modules are
    imported when the backend is first asked for, so the torch backend never imports Triton
    kernel modules. Optional ops (the `plan_*` ones) left out are None on the `Backend`."""

    ops: dict[str, tuple[str, str]]
    capabilities: Capabilities = Capabilities()


_SPECS: dict[str, BackendSpec] = {
    "torch": BackendSpec(ops={
        "ssd_scan": ("kernels.torch_cpu.ssd", "ssd_scan_chunked"),
        "ssd_decode_step": ("kernels.torch_cpu.ssd", "ssd_decode_step_cpu"),
        "causal_conv1d": ("kernels.torch_cpu.conv1d", "causal_conv1d_cpu"),
        "conv1d_decode_step": ("kernels.torch_cpu.conv1d", "causal_conv1d_decode_step_cpu"),
        "write_kv_cache": ("kernels.torch_cpu.paged_attention", "write_kv_cache_cpu"),
        "paged_attention": ("kernels.torch_cpu.paged_attention", "paged_attention_cpu"),
        "kv_block_copy": ("kernels.torch_cpu.paged_attention", "copy_kv_block_prefix_cpu"),
        "gated_delta_rule": ("kernels.torch_cpu.gated_delta", "gated_delta_rule_chunked"),
        "gated_delta_decode_step": ("kernels.torch_cpu.gated_delta", "gated_delta_decode_step_cpu"),
    }),
    "triton": BackendSpec(ops={
        "ssd_scan": ("kernels.ssd_scan", "ssd_scan"),
        "ssd_decode_step": ("kernels.ssd_decode", "ssd_decode_step"),
        "causal_conv1d": ("kernels.causal_conv1d", "causal_conv1d"),
        "conv1d_decode_step": ("kernels.conv1d_decode", "causal_conv1d_decode_step"),
        "write_kv_cache": ("kernels.kv_cache_write", "write_kv_cache"),
        "paged_attention": ("kernels.paged_attention", "paged_attention"),
        "kv_block_copy": ("kernels.kv_block_copy", "copy_kv_block_prefix"),
        "gated_delta_rule": ("kernels.gated_delta_rule", "gated_delta_rule"),
        "gated_delta_decode_step": ("kernels.gated_delta_decode", "gated_delta_decode_step"),
        "plan_ssd_scan": ("kernels.ssd_scan", "plan_ssd_scan"),
        "plan_causal_conv1d": ("kernels.causal_conv1d", "plan_causal_conv1d"),
        "plan_gated_delta_rule": ("kernels.gated_delta_rule", "plan_gated_delta_rule"),
        "plan_gated_delta_chunk": ("kernels.gated_delta_rule", "default_chunk_size"),
        "plan_paged_attention": ("kernels.paged_attention", "plan_from_host"),
        "plan_decode_bucket": ("kernels.paged_attention", "plan_decode_bucket"),
    }, capabilities=Capabilities(scan_chunk_from_config=True, scan_state_pool=True, conv_state_pool=True,
                                 conv_width_per_kernel=True)),
}

BACKENDS = tuple(_SPECS)


@dataclass(frozen=True)
class Backend:
    """Callables with the signatures documented in `kernels/` (shared by kernel and reference)."""

    name: str
    capabilities: Capabilities
    conv_widths: tuple[int, ...] | None  # conv widths (mamba_d_conv) its conv ops take; None: any >= 2
    ssd_scan: Callable  # (x, dt, A, B, C, *, cu_seqlens, D, dt_bias, dt_softplus, dt_limit, initial_states, capture_offsets) -> (y, final, captured)
    ssd_decode_step: Callable  # (x, dt, A, B, C, *, state_pool, slot_idx, D, dt_bias, dt_softplus, dt_limit) -> y
    causal_conv1d: Callable  # (x, weight, bias, *, cu_seqlens, initial_states, capture_offsets, activation) -> (y, final, captured)
    conv1d_decode_step: Callable  # (x, *, conv_state_pool, weight, bias, slot_idx, activation) -> y
    write_kv_cache: Callable  # (key, value, key_cache, value_cache, slot_mapping) -> None
    paged_attention: Callable  # (query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, *, scale[, plan]) -> out
    kv_block_copy: Callable  # (key_cache, value_cache, src_block_ids, dst_block_ids, num_rows) -> None
    gated_delta_rule: Callable  # (q, k, v, g, beta, *, cu_seqlens, initial_states, capture_offsets) -> (o, final, captured)
    gated_delta_decode_step: Callable  # (q, k, v, g, beta, *, state_pool, slot_idx) -> o
    # Per-step plans over host integers (`model.batch.StepPlanners`); None: the op reads its tensors.
    plan_ssd_scan: Callable | None = None  # (seqlens, offsets, chunk_size, tables) -> plan
    plan_causal_conv1d: Callable | None = None  # (seqlens, offsets, tables) -> plan
    plan_gated_delta_rule: Callable | None = None  # (seqlens, offsets, chunk_size, tables) -> plan
    plan_gated_delta_chunk: Callable | None = None  # (dtype) -> the chunk the op picks unplanned for q's dtype
    plan_paged_attention: Callable | None = None  # (q_lens, seq_lens, *, heads, head_dim, block_size, ...) -> plan
    plan_decode_bucket: Callable | None = None  # (batch, *, heads, head_dim, block_size, max_blocks, ...) -> plan


_loaded: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    if name not in _SPECS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {name!r}")
    if name not in _loaded:
        spec = _SPECS[name]
        ops = {op: getattr(importlib.import_module(module), fn) for op, (module, fn) in spec.ops.items()}
        widths = None
        if spec.capabilities.conv_width_per_kernel:  # both conv ops must take the model's width
            kernel_widths = {importlib.import_module(ops[op].__module__).WIDTH
                             for op in ("causal_conv1d", "conv1d_decode_step")}
            widths = tuple(kernel_widths) if len(kernel_widths) == 1 else ()
        _loaded[name] = Backend(name=name, capabilities=spec.capabilities, conv_widths=widths, **ops)
    return _loaded[name]
