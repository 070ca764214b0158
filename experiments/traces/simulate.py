"""Drive the real engine through a trace on the simulated clock and measure one policy.

Per request of the trace, in arrival order: it is added to the engine when the simulated clock
reaches its arrival (`arrival_s * time_scale`), with max_new_tokens = its output length and the
trace's reply forced as its output. The engine steps while it has work (each forward, save and
restore advances the clock by the cost model); when it is idle the clock jumps to the next
arrival. The engine, scheduler, prefix cache, snapshot store and policy are the real ones; only
the runner is model-free (`model.engine.PlaceholderRunner`, checking the KV just below each row:
`check_whole_prefix=False`; `SimConfig.check_whole_prefix` re-hashes the whole prefix, for
validation), wrapped in `runner.SimulatedRunner` for the clock. The simulator drives the engine
through its public surface only (`model.engine.engine` docstring): the replies as each request's
`forced_output_ids`, the optimum's marks as `snapshot_marks`, `has_work`, and each step's
`StepReport` (admitted and finished requests).

Metrics (per policy, summed over requests): `kv_hit_tokens` (KV match at admission, at the
policy's KV block), `ssm_hit_tokens` (restore points), `lost_tokens` (their difference: KV there
but no snapshot), `replayed_tokens` (prompt tokens computed), `forwards` (prefill chunk forwards
of all requests, a two-pass capture counting two), snapshot bytes held (peak, time-weighted
mean), saved and evicted snapshots (saves and restored tokens also per origin: chunk end, mark,
speculative, decode, oracle), TTFT percentiles (simulated seconds).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Iterable, Mapping, Sequence

import numpy as np

from experiments.traces.cost import ShapeCost
from experiments.traces.runner import SimClock, SimulatedRunner
from experiments.workloads.request import WorkloadRequest
from kernels.checks import require
from model.engine import Engine, resolve_settings
from model.engine.placeholder_runner import PlaceholderRunner
from model.engine.snapshot_codec import check_snapshot_dtype
from planner.evictions.base import EvictionPolicy
from planner.evictions.next_use import NextUseEviction
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.base import PlacementPolicy
from planner.policies.registry import get_policy
from planner.snapshot_tiers import Tier, disk_tier, host_tier

GB = 1e9


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated run: the policy, the shape, the snapshot budget and the engine's settings."""

    policy: PlacementPolicy | str  # a name is resolved once, here: afterwards the object
    shape: str = "bamba-9b"
    budget_gb: float | None = None  # snapshot memory; None: unbounded
    block_size: int = 16  # the engine's KV block (vllm-align uses the padded block instead)
    prefill_budget: int = 8192
    max_batch_size: int = 64
    kv_pool_gb: float = 60.0  # KV memory, the same for every policy and budget
    time_scale: float = 1.0  # arrivals at arrival_s * time_scale
    check_whole_prefix: bool = False  # the runner re-hashes the whole KV prefix under each row (validation; slow)
    eviction: str | None = None  # None: the policy's own (`policy.eviction`); a name overrides it
    host_gb: float | None = None  # a host-memory snapshot tier below the device budget (None or 0: none)
    disk_gb: float | None = None  # a disk tier below that (None or 0: none)
    # where a prefix match may end (tokens, dividing the block; 1 any token): None the policy's own
    # (ours-plus 1, the others the block). On Mooncake the prompts are 512-token hash blocks, so a
    # finer unit only gains inside a prompt's last, partial hash block and at reply ends.
    prefix_match_unit: int | None = None
    # how snapshots are stored (`model.engine.snapshot_codec`; None: the states' own): only the bytes
    # the store counts change (`ShapeCost.snapshot_bytes`), the simulator has no values to round
    snapshot_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "policy", get_policy(self.policy))
        if self.snapshot_dtype is not None:
            check_snapshot_dtype(self.snapshot_dtype)
        require(self.eviction is None or self.eviction in EVICTION_POLICIES, "eviction",
                f"must be one of {sorted(EVICTION_POLICIES)} or None, got {self.eviction!r}")
        require(self.budget_gb is None or self.budget_gb >= 0, "budget_gb", f"must be >= 0 or None, got {self.budget_gb}")
        require(self.kv_pool_gb > 0, "kv_pool_gb", f"must be > 0, got {self.kv_pool_gb}")
        require(self.time_scale > 0, "time_scale", f"must be > 0, got {self.time_scale}")
        for name in ("host_gb", "disk_gb"):
            value = getattr(self, name)
            require(value is None or value >= 0, name, f"must be >= 0 or None, got {value}")
        require(not self.lower_tiers() or self.budget_gb is not None, "host_gb",
                "a lower tier needs a device budget (budget_gb): an unbounded device never demotes")

    def lower_tiers(self) -> tuple[Tier, ...]:
        """The snapshot tiers below the device (`planner.snapshot_tiers`: PCIe 5 host, NVMe disk)."""
        return tuple(make(gb) for gb, make in ((self.host_gb, host_tier), (self.disk_gb, disk_tier)) if gb)

    def requested_settings(self, cost: ShapeCost) -> dict:
        """The flat settings this run asks for (its base block, budgets, KV pool in bytes, eviction
        override); the policy's defaults fill in the rest (`model.engine.settings.resolve_settings`)."""
        kv_tokens = int(self.kv_pool_gb * GB / cost.kv_bytes_per_token)
        return dict(block_size=self.block_size, prefill_budget=self.prefill_budget, max_batch_size=self.max_batch_size,
                    num_kv_blocks=lambda block: max(1, kv_tokens // block), policy=self.policy, capture_mode="in_pass",
                    snapshot_byte_budget=None if self.budget_gb is None else int(self.budget_gb * GB),
                    eviction=self.eviction, snapshot_lower_tiers=self.lower_tiers(),
                    prefix_match_unit=self.prefix_match_unit, snapshot_dtype=self.snapshot_dtype)

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


def build_engine(cfg: SimConfig, cost: ShapeCost, clock: SimClock,
                 eviction: EvictionPolicy | None = None) -> Engine:
    """The real engine over the model-free runner, wrapped in the simulated runner
    (`Engine.for_runner`: the policy's defaults applied as in every study). `eviction`: an
    eviction policy object that overrides the configured one (the optimum's next-use eviction)."""
    def make_runner(config) -> SimulatedRunner:
        s = config.scheduler
        inner = PlaceholderRunner(s.max_batch_size, s.num_kv_blocks, s.block_size, 64,
                                  cost.snapshot_bytes(config.snapshot_dtype),
                                  check_whole_prefix=cfg.check_whole_prefix)
        return SimulatedRunner(inner, cost, clock)

    settings = cfg.requested_settings(cost) | ({} if eviction is None else {"eviction": eviction})
    return Engine.for_runner(make_runner, cost.model_shape, snapshot_flops=cost.snapshot_flops, clock=clock,
                             **settings)


# No automatic cyclic GC while a run lasts (threshold 0; the caller's thresholds come back after): a
# run holds millions of long-lived objects (KV blocks, block hashes, snapshots, token lists and
# tuples) and makes almost no cycles. At (50_000, 50, 1_000) collections took 2.0 of 15.0 s of
# ours-plus 4 GB + 256 GB host on the first 1,000 Mooncake requests and found ~7,200 objects; off,
# that point on 3,000 requests takes 40.7 s instead of 47.6, the same peak RSS (2,722 MB) and rows.
# (At the default (700, 10, 10) collections had been 6.1 of 27.8 s, before the speed work.)
GC_THRESHOLDS = (0, 0, 0)


def simulate(requests: Iterable[WorkloadRequest], cfg: SimConfig,
             marks: dict[int, Sequence[int]] | None = None, uses: Mapping[tuple, Sequence[int]] | None = None) -> dict:
    """Run the requests through one policy; returns its metrics and per-request records.

    `marks`: request index -> positions it must leave a snapshot at (the optimum's: prefill, prompt end or reply);
    `uses`: snapshot key -> the requests that will restore it (`oracle.optimum_uses`): under a
    budget, eviction then follows Belady's MIN (`NextUseEviction`) instead of the policy's own."""
    previous = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return _simulate(requests, cfg, marks, uses)
    finally:
        gc.set_threshold(*previous)


def _simulate(requests: Iterable[WorkloadRequest], cfg: SimConfig, marks: dict[int, Sequence[int]] | None,
              uses: Mapping[tuple, Sequence[int]] | None) -> dict:
    require(marks is not None or not cfg.policy.needs_oracle, "marks",
            f"policy {cfg.policy.name!r} is offline: give its oracle marks (experiments.traces.oracle.oracle_for)")
    t0 = time.perf_counter()
    cost = ShapeCost.from_preset(cfg.shape)
    clock = SimClock()
    future = NextUseEviction(uses) if uses is not None and cfg.budget_gb is not None else None
    engine = build_engine(cfg, cost, clock, future)
    store = engine.snapshots
    pending = iter(requests)
    nxt = next(pending, None)
    indices: dict[str, int] = {}
    peak = 0
    byte_seconds = 0.0
    last_t = 0.0
    prompt_tokens = 0
    records: list[RequestRecord] = []
    while nxt is not None or engine.has_work:
        if not engine.has_work:
            clock.advance_to(nxt.arrival_s * cfg.time_scale)
        while nxt is not None and nxt.arrival_s * cfg.time_scale <= clock.now:
            rid = f"r{nxt.index}"
            engine.add_request(nxt.prompt_ids(), max_new_tokens=nxt.output_len, request_id=rid,
                               forced_output_ids=nxt.reply_ids(), snapshot_marks=(marks or {}).get(nxt.index, ()),
                               arrival_s=nxt.arrival_s * cfg.time_scale)
            indices[rid] = nxt.index
            prompt_tokens += nxt.prompt_len
            nxt = next(pending, None)
        if not engine.has_work:
            continue
        step = engine.step()
        finished = step.finished
        if future is not None:  # admitted requests have restored: their uses are behind them
            for r in step.admitted:
                future.served(indices[r.request_id])
        byte_seconds += store.bytes_held * (clock.now - last_t)
        last_t = clock.now
        peak = max(peak, store.bytes_held)
        for r in finished:
            m = r.metrics
            records.append(RequestRecord(indices[r.request_id], len(r.prompt_token_ids), m.kv_match_tokens,
                                         m.restore_at, m.replayed_tokens, m.prefill_passes, list(m.chunk_ends),
                                         list(m.snapshot_positions), m.first_token_s - m.arrival_s, m.preemptions))
            del indices[r.request_id]  # the record holds what is needed: nothing keeps a finished request
    records.sort(key=lambda r: r.index)
    held = {"peak": peak, "mean": byte_seconds / max(clock.now, 1e-12)}
    metrics = _metrics(records, engine, clock, held, prompt_tokens) | {"wall_s": time.perf_counter() - t0}
    return {"metrics": metrics, "records": records, "settings": engine.effective_settings}


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
        "snapshot_bytes_saved_per_request": stats.saved_bytes / max(len(records), 1),  # what each request adds
        "snapshots_evicted": stats.evicted,
        "snapshots_restored": stats.restored,
        "snapshots_rejected": stats.rejected,
        "snapshots_declined": stats.declined,
        "snapshots_demoted": dict(sorted(stats.demoted.items())),  # per lower tier: moves down
        "snapshot_bytes_demoted": dict(sorted(stats.demoted_bytes.items())),
        "snapshots_promoted": dict(sorted(stats.promoted.items())),  # restores from a lower tier
        "snapshot_bytes_promoted": dict(sorted(stats.promoted_bytes.items())),
        "restore_transfer_s": stats.restore_transfer_s,  # their transfer time, before any overlap
        "eviction": engine.effective_settings["eviction"],
        # shadow_best: lookups at which each candidate rule decided for the store (None: one rule)
        "eviction_leaders": engine.snapshots.eviction.leaders(),
        "saved_by_origin": dict(sorted(stats.saved_by_origin.items())),
        "restored_tokens_by_origin": dict(sorted(stats.restored_tokens_by_origin.items())),
        "preemptions": sum(r.preemptions for r in records),
        "ttft_s_p50": float(np.percentile(ttft, 50)),
        "ttft_s_p90": float(np.percentile(ttft, 90)),
        "ttft_s_p99": float(np.percentile(ttft, 99)),
        "ttft_s_mean": float(ttft.mean()),
        "simulated_span_s": clock.now,
        "simulated_busy_s": engine.runner.busy_s,
        "block_size": engine.effective_settings["block_size"],
        "state_block": engine.effective_settings["state_block"],
        "effective_settings": engine.effective_settings,
    }
