"""Shared pieces of the model experiments (warm_restore, ablations, multiturn, plan_incident).

* the model: `build_model` from a preset name or a checkpoint folder, `model_config` without weights;
* engines: experiments build every engine through `Engine.for_model`, `Engine.for_placeholder`
  or `Engine.for_runner` (the placement policy's engine defaults applied in one place,
  `model.engine.settings.resolve_settings`; explicit settings win), and record what it ran under
  as `effective_settings` (`Engine.effective_settings`). `dense_serve` gives the seed's dense
  serve as flat settings (its KV pool sized at the policy's block, `kv_blocks_for`). Every measured
  configuration gets a fresh engine (its own KV pool and state slots), so nothing cached by one
  configuration leaks into the next; `warm_up` runs one short prompt first, so one-time costs
  (allocator growth, thread-pool start, first-shape kernels) do not land in the first measured
  point;
* one request: `serve`, and what a cold request and its warm repeat record (`cold_record`,
  `warm_record`); the seed's figures (`SEED_FIGURES`);
Snapshot evictions are resolved by name in the planner (`planner.evictions.registry.get_eviction`, the
same shape as the placement-policy registry `planner.policies.registry.get_policy`).
"""

from __future__ import annotations

import functools
import os
import random
import time
from pathlib import Path
from typing import Sequence

import torch

from experiments.common.results_io import log
from kernels.checks import require
from model.config import HybridConfig
from model.families import PRESETS, config_from_json_file
from model.engine import Engine
from model.hybrid import HybridLM
from model.loading import from_preset, load_pretrained
from planner.request import Request

# one letter per layer, as the results have written it: Mamba M, attention A, MLP-only -, MoE-only E
LAYER_SYMBOLS = {"mamba": "M", "attention": "A", "linear_attention": "D", "mlp": "-", "moe": "E"}  # D: Gated DeltaNet
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
    return PRESETS[name] if name in PRESETS else config_from_json_file(Path(name) / "config.json")


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


def build_model_or_exit(ap, out: Path | None, name: str, **kwargs) -> HybridLM:
    """`build_model`, or, when a checkpoint does not load, one usage line naming --model (argparse's
    exit 2) after removing the run folder `out` the command made for it: an error leaves nothing."""
    from experiments.common.outputs import abandon

    try:
        return build_model(name, **kwargs)
    except ModelLoadError as e:
        if out is not None:
            abandon(out)
        ap.error(f"argument --model: {e}")


def model_summary(model: HybridLM) -> dict:
    return {"model_type": model.config.model_type, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "layers": "".join(LAYER_SYMBOLS[t] for t in model.config.layer_types)}


def random_prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(vocab_size) for _ in range(n)]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# ------------------------------------------------------------------------------------------ engines
def kv_blocks_for(prompt_lens: Sequence[int], block_size: int, slack: int = 16) -> int:
    """A KV pool that holds every listed prompt at once: no KV block is ever evicted, so the
    prefix match is decided by the planner alone."""
    return sum(-(-n // block_size) for n in prompt_lens) + slack


def dense_serve(block_size: int, budget: int, prompt_lens: Sequence[int], policy: str = "aligned",
                interval: int = 0, **kw) -> dict:
    """The seed's dense serve as flat engine settings (for `Engine.for_model` / `for_placeholder`):
    one slot, a KV pool holding every listed prompt at the KV block the policy runs on."""
    return dict(block_size=block_size, prefill_budget=budget, max_batch_size=1,
                num_kv_blocks=functools.partial(kv_blocks_for, tuple(prompt_lens)), policy=policy,
                snapshot_interval_blocks=interval, **kw)


def serve(engine: Engine, prompt: Sequence[int], request_id: str, max_new_tokens: int = 1,
          progress: str | None = None) -> Request:
    """One request alone to completion (with max_new_tokens 1, TTFT is the whole of it); with
    `progress`, a log line per tick under that label."""
    req = engine.add_request(prompt, max_new_tokens, request_id)
    while engine.has_work:
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
    engine = Engine.for_model(model, **dense_serve(16, 8192, [tokens]))
    t0 = time.perf_counter()
    serve(engine, random_prompt(tokens, model.config.vocab_size, seed=12345), "warm-up", max_new_tokens=2)
    log(f"warm-up: {tokens} tokens + 1 decode in {time.perf_counter() - t0:.2f} s")
