"""Driving the engine over the real model, shared by the ablations and the multi-turn study.

A model is built once per process (`build_model`); every measured configuration gets a fresh
`Engine` over a fresh `ModelRunner` (its own KV pool and state slots), so nothing cached by one
configuration leaks into the next. `warm_up` runs one short prompt first, so one-time costs
(allocator growth, thread-pool start, first-shape kernels) do not land in the first point.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, Sequence

import torch

from model.engine import Engine
from model.hybrid import HybridLM
from model.loading import from_preset
from planner.request import Request
from planner.scheduler import SchedulerConfig
from planner.snapshot_store import EvictionPolicy

FP32_LOGIT_TOL = 1e-4  # warm vs cold max abs logit difference allowed in fp32 (the brief's bound)

# One torch thread by default. On the shared 2-core machine, 2 threads collapse whenever another
# process is busy: each op's OpenMP barrier waits for a descheduled thread. Measured at load ~3.5
# (preset "small"): a 28-token warm replay took 2.5 s with 2 threads and 25 ms with 1; a cold
# 4000-token prefill 5.8 s vs 1.4 s. Unloaded, 2 threads are ~15% faster on a 32K prefill
# (24 s vs 28 s, model/config.py). OMP_WAIT_POLICY=PASSIVE also avoids the collapse (29 ms).
THREADS_HELP = "torch CPU threads (default 1: robust to other jobs on the cores; see experiments/engine_runs.py)"


def set_threads(n: int) -> None:
    if n < 1:
        raise ValueError(f"threads: must be >= 1, got {n}")
    torch.set_num_threads(n)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_model(preset: str, device: str = "cpu", seed: int = 0, dtype: str = "float32",
                backend: str = "torch") -> HybridLM:
    log(f"building preset {preset!r} on {device} ({backend} backend, {dtype}, seed {seed})")
    return from_preset(preset, backend=backend, seed=seed, dtype=getattr(torch, dtype), device=device)


def random_prompt(n: int, vocab_size: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(vocab_size) for _ in range(n)]


def make_engine(model: HybridLM, sched: SchedulerConfig, capture_mode: str = "in_pass",
                snapshot_byte_budget: int | None = None, eviction: EvictionPolicy | None = None,
                snapshot_flops: Callable[[int], float] | None = None, keep_prompt_logits: bool = True,
                decode_snapshots: bool = False) -> Engine:
    return Engine.for_model(model, eviction=eviction, snapshot_flops=snapshot_flops, capture_mode=capture_mode,
                            snapshot_byte_budget=snapshot_byte_budget, keep_prompt_logits=keep_prompt_logits,
                            decode_snapshots=decode_snapshots, **dataclasses.asdict(sched))


def kv_blocks_for(prompt_lens: Sequence[int], block_size: int, slack: int = 16) -> int:
    """A KV pool that holds every listed prompt at once: no KV block is ever evicted, so the
    prefix match is decided by the planner alone."""
    return sum(-(-n // block_size) for n in prompt_lens) + slack


def serve(engine: Engine, prompt: Sequence[int], request_id: str, max_new_tokens: int = 1) -> Request:
    """One request alone to completion (with max_new_tokens 1, TTFT is the whole of it)."""
    req = engine.add_request(prompt, max_new_tokens, request_id)
    engine.run_until_done()
    if not req.is_finished:
        raise RuntimeError(f"request {request_id!r} did not finish")
    return req


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def warm_up(model: HybridLM, tokens: int = 512) -> None:
    sched = SchedulerConfig(block_size=16, prefill_budget=8192, max_batch_size=1,
                            num_kv_blocks=kv_blocks_for([tokens], 16))
    engine = make_engine(model, sched)
    t0 = time.perf_counter()
    serve(engine, random_prompt(tokens, model.config.vocab_size, seed=12345), "warm-up", max_new_tokens=2)
    log(f"warm-up: {tokens} tokens + 1 decode in {time.perf_counter() - t0:.2f} s")
