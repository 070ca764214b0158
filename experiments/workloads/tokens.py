"""Deterministic pseudo-random token ids for traces that carry no text (Mooncake).

Every token is a pure function of (stream kind, stream key, offset), so a 512-token block seeded by
hash id h is the same array wherever h appears, and a reply seeded by a request's line index is
the same array in every later prompt that contains it. The function is splitmix64 (Steele et
al., OOPSLA'14) written in NumPy integer arithmetic: the same ids on every platform and NumPy
version, unlike `numpy.random`, whose streams may change between releases.
"""

from __future__ import annotations

import numpy as np

from kernels.checks import require

BLOCK = 0  # stream kind: one 512-token block of a Mooncake prompt, keyed by its hash id
REPLY = 1  # stream kind: a request's reply, keyed by the request's index in its trace

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _fmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on a uint64 array (wraps modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def expand(kinds: np.ndarray, keys: np.ndarray, offsets: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids in [0, vocab_size) for per-token (kind, key, offset) arrays of equal length.

    Token = the (offset+1)-th splitmix64 output of the stream seeded by fmix(2 * key + kind),
    scaled to the vocabulary by a multiply-shift (no modulo bias). Returns int64.
    """
    require(1 <= vocab_size < 2**32, "vocab_size", f"must be in [1, 2**32), got {vocab_size}")
    with np.errstate(over="ignore"):
        seed = _fmix64(np.asarray(keys, dtype=np.uint64) * np.uint64(2) + np.asarray(kinds, dtype=np.uint64))
        z = _fmix64(seed + (np.asarray(offsets, dtype=np.uint64) + np.uint64(1)) * _GOLDEN)
        return ((z >> np.uint64(32)) * np.uint64(vocab_size) >> np.uint64(32)).astype(np.int64)


def block_tokens(hash_id: int, vocab_size: int, block_size: int = 512) -> np.ndarray:
    """The `block_size` token ids of the block with this hash id."""
    offsets = np.arange(block_size)
    return expand(np.full(block_size, BLOCK), np.full(block_size, hash_id), offsets, vocab_size)


def reply_tokens(request_index: int, length: int, vocab_size: int) -> np.ndarray:
    """The `length` token ids of the reply of the request at this index of its trace."""
    return expand(np.full(length, REPLY), np.full(length, request_index), np.arange(length), vocab_size)
