"""Shared by the tests/test_model_*.py files: thread count, token draws, the max-abs comparison."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny shapes: one thread. With the 2 cores shared, OpenMP barriers around 1-ms matmuls made a
    tiny forward 100x slower (1.2 s vs 10 ms) at 2 threads. Import into a test module to apply it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tokens(n: int, seed: int, vocab: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference of same-shaped tensors, in fp32; NaN in `a` fails."""
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    assert not torch.isnan(a).any(), "NaN in the result"
    return (a.float() - b.float()).abs().max().item()
