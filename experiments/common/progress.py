"""Progress of a long run: a timestamped line with done/total, rate and ETA.

Why not tqdm or rich: runs are read back from log files and CI output as often as watched live,
and a carriage-return bar turns into thousands of lines there; one plain line every `every_s`
seconds (and at the end) reads the same in both, and needs no dependency on the GPU machine,
which has no network.
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator, TypeVar

from experiments.common.results_io import log

T = TypeVar("T")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """`with Progress(total, "points") as p: ... p.advance()`; prints at most one line per `every_s`."""

    def __init__(self, total: int, unit: str, every_s: float = 10.0, clock=time.monotonic):
        self.total, self.unit, self.every_s, self.clock = total, unit, every_s, clock
        self.done, self.last_printed = 0, -1
        self.start = self.last = clock()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None and self.done and self.last_printed != self.done:
            self._print()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            self._print(note)

    def line(self, note: str = "") -> str:
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else None
        rate_text = f"{rate:.2f} {self.unit}/s" if rate < 10 else f"{rate:.0f} {self.unit}/s"
        parts = [f"{self.done}/{self.total} {self.unit} ({pct:.0f}%)", rate_text,
                 f"elapsed {_clock(elapsed)}", f"ETA {_clock(eta) if eta is not None else '?'}"]
        return ", ".join(parts) + (f"; {note}" if note else "")

    def _print(self, note: str = "") -> None:
        self.last_printed = self.done
        log(self.line(note))


def track(items: Iterable[T], total: int, unit: str, every_s: float = 10.0) -> Iterator[T]:
    """Iterate `items`, printing progress as each one finishes."""
    with Progress(total, unit, every_s) as p:
        for item in items:
            yield item
            p.advance()
