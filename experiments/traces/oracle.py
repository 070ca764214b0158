"""The offline optimum's capture positions: where, in whose run, a later request will match.

Knowing the whole trace, request j's KV match with an unbounded KV cache is the longest prefix of
its prompt, in whole KV blocks and capped to leave one token, that some earlier request computed:
its prompt + reply without the reply's last token (the last sampled token is never fed back, so
the KV never holds it). The first request o that computed that prefix leaves a snapshot there,
and j restores exactly at its match. `optimum_marks` gives, per request index, every such
position of its own computed sequence (its `Request.snapshot_marks`): inside its prefill the
planner captures it (strictly inside (restore point, prompt end)); at its prompt end or inside
its reply the engine saves the state after the row that ends there (the last prefill chunk, a
decode row), on top of the decode-time state it keeps at finish (one per request, at the last
decode-grid point only, which a match elsewhere in the reply or at the prompt end would miss).

With unbounded snapshot memory and a KV cache that keeps everything, restoring every match is
the most any placement can reach, so the policy that captures these positions (`optimum`) is the
upper bound of the Sparse Prefix Caching (arXiv 2605.05219) dynamic program's objective there.
The matches assume each owner has finished when its follower arrives; one that arrives while
its owner still decodes matches only the blocks computed so far, a position set by the
schedule's timing that no mark foresees (the first 1,000 Mooncake conversation requests read as
chains have one such request: 1,632 of 2.5 million KV-hit tokens lost, unbounded).

Under a snapshot budget the problem is no longer that paper's: its program places M checkpoints in
one retained entry for a known distribution of overlap depths, while here entries come and go
over an hour and the budget bounds what is held at once. Every snapshot of a shape has the same
size, so we keep the captures above and let Belady's MIN decide what stays: `optimum_uses` gives,
per snapshot key, the requests that will restore it, and `planner.evictions.next_use.NextUseEviction` evicts
(or declines) the one used farthest ahead. That is optimal for the number of restores; for
restored tokens it is a strong reference, not a proven bound (restores spare different amounts).

Prefixes are identified by 64-bit rolling hashes of the tokens (`prefix_hashes_from` below),
taken at block ends; a collision (about n^2 / 2^64 for n distinct prefixes) would only add a mark.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from experiments.workloads.request import WorkloadRequest
from planner.block_pool import hash_full_blocks

_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_P_INT = int(_P)


class Powers:
    """P**k modulo 2**64 and the inverse powers, grown on demand."""

    def __init__(self):
        self.up = np.ones(1, np.uint64)
        self.down = np.ones(1, np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n + 1:
            size = max(n + 1, 2 * len(self.up))
            with np.errstate(over="ignore"):
                f = np.full(size, _P, np.uint64)
                f[0] = 1
                self.up = np.cumprod(f, dtype=np.uint64)
                g = np.full(size, np.uint64(pow(_P_INT, -1, 1 << 64)), np.uint64)
                g[0] = 1
                self.down = np.cumprod(g, dtype=np.uint64)
        return self.up, self.down


def prefix_hashes_from(h0: int, tokens: np.ndarray, powers: Powers) -> np.ndarray:
    """Rolling hashes after each token: h_{i+1} = h_i * P + token_i + 1 (mod 2**64), from h0."""
    n = len(tokens)
    up, down = powers.get(n)
    with np.errstate(over="ignore"):
        # h_i = P**(i+1) * (h0 + sum_{j<=i} (t_j + 1) * P**-(j+1))
        terms = (tokens.astype(np.uint64) + np.uint64(1)) * down[1:n + 1]
        return up[1:n + 1] * (np.uint64(h0) + np.cumsum(terms, dtype=np.uint64))


def optimum_matches(requests: Sequence[WorkloadRequest], block_size: int = 16) -> list[tuple[int, int, int]]:
    """(request index, first owner's index, position) per request with a KV match (module docstring):
    the owner is the first request whose computed sequence (prompt + reply but its last token) has it."""
    powers = Powers()
    hashes, owners = [], []
    for req in requests:
        seq = np.asarray(req.prompt_ids(), dtype=np.int64)
        reply = req.reply_ids()
        if reply is not None:  # the KV holds the reply but its last token (sampled, never fed back)
            seq = np.concatenate([seq, np.asarray(reply, dtype=np.int64)[:-1]])
        h = prefix_hashes_from(0, seq, powers)[block_size - 1::block_size]
        hashes.append(h)
        owners.append(np.full(len(h), req.index, dtype=np.int64))
    if not hashes:
        return []
    flat = np.concatenate(hashes)
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    first_owner = np.concatenate(owners)[first][inverse]  # per block: the first request that had its prefix
    out = []
    at = 0
    for req, h in zip(requests, hashes):
        usable = (req.prompt_len - 1) // block_size
        earlier = first_owner[at:at + usable] < req.index
        matched = usable if earlier.all() else int(np.argmin(earlier))
        if matched:
            out.append((req.index, int(first_owner[at + matched - 1]), matched * block_size))
        at += len(h)
    return out


def optimum_marks(requests: Sequence[WorkloadRequest], block_size: int = 16,
                  matches: Sequence[tuple[int, int, int]] | None = None) -> dict[int, list[int]]:
    """Request index -> positions of its computed sequence (prompt, then reply) a later request's
    match lands on (module docstring)."""
    marks: dict[int, set[int]] = {}
    for _, owner, position in optimum_matches(requests, block_size) if matches is None else matches:
        marks.setdefault(owner, set()).add(position)
    return {i: sorted(m) for i, m in marks.items()}


def optimum_uses(requests: Sequence[WorkloadRequest], block_size: int = 16,
                 matches: Sequence[tuple[int, int, int]] | None = None) -> dict[tuple, list[int]]:
    """Snapshot key (`planner.snapshot_store.Snapshot.key`) -> the requests that will restore it:
    the future `NextUseEviction` needs under a budget. The key of a match at a block end is the
    chained sha256 of the prompt's blocks below it and an empty tail, as the engine computes it."""
    by_index = {req.index: req for req in requests}
    uses: dict[tuple, list[int]] = {}
    for index, _, position in optimum_matches(requests, block_size) if matches is None else matches:
        anchor = hash_full_blocks(by_index[index].prompt_ids()[:position], block_size)[-1]
        uses.setdefault((anchor, ()), []).append(index)
    return uses
