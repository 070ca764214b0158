"""One policy name, one engine: every study records the same `effective_settings` for the same
policy and model.

Each study builds its engines through its own constructor (warm_restore.policy_engine,
ablations.point_engine, multiturn's engine_for on the study `build_study` makes, the trace
simulator's build_engine, peer_vllm.OursPeer, plan_incident.policy_engine), and all of them go
through `Engine.for_*`, which apply the policy's engine defaults in one place
(`model/engine/settings.py`). Here every registered policy gets each study's smallest
configuration, on the "tiny" model (every study) and on Bamba-9B's shape (the studies that need
no weights), and the settings read back from the engines must agree across studies and with a
table derived by hand from the policies' fields (`kv_block`, `decode_grid`, `eviction` in
planner/policies/) and the rules in the `model/engine/settings.py` docstring:

* "kv" keeps the base block 16; "vllm" is vLLM's padded block V rounded up to a multiple of 16;
  "vllm-state" keeps 16 with state_block V;
* decode grid None: decode states off, grid 0; "block": on, grid 0 (the KV block); "state": on,
  the state block; "kernel": on, the kernel chunk rounded up to a multiple of the KV block.

V, the padded block (`planner/policies/vllm.py` `vllm_hybrid_block`: 16 x ceil(one Mamba layer's
state / one 16-token attention page)):
* tiny: conv_dim = 4 x 32 + 2 x 2 x 16 = 192; a Mamba layer holds conv 192 x 3 = 576 and SSM
  4 x 32 x 16 = 2048 values = 2624; a token's K and V in one layer 2 x 2 x 16 = 64 values, a page
  1024: ceil(2624 / 1024) = 3 pages, V = 48 (in any one dtype: both sides scale with it).
  Kernel chunk 16 (`mamba_chunk_size`).
* Bamba-9B: V = 528 (tests/test_traces.py derives it), kernel chunk 256.
"""

import argparse

import pytest

from experiments.ablations import study as ablations
from experiments.peer_vllm import study as peer_vllm
from experiments.plan_incident import study as plan_incident
from experiments.warm_restore import study as warm_restore
from experiments.multiturn import cli as multiturn_cli
from experiments.multiturn.run import RunConfig, engine_for
from experiments.common.runs import dense_serve
from experiments.traces.cost import ShapeCost
from experiments.traces.runner import SimClock
from experiments.traces.simulate import SimConfig, build_engine
from model.families import PRESETS
from model.engine import EFFECTIVE_KEYS, Engine, ModelShape
from model.loading import from_preset
from planner.policies.registry import POLICIES

BLOCK, BUDGET, PROMPT = 16, 64, 64  # the base KV block every study runs at here; a 64-token prompt


def table(padded: int, kernel: int) -> dict:
    """The hand table (module docstring), V = `padded`: (block, state_block, decode_snapshots, grid, eviction);
    the match unit is 0 (the block) but for ours-plus's "token" (1), whose "exact" decode grid is that unit."""
    return {
        "legacy": (16, 0, False, 0, "lru"),  # kv, no decode grid, lru (the base's fields)
        "aligned": (16, 0, False, 0, "lru"),
        "trtllm": (16, 0, False, 0, "lru"),
        "vllm-align": (padded, 0, True, 0, "lru"),  # vllm, grid "block"
        "vllm-junction": (16, padded, True, padded, "lru"),  # vllm-state, grid "state"
        "sglang": (16, 0, True, kernel, "lru"),  # kv, grid "kernel": 16 and 256 are multiples of 16
        "marconi": (16, 0, True, 0, "flop_aware"),  # kv, grid "block"
        "ollama": (16, 0, True, 0, "lru"),  # kv, grid "block"
        "ours-plus": (16, 0, True, 1, "shadow_best"),  # grid "exact" on its token unit
        "ours-adaptive": (16, 0, True, 1, "shadow_best"),  # ours-plus's engine defaults
        "optimum": (16, 0, True, 0, "lru"),
    }


def expected(policy: str, padded: int, kernel: int) -> dict:
    block, state, decode, grid, eviction = table(padded, kernel)[policy]
    return {"policy": policy, "block_size": block, "state_block": state, "kernel_chunk": kernel,
            "decode_snapshots": decode, "decode_snapshot_grid": grid,
            "prefix_match_unit": 1 if policy in ("ours-plus", "ours-adaptive") else 0, "eviction": eviction,
            "snapshot_dtype": "float32"}  # no policy sets it (model.engine.settings rule 3)


SHAPES = {"tiny": (48, 16), "bamba-9b": (528, 256)}  # (V, kernel chunk), derived in the docstring


@pytest.fixture(scope="module")
def tiny():
    return from_preset("tiny", seed=0)


# ------------------------------------------------------------------ each study's own constructor
def warm_restore_settings(model, policy: str) -> dict:
    args = argparse.Namespace(block_size=BLOCK, prefill_budget=BUDGET, prompt_len=PROMPT, interval=0)
    return warm_restore.policy_engine(model, policy, args).effective_settings


def ablations_settings(model, policy: str) -> dict:
    p = ablations.point("prompt_len", policy, policy, PROMPT, BLOCK, BUDGET, 0)
    return ablations.point_engine(model, p, [PROMPT, PROMPT]).effective_settings


def multiturn_study(runner: str, model_name: str, monkeypatch=None, model=None):
    """The study `python -m experiments.multiturn --quick` builds; on the model runner, `model` is
    the one it builds (so that the tiny model is built once, and not warmed up)."""
    ap = multiturn_cli.parser()
    args = ap.parse_args(["--runner", runner, "--model", model_name, "--quick", "--block-size", str(BLOCK),
                          "--prefill-budget", str(BUDGET)])
    if runner == "model":
        monkeypatch.setattr(multiturn_cli, "build_model_or_exit", lambda *a, **k: model)
        monkeypatch.setattr(multiturn_cli, "warm_up", lambda m: None)
    return multiturn_cli.build_study(ap, args, multiturn_cli.workload_config(ap, args))[0]


def multiturn_settings(study, policy: str, **config) -> dict:
    return engine_for(study, RunConfig(policy, policy, **config)).effective_settings


def traces_settings(cost: ShapeCost, policy: str, **config) -> dict:
    cfg = SimConfig(policy, block_size=BLOCK, prefill_budget=BUDGET, max_batch_size=2, kv_pool_gb=0.001, **config)
    return build_engine(cfg, cost, SimClock()).effective_settings


def plan_incident_settings(model_name: str, policy: str) -> dict:
    return plan_incident.policy_engine(policy, model_name, PROMPT, BLOCK, BUDGET, 0).effective_settings


# ------------------------------------------------------------------ the checks
def test_every_study_records_the_same_settings_per_policy_on_the_tiny_model(tiny, monkeypatch):
    model_study = multiturn_study("model", "tiny", monkeypatch, tiny)
    placeholder_study = multiturn_study("placeholder", "tiny")
    cost = ShapeCost.from_config("tiny", PRESETS["tiny"])
    for policy in POLICIES:
        by_study = {
            "warm_restore": warm_restore_settings(tiny, policy),
            "ablations": ablations_settings(tiny, policy),
            "multiturn (model)": multiturn_settings(model_study, policy),
            "multiturn (placeholder)": multiturn_settings(placeholder_study, policy),
            "traces": traces_settings(cost, policy),
            "plan_incident": plan_incident_settings("tiny", policy),
        }
        if policy == peer_vllm.OUR_ENGINE["policy"]:  # peer_vllm runs our engine under one policy
            by_study["peer_vllm"] = peer_vllm.OursPeer(tiny, num_kv_blocks=64).engine.effective_settings
        first = by_study["warm_restore"]
        assert tuple(first) == EFFECTIVE_KEYS, policy
        assert all(s == first for s in by_study.values()), (policy, by_study)
        if policy in table(*SHAPES["tiny"]):  # a policy registered later: the agreement above still holds
            assert first == expected(policy, *SHAPES["tiny"]), policy


def test_every_study_without_weights_records_the_same_settings_at_bamba_9b():
    study = multiturn_study("placeholder", "bamba-9b")
    cost = ShapeCost.from_preset("bamba-9b")
    for policy in POLICIES:
        by_study = {"multiturn (placeholder)": multiturn_settings(study, policy),
                    "traces": traces_settings(cost, policy),
                    "plan_incident": plan_incident_settings("bamba-9b", policy)}
        first = by_study["traces"]
        assert all(s == first for s in by_study.values()), (policy, by_study)
        if policy in table(*SHAPES["bamba-9b"]):
            assert first == expected(policy, *SHAPES["bamba-9b"]), policy


@pytest.mark.parametrize("eviction", ["lru", "flop_aware", "learned_value"])
def test_an_explicit_eviction_wins_the_same_way_in_every_study(tiny, eviction):
    """`--eviction` (traces: every policy; multiturn: its bounded configurations) replaces the
    policy's own eviction and nothing else."""
    placeholder_study = multiturn_study("placeholder", "bamba-9b")
    cost = ShapeCost.from_preset("bamba-9b")
    for policy in table(*SHAPES["bamba-9b"]):
        want = expected(policy, *SHAPES["bamba-9b"]) | {"eviction": eviction}
        assert traces_settings(cost, policy, eviction=eviction) == want, policy
        got = multiturn_settings(placeholder_study, policy, snapshot_budget=True, eviction=eviction)
        assert got == want, policy
    direct = Engine.for_model(tiny, policy="ours-plus", block_size=BLOCK, num_kv_blocks=8, eviction=eviction)
    assert direct.effective_settings == expected("ours-plus", *SHAPES["tiny"]) | {"eviction": eviction}


def test_explicit_decode_states_and_state_block_win_over_the_policy():
    shape = ModelShape(vllm_block=40, kernel_chunk=100)  # V 40 -> 48 on block 16; kernel 100 -> 112
    def settings(policy, **explicit):
        return Engine.for_placeholder(shape=shape, policy=policy, block_size=BLOCK, num_kv_blocks=8,
                                      **explicit).effective_settings

    assert settings("vllm-align")["block_size"] == 48  # ceil(40 / 16) x 16
    assert settings("sglang")["decode_snapshot_grid"] == 112  # ceil(100 / 16) x 16
    assert settings("vllm-junction")["decode_snapshot_grid"] == 48  # the state block
    # an explicit state block moves a "state" decode grid with it
    assert settings("vllm-junction", state_block=64)["decode_snapshot_grid"] == 64
    # decode states asked of a policy without a grid: on the KV block (grid 0)
    on = settings("aligned", decode_snapshots=True)
    assert (on["decode_snapshots"], on["decode_snapshot_grid"]) == (True, 0)
    # turned off: no grid, whatever the policy's
    off = settings("sglang", decode_snapshots=False)
    assert (off["decode_snapshots"], off["decode_snapshot_grid"]) == (False, 0)
    assert settings("sglang", kernel_chunk=32)["decode_snapshot_grid"] == 32
    assert settings("sglang", decode_snapshot_grid=64)["decode_snapshot_grid"] == 64
    # an explicit match unit wins, and an "exact" decode grid follows it: the block unit is the block grid
    assert (settings("ours-plus")["prefix_match_unit"], settings("ours-plus")["decode_snapshot_grid"]) == (1, 1)
    assert settings("ours-plus", prefix_match_unit=4)["decode_snapshot_grid"] == 4
    assert settings("ours-plus", prefix_match_unit=16)["decode_snapshot_grid"] == 0
    assert settings("aligned", prefix_match_unit=1)["decode_snapshot_grid"] == 0  # no decode states asked


def test_a_kv_pool_sized_by_the_block_the_policy_runs_on():
    """`dense_serve` sizes the pool for its prompts at the policy's block: 100 tokens need
    ceil(100 / 16) = 7 blocks of 16 or ceil(100 / 48) = 3 of 48, plus 16 spare."""
    shape = ModelShape(vllm_block=48, kernel_chunk=16)
    for policy, blocks in (("aligned", 7 + 16), ("vllm-align", 3 + 16)):
        engine = Engine.for_placeholder(shape=shape, **dense_serve(BLOCK, BUDGET, [100], policy))
        assert engine.config.scheduler.num_kv_blocks == blocks, policy


def test_a_policy_on_vllms_block_needs_the_model():
    with pytest.raises(ValueError, match="shape"):
        Engine.for_placeholder(policy="vllm-align", block_size=BLOCK, num_kv_blocks=8)
