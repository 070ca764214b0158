"""The `triton` backend (kernels: the interpreter on a CPU, the GPU where there is one) == the `torch`
backend (references, on the CPU).

Same "tiny" (Bamba) or "granite-tiny" (GraniteMoeHybrid) weights, fp32, a mixed schedule: prefill rows with in-pass captures, rows resuming
from pool states, decode rows. The Triton scan tiles by the config's 16-token chunk, so the
45-token sequences cross several scan chunks (the torch reference uses one 128-token chunk:
the two backends cut the scan differently and must still agree).
"""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE
from model import SequenceChunk, from_preset
from model.backends import BACKENDS, Capabilities, get_backend
from model_helpers import max_abs, one_thread, tokens  # noqa: F401  (one_thread: autouse)

LOGIT_ATOL = 1e-4  # fp32 logits, max abs (as the chunked == whole tests)
STATE_ATOL = 1e-5  # fp32 conv / SSM states and KV, max abs
BLOCK_SIZE = 16  # the Triton paged-attention kernel takes pages of 16..256 tokens


def test_backends_declare_their_capabilities_and_the_model_never_checks_a_name():
    """Where the backends differ beyond the ops' signatures, each declares it (issue 19); the model
    reads the declaration, and no source line of the model compares a backend's name."""
    import pathlib
    import re

    assert BACKENDS == ("torch", "triton")
    torch_ops, triton_ops = get_backend("torch"), get_backend("triton")
    assert torch_ops.capabilities == Capabilities() and torch_ops.conv_widths is None  # any width
    assert triton_ops.capabilities == Capabilities(scan_chunk_from_config=True, scan_state_pool=True,
                                                   conv_state_pool=True, conv_width_per_kernel=True)
    assert triton_ops.conv_widths == (4,)  # both conv kernels' WIDTH
    root = pathlib.Path(__file__).resolve().parents[1] / "model"
    by_name = [f"{p.relative_to(root.parent)}:{i}" for p in sorted(root.rglob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if re.search(r"""[!=]=\s*["'](?:torch|triton)["']""", line)]
    assert not by_name, by_name


@pytest.fixture(scope="module")
def device():
    """Where the Triton model runs: the GPU when there is one (scripts/gpu_check.sh), else the CPU
    (the interpreter). The torch backend, the reference, stays on the CPU."""
    return DEVICE


@pytest.fixture(scope="module", params=["tiny", "granite-tiny"])
def models(request, device):
    # Both initialized on the CPU (the seeded init draws on the model's device), then moved.
    return {"torch": from_preset(request.param, backend="torch", seed=0),
            "triton": from_preset(request.param, backend="triton", seed=0).to(device)}


def test_same_weights(models, device):
    assert models["triton"].device.type == torch.device(device).type
    for (name, a), b in zip(models["torch"].state_dict().items(), models["triton"].state_dict().values()):
        assert torch.equal(a, b.cpu()), name
    assert models["triton"].backend == "triton" and models["torch"].backend == "torch"


def test_plain_logits_agree(models):
    ids = tokens(45, 0)
    err = max_abs(models["triton"].logits(ids).cpu(), models["torch"].logits(ids))
    assert err <= LOGIT_ATOL, err


# (sequence, slot, [(start, n, capture_offsets), ...]) per step; slots 0..2
SCHEDULE = [
    {"A": (0, 30, (7, 19)), "B": (0, 20, (16,)), "C": (0, 1, ())},
    {"A": (30, 1, ()), "B": (20, 13, (5,)), "C": (1, 1, ())},
    {"A": (31, 14, (9,)), "B": (33, 1, ()), "C": (2, 1, ())},
]
SEQS = {"A": (tokens(45, 1), 0, [3, 0, 5]), "B": (tokens(34, 2), 1, [1, 4, 6]), "C": (tokens(3, 3), 2, [2])}


def _run(model):
    cache = model.allocate_cache(8, BLOCK_SIZE, 3)
    steps = []
    for step in SCHEDULE:
        rows = [SequenceChunk(SEQS[s][0][st:st + n], st, SEQS[s][2], SEQS[s][1], capture_offsets=offs, all_logits=True)
                for s, (st, n, offs) in step.items()]
        steps.append(model.forward_batch(rows, cache))
    return steps, cache


def test_forward_batch_agrees_logits_captures_states(models):
    (ref_steps, ref_cache), (tri_steps, tri_cache) = _run(models["torch"]), _run(models["triton"])
    whole = {s: models["torch"].logits(ids) for s, (ids, _, _) in SEQS.items()}
    n_captures = 0
    for step, ref, tri in zip(SCHEDULE, ref_steps, tri_steps):
        for r, (s, (st, n, offs)) in enumerate(step.items()):
            assert max_abs(tri.logits[r].cpu(), ref.logits[r]) <= LOGIT_ATOL, (s, st)
            assert max_abs(tri.logits[r].cpu(), whole[s][st:st + n]) <= LOGIT_ATOL, (s, st)
            assert len(tri.captured[r]) == len(ref.captured[r]) == len(offs)
            for a, b in zip(tri.captured[r], ref.captured[r]):
                for x, y in zip(a.conv + a.ssm, b.conv + b.ssm):
                    assert max_abs(x.cpu(), y) <= STATE_ATOL, (s, st)
                n_captures += 1
    assert n_captures == 5
    for slot in range(3):
        a, b = tri_cache.read_state(slot), ref_cache.read_state(slot)
        for x, y in zip(a.conv + a.ssm, b.conv + b.ssm):
            assert max_abs(x.cpu(), y) <= STATE_ATOL, slot
            assert y.abs().max() > 1e-3
    for layer in models["torch"].config.attn_layer_indices:
        assert max_abs(tri_cache.key_cache[layer].cpu(), ref_cache.key_cache[layer]) <= STATE_ATOL
        assert max_abs(tri_cache.value_cache[layer].cpu(), ref_cache.value_cache[layer]) <= STATE_ATOL
