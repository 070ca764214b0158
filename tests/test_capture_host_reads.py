"""Nothing in a CUDA-graph capture region reads a device tensor on the host, debug checks included.

PyTorch refuses a host read (`.item()`, `.tolist()`, `int(t)`, a data-dependent shape) and a
blocking host-to-device copy while a stream captures, so a launcher's device-reading debug check
(on throughout the suite, tests/conftest.py) would break `model.decode_graph`'s capture: the
checks are off while `kernels.checks.capturing()` holds. The CPU has no capture, so this file
fakes one: PyTorch's capture predicates (`torch.cuda.is_initialized`,
`torch.cuda.is_current_stream_capturing`) report True inside the region, and `tests/step_counter.py`
counts the host reads made there (launches excluded: on a GPU the interpreter's copies are the
launch). The region runs the decode bucket step as `DecodeGraphs._capture` records it: ssd_decode,
conv1d_decode, kv_cache_write and paged attention on the bucket's plan. Before the switch knew
about captures, the step read slots and lengths back in every Mamba and attention layer here.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from kernels import checks
from kernels.contracts.varlen import check_seqlens, check_state_pool
from model import SequenceChunk, from_preset
from model.decode_graph import DecodeGraphs
from model_helpers import one_thread, prefilled  # noqa: F401  (one_thread: autouse)
from step_counter import StepCounter

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="on a GPU, test_decode_graph.py's graph tests capture for real")

BLOCK = 4


@contextlib.contextmanager
def fake_capture(monkeypatch):
    """A region that PyTorch's predicates, and so `kernels.checks.capturing`, call a capture."""
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_initialized", lambda: True)
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        yield


def _host_reads(counter: StepCounter) -> dict[str, list[str]]:
    """Per layer tag (or "step"), the syncs and host-data tensors counted, where there were any."""
    out = {}
    for tag in set(counter.syncs) | set(counter.creations):
        what = counter.syncs.get(tag, []) + counter.creations.get(tag, [])
        if what:
            out[tag] = what
    return out


@pytest.fixture(scope="module")
def bucket_step():
    """The tiny hybrid (Mamba, attention, Mamba; triton backend) with 3 prefilled sequences, their
    first decode step filled into bucket 4 (one pad row): (model, graphs, bucket)."""
    model = from_preset("tiny", backend="triton", seed=0)
    lens, slots = [9, 14, 5], [4, 0, 2]
    cache, ids, tables = prefilled(model, lens, slots, BLOCK)
    graphs = DecodeGraphs(model, cache, max_blocks=8, use_graphs=False)
    b = graphs._bucket(graphs.bucket_for(3))
    b.fill([SequenceChunk(i[n:n + 1], n, t, sl) for i, t, sl, n in zip(ids, tables, slots, lens)], BLOCK)
    return model, graphs, b


def test_decode_step_reads_nothing_on_the_host_while_capturing(bucket_step, monkeypatch):
    model, graphs, b = bucket_step
    assert checks.debug_checks(), "the suite runs with the debug checks on (tests/conftest.py)"
    kinds = sorted(layer.kind for layer in model.layers)
    assert kinds == ["attention", "mamba", "mamba"], kinds
    counter = StepCounter(model)
    with fake_capture(monkeypatch), monkeypatch.context() as m, counter.installed(m):
        logits = graphs._step(b)
    assert _host_reads(counter) == {}, f"host reads inside the capture region: {_host_reads(counter)}"
    launched = {name for per_layer in counter.launches.values() for name in per_layer}
    assert {"_ssd_decode_kernel", "_conv1d_decode_kernel", "kv_cache_write_kernel",
            "paged_attention_kernel"} <= launched, launched
    assert logits.shape[0] == b.size and torch.isfinite(logits).all()


def test_same_step_reads_slots_and_lengths_outside_a_capture(bucket_step, monkeypatch):
    """Outside a capture the debug checks do read the device back, in every Mamba and attention
    layer: the count above is of a step that would read, not of one with nothing to find."""
    model, graphs, b = bucket_step
    counter = StepCounter(model)
    with monkeypatch.context() as m, counter.installed(m):
        graphs._step(b)
    reads = _host_reads(counter)
    for i, layer in enumerate(model.layers):
        assert reads.get(f"{i}:{layer.kind}"), f"layer {i} ({layer.kind}): no debug read counted: {reads}"


def test_varlen_contract_checks_skip_device_reads_while_capturing(monkeypatch):
    """The plan-trusting contract checks (a plan's lengths against cu_seqlens; a pool's slots) read
    nothing inside a capture, and still check what needs no read."""
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    pool, slots = torch.zeros(4, 2, 3), torch.tensor([1, 1], dtype=torch.int32)  # duplicate slots: a read finds them
    with pytest.raises(ValueError, match="state_slots"):
        check_state_pool(pool, slots, (2, 3), (torch.float32,), pool.device, 2, None)
    counter = StepCounter(types.SimpleNamespace(layers=[]))
    with fake_capture(monkeypatch), monkeypatch.context() as m, counter.installed(m):
        assert check_seqlens(cu, 5, cu.device, seqlens=[3, 2]) == [3, 2]
        check_state_pool(pool, slots, (2, 3), (torch.float32,), pool.device, 2, None)
        with pytest.raises(ValueError, match="seqlens"):
            check_seqlens(cu, 6, cu.device, seqlens=[3, 2])  # host facts: still checked
    assert _host_reads(counter) == {}


def test_debug_checks_are_off_only_while_capturing(monkeypatch):
    assert not checks.capturing() and checks.debug_checks()  # CPU torch: CUDA never initialized
    with fake_capture(monkeypatch):
        assert checks.capturing() and not checks.debug_checks()
    assert not checks.capturing() and checks.debug_checks()  # the patch ends with the region
    prev = checks.set_debug_checks(False)
    try:
        with fake_capture(monkeypatch):
            assert not checks.debug_checks()
        assert not checks.debug_checks()
    finally:
        checks.set_debug_checks(prev)
