"""A model step on the triton backend makes no host sync and no host-to-device copy inside its
layers, uploads its metadata once, and launches exactly the kernels it should per layer.

The "tiny" preset (Mamba, attention, Mamba) under the interpreter; what counts as a sync or an
upload on a CPU is defined in `tests/step_counter.py`. Before the step metadata was built once
per step (issue 11) the same prefill step counted 2 syncs (`.tolist()`) and 2 host-to-device
creations per Mamba layer and 2 syncs per attention layer, the decode step 6 syncs per Mamba
layer (`int(min)`, `int(max)`, `torch.unique`, twice) and 2 per attention layer; this test failed
on that tree (results/LOG.md).
"""

from __future__ import annotations

import pytest
import torch

from kernels.checks import set_debug_checks
from model import SequenceChunk, from_preset
from conftest import DEVICE
from model_helpers import one_thread, tokens  # noqa: F401  (one_thread: autouse)
from step_counter import STEP, StepCounter

# The conv writes its final states into the conv-state pool by a second, small launch (the tiles of
# the first read those slots): 7 launches and no gather/scatter, where there were 6 plus 2 torch
# index ops (conv_pool[slots] and conv_pool[slots] = final) around them.
MAMBA_PREFILL = {"_causal_conv1d_kernel": 1, "_causal_conv1d_final_kernel": 1, "_ssd_chunk_cumsum_kernel": 1,
                 "_ssd_bmm_kernel": 1, "_ssd_chunk_state_kernel": 1, "_ssd_state_passing_kernel": 1,
                 "_ssd_chunk_scan_kernel": 1}
MAMBA_DECODE = {"_conv1d_decode_kernel": 1, "_ssd_decode_kernel": 1}
ATTENTION = {"kv_cache_write_kernel": 1, "paged_attention_kernel": 1}  # no split-K at these lengths
# A 1101-token decode row beside a 12-token chunk (tiny: GROUP 2, so > 8 tokens is a chunk): the
# decode row leaves the chunk's launch for its own split-K launch (2 splits) and the merge, all
# planned on the host (kernels/paged_attention.py `choose_launches`).
ATTENTION_MIXED_SPLIT = {"kv_cache_write_kernel": 1, "paged_attention_kernel": 2, "paged_attention_merge_kernel": 1}


@pytest.fixture(scope="module")
def model():
    return from_preset("tiny", backend="triton", seed=0, device=DEVICE)


@pytest.fixture
def production_checks():
    """The counted path runs as in production: device-reading checks off (the suite turns them on)."""
    prev = set_debug_checks(False)
    yield
    set_debug_checks(prev)


def _steps():
    """Prefill (two fresh rows, one with captures), decode (both rows), mixed (a resumed chunk + a decode)."""
    a, b = tokens(60, 1), tokens(30, 2)
    ta, tb = list(range(0, 8)), list(range(8, 16))  # block size 8: 64 tokens a row
    return [
        [SequenceChunk(a[:37], 0, ta, 3, capture_offsets=(10, 20)), SequenceChunk(b[:21], 0, tb, 1)],
        [SequenceChunk(a[37:38], 37, ta, 3), SequenceChunk(b[21:22], 21, tb, 1)],
        [SequenceChunk(a[38:57], 38, ta, 3, capture_offsets=(5,)), SequenceChunk(b[22:23], 22, tb, 1)],
    ]


def test_step_makes_no_host_sync_and_one_upload(model, production_checks, monkeypatch):
    cache = model.allocate_cache(16, 8, 4)
    expected_mamba = [MAMBA_PREFILL, MAMBA_DECODE, {**MAMBA_PREFILL, **MAMBA_DECODE}]
    kinds = {f"{i}:{layer.kind}": layer.kind for i, layer in enumerate(model.layers)}
    assert sorted(kinds.values()) == ["attention", "mamba", "mamba"]
    for step, (rows, want_mamba) in enumerate(zip(_steps(), expected_mamba)):
        counter = StepCounter(model)
        with monkeypatch.context() as m, counter.installed(m):
            out = model.forward_batch(rows, cache)
        assert all(torch.isfinite(lg).all() for lg in out.logits), f"step {step}: non-finite logits"
        for tag, kind in kinds.items():
            assert counter.syncs.get(tag, []) == [], f"step {step}, layer {tag}: host syncs {counter.syncs[tag]}"
            assert counter.creations.get(tag, []) == [], \
                f"step {step}, layer {tag}: tensors from host data {counter.creations[tag]}"
            if kind == "mamba":  # the conv and the scan read and write the state pools through slots
                assert counter.gathers.get(tag, []) == [], f"step {step}, layer {tag}: gathers {counter.gathers[tag]}"
            want = want_mamba if kind == "mamba" else ATTENTION
            assert dict(counter.launches[tag]) == want, f"step {step}, layer {tag}: launches {counter.launches[tag]}"
        assert counter.uploads == 1, f"step {step}: {counter.uploads} metadata uploads"
        assert not counter.launches.get(STEP), f"step {step}: launches outside the layers {counter.launches[STEP]}"


def test_mixed_step_with_a_long_decode_row_makes_no_host_sync(model, production_checks, monkeypatch):
    cache = model.allocate_cache(150, 8, 4)
    rows = [SequenceChunk(tokens(12, 3), 0, [0, 1], 0), SequenceChunk(tokens(1, 4), 1100, list(range(2, 141)), 1)]
    counter = StepCounter(model)
    with monkeypatch.context() as m, counter.installed(m):
        out = model.forward_batch(rows, cache)
    assert all(torch.isfinite(lg).all() for lg in out.logits)
    for i, layer in enumerate(model.layers):
        tag = f"{i}:{layer.kind}"
        assert counter.syncs.get(tag, []) == [] and counter.creations.get(tag, []) == [], tag
        want = {**MAMBA_PREFILL, **MAMBA_DECODE} if layer.kind == "mamba" else ATTENTION_MIXED_SPLIT
        assert dict(counter.launches[tag]) == want, f"layer {tag}: launches {counter.launches[tag]}"
    assert counter.uploads == 1


def test_counter_sees_a_sync_and_an_upload_in_a_layer(model, production_checks, monkeypatch):
    """The harness can fail: a layer that reads a device tensor and builds one from host data is caught."""
    cache = model.allocate_cache(16, 8, 4)
    rows = _steps()[0]
    layer = model.layers[0]
    inner = layer.feed_forward.forward

    def leaky(x):
        float(x.sum())  # a host sync
        return inner(x) + torch.tensor(0.0)  # a host-to-device creation
    monkeypatch.setattr(layer.feed_forward, "forward", leaky)
    counter = StepCounter(model)
    with monkeypatch.context() as m, counter.installed(m):
        model.forward_batch(rows, cache)
    assert counter.syncs["0:mamba"] == ["_local_scalar_dense"]
    assert counter.creations["0:mamba"] == ["tensor"]
    assert counter.uploads == 1


def test_debug_switch_turns_the_device_checks_back_on(model, monkeypatch):
    """With the debug switch on (as in the rest of the suite), the launchers re-check the device
    tensors against the plans: host syncs appear, the results are the same."""
    cache = model.allocate_cache(16, 8, 4)
    prev = set_debug_checks(True)
    try:
        counter = StepCounter(model)
        with monkeypatch.context() as m, counter.installed(m):
            model.forward_batch(_steps()[0], cache)
    finally:
        set_debug_checks(prev)
    assert counter.syncs["0:mamba"] and counter.syncs["1:attention"]
