"""Where to put M snapshots in one sequence so later requests replay the least (the paper's "checkpoints"): an exact
dynamic program, the placement problem of Sparse Prefix Caching (arXiv 2605.05219).

A sequence will be matched by later requests at known depths d_1 < ... < d_k (positions, in
tokens), depth d_i by w_i of them. A request matching at d restores at the deepest snapshot
s <= d and replays d - s tokens more than with a snapshot exactly at d; with no snapshot
below d it restores nothing. Choosing snapshots S, |S| <= M, to maximise the restored tokens

    R(S) = sum_i w_i * max{s in S : s <= d_i}        (0 when no s <= d_i)

is the same as minimising the expected replay. An optimal S lies on the depths themselves
(moving a snapshot up to the next depth at or above it never lowers R), so with snapshots at
depth indices i_1 < ... < i_m, depth j is served by the last i_t <= j:

    R = sum_t d_{i_t} * (w_{i_t} + ... + w_{i_{t+1} - 1})

Let best[m][i] be the most restored over depths i..k with m snapshots, the first at i:

    best[1][i] = d_i * W(i, k)
    best[m][i] = max_{i' > i} d_i * W(i, i' - 1) + best[m - 1][i']

(W(a, b) = w_a + ... + w_b), and the answer is max_i best[m][i] over m <= M. That is O(M k^2)
time here (the paper states O(NM) for N candidate positions; for the k <= a few hundred depths a
Mooncake sequence has, the quadratic inner step is one numpy max per row).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kernels.checks import require


def best_snapshots(depths: Sequence[int], weights: Sequence[float], m: int) -> tuple[float, list[int]]:
    """The most restored tokens with at most `m` snapshots, and where (ascending depths).

    `depths`: distinct positions later requests will match (any order); `weights`: how many
    requests match at each (> 0). Ties go to the fewest and shallowest snapshots."""
    require(m >= 0, "m", f"must be >= 0, got {m}")
    require(len(depths) == len(weights), "weights", f"need one per depth: {len(weights)} for {len(depths)} depths")
    require(len(set(depths)) == len(depths), "depths", "must be distinct")
    require(all(d > 0 for d in depths), "depths", "must be > 0")
    require(all(w > 0 for w in weights), "weights", "must be > 0")
    k = len(depths)
    if k == 0 or m == 0:
        return 0.0, []
    order = np.argsort(np.asarray(depths))
    d = np.asarray(depths, dtype=np.float64)[order]
    w = np.asarray(weights, dtype=np.float64)[order]
    prefix = np.concatenate([[0.0], np.cumsum(w)])  # W(a, b) = prefix[b + 1] - prefix[a]
    m = min(m, k)
    # exact[c][i]: the most over depths i.. with exactly c snapshots, the first at i (-inf: fewer
    # than c depths left); after[c][i]: the depth index of the second one (k: none).
    exact = [d * (prefix[k] - prefix[:k])]
    after = [np.full(k, k, dtype=np.int64)]
    for _ in range(1, m):
        prev = exact[-1]
        cur = np.full(k, -np.inf)
        arg = np.full(k, k, dtype=np.int64)
        for i in range(k - 1):
            # the next snapshot at i' in (i, k): d_i serves depths i..i'-1, the rest as in prev[i']
            gains = d[i] * (prefix[i + 1:k] - prefix[i]) + prev[i + 1:]
            j = int(np.argmax(gains))
            cur[i], arg[i] = gains[j], i + 1 + j
        exact.append(cur)
        after.append(arg)
    value, count, first = 0.0, 0, k
    for c, row in enumerate(exact, start=1):  # at most m: the fewest snapshots win ties
        i = int(np.argmax(row))
        if row[i] > value:
            value, count, first = float(row[i]), c, i
    positions, i = [], first
    for c in range(count, 0, -1):
        positions.append(int(d[i]))
        i = int(after[c - 1][i])
    return value, positions


def restored_tokens(depths: Sequence[int], weights: Sequence[float], snapshots: Sequence[int]) -> float:
    """R(S) for snapshots S (module docstring): each depth restores at the deepest s <= it."""
    s = np.sort(np.asarray(snapshots, dtype=np.int64))
    d = np.asarray(depths, dtype=np.int64)
    at = np.searchsorted(s, d, side="right") - 1
    served = np.where(at >= 0, s[np.maximum(at, 0)], 0) if len(s) else np.zeros_like(d)
    return float(np.dot(np.asarray(weights, dtype=np.float64), served))
