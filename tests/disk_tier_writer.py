"""A process that spills snapshots to a disk tier until it is killed (tests/test_disk_restart.py).

    .venv/bin/python -m tests.disk_tier_writer FOLDER [--prompts 12] [--seed 0] [--kill-at-op N --fraction F]

It serves `prompts(seed, n)` one after another on the tiny model (seed 0) with a device that holds
one snapshot (`restart_engine`), so each prompt's snapshot at 80 pushes the previous one to disk:
every prompt after the first is a file write, an index append, and the drops of the disk tier's
evictions. It prints "ready" once the model is built and "served i" after each prompt. With
`--kill-at-op N` it SIGKILLs itself at its N-th file operation, after writing the first fraction F
of that operation's bytes (`KillingOps`); without it, the test kills it at a random time.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

from model.engine import Engine
from model.engine.spill import FileOps, FileSpill
from model.loading import from_preset
from planner.snapshot_tiers import disk_tier

PROMPT_LEN = 100  # aligned saves the split point 99 // 16 * 16 - 16 = 80
SNAPSHOT_AT = 80
DISK_SNAPSHOTS = 6  # the disk tier's budget, in snapshots: a longer run evicts from disk too


def prompts(seed: int, n: int) -> list[list[int]]:
    """n prompts of PROMPT_LEN tokens; the first tokens differ, so no two share a block."""
    gen = torch.Generator().manual_seed(seed)
    return [[3 + i] + torch.randint(3, 256, (PROMPT_LEN - 1,), generator=gen).tolist() for i in range(n)]


def restart_engine(model, spill, **extra) -> Engine:
    """The device holds one snapshot, the disk DISK_SNAPSHOTS (a FileSpill over `spill`'s folder)."""
    one = model.allocate_cache(1, 16, 1).state_bytes_per_slot
    tiers = (disk_tier(DISK_SNAPSHOTS * one / 1e9, spill=spill),) if spill is not None else ()
    settings = dict(block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=1024, policy="aligned",
                    keep_prompt_logits=True, snapshot_byte_budget=one, snapshot_lower_tiers=tiers) | extra
    return Engine.for_model(model, **settings)


class KillingOps(FileOps):
    """File operations that SIGKILL the process at operation `at` (0-based), after writing the first
    `fraction` of that operation's bytes (a rename or unlink is done or not: fraction >= 0.5 does it)."""

    def __init__(self, at: int | None, fraction: float, die=None, durable: bool = True):
        super().__init__(durable)
        self.at, self.fraction, self.count = at, fraction, 0
        self.die = die or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self.log: list[str] = []  # the operations done, by kind (the crash tests' tally)

    def _now(self, kind: str) -> bool:
        self.log.append(kind)
        self.count += 1
        return self.count - 1 == self.at

    def write_file(self, path, data):
        if self._now("write_file"):
            with open(path, "xb") as f:
                f.write(data[: int(len(data) * self.fraction)])
            self.die()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            FileOps.write(self, fd, data)  # one operation: not counted again as an append
        finally:
            os.close(fd)

    def write(self, fd, data):
        if self._now("append"):
            os.write(fd, data[: int(len(data) * self.fraction)])
            self.die()
        super().write(fd, data)

    def replace(self, src, dst):
        if self._now("replace"):
            if self.fraction >= 0.5:
                os.replace(src, dst)
            self.die()
        super().replace(src, dst)

    def unlink(self, path):
        if self._now("unlink"):
            if self.fraction >= 0.5:
                path.unlink(missing_ok=True)
            self.die()
        super().unlink(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.disk_tier_writer")
    ap.add_argument("folder")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kill-at-op", type=int, default=None)
    ap.add_argument("--fraction", type=float, default=0.5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = from_preset("tiny", seed=0)
    ops = KillingOps(args.kill_at_op, args.fraction) if args.kill_at_op is not None else None
    eng = restart_engine(model, FileSpill(args.folder, ops=ops))
    print("ready", flush=True)
    for i, p in enumerate(prompts(args.seed, args.prompts)):
        eng.add_request(p, max_new_tokens=1)
        eng.run_until_done()
        print(f"served {i}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
