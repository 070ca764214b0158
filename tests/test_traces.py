"""Placement policies by name, the trace simulator (validated against the placeholder engine) and
its command."""

import gzip
import json
import math

import pytest

from experiments.traces.cost import ShapeCost
from experiments.traces.simulate import SimConfig, simulate
from experiments.workloads import MooncakeTrace
from experiments.workloads.mooncake import TRACES
from model.engine import Engine
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.base import PlanContext
from planner.policies.registry import POLICIES
from planner.policies.trtllm import TRTLLM_PERIOD_TOKENS
from planner.policies.vllm import vllm_checkpoint_in_forward, vllm_checkpoint_position, vllm_hybrid_block
from planner.prefill_plan import plan_chunk, plan_prompt

PEERS = ("legacy", "aligned", "vllm-align", "vllm-junction", "sglang", "trtllm", "marconi", "ours-plus")


def test_every_policy_is_registered_with_its_source_and_engine_settings():
    for name in PEERS:
        assert POLICIES[name].name == name and POLICIES[name].source, name
    for policy in POLICIES.values():  # every policy carries its engine defaults
        assert policy.kv_block in ("kv", "vllm", "vllm-state"), policy
        assert policy.decode_grid in (None, "block", "state", "kernel", "exact"), policy
        assert policy.match_unit in ("block", "token"), policy
        assert policy.eviction in EVICTION_POLICIES and isinstance(policy.needs_oracle, bool), policy


def test_vllm_padded_block_at_bamba_9b():
    # One Mamba layer: conv 3 x (8192 + 2 x 128) + SSM 128 x 64 x 128 = 1,073,920 bf16 values =
    # 2,147,840 bytes; one attention layer holds 2 x 8 x 128 x 2 = 4096 bytes a token; a 16-token
    # page 65,536 bytes: ceil(2,147,840 / 65,536) = 33 pages, 33 x 16 = 528 tokens.
    cost = ShapeCost.from_preset("bamba-9b")
    assert cost.state_bytes_layer == 2_147_840 and cost.kv_bytes_per_token_layer == 4096
    assert cost.vllm_block == 528 == vllm_hybrid_block(2_147_840, 4096)
    assert vllm_hybrid_block(65_536, 4096) == 16 and vllm_hybrid_block(65_537, 4096) == 32


def test_vllm_checkpoint_rules():
    assert vllm_checkpoint_position(2000, 528) == 1584 and vllm_checkpoint_position(1, 16) == 0
    assert vllm_checkpoint_position(1056, 528) == 528  # one token must be left to run
    assert vllm_checkpoint_in_forward(0, 2000, 1584, 528, 528)
    assert not vllm_checkpoint_in_forward(0, 1584, 1584, 528, 528)  # must lie strictly inside
    assert not vllm_checkpoint_in_forward(8, 2000, 1584, 16, 528)  # start off the unit
    assert not vllm_checkpoint_in_forward(1576, 2000, 1584, 16, 528)  # less than a unit below it


def test_vllm_align_chunks():
    ctx = PlanContext(528)
    one = plan_prompt(2000, 528, 8192, 0, "vllm-align", ctx=ctx)
    assert [p.end for p in one] == [2000] and one[0].snapshot_positions == (1584,)  # in-forward checkpoint
    three = plan_prompt(2000, 528, 1000, 0, "vllm-align", ctx=ctx)
    assert [p.end for p in three] == [528, 1056, 2000]
    assert [s for p in three for s in p.snapshot_positions] == [528, 1056, 1584]


def test_marks_stop_or_capture():
    ctx = PlanContext(16, 0, 528, 256)
    # KV match 992 above restore point 0: the junction.
    for name, ends, snaps in (("vllm-junction", [528], [528]), ("marconi", [992, 3000], [992]),
                              ("ours-plus", [3000], [992, 2976])):
        marks = POLICIES[name].marks(992, 0, 3000, ctx)
        assert marks == (992,), name
        plans = plan_prompt(3000, 16, 8192 if name != "vllm-junction" else 528, 0, name, marks=marks, ctx=ctx)
        assert [p.end for p in plans][:len(ends)] == ends, name
        assert [s for p in plans for s in p.snapshot_positions][:len(snaps)] == snaps, name
    # vllm-junction in one budget: the junction stops the chunk (a second forward) ...
    plans = plan_prompt(3000, 16, 8192, 0, "vllm-junction", marks=(992,), ctx=ctx)
    assert plans[0].end == 992 and plans[0].snapshot_at_end
    # ... and the last chunk, though it starts mid-block, exports the tail checkpoint
    # floor(2999 / 16) * 16 = 2992 in-forward, so it does not stop at the next 528 boundary ...
    assert [p.end for p in plans] == [992, 3000] and plans[-1].snapshot_positions == (2992,)
    # ... while a non-last chunk starting mid-block does (then block multiples).
    plans = plan_prompt(3000, 16, 1200, 0, "vllm-junction", marks=(992,), ctx=ctx)
    assert [p.end for p in plans] == [992, 1056, 2112, 3000] and plans[-1].snapshot_positions == (2992,)
    # A last chunk starting less than a unit below the checkpoint cannot export it: it stops there.
    plans = plan_prompt(3000, 16, 2990, 0, "vllm-junction", ctx=ctx)
    assert [p.end for p in plans] == [2640, 2992, 3000] and plans[1].snapshot_at_end
    assert POLICIES["ours-plus"].marks(992, 992, 3000, ctx) == ()  # nothing lost: no mark
    assert POLICIES["sglang"].marks(0, 0, 3000, ctx) == (2816,)  # floor(2999 / 256) * 256
    trt = POLICIES["trtllm"].marks(992, 0, 9000, ctx)
    assert trt == (992, TRTLLM_PERIOD_TOKENS, 2 * TRTLLM_PERIOD_TOKENS, 8992)


def test_plan_chunk_keeps_the_seed_figures_with_a_context():
    ends = [p.end for p in plan_prompt(32772, 16, lambda i: 8193 if i == 0 else 8192, 0, "aligned")]
    assert ends == [8192, 16384, 24576, 32752, 32772]
    plan = plan_chunk(0, 100, 100, 16, 0, POLICIES["legacy"], marks=(40,))
    assert (plan.end, plan.snapshot_at_end) == (40, True)  # legacy stops at a mark


def _warm_pair(policy, shared=600, n=1000):
    """Three requests: A cold, B shares A's first `shared` tokens, C the same prefix as B."""
    eng = Engine.for_placeholder(policy=policy, block_size=16, prefill_budget=4096, num_kv_blocks=512,
                                 max_batch_size=1)
    a = list(range(1, n + 1))
    b = a[:shared] + [5000 + i for i in range(n - shared)]
    c = a[:shared] + [9000 + i for i in range(n - shared)]
    reqs = [eng.add_request(p, max_new_tokens=2) for p in (a, b, c)]
    eng.run_until_done()
    return [r.metrics for r in reqs]


# ours-plus matches at any token: the shared 600 exactly; the others floor it to the block, 592
@pytest.mark.parametrize("policy,kv,b_ends,b_forwards", [("ours-plus", 600, [1000], 1), ("marconi", 592, [592, 1000], 2),
                                                          ("aligned", 592, [1000], 1)])
def test_junction_snapshot_serves_the_next_request(policy, kv, b_ends, b_forwards):
    _, b, c = _warm_pair(policy)
    assert (b.kv_match_tokens, b.restore_at) == (kv, 0)  # nothing there yet
    assert b.chunk_ends == b_ends and b.prefill_passes == b_forwards
    if policy == "aligned":
        assert c.restore_at == 0 and kv not in b.snapshot_positions
    else:
        assert kv in b.snapshot_positions and (c.kv_match_tokens, c.restore_at) == (kv, kv)


def _scaled_trace(tmp_path, n=40, scale=24):
    """The conversation trace's first n lines with lengths divided by `scale` (the sharing of
    leading 512-token blocks kept): a slice the token-by-token placeholder runs in seconds."""
    lines = []
    with gzip.open(TRACES["mooncake-conversation"], "rt") as f:
        for i, text in zip(range(n), f):
            o = json.loads(text)
            length = max(1, o["input_length"] // scale)
            lines.append({"timestamp": o["timestamp"], "input_length": length,
                          "output_length": max(1, o["output_length"] // scale),
                          "hash_ids": o["hash_ids"][:math.ceil(length / 512)]})
    path = tmp_path / "slice.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("policy,budget", [("ours-plus", 0.2), ("vllm-junction", None), ("marconi", 0.2),
                                           ("legacy", None), ("sglang", None), ("trtllm", 0.13)])
def test_simulator_equals_the_placeholder_engine(tmp_path, policy, budget):
    # The simulator's runner checks the KV just below each row; the placeholder engine's re-hashes the
    # whole prefix under every row (a shared block overwritten anywhere fails): the same records.
    path = _scaled_trace(tmp_path)
    for reading in ("as-given", "chains"):
        requests = list(MooncakeTrace(path, reading).requests())
        runs = [simulate(requests, SimConfig(policy, budget_gb=budget, prefill_budget=256, max_batch_size=4,
                                             kv_pool_gb=0.05, check_whole_prefix=whole)) for whole in (False, True)]
        fast, slow = ([dataclass_tuple(x) for x in run["records"]] for run in runs)
        assert fast == slow and len(fast) == len(requests)
        keys = ("kv_hit_tokens", "ssm_hit_tokens", "replayed_tokens", "forwards", "snapshots_saved",
                "snapshots_evicted", "snapshot_bytes_peak", "ttft_s_p50")
        assert {k: runs[0]["metrics"][k] for k in keys} == {k: runs[1]["metrics"][k] for k in keys}
    m = runs[0]["metrics"]
    assert m["kv_hit_tokens"] > 0 and m["lost_tokens"] == m["kv_hit_tokens"] - m["ssm_hit_tokens"]


def dataclass_tuple(record):
    return (record.index, record.kv_match, record.restore_at, record.replayed, record.forwards,
            tuple(record.chunk_ends), tuple(record.snapshot_positions), record.ttft_s)


@pytest.mark.parametrize("whole", [False, True])
def test_the_simulators_runner_catches_a_wrong_restore(whole):
    from model.batch import SequenceChunk
    from model.engine import PlaceholderRunner
    import torch

    r = PlaceholderRunner(1, 4, 4, check_whole_prefix=whole)
    r.forward([SequenceChunk(torch.arange(8), 0, [0, 1], 0)])
    state = r.read_state(0)
    r.forward([SequenceChunk(torch.arange(3), 8, [0, 1, 2], 0)])
    with pytest.raises(AssertionError, match="holds position"):
        r.forward([SequenceChunk(torch.arange(3), 8, [0, 1, 2], 0)])
    r.write_state(0, state)
    r.forward([SequenceChunk(torch.arange(3), 8, [0, 1, 2], 0, kv_cached_len=8)])
    r.write_state(0, type(state)(8, state.hash + 1, state.nbytes))
    with pytest.raises(AssertionError, match="disagree"):
        r.forward([SequenceChunk(torch.arange(3), 8, [0, 1, 2], 0)])


def test_command_writes_the_summary(tmp_path):
    from experiments.traces.__main__ import main

    path = _scaled_trace(tmp_path, n=12)
    out = tmp_path / "out"
    assert main(["--trace", "mooncake-conversation", "--trace-file", str(path), "--reading", "as-given,chains",
                 "--policy", "vllm-align,ours-plus", "--budget-gb", "0.2,inf", "--limit", "12",
                 "--kv-pool-gb", "0.2", "--prefill-budget", "1024", "--max-batch-size", "4", "--out", str(out),
                 "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["trace"] == "mooncake-conversation" and s["reading"] == "as-given" and s["shape"] == "bamba-9b"
    assert s["budget_gb"] == [0.2, None] and s["prompt_tokens"] > 0 and s["device"] and s["torch"]
    assert set(s["policies"]) == {"vllm-align", "ours-plus"} and set(s["readings"]) == {"as-given", "chains"}
    for m in s["policies"].values():
        for key in ("kv_hit_tokens", "ssm_hit_tokens", "lost_tokens", "replayed_tokens", "snapshot_bytes_peak",
                    "snapshots_saved", "snapshots_evicted", "ttft_s_p50", "ttft_s_p99", "forwards"):
            assert key in m and set(m["by_budget"]) == {"0.2", "unbounded"}
    assert s["policies"]["vllm-align"]["block_size"] == 528
    ran = s["policies"]["vllm-align"]["effective_settings"]  # vLLM's padded block at Bamba-9B, decode on it
    assert (ran["block_size"], ran["decode_snapshots"], ran["decode_snapshot_grid"]) == (528, True, 0)


def test_command_names_a_bad_line(tmp_path, capsys):
    from experiments.traces.__main__ import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}) + "\n"
                   + json.dumps({"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [1]}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["--trace", "mooncake-conversation", "--trace-file", str(bad), "--policy", "aligned",
              "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    assert f"{bad}:2 hash_ids: has 1 ids" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists()


def test_optimum_marks_restore_every_match_on_a_slice(tmp_path):
    from experiments.traces.oracle import optimum_marks

    path = _scaled_trace(tmp_path, n=60, scale=16)
    requests = list(MooncakeTrace(path, "chains").requests())
    marks = optimum_marks(requests)
    # a mark lies in what its request computes: prompt + reply but its last token (oracle docstring)
    assert marks and all(0 < m < requests[i].prompt_len + requests[i].output_len for i, ms in marks.items() for m in ms)
    cfg = dict(prefill_budget=512, max_batch_size=4, kv_pool_gb=1.0)
    best = simulate(requests, SimConfig("optimum", **cfg), marks)["metrics"]
    ours = simulate(requests, SimConfig("ours-plus", **cfg))["metrics"]
    assert best["kv_hit_tokens"] > 0 and best["ssm_hit_tokens"] == best["kv_hit_tokens"]
    assert best["ssm_hit_tokens"] >= ours["ssm_hit_tokens"]


def test_ray_sweep_on_two_cpus_matches_the_shards(tmp_path):
    pytest.importorskip("ray")
    from experiments.common import sweep_parts
    from experiments.traces.__main__ import main

    path = _scaled_trace(tmp_path, n=10)
    common = ["--trace", "mooncake-conversation", "--trace-file", str(path), "--policy", "aligned,ours-plus",
              "--budget-gb", "0.2,inf", "--kv-pool-gb", "0.2", "--prefill-budget", "1024", "--max-batch-size", "4",
              "--no-plots"]
    assert main([*common, "--ray", "--ray-cpus", "2", "--ray-tasks", "2", "--out", str(tmp_path / "ray")]) == 0
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("ray", "local"))
    assert a["config"] == b["config"] and len(sweep_parts.part_files(tmp_path / "ray", "traces")) == 2
    drop = ("wall_s",)
    for name in ("aligned", "ours-plus"):
        for budget in ("0.2", "unbounded"):
            x, y = a["policies"][name]["by_budget"][budget], b["policies"][name]["by_budget"][budget]
            assert {k: v for k, v in x.items() if k not in drop} == {k: v for k, v in y.items() if k not in drop}


def test_budgeted_optimum_follows_the_future(tmp_path):
    """Under a budget the optimum evicts by next use (Belady's MIN): on a slice it restores
    more tokens than the same captures under LRU, and no policy restores more."""
    from experiments.traces.oracle import optimum_marks, optimum_matches, optimum_uses
    from planner.evictions.next_use import NextUseEviction

    path = _scaled_trace(tmp_path, n=80, scale=16)
    requests = list(MooncakeTrace(path, "as-given").requests())
    matches = optimum_matches(requests)
    marks, uses = optimum_marks(requests, matches=matches), optimum_uses(requests, matches=matches)
    assert sum(len(v) for v in uses.values()) == len(matches) > 0
    cost = ShapeCost.from_preset("bamba-9b")
    budget = 3 * cost.state_bytes / 1e9  # three snapshots: eviction decides
    cfg = dict(prefill_budget=512, max_batch_size=4, kv_pool_gb=1.0, budget_gb=budget)
    future = simulate(requests, SimConfig("optimum", **cfg), marks, uses)["metrics"]
    lru = simulate(requests, SimConfig("optimum", **cfg), marks)["metrics"]
    assert future["snapshot_bytes_peak"] <= budget * 1e9 and future["snapshots_evicted"] > 0
    assert future["ssm_hit_tokens"] > lru["ssm_hit_tokens"]  # 25648 vs 15776 of 29504 KV-hit tokens here
    for name in ("ours-plus", "marconi", "trtllm", "vllm-junction"):
        assert future["ssm_hit_tokens"] >= simulate(requests, SimConfig(name, **cfg))["metrics"]["ssm_hit_tokens"], name
    assert NextUseEviction(uses).next_use(next(iter(uses))) == min(next(iter(uses.values())))


def test_command_eviction_override_and_origin_counts(tmp_path):
    from experiments.traces.__main__ import main

    common = ["--trace", "synthetic", "--policy", "ours-plus,marconi", "--limit", "30", "--kv-pool-gb", "1",
              "--budget-gb", "0.2", "--no-plots"]  # three 62 MB Bamba-9B snapshots
    assert main([*common, "--out", str(tmp_path / "own")]) == 0
    assert main([*common, "--eviction", "lru", "--out", str(tmp_path / "lru")]) == 0
    own = json.loads((tmp_path / "own" / "summary.json").read_text())
    lru = json.loads((tmp_path / "lru" / "summary.json").read_text())
    assert own["policies"]["ours-plus"]["eviction"] == "shadow_best"
    assert own["policies"]["marconi"]["eviction"] == "flop_aware"
    assert {p["eviction"] for p in lru["policies"].values()} == {"lru"} and lru["config"]["eviction"] == "lru"
    assert "eviction" not in own["config"]  # sweeps without the flag keep their definition
    for s in (own, lru):
        for m in s["policies"].values():
            assert sum(m["saved_by_origin"].values()) == m["snapshots_saved"]
            assert sum(m["restored_tokens_by_origin"].values()) == m["ssm_hit_tokens"]
            assert set(m["saved_by_origin"]) <= {"chunk", "mark", "speculative", "decode"}
        assert s["policies"]["ours-plus"]["snapshots_evicted"] > 0 and s["policies"]["ours-plus"]["ssm_hit_tokens"] > 0
    with pytest.raises(SystemExit):
        main([*common, "--eviction", "fifo", "--out", str(tmp_path / "bad")])


def test_command_runs_the_synthetic_chat_sessions(tmp_path):
    from experiments.traces.__main__ import main

    out = tmp_path / "out"
    assert main(["--trace", "synthetic", "--policy", "aligned,ours-plus", "--limit", "30", "--kv-pool-gb", "1",
                 "--out", str(out), "--no-plots"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["trace"] == "synthetic" and s["reading"] == "chains" and s["requests"] == 30
    ours, aligned = s["policies"]["ours-plus"], s["policies"]["aligned"]
    # next turns share their history: the KV hits; ours-plus keeps the decode state a next turn restores
    assert ours["kv_hit_tokens"] > 0 and ours["ssm_hit_tokens"] > aligned["ssm_hit_tokens"]


def test_a_killed_shard_resumes_with_the_points_it_finished(tmp_path):
    from experiments.common import sweep_parts

    points = [{"x": i} for i in range(5)]
    measured = []

    def measure(i, p):
        if i == 3 and not measured[-1:] == ["resumed"]:
            raise KeyboardInterrupt  # the kill, after points 0..2 were written
        measured.append(i)
        return [{"point": i, "row": 0, "y": p["x"] * 10}]

    with pytest.raises(KeyboardInterrupt):
        sweep_parts.run_shard(tmp_path, "s", points, {"c": 1}, (0, 1), measure, tag=dict)
    assert measured == [0, 1, 2]
    measured.append("resumed")
    part = sweep_parts.run_shard(tmp_path, "s", points, {"c": 1}, (0, 1), measure, tag=dict, resume=True)
    assert measured == [0, 1, 2, "resumed", 3, 4] and part["done"] == [0, 1, 2, 3, 4]
    assert [r["y"] for r in part["rows"]] == [0, 10, 20, 30, 40]
    measured.clear()
    with pytest.raises(sweep_parts.IncompleteSweep, match=r"s\.part0of1\.json\.gz holds another study"):
        sweep_parts.run_shard(tmp_path, "s", points, {"c": 2}, (0, 1), lambda i, p: measured.append(i) or [],
                              tag=dict, resume=True)  # a resume into another definition's folder: refused
    assert measured == [] and len(sweep_parts.part_files(tmp_path, "s")) == 1
    sweep_parts.run_shard(tmp_path, "s", points, {"c": 2}, (0, 1), lambda i, p: measured.append(i) or [], tag=dict)
    assert measured == [0, 1, 2, 3, 4]  # a rerun without --resume: the stale part replaced, nothing kept


def test_shadow_best_with_one_candidate_is_that_candidate(tmp_path, monkeypatch):
    """Through the engine: shadow_best following a single candidate (learned value) gives learned
    value's records exactly, and reports every lookup as led by it; with its four candidates it
    reports each one's share."""
    from planner.evictions import shadow_best
    from planner.evictions.learned_value import LearnedValueEviction

    path = _scaled_trace(tmp_path, n=80, scale=16)
    requests = list(MooncakeTrace(path, "chains").requests())
    budget = 3 * ShapeCost.from_preset("bamba-9b").state_bytes / 1e9  # three snapshots: eviction decides
    cfg = dict(prefill_budget=512, max_batch_size=4, kv_pool_gb=1.0, budget_gb=budget)
    four = simulate(requests, SimConfig("ours-plus", **cfg))["metrics"]
    assert four["eviction"] == "shadow_best" and set(four["eviction_leaders"]) == set(shadow_best.CANDIDATES)
    lookups = sum(four["eviction_leaders"].values())
    assert lookups >= sum(r.kv_match > 0 for r in simulate(requests, SimConfig("ours-plus", **cfg))["records"]) > 0
    alone = simulate(requests, SimConfig("ours-plus", eviction="learned_value", **cfg))
    monkeypatch.setattr(shadow_best, "CANDIDATES", {"learned_value": LearnedValueEviction})
    one = simulate(requests, SimConfig("ours-plus", **cfg))
    assert [dataclass_tuple(r) for r in one["records"]] == [dataclass_tuple(r) for r in alone["records"]]
    assert one["metrics"]["snapshots_evicted"] == alone["metrics"]["snapshots_evicted"] > 0
    assert one["metrics"]["eviction_leaders"] == {"learned_value": lookups}
    assert alone["metrics"]["eviction_leaders"] is None
