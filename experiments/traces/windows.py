"""Which request windows of a trace tuned a rule or constant (train), which were looked at while
tuning (seen), and which judge it (test): the one place the evaluation protocol names them.

Train windows are those a constant of ours-plus was chosen on (grep `results/LOG.md`):

* Mooncake conversation, requests 0-999 and 5,000-5,999 (`--start 0` / `--start 5000`, 1,000
  requests, the `factorial-mooncake-1000/` and `factorial-mooncake-5000-1000/` records):
  `OURS_PLUS_GRID_TOKENS` (2048) and `OURS_PLUS_UNBOUNDED_GRID_TOKENS` (1024,
  `planner/policies/ours_plus.py`), shadow_best's four candidates, its half-life and its
  `SWITCH_MARGIN` (5%, eighth session: "chosen on the first two windows"), and every eviction
  variant tried and left in the sixth and seventh sessions' tables;
* ShareGPT, requests 0-999 (`factorial-sharegpt-1000/`), reported beside every one of those steps.

Seen windows were run while tuning without choosing a constant on them, so they are not held out
either: Mooncake 2,000-2,999 (the margin's "held out" check, eighth session), the window shifts
25 / 50 / 100 (`window-shift/`, requests 25-1,099), and ShareGPT 1,000-4,999 (the `sharegpt-5000/`
record, requests 0-4,999).

Test windows, by one stated rule (`held_out`): take the stretches of the trace that no train
or seen window touches; tile each stretch with as many disjoint `width`-request windows as fit,
the stretch's slack (its length modulo `width`) put before the first window at an offset drawn
from `numpy.random.default_rng(seed)` (seed `TEST_SEED`, the issue's number), stretch by stretch
in trace order; if more windows than `count` result, split them in trace order into `count`
near-equal consecutive groups and draw one window from each with the same generator. So the test
windows cover the trace's held-out stretches end to end (not only near the start), never overlap
each other or a train or seen window, and the same seed gives the same windows. A constant chosen
on the train windows is never re-chosen on these.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from kernels.checks import require

TEST_SEED = 32  # issue 32
WINDOW_REQUESTS = 1000
SPLITS = ("train", "seen", "test", "whole")


@dataclasses.dataclass(frozen=True)
class Window:
    """Requests [start, start + limit) of `trace` (0-based, in the trace's arrival order)."""

    trace: str
    start: int
    limit: int
    split: str
    why: str = ""

    def __post_init__(self):
        require(self.start >= 0, "start", f"must be >= 0, got {self.start}")
        require(self.limit >= 1, "limit", f"must be >= 1, got {self.limit}")
        require(self.split in SPLITS, "split", f"must be one of {SPLITS}, got {self.split!r}")

    @property
    def end(self) -> int:
        return self.start + self.limit

    def overlaps(self, other: "Window") -> bool:
        return self.start < other.end and other.start < self.end

    def label(self) -> str:
        return f"{self.start:,}-{self.end - 1:,}"


_TUNED = ("ours-plus's grid constants (2048 / 1024), shadow_best's candidates, half-life and 5% switch margin; "
          "results/LOG.md 2026-12-02 to 2026-12-03")
TRAIN: dict[str, tuple[Window, ...]] = {
    "mooncake-conversation": (
        Window("mooncake-conversation", 0, 1000, "train", _TUNED + "; results/traces/factorial-mooncake-1000/"),
        Window("mooncake-conversation", 5000, 1000, "train",
               _TUNED + "; results/traces/factorial-mooncake-5000-1000/"),
    ),
    "sharegpt": (
        Window("sharegpt", 0, 1000, "train", "reported beside every tuning step; results/traces/factorial-sharegpt-1000/"),
    ),
}
SEEN: dict[str, tuple[Window, ...]] = {
    "mooncake-conversation": (
        Window("mooncake-conversation", 25, 1075, "seen",
               "window shifts 25 / 50 / 100 of the first 1,000 (results/traces/window-shift/)"),
        Window("mooncake-conversation", 2000, 1000, "seen",
               "shadow_best's margin checked there (results/LOG.md, eighth session)"),
    ),
    "sharegpt": (
        Window("sharegpt", 1000, 4000, "seen", "the sharegpt-5000 record (requests 0-4,999)"),
    ),
}


def excluded(trace: str) -> tuple[Window, ...]:
    """The train and seen windows of `trace` (none for a trace nothing was tuned on)."""
    return TRAIN.get(trace, ()) + SEEN.get(trace, ())


def free_stretches(total: int, taken: Iterable[Window]) -> list[tuple[int, int]]:
    """[start, end) stretches of requests 0..total-1 that no window in `taken` touches, in order."""
    require(total >= 1, "total", f"must be >= 1, got {total}")
    out, at = [], 0
    for w in sorted(taken, key=lambda w: w.start):
        if w.start > at:
            out.append((at, min(w.start, total)))
        at = max(at, w.end)
    if at < total:
        out.append((at, total))
    return [(a, b) for a, b in out if b > a]


def held_out(trace: str, total: int, width: int = WINDOW_REQUESTS, count: int | None = None,
                 seed: int = TEST_SEED, taken: Sequence[Window] | None = None) -> list[Window]:
    """The held-out windows of `trace` (`total` requests) by the module's rule; `taken`: the
    windows to keep out (default: its train and seen windows)."""
    import numpy as np

    require(width >= 1, "width", f"must be >= 1, got {width}")
    require(count is None or count >= 1, "count", f"must be >= 1 or None, got {count}")
    rng = np.random.default_rng(seed)
    taken = excluded(trace) if taken is None else tuple(taken)
    tiles = []
    for a, b in free_stretches(total, taken):
        fits, slack = divmod(b - a, width)
        if not fits:
            continue
        offset = int(rng.integers(0, slack + 1))
        tiles += [a + offset + k * width for k in range(fits)]
    if count is not None and len(tiles) > count:
        groups = np.array_split(np.arange(len(tiles)), count)
        tiles = [tiles[int(rng.choice(g))] for g in groups]
    why = f"held out: tiles of the stretches no train or seen window touches (seed {seed})"
    return [Window(trace, s, width, "test", why) for s in tiles]


def protocol(trace: str, total: int, width: int = WINDOW_REQUESTS, count: int | None = None,
             seed: int = TEST_SEED, whole: bool = False) -> list[Window]:
    """The train windows, then the test windows, then (with `whole`) the whole trace."""
    train = list(TRAIN.get(trace, ()))
    require(all(w.end <= total for w in train), "total",
            f"{trace}: a train window ends past the trace's {total} requests")
    out = train + held_out(trace, total, width, count, seed)
    return out + ([Window(trace, 0, total, "whole", "the whole trace (it holds the train windows)")] if whole else [])
