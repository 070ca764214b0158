"""Upper bound of prefix-cache reuse: an infinite cache that keeps every full block ever computed.

For a request, the reusable prefix at block size B is its longest common prefix with any earlier
sequence, floored to B (a block is reusable only when an earlier sequence had the same tokens up
to its end), and capped so that at least one prompt token is computed, as the engine's warm match
is (BRIEF section 2). Two caches are measured: one that keeps only prompts' blocks, and one that
also keeps the blocks of each request's reply (the `load_reply` tokens, as an engine that caches
decoded tokens would, if it decoded exactly those); under Mooncake's *chains* reading and for
ShareGPT the next turn's prompt contains the reply, so the two differ there.

Block prefixes are identified by 64-bit polynomial hashes of per-block hashes (collisions: about
n^2 / 2^64, under 1e-5 for the 6 M distinct 16-token prefixes of the conversation trace), kept in
a sorted NumPy array per cache (8 bytes per distinct prefix) with a small Python-set front.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from experiments.workloads.request import WorkloadRequest
from kernels.checks import require

_P = 0x9E3779B97F4A7C15 | 1  # odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 2**64)


def _fmix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(33))) * np.uint64(0xFF51AFD7ED558CCD)
    z = (z ^ (z >> np.uint64(33))) * np.uint64(0xC4CEB9FE1A85EC53)
    return z ^ (z >> np.uint64(33))


def _cumulative_powers(base: int, n: int) -> np.ndarray:
    factors = np.full(n, base, dtype=np.uint64)
    factors[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(factors, dtype=np.uint64)


class _Powers:
    """P**k and P**-k modulo 2**64 for k = 0, 1, ..., grown on demand."""

    def __init__(self):
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n:
            size = max(n, 2 * len(self.up))
            self.up, self.down = _cumulative_powers(_P, size), _cumulative_powers(_P_INV, size)
        return self.up[:n], self.down[:n]


def prefix_hashes(tokens: np.ndarray, block: int, powers: _Powers) -> np.ndarray:
    """Hash of tokens[: (k+1) * block] for each full block k: sum_i b_i * P**(k-i) mod 2**64."""
    n = len(tokens) // block
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    with np.errstate(over="ignore"):
        weights = _fmix64(np.arange(1, block + 1, dtype=np.uint64))
        b = _fmix64((tokens[: n * block].astype(np.uint64).reshape(n, block) * weights).sum(axis=1, dtype=np.uint64))
        up, down = powers.get(n)
        return up * np.cumsum(b * down, dtype=np.uint64)


class _HashSet:
    """A growing set of uint64: sorted array + Python-set front, merged when the front fills."""

    FRONT = 1 << 18  # 262,144 entries (~20 MB of Python ints) between merges

    def __init__(self):
        self.sorted = np.zeros(0, dtype=np.uint64)
        self.front: set[int] = set()

    def leading_members(self, hashes: np.ndarray) -> int:
        """How many of `hashes`, from the first, are members (prefix hashes: stop at a miss)."""
        if len(self.sorted):
            at = np.minimum(np.searchsorted(self.sorted, hashes), len(self.sorted) - 1)
            in_sorted = (self.sorted[at] == hashes).tolist()
        else:
            in_sorted = [False] * len(hashes)
        for i, (h, hit) in enumerate(zip(hashes.tolist(), in_sorted)):
            if not (hit or h in self.front):
                return i
        return len(hashes)

    def add_new(self, hashes: np.ndarray) -> None:
        """Add hashes known not to be members (the tail after `leading_members`)."""
        self.front.update(hashes.tolist())
        if len(self.front) >= self.FRONT:
            new = np.sort(np.fromiter(self.front, dtype=np.uint64, count=len(self.front)))
            self.sorted = np.insert(self.sorted, np.searchsorted(self.sorted, new), new)
            self.front = set()

    def __len__(self) -> int:
        return len(self.sorted) + len(self.front)


class PrefixReuse:
    """Accumulates reusable prompt tokens per block size over requests fed in arrival order."""

    def __init__(self, block_sizes: Iterable[int] = (512, 16)):
        self.block_sizes = tuple(sorted(set(block_sizes)))
        require(len(self.block_sizes) >= 1 and self.block_sizes[0] >= 1, "block_sizes",
                f"need sizes >= 1, got {block_sizes}")
        self.unit = self.block_sizes[0]
        require(all(b % self.unit == 0 for b in self.block_sizes), "block_sizes",
                f"each must be a multiple of the smallest ({self.unit}), got {self.block_sizes}")
        self.powers = _Powers()
        self.prompt_cache, self.reply_cache = _HashSet(), _HashSet()
        self.prompt_tokens = 0
        self.reused = {"prompts": dict.fromkeys(self.block_sizes, 0),
                       "prompts+replies": dict.fromkeys(self.block_sizes, 0)}

    def add(self, req: WorkloadRequest) -> None:
        prompt = np.asarray(req.load_prompt(), dtype=np.int64)
        reply = np.asarray(req.load_reply() if req.load_reply else [], dtype=np.int64)
        hashes = prefix_hashes(np.concatenate([prompt, reply]), self.unit, self.powers)
        usable = (len(prompt) - 1) // self.unit  # at least one prompt token is computed
        for label, cache, kept in (("prompts", self.prompt_cache, hashes[: len(prompt) // self.unit]),
                                   ("prompts+replies", self.reply_cache, hashes)):
            lead = cache.leading_members(kept)  # prefix-closed: everything after the first miss is new
            match = min(lead, usable) * self.unit
            for b in self.block_sizes:
                self.reused[label][b] += match // b * b
            cache.add_new(kept[lead:])
        self.prompt_tokens += len(prompt)

    def fractions(self) -> dict[str, dict[int, float]]:
        """Reusable prompt tokens / prompt tokens, per cache and block size."""
        total = max(self.prompt_tokens, 1)
        return {label: {b: n / total for b, n in per.items()} for label, per in self.reused.items()}
