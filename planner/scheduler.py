"""Token-budget scheduler: decode rows one token each, FIFO prefill chunks shaped by the planner.

Each tick hands out `prefill_budget + max_batch_size` tokens. Every request that holds a batch
slot when the tick starts reserves one of them for its decode step (a request still prefilling
reserves it too, unused); prefill chunks share the rest, first-come first-served. A lone
request therefore gets 8193 tokens in its first chunk and 8192 in later ones (the seed's dense
serve: budget 8192, one slot).

The scheduler decides and books; it runs nothing. `schedule()` returns the rows of one tick;
the engine runs them, saves snapshots, and calls `update()` with the sampled tokens.

Memory: blocks are allocated per chunk. A waiting request that cannot get its first chunk's
blocks waits; a running request that cannot grow preempts the most recently admitted other
request (its blocks go back to the pool, still findable by hash, and it is re-queued at the
front to recompute prompt + output so far), or waits if it is itself the newest.

Liveness (the invariant `tests/test_serve_under_pressure.py` fuzzes): every request whose prompt +
max_new_tokens fit the KV pool alone (`add_request` refuses the others) is served, under every
placement, eviction, match unit and tier. The oldest running request can always grow (it preempts
the newer ones), so the running set drains; once it is empty every block is free or cached-free,
and the queue's head then fits: its block-floored match needs no block beyond its own lease. A
partial-block copy needs one more (its source, held until the copy has run), so an admission whose
copy does not fit takes the block-floored match instead (`copy_fallbacks`) rather than wait for a
block its own copy holds. A copy source held by this tick's admissions comes back at `update`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from kernels.checks import require
from planner.block_pool import BlockPool, append_block_hashes, extend_block_hashes
from planner.policies.aligned import check_interval
from planner.policies.base import PlacementPolicy, PlanContext
from planner.policies.registry import get_policy
from planner.prefill_plan import ChunkPlan
from planner.prefill_state import PrefillState
from planner.prefix_cache import KVLease, PrefixCache, PrefixMatch
from planner.request import Request, RequestStatus
from planner.snapshot_store import Snapshot, SnapshotStore


@dataclasses.dataclass
class SchedulerConfig:
    """The scheduler's settings: KV block size and pool, token budget, batch slots, chunk policy."""

    block_size: int = 16
    prefill_budget: int = 8192
    max_batch_size: int = 1
    num_kv_blocks: int = 4096
    # The placement policy: a name of planner.policies.registry.POLICIES ("aligned": the fix; "legacy":
    # before it) is resolved once, here; afterwards this is always the `PlacementPolicy` object, which
    # every later layer is handed (an engine's settings pass the object: nothing resolves it again).
    policy: PlacementPolicy | str = "aligned"
    snapshot_interval_blocks: int = 0  # also snapshot non-last chunk ends at multiples of this many blocks
    enable_prefix_caching: bool = True
    ssm_snapshots: bool = True  # the model has SSM layers: a warm start needs a snapshot
    state_block: int = 0  # a policy's block-aligned state granularity (vLLM's padded block); 0: block_size
    kernel_chunk: int = 256  # the SSD kernel's chunk (SGLang's state grid)
    # Where a prefix match may end, in tokens, dividing block_size: 0 the KV block (vLLM's and
    # SGLang's rule), 1 any token (a match ending inside a block copies that block's leading rows:
    # planner.prefix_cache).
    prefix_match_unit: int = 0

    def __post_init__(self):
        for name in ("block_size", "prefill_budget", "max_batch_size", "num_kv_blocks", "kernel_chunk"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        require(self.state_block >= 0 and self.state_block % self.block_size == 0, "state_block",
                f"must be 0 or a multiple of block_size={self.block_size}, got {self.state_block}")
        check_interval(self.snapshot_interval_blocks, "snapshot_interval_blocks")
        unit = self.prefix_match_unit
        require(unit >= 0 and (unit == 0 or self.block_size % unit == 0), "prefix_match_unit",
                f"must be 0 (the block) or divide block_size={self.block_size}, got {unit}")
        self.policy = get_policy(self.policy)

    @property
    def match_unit(self) -> int:
        """The prefix match's granularity in tokens (`prefix_match_unit`, 0 read as the block)."""
        return self.prefix_match_unit or self.block_size

    @property
    def plan_context(self) -> PlanContext:
        """What the policy's rules read besides the chunk; `snapshot_memory_bounded` is the store's to
        say, not the config's: the `Scheduler` sets it from the store it is given."""
        return PlanContext(self.block_size, self.snapshot_interval_blocks, self.state_block, self.kernel_chunk,
                           self.prefix_match_unit)

    @property
    def tick_budget(self) -> int:
        """Tokens one tick hands out: the prefill budget plus one decode token per batch slot."""
        return self.prefill_budget + self.max_batch_size


@dataclasses.dataclass(slots=True)
class ScheduledRow:
    """One row of a tick: a request's decode token or its next prefill chunk, with its restore point."""

    request: Request
    start_pos: int  # positions already computed; the row runs [start_pos, start_pos + len(token_ids))
    token_ids: list[int]
    kv_cached_len: int  # positions below this already hold cached KV: not rewritten
    plan: ChunkPlan | None  # None for a decode row
    restore: Snapshot | None = None  # restore this snapshot into the slot before running
    # Its state as admission read it: a later admission of the same tick may promote another
    # snapshot and push this one down to disk, which drops `restore.state` (the fuzz's seed 466).
    restore_state: Any = None

    @property
    def is_decode(self) -> bool:
        """A one-token decode row (no chunk plan)."""
        return self.plan is None

    @property
    def num_tokens(self) -> int:
        """Tokens the row runs."""
        return len(self.token_ids)

    # The fields of a `model.batch.SequenceChunk` a runner reads, for a runner that takes the rows as
    # they are (`takes_token_lists`: the model-free placeholder; `Engine._run`).
    @property
    def block_table(self) -> list[int]:
        return self.request.lease.block_ids

    @property
    def state_slot(self) -> int:
        return self.request.slot

    @property
    def capture_offsets(self) -> tuple[int, ...]:
        """The in-pass captures its plan asks for (none for a decode row)."""
        return () if self.plan is None else self.plan.capture_offsets


@dataclasses.dataclass
class SchedulerOutput:
    """What one tick scheduled: its rows, the requests it preempted, the decode reservations and the
    requests it admitted (each with its first row among `rows`)."""

    tick: int
    rows: list[ScheduledRow]
    preempted: list[Request]
    tokens_reserved: int  # decode reservations taken off the top of the budget
    admitted: list[Request] = dataclasses.field(default_factory=list)
    # Copy-on-write of partial-block matches: (source block, destination block, rows), to run
    # before the tick's forward (the sources are held until `Scheduler.update`).
    kv_copies: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens of every row of the tick."""
        return sum(r.num_tokens for r in self.rows)


@dataclasses.dataclass(frozen=True)
class _Booking:
    """One admission attempt that got its blocks (`Scheduler._book`): the lease, the partial-block copy
    (source id, destination id, rows) or None, the restore point, the prefill state and its first
    chunk's plan, the policy's marks and speculative marks, and whether the store was looked up."""

    lease: KVLease
    copy: tuple[int, int, int] | None
    restore: Snapshot | None
    prefill: PrefillState
    plan: ChunkPlan
    own: frozenset[int]
    speculative: frozenset[int]
    looked_up: bool


class Scheduler:
    """Books KV blocks, batch slots and restore points, and shapes each tick's rows; runs nothing."""

    def __init__(self, config: SchedulerConfig, snapshots: SnapshotStore | None = None):
        """`snapshots`: the store restore points are looked up in (a private one if None)."""
        self.config = config
        self.pool = BlockPool(config.num_kv_blocks)
        self.kv = PrefixCache(self.pool, config.block_size, enabled=config.enable_prefix_caching,
                              match_unit=config.prefix_match_unit)
        self._copy_sources: list = []  # blocks copied from this tick, held until `update`
        self.snapshots = snapshots if snapshots is not None else SnapshotStore(config.block_size)
        self.policy = config.policy
        self.context = dataclasses.replace(config.plan_context,
                                           snapshot_memory_bounded=self.snapshots.byte_budget is not None,
                                           snapshot_stats=self.snapshots.stats)  # live: ours-adaptive reads it
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # admission order: the last one is preempted first
        self.free_slots = list(range(config.max_batch_size - 1, -1, -1))  # pop() gives slot 0 first
        self.tick = 0
        self.copy_fallbacks = 0  # admissions that gave up a partial-block copy for the block floor (`_admit`)

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        """Queue a request; ValueError if its prompt plus output could never fit the KV pool."""
        worst = len(request.prompt_token_ids) + request.max_new_tokens
        need = -(-worst // self.config.block_size)
        require(need <= self.pool.num_blocks, f"request {request.request_id!r}",
                f"prompt + max_new_tokens = {worst} tokens needs {need} KV blocks, the pool has {self.pool.num_blocks}")
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one tick
    def schedule(self) -> SchedulerOutput:
        """The rows of the next tick: decode rows first, then prefill chunks of admitted requests
        (FIFO), then new admissions (each with its restore point) while budget and slots last."""
        self.tick += 1
        cfg = self.config
        holders = list(self.running)
        budget = cfg.tick_budget - len(holders)
        preempted: list[Request] = []
        rows = self._decode_rows(holders, preempted)

        running = RequestStatus.RUNNING
        for req in holders:  # prefill chunks of requests already admitted, FIFO
            if budget <= 0:
                break
            if req.status is not running or req.prefill is None:  # (not running, or decoding)
                continue
            plan = req.prefill.plan_next(budget, self.policy, self.context)
            if not self._grow_or_preempt(req, plan.end, preempted):
                break  # FIFO: nobody overtakes a prefill that is waiting for memory
            rows.append(self._prefill_row(req, plan))
            budget -= plan.length

        # A request preempted by a later row of this tick drops its rows, and is not re-admitted
        # until the next tick (only a preemption stops a row's request running here).
        if preempted:
            rows = [row for row in rows if row.request.status is RequestStatus.RUNNING]
        admitted: list[Request] = []
        copies: list[tuple[int, int, int]] = []
        while budget > 0 and self.waiting and self.free_slots:
            req = self.waiting[0]
            if req in preempted:
                break
            if budget < cfg.block_size and budget < req.num_tokens and any(r.plan is not None for r in rows):
                # A sliver left by block-floored chunks (514 - 512 = 2 tokens at budget 512 with
                # two slots) would admit this request now and match its prefix against a cache
                # that the chunks of this very tick have not published yet, so it would recompute
                # a prefix those chunks are about to publish. Admit it next tick. A tick without
                # a chunk has nothing unpublished: a whole tick budget under a block (prefill
                # budget 256 under vLLM's 528-token block) admits there, or never.
                break
            plan, restore = self._admit(req, budget, copies)
            if plan is None:
                break  # not enough free blocks for its first chunk: it waits
            self.waiting.popleft()
            admitted.append(req)
            rows.append(self._prefill_row(req, plan, restore))
            budget -= plan.length

        return SchedulerOutput(self.tick, rows, preempted, len(holders), admitted, copies)

    def _decode_rows(self, holders: list[Request], preempted: list[Request]) -> list[ScheduledRow]:
        """A row for each decoding holder, paid for by its reservation (`is_decoding`, `token_at`
        inlined); one that needs a block it cannot get is preempted (or preempts, `_grow_or_preempt`)."""
        rows: list[ScheduledRow] = []
        running, bs = RequestStatus.RUNNING, self.config.block_size
        for req in holders:
            if req.status is not running or req.prefill is not None:
                continue
            lease = req.lease
            pos = lease.num_computed_tokens
            # (a new block once per block_size tokens: the capacity test spares the call otherwise)
            if pos >= len(lease.blocks) * bs and not self._grow_or_preempt(req, pos + 1, preempted):
                continue
            prompt = req.prompt_token_ids
            token = prompt[pos] if pos < len(prompt) else req.output_token_ids[pos - len(prompt)]
            rows.append(ScheduledRow(req, pos, [token], lease.num_cached_tokens, None))
        return rows

    def _prefill_row(self, req: Request, plan: ChunkPlan, restore: Snapshot | None = None) -> ScheduledRow:
        """The row of one planned chunk; `restore` is the snapshot its slot starts from (admission only)."""
        return ScheduledRow(req, plan.offset, req.prefill.chunk_tokens(plan), req.lease.num_cached_tokens, plan, restore,
                            restore.state if restore is not None else None)

    def _admit(self, req: Request, budget: int, copies: list) -> tuple[ChunkPlan | None, Snapshot | None]:
        """Adopt the cached prefix (a partial block by copy, appended to `copies`), pick the restore
        point (the deepest usable snapshot at or below the KV match; everything after it is replay),
        and book the first chunk; (None, None) when its blocks are not free (it waits).

        A copy never makes a request wait: it holds one block more than the block-floored match (its
        source, until the copy has run), so when that lease does not fit, the block-floored match is
        booked instead (`copy_fallbacks`). Without this a request needing the whole pool waited
        forever for a block its own copy held (KV block 16, 17 blocks, a 257-token prompt)."""
        cfg = self.config
        tokens = req.all_token_ids
        extend_block_hashes(req.block_hashes, tokens, cfg.block_size)
        match = self.kv.find(tokens, req.block_hashes)
        booked = self._book(req, match, budget)
        if booked is None and match.partial is not None:
            booked = self._book(req, PrefixMatch(match.blocks, match.block_size), budget)
            if booked is not None:
                self.copy_fallbacks += 1
                req.metrics.copy_fallbacks += 1
        if booked is None:
            return None, None
        lease, copy, restore, prefill, plan = booked.lease, booked.copy, booked.restore, booked.prefill, booked.plan
        # The eviction hears of the lookup once, for the admission that happened (an attempt that
        # found no blocks, or the copy's attempt before a fallback, is not a lookup the store served).
        if booked.looked_up:
            self.snapshots.observe_lookup(tokens, lease.num_cached_tokens, req.block_hashes)
        if copy is not None:
            copies.append(copy)
            self._copy_sources.append(match.partial)
            req.metrics.kv_copied_tokens += copy[2]
        if restore is not None:  # a snapshot in a lower tier is promoted; its transfer time is kept
            req.metrics.restore_transfer_s = self.snapshots.mark_restored(restore)
        req.lease, req.prefill, req.status = lease, prefill, RequestStatus.RUNNING
        req.marked_positions, req.speculative_positions = booked.own, booked.speculative
        req.slot = self.free_slots.pop()
        m = req.metrics
        m.kv_match_tokens = lease.num_cached_tokens
        m.restore_at = lease.num_computed_tokens
        m.replayed_tokens = len(tokens) - lease.num_computed_tokens
        self.running.append(req)
        return plan, restore

    def _book(self, req: Request, match: PrefixMatch, budget: int) -> _Booking | None:
        """The lease over `match` with its first chunk's blocks allocated, the restore point, the
        prefill state, its plan and marks; None (every reference given back) when the blocks are short."""
        cfg = self.config
        tokens = req.all_token_ids
        lease, copy = self.kv.adopt_match(match)
        restore = None
        looked_up = bool(lease.num_cached_tokens and cfg.ssm_snapshots)
        if looked_up:
            restore = self.snapshots.lookup(tokens, lease.num_cached_tokens, req.block_hashes, observe=False)
            lease.num_computed_tokens = restore.position if restore is not None else 0
        else:
            lease.num_computed_tokens = lease.num_cached_tokens
        start, total = lease.num_computed_tokens, len(tokens)
        own = {m for m in self.policy.marks(lease.num_cached_tokens, start, total, self.context) if start < m < total}
        marks = own | {m for m in req.snapshot_marks if start < m < total}
        speculative = {m for m in self.policy.speculative_marks(lease.num_cached_tokens, start, total, self.context)
                       if start < m < total} - marks
        prefill = PrefillState(tokens, lease, tuple(sorted(marks | speculative)))
        plan = prefill.plan_next(budget, self.policy, self.context)
        if not self.kv.allocate(lease, plan.end):
            self.kv.release(lease)
            if copy is not None:
                self.pool.free([match.partial])
            return None
        return _Booking(lease, copy, restore, prefill, plan, frozenset(own), frozenset(speculative), looked_up)

    def _grow_or_preempt(self, req: Request, num_tokens: int, preempted: list[Request]) -> bool:
        """Make `req`'s lease hold `num_tokens` positions, preempting newer requests if needed."""
        while not self.kv.allocate(req.lease, num_tokens):
            victim = self.running[-1]
            if victim is req:
                return False  # it is the newest: it waits for others to finish
            self._preempt(victim)
            preempted.append(victim)
        return True

    def _preempt(self, req: Request) -> None:
        """Release the request's blocks and slot and queue it first, to recompute from scratch."""
        self.running.remove(req)
        self.kv.register_tail(req.lease, req.block_hashes, req.tokens)
        self.kv.release(req.lease)
        self.free_slots.append(req.slot)
        req.lease = req.prefill = req.slot = None
        req.status = RequestStatus.WAITING
        req.metrics.preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ after the engine ran a tick
    def update(self, output: SchedulerOutput, sampled: dict[str, int | None]) -> list[Request]:
        """Advance every row that ran; `sampled` maps request id -> next token (None mid-prompt).

        Returns the requests that finished this tick (their blocks and slots are released).
        """
        finished = []
        bs = self.config.block_size
        if self._copy_sources:  # the copies ran before the forward: their sources may be reused now
            self.pool.free(self._copy_sources)
            self._copy_sources = []
        running, publish = RequestStatus.RUNNING, self.kv.enabled
        for row in output.rows:
            req = row.request
            if req.status is not running:
                continue  # preempted later in the same tick
            if row.plan is None:  # a decode row: the steps below, inlined (4 million rows on the trace)
                lease, out = req.lease, req.output_token_ids
                pos = lease.num_computed_tokens + 1
                if pos > len(lease.blocks) * bs:
                    lease.advance(1)  # raises: the row ran past its lease
                lease.num_computed_tokens = pos
                req.metrics.decode_tokens += 1
                token = sampled.get(req.request_id)
                if token is None:
                    require(False, "sampled", f"no token for request {req.request_id!r}, which produced logits")
                token = int(token)
                out.append(token)
                full = (len(req.prompt_token_ids) + len(out)) // bs
                if full > len(req.block_hashes):  # a new full block
                    known = len(req.block_hashes)
                    append_block_hashes(req.block_hashes, req.tokens(known * bs, full * bs), bs)
                if publish and pos // bs > lease.num_published_blocks:  # (`PrefixCache.publish`'s own test)
                    self.kv.publish(lease, req.block_hashes, req.tokens)
                if len(out) >= req.max_new_tokens or token == req.eos_token_id:  # `_is_done`
                    self._finish(req)
                    finished.append(req)
                continue
            req.metrics.chunk_ends.append(row.plan.end)
            if req.prefill.commit(row.plan):
                req.prefill = None
            token = sampled.get(req.request_id)
            if req.prefill is None:
                if token is None:
                    require(False, "sampled", f"no token for request {req.request_id!r}, which produced logits")
                req.output_token_ids.append(int(token))
            full, known = req.num_tokens // bs, len(req.block_hashes)
            if full > known:  # a new full block
                append_block_hashes(req.block_hashes, req.tokens(known * bs, full * bs), bs)
            self.kv.publish(req.lease, req.block_hashes, req.tokens)
            if req.prefill is None and self._is_done(req):
                self._finish(req)
                finished.append(req)
        return finished

    @staticmethod
    def _is_done(req: Request) -> bool:
        """max_new_tokens reached, or the last token is EOS."""
        last = req.output_token_ids[-1] if req.output_token_ids else None
        return len(req.output_token_ids) >= req.max_new_tokens or (last is not None and last == req.eos_token_id)

    def _finish(self, req: Request) -> None:
        """Release a finished request's blocks (they stay findable by hash) and its slot."""
        self.running.remove(req)
        self.kv.register_tail(req.lease, req.block_hashes, req.tokens)
        self.kv.release(req.lease)
        self.free_slots.append(req.slot)
        req.lease = req.slot = None
        req.status = RequestStatus.FINISHED
