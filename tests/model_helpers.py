"""Shared by the tests/test_model_*.py files: thread count, token draws, the max-abs comparison,
the parameter perturbation of HF parity checkpoints."""

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


@torch.no_grad()
def perturb_parameters(model: torch.nn.Module, seed: int, std_by_suffix: dict[str, float] | None = None,
                       buffer_std_by_suffix: dict[str, float] | None = None) -> None:
    """Move every parameter off its init constant, so a parity test cannot pass on a weight left at
    1 or 0: A = -U(1, 16), dt_bias so that softplus gives dt' in 0.02 .. 0.7, norms and D ~ 1 +-
    0.3, everything else N(0, 0.1) unless `std_by_suffix` names another std for it; buffers named
    in `buffer_std_by_suffix` (e.g. a router's score bias) get N(0, std) after the parameters."""
    g = torch.Generator().manual_seed(seed)
    std_by_suffix = std_by_suffix or {}
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=g) * 15 + 1))
        elif name.endswith("dt_bias"):
            p.copy_(torch.rand(p.shape, generator=g) * 4 - 4)
        elif "norm" in name or name.endswith(".D"):
            p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        else:
            std = next((s for suffix, s in std_by_suffix.items() if name.endswith(suffix)), 0.1)
            p.copy_(std * torch.randn(p.shape, generator=g))
    for name, b in model.named_buffers():
        std = next((s for suffix, s in (buffer_std_by_suffix or {}).items() if name.endswith(suffix)), None)
        if std is not None:
            b.copy_(std * torch.randn(b.shape, generator=g))


def prefilled(model, lens: list[int], slots: list[int], block_size: int, num_slots: int = 6):
    """A paged cache with one sequence of lens[s] + 4 tokens a slot, its first lens[s] prefilled
    (block 0 left unused: pad rows' tables point there): (cache, per-sequence ids, block tables)."""
    from model import SequenceChunk

    need = [-(-(n + 4) // block_size) for n in lens]
    cache = model.allocate_cache(sum(need) + 2, block_size, num_slots)
    ids, tables, k = [], [], 1
    for s, n in enumerate(lens):
        ids.append(tokens(n + 4, 10 + s))
        tables.append(list(range(k, k + need[s])))
        k += need[s]
    model.forward_batch([SequenceChunk(i[:n], 0, t, sl) for i, n, t, sl in zip(ids, lens, tables, slots)], cache)
    return cache, ids, tables
