"""Memory tiers below the device for SSM-state snapshots: host DRAM and disk.

A snapshot the device budget cannot keep is demoted one tier down instead of dropped; it stays
findable by lookup, and restoring it costs its transfer back to the device (`Tier.transfer_s`),
after which it is promoted to the device again. The bandwidths are stated once here and
overridable per tier:

* host: PCIe 5 x16, ~50 GB/s host to device (the brief, section 6: a 62.3 MB Bamba-9B snapshot
  loads in ~1.3 ms), plus ~10 us to start a copy;
* disk: NVMe, ~7 GB/s sequential read, plus ~100 us to the first byte.

Recomputing the 2,048 tokens such a snapshot spares takes tens of ms on an H100-class device, so a
host tier is nearly free next to recompute and a disk tier is cheap; both are bounded by their
own byte budgets. A disk tier whose spill records what it holds (`Spill.recorded`: the engine's
`model.engine.spill.FileSpill`, an index beside its files, keyed by the model's identity) survives
a restart: a new store over it adopts those snapshots as its disk tier's residents.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from kernels.checks import require

GB = 10**9
HOST_GB_PER_S = 50.0  # PCIe 5 x16, host to device
HOST_LATENCY_S = 10e-6
DISK_GB_PER_S = 7.0  # NVMe sequential read
DISK_LATENCY_S = 100e-6


@dataclasses.dataclass(frozen=True)
class Tier:
    """One tier below the device: its name, byte budget (None: unbounded), the bandwidth a restore
    reads it at, and a fixed latency per restore."""

    name: str
    byte_budget: int | None
    gb_per_s: float
    latency_s: float = 0.0
    # Where its states really go (`Spill`): None keeps them as they are (the simulator, and a host tier
    # on a machine whose "device" is host memory); the engine's disk tier writes files (model/engine/spill.py).
    spill: Any = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        require(self.name not in ("", "device"), "name", f"a lower tier needs its own name, got {self.name!r}")
        require(self.byte_budget is None or self.byte_budget >= 0, "byte_budget",
                f"must be >= 0 or None (unbounded), got {self.byte_budget}")
        require(self.gb_per_s > 0, "gb_per_s", f"must be > 0, got {self.gb_per_s}")
        require(self.latency_s >= 0, "latency_s", f"must be >= 0, got {self.latency_s}")

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to bring `nbytes` from this tier to the device."""
        return self.latency_s + nbytes / (self.gb_per_s * GB)


def host_tier(gb: float, gb_per_s: float = HOST_GB_PER_S, latency_s: float = HOST_LATENCY_S) -> Tier:
    """A host-memory tier of `gb` GB (10^9 bytes)."""
    require(gb >= 0, "host_gb", f"must be >= 0, got {gb}")
    return Tier("host", int(gb * GB), gb_per_s, latency_s)


def disk_tier(gb: float, gb_per_s: float = DISK_GB_PER_S, latency_s: float = DISK_LATENCY_S,
              spill: Any = None) -> Tier:
    """A disk tier of `gb` GB (10^9 bytes); `spill`: where its states are written (None: kept as they are)."""
    require(gb >= 0, "disk_gb", f"must be >= 0, got {gb}")
    return Tier("disk", int(gb * GB), gb_per_s, latency_s, spill)


class SpillError(Exception):
    """A spilled snapshot that cannot be read back as written (missing, truncated, checksum mismatch)."""


@dataclasses.dataclass(frozen=True)
class SpillEntry:
    """What a spilled state is the state of, written beside it so that a later store over the same
    spill can find it (`Spill.recorded`): its prefix's key (`Snapshot.key`: the chained hash of the
    full blocks below `position` and the tokens above them) and the bookkeeping eviction reads.
    `prefix_tokens`: its tokens [0, position), only where the store kept them (an eviction that
    reads prefixes, `needs_prefix`)."""

    position: int
    anchor: bytes | None
    tail: tuple[int, ...]
    nbytes: int
    origin: str = "chunk"
    flops_saved: float = 0.0
    prefix_tokens: Any = dataclasses.field(default=None, compare=False)


class Spill(Protocol):
    """Where a tier keeps snapshot states off the device's memory (a folder of files, say).

    Optional `recorded() -> list[(SpillEntry, handle)]`: what was spilled here before this store
    existed (an earlier process's), oldest first; a new store adopts them as residents of the tier
    (`SnapshotStore`), reads them back with `get` and forgets them with `drop` as its own."""

    def put(self, state: Any, entry: SpillEntry) -> Any:
        """Write `state`, the state `entry` describes; returns the handle `get` reads it back with
        (with `.nbytes`)."""

    def get(self, handle: Any) -> Any:
        """The state written under `handle`, checked; SpillError when it is gone or not what was written."""

    def drop(self, handle: Any) -> None:
        """Forget `handle` (delete what it names); missing is fine."""
