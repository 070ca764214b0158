"""The engine: runs the scheduler's ticks on a runner, saves snapshots and restores them.

Per tick: the scheduler picks rows (decode tokens and prefill chunks); a row admitted with a
restore point gets its snapshot written into its state slot (stored in `snapshot_dtype`:
`model.engine.snapshot_codec` encodes it on save and decodes it here); the rows run as one batched
forward; snapshots are saved where the plan says (a non-last chunk end: the slot's state after
the chunk; a last chunk spanning the tail split point: the capture at that offset), and after
a last chunk or decode row that ends at one of the request's `snapshot_marks` (an offline
driver's: the prompt end, a position in the reply; origin "oracle"); sampled tokens go back to
the scheduler.

What a caller sees (the whole public surface; a driver reaches into neither the scheduler nor
the runner):
* `add_request(prompt, max_new_tokens, ..., forced_output_ids=, snapshot_marks=, arrival_s=)`: a
  request, returned to the caller, whose metrics fill in as it runs. `forced_output_ids` fixes its
  output (teacher forcing: token k of the output is forced_output_ids[k]; past its end the
  engine samples): a recorded conversation replayed on any runner, the real model included,
  computes exactly the KV and states the recording implies (the trace simulator forces a trace's
  replies so that later prompts holding them share their blocks). `snapshot_marks`: positions to
  leave a snapshot at (an offline driver's); `arrival_s`: when it arrived, if not now (a driver
  that adds requests between ticks on its own clock).
* `has_work`: whether a request waits or runs.
* `step()`: one tick; its `StepReport` names the requests admitted (their restore point chosen),
  the rows run (request and state slot), the requests preempted and those finished.
* `run_until_done()`: steps until idle; returns the requests it finished. The engine keeps no
  finished request: the caller holds what it wants of them.
* `snapshots` (the store: bytes held, stats), `effective_settings`, `config`, `runner` (the one the
  engine was built with), `forward_passes`, `prompt_logits`.

A last chunk that spans a capture offset runs in one of three modes:
* ``in_pass`` - one forward; the SSM scan emits the capture (a few extra writes);
* ``two_pass`` - the fallback (`model.engine.two_pass`): the row is cut at the offset and its
  pieces run one after another;
* ``none`` - no capture (ablation: what the tail snapshot is worth).

The runner is anything with the `model.engine.runner.Runner` contract: `Engine.for_model` wraps
the hybrid model, `Engine.for_placeholder` the model-free runner that tests the planner end to
end in milliseconds, `Engine.for_runner` any other. All three apply the placement policy's engine
defaults in one place (`model.engine.settings.resolve_settings`) and size the runner's memory
from the resolved settings; `Engine.effective_settings` reads back what an engine runs under.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from array import array
from typing import Any, Callable, Sequence

import torch

from kernels.checks import require
from model.batch import BatchOutput, SequenceChunk
from model.cost import ModelCost
from model.engine.model_runner import ModelRunner
from model.engine.placeholder_runner import PlaceholderRunner
from model.engine.runner import Runner
from model.engine.settings import EFFECTIVE_KEYS, ModelShape, resolve_settings
from model.engine.snapshot_codec import DEFAULT_SNAPSHOT_DTYPE, SnapshotCodec, check_snapshot_dtype
from model.engine.spill import state_identity
from model.engine.two_pass import run_in_passes
from model.hybrid import HybridLM
from planner.evictions.base import EvictionPolicy
from planner.evictions.registry import get_eviction
from planner.prefill_plan import ChunkPlan
from planner.request import Request
from planner.scheduler import ScheduledRow, Scheduler, SchedulerConfig
from planner.snapshot_store import SnapshotStore

CAPTURE_MODES = ("in_pass", "two_pass", "none")


@dataclasses.dataclass
class EngineConfig:
    """The scheduler's settings plus how the engine takes captures and keeps snapshots."""

    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    capture_mode: str = "in_pass"  # one of CAPTURE_MODES
    snapshot_byte_budget: int | None = None  # None: unbounded
    keep_prompt_logits: bool = False  # keep each request's last prompt-token logits (for comparisons)
    # Also save, when a request finishes, the state at the last block boundary its KV reached
    # (usually inside the generated reply). A next chat turn extends prompt + reply, and its
    # block-floored match lands exactly there, so it replays only its new message instead of the
    # whole previous reply. Cost: one state copy per block decoded and one snapshot kept per
    # request. SGLang keeps a decode state on a fixed token grid for the same reason; this is
    # the block-granular version.
    decode_snapshots: bool = False
    # The grid those decode-time states sit on (0: the KV block). vLLM keeps them on its padded
    # block, SGLang on its kernel-chunk grid; a multiple of the KV block, so a match can land there.
    decode_snapshot_grid: int = 0
    # Tiers below the device budget (`planner.snapshot_tiers.Tier`: host memory, disk): the device's
    # eviction victims move down instead of leaving; a restore from one costs its transfer.
    snapshot_lower_tiers: tuple = ()
    # The dtype snapshots are stored in (`model.engine.snapshot_codec`): "float32" keeps the states'
    # own (fp32 SSM states, restored bit for bit); "bfloat16" or
    # "float8_e4m3fn" (a per-tensor scale) hold ~2x / ~4x more under a budget, restored with their
    # rounding error. Only when asked: no policy sets it.
    snapshot_dtype: str = DEFAULT_SNAPSHOT_DTYPE

    def __post_init__(self):
        check_snapshot_dtype(self.snapshot_dtype)
        require(self.capture_mode in CAPTURE_MODES, "capture_mode",
                f"must be one of {CAPTURE_MODES}, got {self.capture_mode!r}")
        unit = self.scheduler.match_unit  # a decode state off the match grid could never be restored
        require(self.decode_snapshot_grid >= 0 and self.decode_snapshot_grid % unit == 0, "decode_snapshot_grid",
                f"must be 0 or a multiple of the prefix match unit {unit} (block_size="
                f"{self.scheduler.block_size}, prefix_match_unit={self.scheduler.prefix_match_unit}), "
                f"got {self.decode_snapshot_grid}")

    @classmethod
    def from_settings(cls, **settings: Any) -> "EngineConfig":
        """Flat keyword settings, each a field of `SchedulerConfig` or of `EngineConfig`.

        An unknown keyword (including `scheduler`: its fields are given flat) raises a
        ValueError naming it.
        """
        scheduler_fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
        engine_fields = {f.name for f in dataclasses.fields(cls)} - {"scheduler"}
        for name in settings:
            require(name in scheduler_fields or name in engine_fields, name,
                    f"not an engine setting; the settings are {sorted(scheduler_fields | engine_fields)}")
        scheduler = SchedulerConfig(**{k: v for k, v in settings.items() if k in scheduler_fields})
        return cls(scheduler, **{k: v for k, v in settings.items() if k in engine_fields})


def to_chunk(row: ScheduledRow, capture_offsets: tuple[int, ...] = (),
             token_ids: torch.Tensor | None = None) -> SequenceChunk:
    """The one conversion from the scheduler's row to the model's row (what every runner takes).

    `token_ids`: the row's tokens as a tensor already (`to_chunks` passes views of one tensor)."""
    if token_ids is None:
        token_ids = torch.tensor(row.token_ids, dtype=torch.long)
    return SequenceChunk(token_ids=token_ids, start_pos=row.start_pos,
                         block_table=row.request.lease.block_ids, state_slot=row.request.slot,
                         kv_cached_len=row.kv_cached_len, capture_offsets=tuple(capture_offsets))


def to_chunks(rows: Sequence[ScheduledRow], capture_mode: str) -> list[SequenceChunk]:
    """Every row of a tick as a chunk, with the captures its plan asks for in `capture_mode`.

    The tokens become one tensor, split into per-row views: a tensor per one-token decode row
    cost 12 us on the 2-core CPU machine, a view 3 us (the trace simulator runs 4 million)."""
    # array -> frombuffer: a third of torch.tensor(list)'s time for an 8192-token chunk
    tokens = torch.frombuffer(array("q", itertools.chain.from_iterable(row.token_ids for row in rows)), dtype=torch.long)
    views = tokens.split([len(row.token_ids) for row in rows])
    return [to_chunk(row, () if row.is_decode or capture_mode == "none" else row.plan.capture_offsets, ids)
            for row, ids in zip(rows, views)]


def prefill_origin(req: Request, plan: ChunkPlan, position: int) -> str:
    """Why a prefill save is there (`planner.snapshot_store.ORIGINS`): an offline driver's mark, the
    policy's admission mark (a junction), its own chunk rule, and only when nothing else asked for
    it a speculative mark (free memory only). ours-plus's tail capture at 2048 sits on its
    speculative grid too: labelled speculative it was declined by a full LRU store, and the
    identical repeat replayed the whole prompt (tests/test_reference_simulator.py)."""
    if position in req.snapshot_marks:
        return "oracle"
    if position in req.marked_positions:
        return "mark"
    if position in req.speculative_positions and position not in plan.rule_positions:
        return "speculative"
    return "chunk"


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one `Engine.step` did, for a driver that follows the engine from outside.

    `admitted`: the requests admitted this tick (their KV match and restore point are chosen, the
    snapshot restored: an offline eviction's future use is behind them); `ran`: per row of the
    tick, the request and the state slot it ran in, in row order; `preempted`: the requests sent
    back to wait (they recompute later); `finished`: the requests this tick finished (their
    blocks and slots are released)."""

    admitted: tuple[Request, ...] = ()
    ran: tuple[tuple[Request, int], ...] = ()
    preempted: tuple[Request, ...] = ()
    finished: tuple[Request, ...] = ()


class Engine:
    """Drives a scheduler and a runner: one batched forward per tick, snapshots saved and restored.

    `forward_passes` counts the runner's forwards (a two-pass tick counts each pass);
    `prompt_logits` holds each request's last prompt-token logits when the config keeps them.
    """

    def __init__(self, runner: Runner, config: EngineConfig, eviction: EvictionPolicy | str | None = None,
                 snapshot_flops: Callable[[int], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        """`eviction`: a policy or its name (`planner.evictions.registry.EVICTION_POLICIES`; default LRU);
        `snapshot_flops(position)`: the prefill FLOPs a snapshot at `position` spares (default:
        the position), stamped on each snapshot for FLOP-aware eviction."""
        self.runner = runner
        self.config = config
        require(config.scheduler.match_unit == config.scheduler.block_size or hasattr(runner, "copy_kv_blocks"),
                "prefix_match_unit", f"{config.scheduler.prefix_match_unit} needs a runner that copies KV blocks "
                f"(copy_kv_blocks); {type(runner).__name__} has none")
        for tier in config.snapshot_lower_tiers:  # a spill a later process reads: what its states mean
            if hasattr(tier.spill, "bind"):
                tier.spill.bind(state_identity(runner, config.scheduler.block_size, config.snapshot_dtype))
        self.codec = SnapshotCodec(config.snapshot_dtype)  # encodes on save, decodes on restore
        self.snapshots = SnapshotStore(config.scheduler.block_size, config.snapshot_byte_budget,
                                       get_eviction(eviction) if eviction is not None else None,
                                       lower_tiers=config.snapshot_lower_tiers)
        self.scheduler = Scheduler(config.scheduler, self.snapshots)
        self.snapshot_flops = snapshot_flops or (lambda position: float(position))
        self.clock = clock
        self.prompt_logits: dict[str, torch.Tensor] = {}
        self.forward_passes = 0
        self._forced: dict[str, Sequence[int]] = {}  # request id -> its forced output (`add_request`)
        self._ids = itertools.count()
        self._boundary_states: dict[str, tuple[int, Any]] = {}  # request id -> last block-aligned state

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_runner(cls, make_runner: Callable[[EngineConfig], Runner], shape: ModelShape | None, *,
                   snapshot_flops: Callable[[int], float] | None = None,
                   clock: Callable[[], float] = time.perf_counter, **settings: Any) -> "Engine":
        """The one construction path: the policy's defaults under `settings`
        (`model.engine.settings.resolve_settings`: explicit settings win), then the runner
        `make_runner` builds for the resolved config.

        `settings` are flat keywords of `SchedulerConfig` (block_size, prefill_budget,
        max_batch_size, num_kv_blocks, policy, snapshot_interval_blocks, ...), of `EngineConfig`
        (capture_mode, snapshot_byte_budget, keep_prompt_logits, decode_snapshots, ...) and
        `eviction` (a policy or its name); `shape`: the model's (None: none behind the runner).
        """
        resolved = resolve_settings(shape, **settings)
        eviction = resolved.pop("eviction")
        config = EngineConfig.from_settings(**resolved)
        return cls(make_runner(config), config, eviction, snapshot_flops, clock)

    @classmethod
    def for_model(cls, model: HybridLM, *, snapshot_flops: Callable[[int], float] | None = None,
                  clock: Callable[[], float] = time.perf_counter, **settings: Any) -> "Engine":
        """An engine over the hybrid model, its KV pool and state slots sized from the resolved
        settings (`for_runner`; the shape is the model's config at its dtype). `snapshot_flops`
        defaults to the model's cost model (`model.cost.ModelCost.snapshot_flops`).
        """
        def runner(config: EngineConfig) -> ModelRunner:
            s = config.scheduler
            return ModelRunner(model, model.allocate_cache(s.num_kv_blocks, s.block_size, s.max_batch_size))

        return cls.for_runner(runner, ModelShape.of(model.config, model.dtype.itemsize),
                              snapshot_flops=snapshot_flops or ModelCost(model.config).snapshot_flops, clock=clock,
                              **settings)

    @classmethod
    def for_placeholder(cls, *, shape: ModelShape | None = None, vocab_size: int = 64,
                        snapshot_nbytes: int = 1 << 20, snapshot_flops: Callable[[int], float] | None = None,
                        clock: Callable[[], float] = time.perf_counter, **settings: Any) -> "Engine":
        """An engine over the model-free `PlaceholderRunner` (settings as in `for_runner`).

        `shape`: the model it stands in for (`ModelShape.of(config, dtype_bytes)`, or explicit
        numbers); without one a policy on vLLM's padded block raises, and `kernel_chunk` keeps
        `SchedulerConfig`'s default."""
        def runner(config: EngineConfig) -> PlaceholderRunner:
            s = config.scheduler
            return PlaceholderRunner(s.max_batch_size, s.num_kv_blocks, s.block_size, vocab_size, snapshot_nbytes)

        return cls.for_runner(runner, shape, snapshot_flops=snapshot_flops, clock=clock, **settings)

    @property
    def effective_settings(self) -> dict:
        """What this engine runs under, as a study records it per policy (`settings.EFFECTIVE_KEYS`)."""
        s = self.config.scheduler
        values = {"policy": s.policy.name, "block_size": s.block_size, "state_block": s.state_block,
                  "kernel_chunk": s.kernel_chunk, "decode_snapshots": self.config.decode_snapshots,
                  "decode_snapshot_grid": self.config.decode_snapshot_grid, "prefix_match_unit": s.prefix_match_unit,
                  "eviction": self.snapshots.eviction.name, "snapshot_dtype": self.config.snapshot_dtype}
        return {k: values[k] for k in EFFECTIVE_KEYS}

    # ------------------------------------------------------------------ intake
    def add_request(self, prompt_token_ids: Sequence[int], max_new_tokens: int = 1, request_id: str | None = None,
                    eos_token_id: int | None = None, *, forced_output_ids: Sequence[int] | None = None,
                    snapshot_marks: Sequence[int] = (), arrival_s: float | None = None) -> Request:
        """Queue a request; its metrics (restore point, replayed tokens, TTFT, ...) fill in as it runs.

        `forced_output_ids`: its output, token by token, instead of the argmax of the runner's
        logits (teacher forcing; past its end the engine samples); `snapshot_marks`: positions (of
        prompt + output) the request leaves a snapshot at, origin "oracle"; `arrival_s`: its
        arrival time (default: the engine's clock now)."""
        req = Request(request_id or f"req-{next(self._ids)}", list(prompt_token_ids), max_new_tokens, eos_token_id)
        if snapshot_marks:
            req.snapshot_marks = tuple(int(m) for m in snapshot_marks)
        self.scheduler.add_request(req)
        if forced_output_ids is not None:
            self._forced[req.request_id] = [int(t) for t in forced_output_ids]
        req.metrics.arrival_s = self.clock() if arrival_s is None else arrival_s
        return req

    @property
    def has_work(self) -> bool:
        """Whether any request waits or runs."""
        return self.scheduler.has_work

    def run_until_done(self, max_ticks: int | None = None) -> list[Request]:
        """Step until no request is left (or `max_ticks` ticks ran); returns the requests it finished."""
        finished: list[Request] = []
        ticks = 0
        while self.scheduler.has_work:
            finished.extend(self.step().finished)
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
        return finished

    def _charge_transfer(self, req: Request) -> None:
        """A simulated-time runner pays the part of a lower-tier restore's transfer that the request's
        queue wait did not hide (the load could start at arrival: the prefix is known then)."""
        charge = getattr(self.runner, "charge_transfer", None)
        m = req.metrics
        if charge is not None and m.restore_transfer_s > 0:
            waited = self.clock() - m.arrival_s if m.arrival_s is not None else 0.0
            exposed = m.restore_transfer_s - max(waited, 0.0)
            if exposed > 0:
                charge(exposed)

    # ------------------------------------------------------------------ one tick
    def step(self) -> StepReport:
        """One tick: restore, forward, save snapshots, sample; reports what it admitted, ran and finished."""
        out = self.scheduler.schedule()
        if not out.rows:
            if self.scheduler.has_work:
                raise RuntimeError("scheduler made no progress: every request waits for KV blocks")
            return StepReport(preempted=tuple(out.preempted))
        ran = tuple([(row.request, row.request.slot) for row in out.rows])
        if out.kv_copies:  # partial-block matches: their leading rows, before anything writes
            self.runner.copy_kv_blocks(out.kv_copies)
        for row in out.rows:
            if row.restore is not None:
                self._charge_transfer(row.request)
                self.runner.write_state(row.request.slot, self.codec.decode(row.restore_state))
        result = self._run(out.rows)
        sampled = self._sample_and_save(out.rows, result)
        if self.config.decode_snapshots and self.config.scheduler.enable_prefix_caching:
            self._track_boundary_states(out.rows)
        finished = self.scheduler.update(out, sampled)
        if finished:  # (most ticks finish nobody: no map of 50 rows' slots for them)
            slots = {req.request_id: slot for req, slot in ran}
            for req in finished:
                self._save_boundary_state(req, slots[req.request_id])
                self._forced.pop(req.request_id, None)
        self._stamp_times(out.rows, finished)
        return StepReport(tuple(out.admitted), ran, tuple(out.preempted), tuple(finished))

    def _run(self, rows: list[ScheduledRow]) -> BatchOutput:
        """Run the tick's rows in the configured capture mode; per row its logits and captures."""
        mode = self.config.capture_mode
        # A runner that takes token lists gets the scheduled rows themselves (they carry a chunk's
        # fields: `ScheduledRow.block_table`, ...): no tensor and no chunk per row (the model-free
        # placeholder, 4 million decode rows on a whole trace)
        lists = mode == "in_pass" and getattr(self.runner, "takes_token_lists", False)
        chunks = rows if lists else to_chunks(rows, mode)
        for row, chunk in zip(rows, chunks):
            if row.plan is not None:
                row.request.metrics.prefill_passes += 1 + (len(chunk.capture_offsets) if mode == "two_pass" else 0)
        if mode == "two_pass":
            out, passes = run_in_passes(self.runner, chunks)
        else:
            out, passes = self.runner.forward(chunks), 1
        self.forward_passes += passes
        return out

    def _sample_and_save(self, rows: list[ScheduledRow], result: BatchOutput) -> dict[str, int | None]:
        """Save each prefill row's snapshots; the token of each row that produces one (None mid-prompt):
        the request's forced output where it has one (`add_request`), else the argmax of the logits."""
        sampled: dict[str, int | None] = {}
        all_forced = self._forced
        for row, row_logits, row_captured in zip(rows, result.logits, result.captured):
            req, plan = row.request, row.plan
            if plan is None:  # a decode row (~4 million on a whole trace): it always produces a token
                if req.snapshot_marks:
                    self._save_marked_decode_state(row)
                forced, k = all_forced.get(req.request_id), len(req.output_token_ids)
                sampled[req.request_id] = forced[k] if forced is not None and k < len(forced) \
                    else int(torch.argmax(row_logits))
                continue
            self._save_snapshots(row, row_captured)
            token = None
            if plan.is_last:
                forced, k = all_forced.get(req.request_id), len(req.output_token_ids)
                token = forced[k] if forced is not None and k < len(forced) else int(torch.argmax(row_logits))
                # the prompt's last token only: a preempted request's recompute ends at its last output
                # token, whose logits are another position's (the fuzz's seed 1000 compared those)
                if self.config.keep_prompt_logits and not req.output_token_ids:
                    self.prompt_logits[req.request_id] = row_logits.detach().clone()
            sampled[req.request_id] = token
        return sampled

    def _stamp_times(self, rows: list[ScheduledRow], finished: list[Request]) -> None:
        now = self.clock()
        for row in rows:
            m = row.request.metrics
            if m.first_token_s is None and row.request.output_token_ids:
                m.first_token_s = now
        for req in finished:
            req.metrics.finish_s = now

    # ------------------------------------------------------------------ snapshots
    def _track_boundary_states(self, rows: list[ScheduledRow]) -> None:
        """Keep a copy of the slot state of every row that finished on a block boundary.

        Only decode rows and last prefill chunks: a non-last chunk's end is the planner's business.
        """
        grid = self.config.decode_snapshot_grid or self.config.scheduler.block_size
        if grid == 1:
            return  # every end is on the grid: the finish state is read at finish, not copied per token
        for row in rows:
            end = row.start_pos + len(row.token_ids)
            if end % grid == 0 and (row.plan is None or row.plan.is_last):
                self._boundary_states[row.request.request_id] = (end, self.runner.read_state(row.request.slot))

    def _save_boundary_state(self, req: Request, slot: int) -> None:
        """A finished request's decode-time state: the last one on the grid, read from its slot (not
        yet reused: no forward ran since) when the grid is every token."""
        tracked = self._boundary_states.pop(req.request_id, None)
        if self.config.decode_snapshot_grid == 1 and self.config.decode_snapshots \
                and self.config.scheduler.enable_prefix_caching:
            position = req.num_tokens - 1  # the last sampled token never ran
            prefix = req.prefix(position)
            held = self.snapshots.refresh(prefix, position, req.block_hashes)
            if held is not None:  # an identical repeat's: no copy of a state the store holds (0.3 ms)
                self._record_save(req, position, held.nbytes)
                return
            self._save(req, position, self.runner.read_state(slot), "decode", prefix)
        elif tracked is not None:
            self._save(req, *tracked, origin="decode")

    def _save_snapshots(self, row: ScheduledRow, captured: list[Any]) -> None:
        """Save the row's captures and, where the plan says or a last chunk ends at one of the
        request's `snapshot_marks` (its prompt end: no chunk plan can hold it), the slot state
        after the chunk."""
        if not self.config.scheduler.enable_prefix_caching:
            return  # nothing could ever restore them
        req, plan = row.request, row.plan
        saves = [(plan.offset + o, state) for o, state in zip(plan.capture_offsets, captured)]
        if plan.snapshot_at_end or (plan.is_last and plan.end in req.snapshot_marks):
            saves.append((plan.end, self.runner.read_state(req.slot)))
        for position, state in saves:
            self._save(req, position, state, prefill_origin(req, plan, position))

    def _save_marked_decode_state(self, row: ScheduledRow) -> None:
        """A decode row that ends at one of the request's `snapshot_marks` (a prefix a later request
        matches inside this reply) saves the state after it now, besides the one decode-time state
        kept at finish."""
        end = row.start_pos + row.num_tokens
        if self.config.scheduler.enable_prefix_caching and end in row.request.snapshot_marks:
            self._save(row.request, end, self.runner.read_state(row.request.slot), origin="oracle")

    def _save(self, req: Request, position: int, state: Any, origin: str, prefix: tuple | None = None) -> None:
        """`prefix`: `req.prefix(position)` if the caller has it (one tuple that every store keeps)."""
        state = self.codec.encode(state)  # what the store holds and counts (the state itself by default)
        if self.snapshots.save(req.prefix(position) if prefix is None else prefix, position, state, req.block_hashes,
                               flops_saved=self.snapshot_flops(position), origin=origin):
            self._record_save(req, position, int(state.nbytes))

    @staticmethod
    def _record_save(req: Request, position: int, nbytes: int) -> None:
        """A snapshot the store holds for `req` (new or refreshed): in the request's metrics."""
        req.metrics.snapshot_positions.append(position)
        req.metrics.snapshot_bytes += nbytes
