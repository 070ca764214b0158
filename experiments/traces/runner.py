"""The simulator's runner: the model-free placeholder behind a wrapper that charges the cost model.

`SimulatedRunner` wraps any runner (`model.engine.runner.Runner`; the simulator wraps
`model.engine.placeholder_runner.PlaceholderRunner` with ``check_whole_prefix=False``, its
O(row) check, module docstring there): it advances a `SimClock` by the cost model's time for
every forward, save (`read_state`) and restore (`write_state`), and counts forwards and busy
time. It changes nothing the inner runner computes; the trace's replies reach the engine as each
request's forced output (`Engine.add_request(forced_output_ids=...)`), so later prompts that
contain them share their blocks.
"""

from __future__ import annotations

from typing import Any, Sequence

from experiments.traces.cost import ShapeCost
from model.batch import BatchOutput, SequenceChunk


class SimClock:
    """Simulated seconds; the engine's `clock`."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class SimulatedRunner:
    """Wraps a runner: advances the clock by the cost model for each forward, save and restore."""

    def __init__(self, inner: Any, cost: ShapeCost, clock: SimClock):
        self.inner, self.cost, self.clock = inner, cost, clock
        self.forwards = 0
        self.busy_s = 0.0

    def _spend(self, seconds: float) -> None:
        self.clock.now += seconds
        self.busy_s += seconds

    def read_state(self, slot: int) -> Any:
        self._spend(self.cost.copy_s)
        return self.inner.read_state(slot)

    def write_state(self, slot: int, state: Any) -> None:
        self._spend(self.cost.copy_s)
        self.inner.write_state(slot, state)

    def copy_kv_blocks(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Partial KV blocks copied for matches ending inside a block (one launch: the rows summed)."""
        self._spend(self.cost.kv_copy_s(sum(rows for _, _, rows in copies)))
        self.inner.copy_kv_blocks(copies)

    def charge_transfer(self, seconds: float) -> None:
        """A restore's transfer from a lower snapshot tier, the part its queue wait did not hide."""
        self._spend(seconds)

    @property
    def takes_token_lists(self) -> bool:
        """Whether rows may carry their tokens as lists (the inner runner's say: `Engine._run`)."""
        return getattr(self.inner, "takes_token_lists", False)

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        out = self.inner.forward(rows)
        spans = [(r.start_pos, len(r.token_ids)) for r in rows]  # a tensor's numel() was 3 us a row
        # (a one-token row has no capture: an offset o needs 0 < o < n)
        captures = sum([len(r.capture_offsets) for r, (_, n) in zip(rows, spans) if n > 1])
        self._spend(self.cost.forward_s(spans) + captures * self.cost.capture_s)
        self.forwards += 1
        return out
