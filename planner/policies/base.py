"""What a placement policy is: its rules' inputs (`PlanContext`), its type (`PlacementPolicy`),
the argument checks its rules share, and the one rule several peers share (`junction_marks`).

Positions are token counts from the prompt start; `block_size` is the KV block size.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from kernels.checks import require

KvBlock = Literal["kv", "vllm", "vllm-state"]
DecodeGrid = Literal[None, "block", "state", "kernel", "exact"]
MatchUnit = Literal["block", "token"]
MarkMode = Literal["stop", "capture"]


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """What a policy's rules may read besides the chunk itself.

    `block_size` is the KV block (the prefix match's granularity); `state_block` the granularity
    at which a policy keeps block-aligned states (vLLM's padded block; 0 = the KV block);
    `kernel_chunk` the SSD kernel's chunk (SGLang's state grid); `interval` interval snapshots
    in KV blocks (0 = off); `match_unit` where a prefix match may end (0 = the KV block; 1 = any
    token: `SchedulerConfig.prefix_match_unit`); `snapshot_memory_bounded` whether the snapshot
    store has a device budget (the scheduler reads it off its store; a grid may be denser without);
    `snapshot_stats` the store's live counters (`planner.snapshot_store.SnapshotStats`: saves and
    restored tokens by capture origin), handed by the scheduler for a policy that learns online
    which origins pay back (None outside a scheduler). Read it, never write it; it is left out of
    the context's equality and hash, so a context compares by its rules' static inputs only.
    """

    block_size: int
    interval: int = 0
    state_block: int = 0
    kernel_chunk: int = 256
    match_unit: int = 0
    snapshot_memory_bounded: bool = True
    snapshot_stats: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

    @property
    def unit(self) -> int:
        """The match unit in tokens (`match_unit`, 0 read as the KV block)."""
        return self.match_unit or self.block_size

    @property
    def state_grid(self) -> int:
        return self.state_block or self.block_size


def check_total_and_block(total: int, block_size: int) -> None:
    """A prompt of `total` >= 1 tokens on a KV block of `block_size` >= 1 tokens."""
    require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
    require(total >= 1, "total", f"must be >= 1, got {total}")


def check_chunk_args(offset: int, total: int, proposed: int, block_size: int) -> None:
    """A chunk of `proposed` >= 1 tokens at `offset`, inside the prompt."""
    check_total_and_block(total, block_size)
    require(0 <= offset < total, "offset", f"must be in [0, {total}) for total={total}, got {offset}")
    require(
        1 <= proposed <= total - offset,
        "proposed",
        f"must be in [1, {total - offset}] (tokens left after offset={offset}), got {proposed}",
    )


def junction_marks(kv_match: int, restore_at: int, total: int) -> tuple[int, ...]:
    """The shared-prefix junction: the KV match, when the SSM restore point lags behind it."""
    return (kv_match,) if restore_at < kv_match < total else ()


class PlacementPolicy:
    """A snapshot placement policy: its chunk rules and the engine defaults of the same design.

    Rules (each a method; the base's place nothing, so a policy overrides what it does):

    * `chunk_len`: the length of the chunk at `offset`, given the `proposed` length (already
      capped by the token budget and by what is left);
    * `saves_snapshot`: whether a non-last chunk ending at `end` saves a snapshot;
    * `last_captures`: in-chunk offsets whose state the last chunk captures in its scan launch;
    * `marks`: positions a request must leave a snapshot at, decided once at admission from its
      KV match and restore point. A mark strictly inside a chunk either stops the chunk there
      (`mark_mode="stop"`: one more forward, the state saved at the chunk end) or is captured
      inside the same scan launch (`"capture"`);
    * `speculative_marks`: marks no request has asked for yet (a grid, say): planned like the
      others, but their snapshots go into free snapshot memory only, unless the eviction
      policy's `admits` judges them worth an eviction (`SnapshotStore.save(origin="speculative")`).

    Engine defaults (class attributes):

    * `kv_block`: the KV block it matches with: "kv" the engine's; "vllm" vLLM's padded hybrid
      block; "vllm-state" the engine's, with states on the padded block (`PlanContext.state_block`);
    * `decode_grid`: where a finishing request's decode state is kept: None not kept; "block" the
      KV block; "state" the state block; "kernel" the kernel chunk; "exact" the state after the
      last token it computed (its prompt + reply less the last sampled token; a token match unit
      lets the next turn's match land there);
    * `match_unit`: where its prefix match may end: "block" the KV block; "token" any token
      (`SchedulerConfig.prefix_match_unit` 1, copy-on-write of the partial block);
    * `eviction`: its snapshot eviction, a `planner.evictions.registry.EVICTION_POLICIES` name;
    * `needs_oracle`: whether a driver that knows the trace must set its requests' marks.

    A subclass sets `name` and cites its source in its own docstring (`source`). Instances hold
    no state and cannot be changed.
    """

    name: str = ""
    kv_block: KvBlock = "kv"
    decode_grid: DecodeGrid = None
    match_unit: MatchUnit = "block"
    eviction: str = "lru"
    needs_oracle: bool = False
    mark_mode: MarkMode = "stop"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        require(isinstance(cls.__dict__.get("name"), str) and cls.name != "", "name",
                f"{cls.__qualname__} must set its own non-empty name")
        require(bool((cls.__dict__.get("__doc__") or "").strip()), "source",
                f"{cls.__qualname__} must cite its source in its docstring")
        for field, allowed in (("kv_block", KvBlock), ("decode_grid", DecodeGrid), ("mark_mode", MarkMode),
                               ("match_unit", MatchUnit)):
            require(getattr(cls, field) in get_args(allowed), field,
                    f"must be one of {get_args(allowed)}, got {getattr(cls, field)!r} ({cls.__qualname__})")

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a placement policy is immutable: cannot set {name!r} on {self.name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    @property
    def source(self) -> str:
        """Where the rules come from: the policy class's own docstring."""
        return " ".join(type(self).__doc__.split())

    def chunk_len(self, offset: int, total: int, proposed: int, ctx: PlanContext) -> int:
        """The chunk keeps the length the budget proposed."""
        return proposed

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        """No non-last chunk end saves a snapshot."""
        return False

    def last_captures(self, offset: int, length: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """The last chunk captures nothing inside itself."""
        return ()

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """No position is asked for at admission."""
        return ()

    def speculative_marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """No speculative position."""
        return ()
