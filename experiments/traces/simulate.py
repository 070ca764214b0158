"""Drive the real engine through a trace on the simulated clock and measure one policy.

Per request of the trace, in arrival order: it is added to the engine when the simulated clock
reaches its arrival (`arrival_s * time_scale`), with max_new_tokens = its output length and the
trace's reply forced as its output. The engine steps while it has work (each forward, save and
restore advances the clock by the cost model); when it is idle the clock jumps to the next
arrival. The engine, scheduler, prefix cache, snapshot store and policy are the real ones; only
the runner is model-free (`runner.HashRunner`, or the placeholder itself for validation).

Metrics (per policy, summed over requests): `kv_hit_tokens` (KV match at admission, at the
policy's KV block), `ssm_hit_tokens` (restore points), `lost_tokens` (their difference: KV there
but no snapshot), `replayed_tokens` (prompt tokens computed), `forwards` (prefill chunk forwards
of all requests, a two-pass capture counting two), snapshot bytes held (peak, time-weighted
mean), saved and evicted snapshots (saves and restored tokens also per origin: chunk end, mark,
speculative, decode, oracle), TTFT percentiles (simulated seconds).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Mapping, Sequence

import numpy as np

from experiments.traces.cost import ShapeCost
from experiments.traces.runner import HashRunner, SimClock, SimulatedRunner
from experiments.workloads.request import WorkloadRequest
from kernels.checks import require
from model.engine import Engine, resolve_settings
from model.engine.placeholder_runner import PlaceholderRunner
from planner.eviction import EVICTION_POLICIES, NextUseEviction
from planner.policies.registry import get_policy
from planner.snapshot_store import EvictionPolicy

GB = 1e9
RUNNERS = ("hash", "placeholder")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated run: the policy, the shape, the snapshot budget and the engine's settings."""

    policy: str
    shape: str = "bamba-9b"
    budget_gb: float | None = None  # snapshot memory; None: unbounded
    block_size: int = 16  # the engine's KV block (vllm-align uses the padded block instead)
    prefill_budget: int = 8192
    max_batch_size: int = 64
    kv_pool_gb: float = 60.0  # KV memory, the same for every policy and budget
    time_scale: float = 1.0  # arrivals at arrival_s * time_scale
    runner: str = "hash"
    eviction: str | None = None  # None: the policy's own (`get_policy(policy).eviction`); a name overrides it

    def __post_init__(self):
        get_policy(self.policy)
        require(self.eviction is None or self.eviction in EVICTION_POLICIES, "eviction",
                f"must be one of {sorted(EVICTION_POLICIES)} or None, got {self.eviction!r}")
        require(self.budget_gb is None or self.budget_gb >= 0, "budget_gb", f"must be >= 0 or None, got {self.budget_gb}")
        require(self.kv_pool_gb > 0, "kv_pool_gb", f"must be > 0, got {self.kv_pool_gb}")
        require(self.time_scale > 0, "time_scale", f"must be > 0, got {self.time_scale}")
        require(self.runner in RUNNERS, "runner", f"must be one of {RUNNERS}, got {self.runner!r}")

    def requested_settings(self, cost: ShapeCost) -> dict:
        """The flat settings this run asks for (its base block, budgets, KV pool in bytes, eviction
        override); the policy's defaults fill in the rest (`model.engine.settings.resolve_settings`)."""
        kv_tokens = int(self.kv_pool_gb * GB / cost.kv_bytes_per_token)
        return dict(block_size=self.block_size, prefill_budget=self.prefill_budget, max_batch_size=self.max_batch_size,
                    num_kv_blocks=lambda block: max(1, kv_tokens // block), policy=self.policy, capture_mode="in_pass",
                    snapshot_byte_budget=None if self.budget_gb is None else int(self.budget_gb * GB),
                    eviction=self.eviction)

    def engine_settings(self, cost: ShapeCost) -> dict:
        """The flat engine settings this policy runs with (its block, decode states, budget, eviction):
        what `Engine.for_runner` resolves from `requested_settings`."""
        return resolve_settings(cost.model_shape, **self.requested_settings(cost))


@dataclasses.dataclass
class RequestRecord:
    """What the simulator keeps of one finished request."""

    index: int
    prompt_len: int
    kv_match: int
    restore_at: int
    replayed: int
    forwards: int
    chunk_ends: list[int]
    snapshot_positions: list[int]
    ttft_s: float
    preemptions: int


def build_engine(cfg: SimConfig, cost: ShapeCost, clock: SimClock, replies: dict[str, list[int]],
                 prompt_lens: dict[str, int], eviction: EvictionPolicy | None = None) -> Engine:
    """The real engine over the chosen model-free runner, wrapped in the simulated runner
    (`Engine.for_runner`: the policy's defaults applied as in every study). `eviction`: an
    eviction policy object that overrides the configured one (the optimum's next-use eviction)."""
    engine: Engine | None = None

    def next_tokens(rows) -> list[int | None]:
        by_slot = {req.slot: req.request_id for req in engine.scheduler.running}
        out = []
        for row in rows:  # a decode row's hot path: plain dict and list lookups
            rid = by_slot.get(row.state_slot)
            reply = replies.get(rid) if rid is not None else None
            if reply is None:
                out.append(None)
                continue
            i = row.start_pos + row.token_ids.numel() - prompt_lens[rid]
            out.append(reply[i] if 0 <= i < len(reply) else None)
        return out

    def make_runner(config) -> SimulatedRunner:
        s = config.scheduler
        if cfg.runner == "hash":
            inner = HashRunner(s.max_batch_size, s.num_kv_blocks, s.block_size, 64, cost.state_bytes, emit_logits=False)
        else:
            inner = PlaceholderRunner(s.max_batch_size, s.num_kv_blocks, s.block_size, 64, cost.state_bytes)
        return SimulatedRunner(inner, cost, clock, next_tokens)

    settings = cfg.requested_settings(cost) | ({} if eviction is None else {"eviction": eviction})
    engine = Engine.for_runner(make_runner, cost.model_shape, snapshot_flops=cost.snapshot_flops, clock=clock,
                               **settings)
    return engine


def simulate(requests: Iterable[WorkloadRequest], cfg: SimConfig,
             marks: dict[int, Sequence[int]] | None = None, uses: Mapping[tuple, Sequence[int]] | None = None) -> dict:
    """Run the requests through one policy; returns its metrics and per-request records.

    `marks`: request index -> positions it must leave a snapshot at (the optimum's: prefill, prompt end or reply);
    `uses`: snapshot key -> the requests that will restore it (`oracle.optimum_uses`): under a
    budget, eviction then follows Belady's MIN (`NextUseEviction`) instead of the policy's own."""
    t0 = time.perf_counter()
    cost = ShapeCost.from_preset(cfg.shape)
    clock = SimClock()
    replies: dict[str, list[int]] = {}
    prompt_lens: dict[str, int] = {}
    future = NextUseEviction(uses) if uses is not None and cfg.budget_gb is not None else None
    engine = build_engine(cfg, cost, clock, replies, prompt_lens, future)
    store = engine.snapshots
    pending = iter(requests)
    nxt = next(pending, None)
    arrivals: dict[str, float] = {}
    indices: dict[str, int] = {}
    peak = 0
    byte_seconds = 0.0
    last_t = 0.0
    prompt_tokens = 0
    records: list[RequestRecord] = []
    while nxt is not None or engine.scheduler.has_work:
        if not engine.scheduler.has_work:
            clock.advance_to(nxt.arrival_s * cfg.time_scale)
        while nxt is not None and nxt.arrival_s * cfg.time_scale <= clock.now:
            rid = f"r{nxt.index}"
            reply = nxt.reply_ids()
            if reply is not None:
                replies[rid] = reply
            prompt_lens[rid] = nxt.prompt_len
            req = engine.add_request(nxt.prompt_ids(), max_new_tokens=nxt.output_len, request_id=rid)
            if marks and nxt.index in marks:
                req.snapshot_marks = tuple(int(m) for m in marks[nxt.index])
            req.metrics.arrival_s = nxt.arrival_s * cfg.time_scale
            arrivals[rid], indices[rid] = req.metrics.arrival_s, nxt.index
            prompt_tokens += nxt.prompt_len
            nxt = next(pending, None)
        if not engine.scheduler.has_work:
            continue
        finished = engine.step()
        if future is not None:  # admitted requests have restored: their uses are behind them
            for r in (*engine.scheduler.running, *finished):
                future.served(indices[r.request_id])
        byte_seconds += store.bytes_held * (clock.now - last_t)
        last_t = clock.now
        peak = max(peak, store.bytes_held)
        for r in finished:
            m = r.metrics
            records.append(RequestRecord(indices[r.request_id], len(r.prompt_token_ids), m.kv_match_tokens,
                                         m.restore_at, m.replayed_tokens, m.prefill_passes, list(m.chunk_ends),
                                         list(m.snapshot_positions), m.first_token_s - m.arrival_s, m.preemptions))
            replies.pop(r.request_id, None)
        engine.finished.clear()  # the records hold what is needed; finished requests hold their prompts
    records.sort(key=lambda r: r.index)
    held = {"peak": peak, "mean": byte_seconds / max(clock.now, 1e-12)}
    metrics = _metrics(records, engine, clock, held, prompt_tokens) | {"wall_s": time.perf_counter() - t0}
    return {"metrics": metrics, "records": records, "settings": cfg.engine_settings(cost)}


def _metrics(records: list[RequestRecord], engine: Engine, clock: SimClock, held: dict, prompt_tokens: int) -> dict:
    """The policy's figures summed over its requests (module docstring)."""
    ttft = np.array([r.ttft_s for r in records]) if records else np.zeros(1)
    stats = engine.snapshots.stats
    return {
        "requests": len(records),
        "prompt_tokens": prompt_tokens,
        "kv_hit_tokens": sum(r.kv_match for r in records),
        "ssm_hit_tokens": sum(r.restore_at for r in records),
        "lost_tokens": sum(r.kv_match - r.restore_at for r in records),
        "replayed_tokens": sum(r.replayed for r in records),
        "forwards": sum(r.forwards for r in records),
        "engine_forwards": engine.runner.forwards,
        "snapshot_bytes_peak": held["peak"],
        "snapshot_bytes_mean": held["mean"],
        "snapshots_saved": stats.saved,
        "snapshots_evicted": stats.evicted,
        "snapshots_restored": stats.restored,
        "snapshots_rejected": stats.rejected,
        "snapshots_declined": stats.declined,
        "eviction": engine.snapshots.eviction.name,
        "saved_by_origin": dict(sorted(stats.saved_by_origin.items())),
        "restored_tokens_by_origin": dict(sorted(stats.restored_tokens_by_origin.items())),
        "preemptions": sum(r.preemptions for r in records),
        "ttft_s_p50": float(np.percentile(ttft, 50)),
        "ttft_s_p90": float(np.percentile(ttft, 90)),
        "ttft_s_p99": float(np.percentile(ttft, 99)),
        "ttft_s_mean": float(ttft.mean()),
        "simulated_span_s": clock.now,
        "simulated_busy_s": engine.runner.busy_s,
        "block_size": engine.config.scheduler.block_size,
        "state_block": engine.config.scheduler.state_block,
        "effective_settings": engine.effective_settings,
    }
