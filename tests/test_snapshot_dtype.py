"""Snapshots stored in a smaller dtype (`model.engine.snapshot_codec`, `EngineConfig.snapshot_dtype`).

Bounds, stated once and derived from the formats (not from our output), per element x restored as x':
* bfloat16 (8 significand bits, round to nearest even): |x - x'| <= 2^-8 |x|;
* float8_e4m3fn with s = amax / 448: |x - x'| <= max(2^-4 |x|, 2^-10 s) (4 significand bits for
  |x / s| >= 2^-6, the subnormal step 2^-9 below), plus 2^-22 |x| for the two fp32 roundings of x / s
  and q * s (2^-24 each).
The default ("float32") converts nothing: the store holds the slot's own copy, a warm request's logits
are bit-identical to today's engine's.
"""

import argparse
import random

import pytest
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from model.cache import SSMState
from model.cost import ModelCost
from model.engine import Engine
from model.engine.snapshot_codec import FP8_MAX, SNAPSHOT_DTYPES, QuantizedState, SnapshotCodec
from model.engine.spill import from_tensors, state_identity, to_tensors
from model.loading import from_preset
from tests.model_helpers import one_thread  # noqa: F401 (autouse fixture)

BF16_REL = 2.0 ** -8
FP8_REL, FP8_SUBNORMAL = 2.0 ** -4, 2.0 ** -10
FP32_SLACK = 2.0 ** -22


def bf16_bound(x: torch.Tensor) -> torch.Tensor:
    return BF16_REL * x.double().abs()


def fp8_bound(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    scale = x.abs().max() / FP8_MAX
    return torch.maximum(FP8_REL * x.abs(), FP8_SUBNORMAL * scale) + FP32_SLACK * x.abs()


BOUNDS = {"bfloat16": bf16_bound, "float8_e4m3fn": fp8_bound}


def ugly_state(seed: int) -> SSMState:
    """Two layers of odd shapes, magnitudes 1e-3 .. 1e3 apart (a snapshot-wide scale would flush the
    small layer to zero), one tensor spanning 6 decades inside itself (fp8's subnormal range)."""
    g = torch.Generator().manual_seed(seed)
    conv = [torch.randn(37, 3, generator=g) * 1e3, torch.randn(11, 3, generator=g) * 1e-3]
    spread = torch.randn(5, 7, 9, generator=g) * torch.logspace(-6, 0, 9)
    return SSMState(conv, [torch.randn(3, 5, 13, generator=g) * 7.0, spread])


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_round_trip_within_the_format_bound(dtype, seed):
    state = ugly_state(seed)
    stored = SnapshotCodec(dtype).encode(state)
    assert isinstance(stored, QuantizedState)
    assert all(t.dtype == SNAPSHOT_DTYPES[dtype] for t in (*stored.conv, *stored.ssm))
    back = SnapshotCodec.decode(stored)
    for x, y in zip((*state.conv, *state.ssm), (*back.conv, *back.ssm)):
        err = (x.double() - y.double()).abs()
        bound = BOUNDS[dtype](x)
        assert not torch.isnan(y).any()
        assert (err <= bound).all(), (err - bound).max().item()
        assert (err / bound.clamp_min(1e-300)).max() > 0.25  # it did round: the bound is not vacuous


def test_fp8_scale_is_per_tensor_amax_over_448_and_zeros_stay_zero():
    state = ugly_state(3)
    state.conv[1].zero_()
    stored = SnapshotCodec("float8_e4m3fn").encode(state)
    for x, s in zip((*state.conv, *state.ssm), (*stored.conv_scale, *stored.ssm_scale)):
        want = x.abs().max() / 448 if x.abs().max() > 0 else torch.tensor(1.0)
        assert s.dtype == torch.float32 and s.item() == pytest.approx(want.item(), rel=2 ** -23)
    assert torch.equal(SnapshotCodec.decode(stored).conv[1], torch.zeros(11, 3))


def test_bytes_shrink_2x_and_4x_plus_one_scale_a_tensor():
    state = ugly_state(0)
    elements = sum(t.numel() for t in (*state.conv, *state.ssm))
    assert state.nbytes == 4 * elements
    assert SnapshotCodec("bfloat16").encode(state).nbytes == 2 * elements
    assert SnapshotCodec("float8_e4m3fn").encode(state).nbytes == elements + 4 * 4  # 4 tensors, 4-byte scales


def test_a_tensor_no_wider_than_the_snapshot_dtype_is_kept():
    conv = torch.randn(6, 3).to(torch.bfloat16)  # a bf16 model's conv state
    state = SSMState([conv], [torch.randn(2, 3, 4)])
    stored = SnapshotCodec("bfloat16").encode(state)
    assert stored.conv[0] is conv and stored.conv_scale == [None] and stored.ssm[0].dtype == torch.bfloat16
    fp8 = SnapshotCodec("float8_e4m3fn").encode(state)
    assert fp8.conv[0].dtype == torch.float8_e4m3fn and fp8.conv_scale[0] is not None


def test_float32_is_the_identity():
    state = ugly_state(0)
    codec = SnapshotCodec()
    assert codec.snapshot_dtype == "float32" and codec.encode(state) is state and codec.decode(state) is state


def test_a_bad_snapshot_dtype_is_one_line_naming_it():
    with pytest.raises(ValueError, match="snapshot_dtype"):
        SnapshotCodec("float16")
    with pytest.raises(ValueError, match="snapshot_dtype"):
        Engine.for_placeholder(num_kv_blocks=8, snapshot_dtype="int8")


def test_spilled_fp8_state_reads_back_identical_and_the_disk_identity_names_the_dtype():
    stored = SnapshotCodec("float8_e4m3fn").encode(ugly_state(4))
    back = from_tensors(load_tensors(save_tensors(to_tensors(stored))), "cpu")
    assert isinstance(back, QuantizedState) and back.nbytes == stored.nbytes
    for a, b in zip((*stored.conv, *stored.ssm, *stored.conv_scale, *stored.ssm_scale),
                    (*back.conv, *back.ssm, *back.conv_scale, *back.ssm_scale)):
        assert a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    runner = Engine.for_placeholder(num_kv_blocks=8).runner
    assert state_identity(runner, 16) == state_identity(runner, 16, "float32")  # the default's digest as always
    assert len({state_identity(runner, 16, d) for d in SNAPSHOT_DTYPES}) == 3


# ---------------------------------------------------------------------------------------------- engine
def prompt(n, seed, vocab=256):
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)]


def warm_run(model, **settings):
    """A cold request, then its repeat (restored at the aligned split point 92, 8 tokens replayed);
    the engine, both requests and every state the engine wrote into a slot."""
    eng = Engine.for_model(model, block_size=4, prefill_budget=64, max_batch_size=1, num_kv_blocks=80,
                           keep_prompt_logits=True, **settings)
    written = []
    write = eng.runner.write_state
    eng.runner.write_state = lambda slot, state: (written.append(state), write(slot, state))
    p = prompt(100, 0)
    cold = eng.add_request(p, 4, "cold")
    eng.run_until_done()
    warm = eng.add_request(p, 4, "warm")
    eng.run_until_done()
    assert warm.metrics.restore_at == 92 and len(written) == 1
    return eng, cold, warm, written[0]


@pytest.fixture(scope="module", params=["tiny", "qwen3-next-tiny"])
def model(request):
    return from_preset(request.param, seed=0)


def expected_state_bytes(model) -> int:
    """An fp32 model's snapshot from its config (`ModelCost`): conv and recurrent states in fp32."""
    return ModelCost(model.config).snapshot_bytes(4, 4)


def test_default_is_float32_and_unchanged(model):
    eng, cold, warm, restored = warm_run(model)
    explicit, _, warm32, restored32 = warm_run(model, snapshot_dtype="float32")
    assert eng.effective_settings["snapshot_dtype"] == "float32" and eng.config.snapshot_dtype == "float32"
    snap = eng.snapshots.lookup(cold.prompt_token_ids, 92, cold.block_hashes, observe=False)
    assert type(snap.state) is SSMState and snap.nbytes == expected_state_bytes(model)
    assert type(restored) is SSMState and restored is snap.state  # the slot gets the stored copy itself
    assert torch.equal(eng.prompt_logits["warm"], explicit.prompt_logits["warm"])
    assert warm.output_token_ids == warm32.output_token_ids == cold.output_token_ids


@pytest.mark.parametrize("dtype,shrink", [("bfloat16", 2), ("float8_e4m3fn", 4)])
def test_engine_stores_smaller_and_restores_within_the_bound(model, dtype, shrink):
    ref, _, _, exact = warm_run(model)
    eng, cold, warm, restored = warm_run(model, snapshot_dtype=dtype)
    assert eng.effective_settings["snapshot_dtype"] == dtype
    layers = len(model.config.state_layer_indices)
    scales = 4 * 2 * layers if dtype == "float8_e4m3fn" else 0
    snap = eng.snapshots.lookup(cold.prompt_token_ids, 92, cold.block_hashes, observe=False)
    assert snap.nbytes == expected_state_bytes(model) // shrink + scales
    assert eng.snapshots.bytes_held == len(eng.snapshots) * snap.nbytes == cold.metrics.snapshot_bytes
    # the slot got the decoded state: within the format's bound of the exact snapshot, layer by layer
    assert type(restored) is SSMState
    for x, y in zip((*exact.conv, *exact.ssm), (*restored.conv, *restored.ssm)):
        assert ((x.double() - y.double()).abs() <= BOUNDS[dtype](x)).all()
    assert not torch.equal(eng.prompt_logits["warm"], ref.prompt_logits["warm"])  # it is not the exact state


# ---------------------------------------------------------------------------------------------- simulator
def test_simulator_counts_the_stored_bytes():
    from experiments.traces.cost import ShapeCost
    from experiments.traces.runner import SimClock
    from experiments.traces.simulate import SimConfig, build_engine

    for shape in ("bamba-9b", "qwen3-next-80b"):
        cost = ShapeCost.from_preset(shape)
        c = cost.counts
        tensors = 2 * (c.mamba_layers + c.linear_attention_layers)
        assert cost.snapshot_bytes() == cost.snapshot_bytes("float32") == cost.state_bytes  # bf16 states: kept
        assert cost.snapshot_bytes("bfloat16") == cost.state_bytes
        assert cost.snapshot_bytes("float8_e4m3fn") == c.snapshot_bytes(1, 1) + 4 * tensors == cost.state_bytes // 2 + 4 * tensors
        for dtype, want in ((None, cost.state_bytes), ("float8_e4m3fn", cost.snapshot_bytes("float8_e4m3fn"))):
            eng = build_engine(SimConfig("aligned", shape=shape, budget_gb=1.0, snapshot_dtype=dtype), cost, SimClock())
            assert eng.runner.inner.snapshot_nbytes == want
            assert eng.effective_settings["snapshot_dtype"] == (dtype or "float32")


def test_the_flag_parses_and_refuses_other_names():
    from experiments.common.flags import add_snapshot_dtype_flag

    ap = argparse.ArgumentParser()
    add_snapshot_dtype_flag(ap)
    assert ap.parse_args([]).snapshot_dtype is None
    assert ap.parse_args(["--snapshot-dtype", "float8_e4m3fn"]).snapshot_dtype == "float8_e4m3fn"
    with pytest.raises(SystemExit):
        ap.parse_args(["--snapshot-dtype", "fp8"])


# ---------------------------------------------------------------------------------------------- the benchmark
def test_the_benchmark_measures_against_an_fp32_restore():
    from experiments.bench.snapshot_dtype import measure

    rows = {r["snapshot_dtype"]: r for r in measure("tiny", 100, 0, 4, ("aligned",))}
    exact = rows["float32"]
    assert exact["state_rel_err"] == 0 and exact["logits_err_vs_fp32_restore"] == 0
    assert exact["greedy_agree"] == exact["decoded"] == 4 and exact["first_divergence"] == 4
    assert exact["logits_err_vs_cold"] <= 1e-4  # fp32 logits tolerance (BRIEF section 3): a restore is not a copy of cold
    # relative to each tensor's amax the format bounds give 2^-8 (bf16) and 2^-4 (fp8), plus fp32 slack
    assert 0 < rows["bfloat16"]["state_rel_err"] <= BF16_REL
    assert 0 < rows["float8_e4m3fn"]["state_rel_err"] <= FP8_REL + FP32_SLACK
    elements = exact["snapshot_bytes"] // 4
    assert rows["bfloat16"]["bytes_vs_fp32"] == 0.5
    assert rows["float8_e4m3fn"]["snapshot_bytes"] == elements + 4 * 4  # tiny: 2 Mamba layers, 4 scales


def test_the_benchmark_writes_its_data_and_refuses_a_folder_without_it(tmp_path, capsys):
    from experiments.bench.snapshot_dtype import main

    out = tmp_path / "run"
    assert main(["--model", "tiny", "--prompt-len", "40", "--seed", "0", "--decode", "2", "--policy", "aligned", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"snapshot_dtype.json", "snapshot_dtype.csv", "snapshot_dtype.png"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["--replot", "--out", str(tmp_path / "empty")])
    assert exc.value.code == 2 and "snapshot_dtype.json" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_trace_study_passes_the_flag_to_every_point(monkeypatch):
    """--snapshot-dtype reaches the config only when given (records without it keep their definition),
    and every point's SimConfig from there."""
    from experiments.traces import study as traces_cli
    from experiments.traces import sweep

    base = ["--trace", "synthetic", "--policy", "aligned", "--budget-gb", "1"]
    assert "snapshot_dtype" not in traces_cli.config_of(traces_cli.parser().parse_args(base))
    config = traces_cli.config_of(traces_cli.parser().parse_args(base + ["--snapshot-dtype", "float8_e4m3fn"]))
    assert config["snapshot_dtype"] == "float8_e4m3fn"
    seen = []
    monkeypatch.setattr(sweep, "load_requests", lambda *a, **k: ())
    monkeypatch.setattr(sweep, "simulate", lambda requests, cfg, *a: seen.append(cfg) or {"metrics": {}, "records": []})
    sweep.measure_point({"trace": "synthetic", "reading": "chains", "policy": "aligned", "budget_gb": 1.0}, config)
    assert seen[0].snapshot_dtype == "float8_e4m3fn"
