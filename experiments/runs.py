"""Shared pieces of the model experiments (warm_restore, ablations, multiturn, plan_incident).

* the model: `build_model` from a preset name or a checkpoint folder, `model_config` without weights;
* engines: `make_engine` is the one place experiments construct an engine over the model
  (`make_placeholder_engine` the one over the model-free placeholder runner);
  every measured configuration gets a fresh one (its own KV pool and state slots), so nothing
  cached by one configuration leaks into the next; `warm_up` runs one short prompt first, so
  one-time costs (allocator growth, thread-pool start, first-shape kernels) do not land in the
  first measured point;
* one request: `serve`, and what a cold request and its warm repeat record (`cold_record`,
  `warm_record`); the seed's figures (`SEED_FIGURES`);
Snapshot evictions are resolved by name in the planner (`planner.eviction.get_eviction`, the
same shape as the placement-policy registry `planner.policies.registry.get_policy`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from experiments.results_io import log
from kernels.checks import require
from model.config import PRESETS, HybridConfig
from model.engine import Engine
from model.hybrid import HybridLM
from model.loading import from_preset, load_pretrained
from planner.request import Request
from planner.scheduler import SchedulerConfig
from planner.snapshot_store import EvictionPolicy

# one letter per layer, as the results have written it: Mamba M, attention A, MLP-only -, MoE-only E
LAYER_SYMBOLS = {"mamba": "M", "attention": "A", "mlp": "-", "moe": "E"}
FP32_LOGIT_TOL = 1e-4  # warm vs cold max abs logit difference allowed in fp32 (the brief's bound)

# The seed's incident (block 16, budget 8192, one slot, a 32772-token prompt served twice).
SEED_FIGURES = {
    "legacy": {"chunk_ends": [8193, 16385, 24577, 32769, 32772], "warm_restore_at": 24577,
               "warm_replayed_tokens": 8195, "warm_ttft_s": 12.5},
    "aligned": {"chunk_ends": [8192, 16384, 24576, 32752, 32772], "warm_restore_at": 32752,
                "warm_replayed_tokens": 20, "warm_ttft_s": 0.2},
}
SEED_SHAPE = {"prompt_len": 32772, "block_size": 16, "budget": 8192}


# ------------------------------------------------------------------------------------------ machine
def set_threads(n: int) -> None:
    """torch CPU threads; 0 leaves torch's default (the experiments default to 1: flags.DEFAULT_THREADS)."""
    require(n >= 0, "threads", f"must be >= 0 (0 = torch's default), got {n}")
    if n:
        torch.set_num_threads(n)


def machine_load(loadavg_start: Sequence[float]) -> dict:
    """What else the machine was doing during a run: the load averages (1, 5, 15 min) at its start
    (`os.getloadavg()` taken then) and now, the cores, and our torch threads."""
    return {"loadavg_start": list(loadavg_start), "loadavg_end": list(os.getloadavg()), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------ model
class ModelLoadError(ValueError):
    """A checkpoint folder that does not load; the message names the folder or file."""


def model_config(name: str) -> HybridConfig:
    """A preset's config, or a checkpoint folder's config.json (no weights)."""
    return PRESETS[name] if name in PRESETS else HybridConfig.from_json_file(Path(name) / "config.json")


def build_model(name: str, device: str = "cpu", seed: int = 0, dtype: str = "float32",
                backend: str = "torch") -> HybridLM:
    """A preset with seeded random weights, or a checkpoint folder's weights (`model.loading`)."""
    if name in PRESETS:
        log(f"building preset {name!r} on {device} ({backend} backend, {dtype}, seed {seed})")
        return from_preset(name, backend=backend, seed=seed, dtype=getattr(torch, dtype), device=device)
    log(f"loading checkpoint {name} on {device} ({backend} backend, {dtype})")
    from safetensors import SafetensorError

    try:
        return load_pretrained(name, backend=backend, dtype=getattr(torch, dtype), device=device)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise ModelLoadError(f"{name}: checkpoint does not load: {e}") from e


def model_summary(model: HybridLM) -> dict:
    return {"model_type": model.config.model_type, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "layers": "".join(LAYER_SYMBOLS[t] for t in model.config.layer_types)}


def random_prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(vocab_size) for _ in range(n)]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# ------------------------------------------------------------------------------------------ engines
def make_engine(model: HybridLM, sched: SchedulerConfig, capture_mode: str = "in_pass",
                snapshot_byte_budget: int | None = None, eviction: EvictionPolicy | None = None,
                snapshot_flops: Callable[[int], float] | None = None, keep_prompt_logits: bool = True,
                decode_snapshots: bool = False) -> Engine:
    return Engine.for_model(model, eviction=eviction, snapshot_flops=snapshot_flops, capture_mode=capture_mode,
                            snapshot_byte_budget=snapshot_byte_budget, keep_prompt_logits=keep_prompt_logits,
                            decode_snapshots=decode_snapshots, **dataclasses.asdict(sched))


def make_placeholder_engine(sched: SchedulerConfig, snapshot_byte_budget: int | None = None,
                            eviction: EvictionPolicy | None = None,
                            snapshot_flops: Callable[[int], float] | None = None, keep_prompt_logits: bool = False,
                            decode_snapshots: bool = False, vocab_size: int = 64) -> Engine:
    """The same engine over the model-free placeholder runner: every planner figure exact, no model."""
    return Engine.for_placeholder(vocab_size=vocab_size, eviction=eviction, snapshot_flops=snapshot_flops,
                                  snapshot_byte_budget=snapshot_byte_budget, keep_prompt_logits=keep_prompt_logits,
                                  decode_snapshots=decode_snapshots, **dataclasses.asdict(sched))


def make_runner_engine(runner, settings: dict, eviction: str | None = None,
                       snapshot_flops: Callable[[int], float] | None = None,
                       clock: Callable[[], float] | None = None) -> Engine:
    """The engine over any runner (the trace simulator's), from flat engine settings."""
    from model.engine.engine import EngineConfig

    kwargs = {} if clock is None else {"clock": clock}
    return Engine(runner, EngineConfig.from_settings(**settings), eviction, snapshot_flops, **kwargs)


def kv_blocks_for(prompt_lens: Sequence[int], block_size: int, slack: int = 16) -> int:
    """A KV pool that holds every listed prompt at once: no KV block is ever evicted, so the
    prefix match is decided by the planner alone."""
    return sum(-(-n // block_size) for n in prompt_lens) + slack


def dense_serve(block_size: int, budget: int, prompt_lens: Sequence[int], policy: str = "aligned",
                interval: int = 0, **kw) -> SchedulerConfig:
    """The seed's dense serve: one slot, a KV pool holding every listed prompt."""
    return SchedulerConfig(block_size=block_size, prefill_budget=budget, max_batch_size=1,
                           num_kv_blocks=kv_blocks_for(prompt_lens, block_size), policy=policy,
                           snapshot_interval_blocks=interval, **kw)


def serve(engine: Engine, prompt: Sequence[int], request_id: str, max_new_tokens: int = 1,
          progress: str | None = None) -> Request:
    """One request alone to completion (with max_new_tokens 1, TTFT is the whole of it); with
    `progress`, a log line per tick under that label."""
    req = engine.add_request(prompt, max_new_tokens, request_id)
    while engine.scheduler.has_work:
        engine.step()
        if progress:
            m = req.metrics
            done = m.chunk_ends[-1] if m.chunk_ends else m.restore_at
            log(f"{progress}: {done}/{len(prompt)} tokens ({time.perf_counter() - m.arrival_s:.2f} s)")
    if not req.is_finished:
        raise RuntimeError(f"request {request_id!r} did not finish")
    return req


def cold_record(cold: Request) -> dict:
    """What the planner did with a cold prompt: where its chunks ended and which snapshots it saved."""
    return {"chunk_ends": cold.metrics.chunk_ends, "snapshot_positions": cold.metrics.snapshot_positions}


def warm_record(warm: Request) -> dict:
    """What a warm request reused: its KV match, restore point, replayed tokens and chunks."""
    m = warm.metrics
    return {"warm_kv_match": m.kv_match_tokens, "warm_restore_at": m.restore_at,
            "warm_replayed_tokens": m.replayed_tokens, "warm_chunk_ends": m.chunk_ends}


def warm_up(model: HybridLM, tokens: int = 512) -> None:
    engine = make_engine(model, dense_serve(16, 8192, [tokens]))
    t0 = time.perf_counter()
    serve(engine, random_prompt(tokens, model.config.vocab_size, seed=12345), "warm-up", max_new_tokens=2)
    log(f"warm-up: {tokens} tokens + 1 decode in {time.perf_counter() - t0:.2f} s")
