"""The offline optimum's capture positions: where, in whose prefill, a later request will match.

Knowing the whole trace, request j's KV match with an unbounded KV cache is the longest prefix of
its prompt, in whole KV blocks and capped to leave one token, that some earlier sequence (prompt
+ reply) also had. The first request o that had that prefix computed it; a snapshot there, taken
during o's prefill (or, inside o's reply, by its decode-time state), lets j restore exactly at its
match. `optimum_marks` gives, per request index, the positions of its own prompt to capture.

With unbounded snapshot memory and a KV cache that keeps everything, restoring every match is
the most any placement can reach, so the policy that captures these positions (`optimum`) is the
upper bound of the Sparse Prefix Caching (arXiv 2605.05219) dynamic program's objective there.
Under a snapshot budget we do not solve that program: `optimum` then keeps LRU eviction and is a
reference, not a bound.

Prefixes are identified by 64-bit rolling hashes of the tokens (`runner.prefix_hashes_from`),
taken at block ends; a collision (about n^2 / 2^64 for n distinct prefixes) would only add a mark.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from experiments.traces.runner import Powers, prefix_hashes_from
from experiments.workloads.request import WorkloadRequest


def optimum_marks(requests: Sequence[WorkloadRequest], block_size: int = 16) -> dict[int, list[int]]:
    """Request index -> positions of its prompt a later request's match lands on (module docstring)."""
    powers = Powers()
    hashes, owners, plens = [], [], []
    for req in requests:
        seq = np.asarray(req.prompt_ids(), dtype=np.int64)
        reply = req.reply_ids()
        if reply is not None:
            seq = np.concatenate([seq, np.asarray(reply, dtype=np.int64)])
        h = prefix_hashes_from(0, seq, powers)[block_size - 1::block_size]
        hashes.append(h)
        owners.append(np.full(len(h), req.index, dtype=np.int64))
        plens.append(req.prompt_len)
    if not hashes:
        return {}
    flat = np.concatenate(hashes)
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    first_owner = np.concatenate(owners)[first][inverse]  # per block: the first request that had its prefix
    marks: dict[int, set[int]] = {}
    at = 0
    for req, h in zip(requests, hashes):
        usable = (req.prompt_len - 1) // block_size
        earlier = first_owner[at:at + usable] < req.index
        at += len(h)
        matched = usable if earlier.all() else int(np.argmin(earlier))
        if matched == 0:
            continue
        owner = int(first_owner[at - len(h) + matched - 1])
        position = matched * block_size
        if position < plens[owner]:
            marks.setdefault(owner, set()).add(position)
    return {i: sorted(m) for i, m in marks.items()}
