"""A model step on the triton backend makes no host sync and no host-to-device copy inside its
layers, uploads its metadata once, and launches exactly the kernels it should per layer.

The "tiny" preset (Mamba, attention, Mamba) under the interpreter; what counts as a sync or an
upload on a CPU is defined in `tests/step_counter.py`. Before the step metadata was built once
per step (issue 11) the same prefill step counted 2 syncs (`.tolist()`) and 2 host-to-device
creations per Mamba layer and 2 syncs per attention layer, the decode step 6 syncs per Mamba
layer (`int(min)`, `int(max)`, `torch.unique`, twice) and 2 per attention layer; this test failed
on that tree (results/LOG.md).

The "qwen3-next-tiny" preset (3 Gated DeltaNet layers, attention): before the delta rule took the
step's plan, every prefill or mixed step counted 1 sync (`cu_seqlens.tolist()`), 1 host-to-device
creation and 1 upload of its own chunk table per DeltaNet layer (4 uploads a step here; 36 syncs and
36 uploads a step at Qwen3-Next-80B's 36 DeltaNet layers); the Qwen3-Next tests here failed on that tree.
"""

from __future__ import annotations

import dataclasses

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
# A Gated DeltaNet layer: the varlen conv (its states gathered from and scattered to the pools by the
# model, so no final-state launch) and the delta rule's four kernels; decode rows: the two one-token steps.
DELTANET_PREFILL = {"_causal_conv1d_kernel": 1, "_gdn_qk_prep_kernel": 1, "_gdn_chunk_wy_kernel": 1,
                    "_gdn_state_kernel": 1, "_gdn_output_kernel": 1}
DELTANET_DECODE = {"_conv1d_decode_kernel": 1, "_gdn_decode_kernel": 1}
# Qwen3-Next's MoE feed-forward reads its per-expert token counts on the host, once a layer
# (model/families/qwen3_next_moe.py, `bincount(...).tolist()`): the one sync a layer allowed, and only there.
MOE_FEED_FORWARD_SYNCS = ["tolist"]


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


@pytest.fixture(scope="module")
def qwen3_next():
    return from_preset("qwen3-next-tiny", backend="triton", seed=0, device=DEVICE)


def _feed_forwards_tagged(model, counter: StepCounter, monkeypatch):
    """Each layer's feed-forward counted under its own tag ("i:feed_forward"), apart from its mixer's."""
    for i, layer in enumerate(model.layers):
        inner, tag = layer.feed_forward.forward, f"{i}:feed_forward"

        def tagged(*a, _inner=inner, _tag=tag, **k):
            prev, counter.where = counter.where, _tag
            try:
                return _inner(*a, **k)
            finally:
                counter.where = prev
        monkeypatch.setattr(layer.feed_forward, "forward", tagged)


def test_qwen3_next_step_makes_no_host_sync_and_one_upload(qwen3_next, production_checks, monkeypatch):
    """The DeltaNet layers take the step's delta-rule plan: no sync, no creation, no upload of their own."""
    model = qwen3_next
    cache = model.allocate_cache(16, 8, 4)
    expected_deltanet = [DELTANET_PREFILL, DELTANET_DECODE, {**DELTANET_PREFILL, **DELTANET_DECODE}]
    kinds = {f"{i}:{layer.kind}": layer.kind for i, layer in enumerate(model.layers)}
    assert sorted(kinds.values()) == ["attention"] + ["linear_attention"] * 3
    for step, (rows, want_deltanet) in enumerate(zip(_steps(), expected_deltanet)):
        counter = StepCounter(model)
        with monkeypatch.context() as m, counter.installed(m):
            _feed_forwards_tagged(model, counter, m)
            out = model.forward_batch(rows, cache)
        assert all(torch.isfinite(lg).all() for lg in out.logits), f"step {step}: non-finite logits"
        for i, (tag, kind) in enumerate(kinds.items()):
            assert counter.syncs.get(tag, []) == [], f"step {step}, layer {tag}: host syncs {counter.syncs[tag]}"
            assert counter.creations.get(tag, []) == [], \
                f"step {step}, layer {tag}: tensors from host data {counter.creations[tag]}"
            want = want_deltanet if kind == "linear_attention" else ATTENTION
            assert dict(counter.launches[tag]) == want, f"step {step}, layer {tag}: launches {counter.launches[tag]}"
            assert counter.syncs.get(f"{i}:feed_forward", []) == MOE_FEED_FORWARD_SYNCS, (step, i)
        assert counter.uploads == 1, f"step {step}: {counter.uploads} metadata uploads"
        assert not counter.launches.get(STEP), f"step {step}: launches outside the layers {counter.launches[STEP]}"


def test_qwen3_next_planned_step_equals_the_op_planning_itself(qwen3_next, production_checks, monkeypatch):
    """The step's delta-rule plan is the table the op builds from `cu_seqlens` (same lengths, offsets
    and chunk: `default_chunk_size` of the model's dtype, 32 in fp32): logits, captures and pools
    bit for bit, over the prefill, decode and mixed steps."""
    model = qwen3_next
    planned_cache, own_cache = model.allocate_cache(16, 8, 4), model.allocate_cache(16, 8, 4)
    planners = model._step_planners
    assert planners(planned_cache).gated_delta_rule is not None  # the triton backend plans the delta rule
    for step, rows in enumerate(_steps()):
        planned = model.forward_batch(rows, planned_cache)
        with monkeypatch.context() as m:
            m.setattr(model, "_step_planners", lambda c: dataclasses.replace(planners(c), gated_delta_rule=None))
            own = model.forward_batch(rows, own_cache)
        for a, b in zip(planned.logits, own.logits):
            assert torch.equal(a, b), f"step {step}: logits differ by {(a - b).abs().max().item()}"
        for a_row, b_row in zip(planned.captured, own.captured):
            for a, b in zip(a_row, b_row):
                assert all(torch.equal(x, y) for x, y in zip(a.conv + a.ssm, b.conv + b.ssm)), f"step {step}"
        for i in model.config.linear_attn_layer_indices:
            assert torch.equal(planned_cache.ssm_pool[i], own_cache.ssm_pool[i]), (step, i)
            assert torch.equal(planned_cache.conv_pool[i], own_cache.conv_pool[i]), (step, i)


def test_only_a_model_with_deltanet_layers_plans_the_delta_rule(model, qwen3_next):
    """Bamba's "tiny" (Mamba and attention) builds no delta-rule plan; Qwen3-Next's no SSD-scan plan."""
    tiny_planners = model._step_planners(model.allocate_cache(16, 8, 4))
    qwen_planners = qwen3_next._step_planners(qwen3_next.allocate_cache(16, 8, 4))
    assert tiny_planners.gated_delta_rule is None and tiny_planners.ssd_scan is not None
    assert qwen_planners.gated_delta_rule is not None and qwen_planners.ssd_scan is None
