"""A generation request and the per-request numbers the experiments report."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

from kernels.checks import require
from planner.block_pool import BlockHash

if TYPE_CHECKING:
    from planner.prefill_state import PrefillState
    from planner.prefix_cache import KVLease


class RequestStatus(enum.Enum):
    """Where a request is in the scheduler: waiting (or preempted), running, finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass
class RequestMetrics:
    """What the experiments report per request: times, the KV match, the restore point and
    replayed tokens, chunk ends, snapshots saved, passes and preemptions."""

    arrival_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    kv_match_tokens: int = 0  # cached KV positions adopted at (the last) admission
    kv_copied_tokens: int = 0  # of those, rows copied from another block (a match ending inside a block)
    copy_fallbacks: int = 0  # admissions that took the block-floored match: the copy's lease did not fit
    restore_at: int = 0  # SSM snapshot position restored at admission (0: cold start)
    restore_transfer_s: float = 0.0  # its transfer from a lower snapshot tier to the device (0: it was there)
    replayed_tokens: int = 0  # prompt tokens run after the restore point
    chunk_ends: list[int] = dataclasses.field(default_factory=list)
    snapshot_positions: list[int] = dataclasses.field(default_factory=list)  # saved by this request
    snapshot_bytes: int = 0
    prefill_passes: int = 0  # forward passes its prefill took (two-pass captures add one)
    decode_tokens: int = 0
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None or self.arrival_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        if self.decode_tokens == 0 or self.finish_s is None or self.first_token_s is None:
            return None
        return self.decode_tokens / max(self.finish_s - self.first_token_s, 1e-9)


@dataclasses.dataclass(eq=False)
class Request:
    """A generation request: its prompt and output tokens, its scheduler state (status, KV lease,
    state slot, prefill in progress), the snapshot positions asked of it, and its metrics."""

    request_id: str
    prompt_token_ids: list[int]
    max_new_tokens: int = 1
    eos_token_id: int | None = None
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    lease: KVLease | None = None
    slot: int | None = None  # batch slot; also the row of the SSM/conv state pools
    prefill: PrefillState | None = None  # None once decoding (or while waiting)
    block_hashes: list[BlockHash] = dataclasses.field(default_factory=list)
    # Positions this request must leave a snapshot at besides its policy's, in its prefill, at its
    # prompt end or in its reply (an offline driver that knows which prefixes later requests will
    # match sets them: experiments.traces.oracle).
    snapshot_marks: tuple[int, ...] = ()
    # The policy's own marks at admission (a junction, say), and its speculative marks: saved only
    # into free snapshot memory unless the eviction policy admits them.
    marked_positions: frozenset[int] = frozenset()
    speculative_positions: frozenset[int] = frozenset()
    metrics: RequestMetrics = dataclasses.field(default_factory=RequestMetrics)
    _prompt_tuple: tuple[int, ...] | None = dataclasses.field(default=None, repr=False)  # `prefix`'s

    def __post_init__(self):
        require(len(self.prompt_token_ids) > 0, "prompt_token_ids", f"request {self.request_id!r} has an empty prompt")
        require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens, without building their list."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list (a 12,000-token
        prompt is copied otherwise, every time a decoding request fills a block)."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n:end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n]

    def prefix(self, end: int) -> tuple[int, ...]:
        """Tokens [0, end) of prompt + output as a tuple: what a snapshot store keeps of a saved prefix.
        Handed to a store (and the shadow stores behind its eviction) as is, it is kept without a copy
        (`SnapshotStore.save`), where each of five stores copied `all_token_ids[:end]` before."""
        prompt = self._prompt_tuple
        if prompt is None:  # the prompt as a tuple once: a prefix inside it is then one copy, at its end none
            prompt = self._prompt_tuple = tuple(self.prompt_token_ids)
        n = len(prompt)
        if end >= n:
            return prompt + tuple(self.output_token_ids[:end - n]) if end > n else prompt
        return prompt[:end]

    def token_at(self, position: int) -> int:
        """Token `position` of prompt + output, without building their list."""
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    @property
    def is_decoding(self) -> bool:
        return self.status is RequestStatus.RUNNING and self.prefill is None

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
