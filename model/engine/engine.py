"""The engine: runs the scheduler's ticks on a model runner, saves and restores SSM snapshots.

Per tick: the scheduler picks rows (decode tokens and prefill chunks); a row admitted with a
snapshot gets it written into its state slot; the rows run as one batched forward; snapshots
are saved where the plan says (a non-last chunk end: the slot's state after the chunk; a last
chunk spanning the tail split point: the state at that offset); sampled tokens go back to the
scheduler.

A last chunk that spans a capture point runs in one of three modes:
* ``in_pass`` - one forward; the SSM scan emits the state at the offset (a few extra writes);
* ``two_pass`` - the fallback: the row is cut at the offset and runs as two forwards;
* ``none`` - no capture (ablation: what the tail snapshot is worth).

The runner is anything with `forward(rows) -> RunnerOutput` and slot state access; the real
one wraps the hybrid model (`model.engine.model_runner.ModelRunner`), the placeholder one
(`model.engine.placeholder_runner`) lets the planner be tested end to end without a model.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Sequence

import torch

from model.engine.runner import Runner, RunRow
from planner.request import Request
from planner.scheduler import ScheduledRow, Scheduler, SchedulerConfig
from planner.snapshot_store import EvictionPolicy, SnapshotStore

CAPTURE_MODES = ("in_pass", "two_pass", "none")


@dataclasses.dataclass
class EngineConfig:
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    capture_mode: str = "in_pass"
    snapshot_byte_budget: int | None = None  # None: unbounded
    keep_prompt_logits: bool = False  # keep each request's last prompt-token logits (for comparisons)
    # Also save, when a request finishes, the state at the last block boundary its KV reached
    # (usually inside the generated reply). A next chat turn extends prompt + reply, and its
    # block-floored match lands exactly there, so it replays only its new message instead of the
    # whole previous reply. Cost: one state copy per block decoded (1.36 MB per 16 tokens for
    # the "small" preset), one snapshot kept per request. SGLang tracks a decode state every
    # 256 tokens for the same reason; this is the block-granular version.
    decode_snapshots: bool = False

    def __post_init__(self):
        if self.capture_mode not in CAPTURE_MODES:
            raise ValueError(f"capture_mode: must be one of {CAPTURE_MODES}, got {self.capture_mode!r}")


class Engine:
    def __init__(self, runner: Runner, config: EngineConfig, eviction: EvictionPolicy | None = None,
                 snapshot_flops: Callable[[int], float] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.runner = runner
        self.config = config
        self.snapshots = SnapshotStore(config.scheduler.block_size, config.snapshot_byte_budget, eviction)
        self.scheduler = Scheduler(config.scheduler, self.snapshots)
        self.snapshot_flops = snapshot_flops or (lambda position: float(position))
        self.clock = clock
        self.prompt_logits: dict[str, torch.Tensor] = {}
        self.finished: list[Request] = []
        self.forward_passes = 0
        self._ids = itertools.count()
        self._boundary_states: dict[str, tuple[int, Any]] = {}  # request id -> last block-aligned state

    # ------------------------------------------------------------------ intake
    def add_request(self, prompt_token_ids: Sequence[int], max_new_tokens: int = 1, request_id: str | None = None,
                    eos_token_id: int | None = None) -> Request:
        req = Request(request_id or f"req-{next(self._ids)}", list(prompt_token_ids), max_new_tokens, eos_token_id)
        self.scheduler.add_request(req)
        req.metrics.arrival_s = self.clock()
        return req

    def run_until_done(self, max_ticks: int | None = None) -> list[Request]:
        ticks = 0
        while self.scheduler.has_work:
            self.step()
            ticks += 1
            if max_ticks is not None and ticks >= max_ticks:
                break
        return self.finished

    # ------------------------------------------------------------------ one tick
    def step(self) -> list[Request]:
        out = self.scheduler.schedule()
        if not out.rows:
            if self.scheduler.has_work:
                raise RuntimeError("scheduler made no progress: every request waits for KV blocks")
            return []
        for row in out.rows:
            if row.restore is not None:
                self.runner.write_state(row.request.slot, row.restore.state)
        logits, captured = self._run(out.rows)
        sampled: dict[str, int | None] = {}
        for row, row_logits, row_captured in zip(out.rows, logits, captured):
            req = row.request
            if not row.is_decode:
                self._save_snapshots(row, row_captured)
            produces_token = row.is_decode or row.plan.is_last
            sampled[req.request_id] = int(torch.argmax(row_logits)) if produces_token else None
            if produces_token and not row.is_decode and self.config.keep_prompt_logits:
                self.prompt_logits[req.request_id] = row_logits.detach().clone()
        if self.config.decode_snapshots and self.config.scheduler.enable_prefix_caching:
            self._track_boundary_states(out.rows)
        finished = self.scheduler.update(out, sampled)
        for req in finished:
            self._save_boundary_state(req)
        now = self.clock()
        for row in out.rows:
            m = row.request.metrics
            if m.first_token_s is None and row.request.output_token_ids:
                m.first_token_s = now
        for req in finished:
            req.metrics.finish_s = now
        self.finished.extend(finished)
        return finished

    def _runner_row(self, row: ScheduledRow, begin: int, end: int, captures: tuple[int, ...]) -> RunRow:
        return RunRow(row.token_ids[begin:end], row.start_pos + begin, row.request.lease.block_ids,
                      row.request.slot, row.kv_cached_len, captures)

    def _run(self, rows: list[ScheduledRow]) -> tuple[list[torch.Tensor], list[list[Any]]]:
        """Run the tick's rows; returns last-token logits and captured states per row."""
        mode = self.config.capture_mode
        offsets = [() if row.is_decode or mode == "none" else row.plan.capture_offsets for row in rows]
        for row, offs in zip(rows, offsets):
            if not row.is_decode:
                row.request.metrics.prefill_passes += 1 + (len(offs) if mode == "two_pass" else 0)
        if mode != "two_pass" or not any(offsets):
            self.forward_passes += 1
            out = self.runner.forward([self._runner_row(r, 0, r.num_tokens, o) for r, o in zip(rows, offsets)])
            return out.logits, out.captured
        # Two passes: cut each capturing row at its offsets; segment k of every row runs in pass k,
        # and the slot's state after a non-final segment is the captured state.
        cuts = [(0, *o, r.num_tokens) for r, o in zip(rows, offsets)]
        logits: list[torch.Tensor | None] = [None] * len(rows)
        captured: list[list[Any]] = [[] for _ in rows]
        for k in range(max(len(c) - 1 for c in cuts)):
            active = [i for i, c in enumerate(cuts) if k < len(c) - 1]
            self.forward_passes += 1
            out = self.runner.forward([self._runner_row(rows[i], cuts[i][k], cuts[i][k + 1], ()) for i in active])
            for i, row_logits in zip(active, out.logits):
                if k + 1 < len(cuts[i]) - 1:
                    captured[i].append(self.runner.read_state(rows[i].request.slot))
                else:
                    logits[i] = row_logits
        return logits, captured

    def _track_boundary_states(self, rows: list[ScheduledRow]) -> None:
        """Keep a copy of the slot state of every row that finished on a block boundary.

        Only decode rows and last prefill chunks: a non-last chunk's end is the planner's business.
        """
        bs = self.config.scheduler.block_size
        for row in rows:
            end = row.start_pos + row.num_tokens
            if (row.is_decode or row.plan.is_last) and end % bs == 0:
                self._boundary_states[row.request.request_id] = (end, self.runner.read_state(row.request.slot))

    def _save_boundary_state(self, req: Request) -> None:
        tracked = self._boundary_states.pop(req.request_id, None)
        if tracked is None:
            return
        position, state = tracked
        if self.snapshots.save(req.all_token_ids, position, state, req.block_hashes,
                               flops_saved=self.snapshot_flops(position)):
            req.metrics.snapshot_positions.append(position)
            req.metrics.snapshot_bytes += int(state.nbytes)

    def _save_snapshots(self, row: ScheduledRow, captured: list[Any]) -> None:
        if not self.config.scheduler.enable_prefix_caching:
            return  # nothing could ever restore them
        req, plan = row.request, row.plan
        saves = [(plan.offset + o, state) for o, state in zip(plan.capture_offsets, captured)]
        if plan.snapshot_at_end:
            saves.append((plan.end, self.runner.read_state(req.slot)))
        for position, state in saves:
            if self.snapshots.save(req.all_token_ids, position, state, req.block_hashes,
                                   flops_saved=self.snapshot_flops(position)):
                req.metrics.snapshot_positions.append(position)
                req.metrics.snapshot_bytes += int(state.nbytes)
