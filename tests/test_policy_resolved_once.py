"""A placement policy's name is resolved once, at the edge, and the object is handed down (issue 37
item 3): the CLI, a sweep point or a public constructor (`Engine.for_*` through `resolve_settings`,
`SchedulerConfig`, `SimConfig`) turns a name into the `PlacementPolicy` with one registry lookup,
and every layer below (the engine's config, the scheduler, `PrefillState.plan_next`, `plan_chunk`)
takes the object. Two ways a second resolution would show: the registry's lookups counted over one
engine build and run, and a policy that is in no registry run through every layer (any lookup of
its name fails); and a simulated point resolves its engine's settings once. Before this change one sweep point looked the name up 8 times and an engine build
3 times (`planner.policies.registry.get_policy` with a name).
"""

import contextlib
import sys
from collections.abc import Mapping

import pytest

from experiments.traces.simulate import SimConfig, simulate
from experiments.traces.sweep import load_requests, measure_point
from model.engine import Engine
from model.engine.settings import resolve_settings
from planner.policies import registry
from planner.policies.base import PlacementPolicy
from planner.prefill_plan import plan_chunk
from planner.scheduler import SchedulerConfig

TRACE = "mooncake-conversation"


class CountingPolicies(Mapping):
    """The registry's mapping, counting the lookups of a name (`get_policy` reads `registry.POLICIES`)."""

    def __init__(self, inner):
        self.inner, self.lookups = inner, 0

    def __getitem__(self, name):
        self.lookups += 1
        return self.inner[name]

    def __contains__(self, name):  # `get_policy`'s check before its lookup: not a second one
        return name in self.inner

    def __iter__(self):
        return iter(self.inner)

    def __len__(self):
        return len(self.inner)


@contextlib.contextmanager
def calls_of(function):
    """Count the calls of `function` however it was imported (its code object, by the profiler)."""
    count, code, previous = [0], function.__code__, sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is code:
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(previous)


@pytest.fixture
def counted(monkeypatch):
    policies = CountingPolicies(registry.POLICIES)
    monkeypatch.setattr(registry, "POLICIES", policies)
    return policies


def test_an_engine_build_and_its_run_look_the_name_up_once(counted):
    engine = Engine.for_placeholder(policy="ours-plus", block_size=16, num_kv_blocks=256, prefill_budget=64)
    for i in range(3):
        engine.add_request(list(range(100 + i)), max_new_tokens=4)
    engine.run_until_done()
    assert counted.lookups == 1
    assert engine.scheduler.policy is counted.inner["ours-plus"] is engine.config.scheduler.policy
    assert engine.effective_settings["policy"] == "ours-plus"


def test_a_sweep_point_looks_the_name_up_once(counted):
    point = {"trace": TRACE, "reading": "chains", "policy": "ours-plus", "budget_gb": 4.0}
    config = {"limit": 8, "shape": "bamba-9b", "prefill_budget": 8192, "max_batch_size": 64, "kv_pool_gb": 60.0,
              "time_scale": 1.0}
    with calls_of(resolve_settings) as settings_resolved:
        row = measure_point(point, config)
    assert counted.lookups == 1  # the point's name; SimConfig, the engine, scheduler and planner get the object
    assert settings_resolved[0] == 1  # by the engine; the simulator reports the engine's effective_settings
    assert row["effective_settings"]["policy"] == "ours-plus" and row["requests"] == 8


class FirstTwentyFour(PlacementPolicy):
    """A test policy in no registry: every chunk at most 24 tokens. Source: this test."""

    name = "first-twenty-four"

    def chunk_len(self, offset, total, proposed, ctx):
        return min(proposed, 24)


def test_a_policy_in_no_registry_runs_through_every_layer():
    # any layer that looked its name up would raise "policy: must be one of [...]"
    policy = FirstTwentyFour()
    engine = Engine.for_placeholder(policy=policy, block_size=16, num_kv_blocks=64, prefill_budget=64)
    req = engine.add_request(list(range(100)), max_new_tokens=2)
    engine.run_until_done()
    assert req.metrics.chunk_ends == [24, 48, 72, 96, 100]  # the policy's rule, not the budget's 65-token chunks
    assert engine.scheduler.policy is policy and engine.effective_settings["policy"] == "first-twenty-four"
    out = simulate(load_requests(TRACE, "chains", 3), SimConfig(policy))
    assert out["metrics"]["requests"] == 3 and out["settings"]["policy"] == "first-twenty-four"
    assert all(max(b - a for a, b in zip([0] + r.chunk_ends, r.chunk_ends)) <= 24 for r in out["records"])


def test_an_unknown_name_gets_one_line_at_each_edge_and_the_planner_refuses_a_name():
    for build in (lambda: Engine.for_placeholder(policy="greedy"), lambda: SchedulerConfig(policy="greedy"),
                  lambda: SimConfig("greedy")):
        with pytest.raises(ValueError, match=r"^policy: must be one of \[.*'aligned'.*\], got 'greedy'$"):
            build()
    with pytest.raises(ValueError, match="^policy: must be a PlacementPolicy"):
        plan_chunk(0, 100, 10, 16, 0, "aligned")
