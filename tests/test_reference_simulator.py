"""The trace simulator against an independent reference, exactly, on small random traces (issue 23,
deliverable 5).

`experiments.traces.simulate.simulate` drives the real engine, scheduler, prefix cache, snapshot
store, eviction and cost model; `tests/reference_simulator.py` recomputes every request from
scratch with plain lists and dicts, sharing only the policy's public rule functions (its
docstring lists each rule and where it comes from). Both run the same trace under the same
settings (`SimConfig.engine_settings`), and per request must agree on the KV match, the restore
point, the replayed tokens, the prefill forwards, the chunk ends and the snapshot positions saved;
at the end on the store's counters (saved, evicted, restored, rejected, declined, per origin) and
on the exact set of held snapshots (positions, and each held prefix found by the engine's store).

The traces keep the scheduling simple so that exact agreement is a fair test: arrivals 1000 s
apart (each request finishes before the next arrives), a KV pool that holds every trace (no KV
block is evicted), prompts built from a few shared random prefixes (repeats, next turns =
prompt + reply + new tokens, branches, fresh prompts), lengths often one off a grid (the block,
the kernel chunk, vLLM's 528-token padded block, ours-plus's 2048-token grid, TRT-LLM's 4096),
replies forced. The eight peer policies run unbounded and under a budget of 0-5 snapshots with
their own eviction (LRU, flop_aware, learned_value), marconi and ours-plus also with eviction
overridden to LRU; the offline optimum with the oracle's marks (`oracle.optimum_marks`, which the
reference re-derives from the oracle's docstring) unbounded and under LRU (its Belady's MIN needs
snapshot keys as sha256 chains: left out).

The suite runs seeds 0 .. REF_SIM_TRACES - 1 (default 10) plus the seeds with rare events
(`RARE_SEEDS`) per policy and mode; for the issue's 500 (about 3 minutes on the shared 2-core box):
`REF_SIM_TRACES=500 .venv/bin/python -m pytest -q tests/test_reference_simulator.py`.
"""

from __future__ import annotations

import dataclasses
import os
import random
from unittest import mock

import pytest

import experiments.traces.simulate as simulate_module
from experiments.traces.cost import ShapeCost
from experiments.traces.oracle import optimum_marks
from experiments.traces.simulate import SimConfig, simulate
from experiments.workloads.request import WorkloadRequest
from planner.block_pool import hash_full_blocks
from planner.policies.registry import get_policy
from tests.reference_simulator import oracle_marks, simulate_reference

TRACES = int(os.environ.get("REF_SIM_TRACES", "10"))
# Seeds whose traces hold a rare event, each found by a slip that only they killed at 100 traces: a
# FLOP-aware eviction the FLOPs term decides (14), a learned-value key re-saved after its eviction
# (21), a speculative snapshot that exactly fills the budget (50), a junction on ours-plus's
# 2048 grid under a full LRU store (69), a duplicate save under a budget (72), a held snapshot whose
# full blocks are on a deeper one's prefix but whose partial block is not (100: seglen's ancestry on
# full blocks alone fails it), shadow_best's leader kept by its 5% switch margin (140, 254: a margin
# of 0 fails them), an eviction that hands a snapshot's children up past such a partial block (143).
RARE_SEEDS = (14, 21, 50, 69, 72, 100, 140, 143, 254)
SEEDS = tuple(range(TRACES)) + tuple(s for s in RARE_SEEDS if s >= TRACES)
PEERS = ("legacy", "aligned", "vllm-align", "vllm-junction", "sglang", "trtllm", "marconi", "ollama", "ours-plus")
GAP_S = 1000.0  # a request of <= 9,300 tokens takes well under a simulated second
VOCAB = 30_000
SHAPES = ("bamba-9b", "nemotron-h-8b")  # kernel chunk 256 and 128
GRIDS = (16, 48, 128, 256, 528, 2048, 4096)  # lengths land one off these


# ------------------------------------------------------------------ random traces
def pick_len(rng: random.Random, hi: int) -> int:
    """A length in 1..hi, half the time within two tokens of a grid multiple."""
    grids = [g for g in GRIDS if g <= hi]
    if grids and rng.random() < 0.5:
        g = rng.choice(grids)
        return max(1, min(hi, rng.randint(1, hi // g) * g + rng.choice((-1, 0, 1, 2))))
    return rng.randint(1, hi)


def random_trace(rng: random.Random, scale: int) -> list:
    """(prompt, reply) pairs over a few shared prefixes: repeats, next turns, branches, fresh ones."""
    def fresh(n: int) -> list:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    roots = [fresh(scale) for _ in range(rng.randint(1, 3))]
    trace: list = []
    for _ in range(rng.randint(3, 8)):
        kind = rng.choice(("root", "root", "repeat", "next", "next", "branch", "fresh")) if trace else "root"
        if kind == "root":
            prompt = rng.choice(roots)[:pick_len(rng, scale)] + fresh(rng.choice((0, 0, rng.randint(1, 40))))
        elif kind == "repeat":
            prompt = list(rng.choice(trace)[0])
        elif kind == "next":
            p, r = rng.choice(trace)
            prompt = p + r + fresh(rng.randint(1, 40))
        elif kind == "branch":
            p, r = rng.choice(trace)
            prompt = (p + r)[:pick_len(rng, len(p) + len(r))] + fresh(rng.choice((0, rng.randint(1, 40))))
        else:
            prompt = fresh(pick_len(rng, scale))
        prompt = prompt[:2 * scale + 100] or fresh(1)
        trace.append((prompt, fresh(rng.choice((1, 2, rng.randint(1, 40), rng.randint(1, 40))))))
    return trace


def random_case(seed: int) -> dict:
    """One seeded trace and the engine settings it runs with."""
    rng = random.Random(seed)
    scale = rng.choice((300, 300, 300, 1200, 1200, 4600))
    budget = {300: (64, 100), 1200: (100, 257, 530), 4600: (600, 1100)}[scale]
    return dict(trace=random_trace(rng, scale), shape=rng.choice(SHAPES), block_size=rng.choice((16, 16, 16, 48)),
                prefill_budget=rng.choice(budget), max_batch_size=rng.choice((1, 4)),
                snapshots=rng.choice((0, 1, 2, 2, 3, 3, 5)), exact_budget=rng.random() < 0.5)


def requests_of(trace: list) -> list:
    return [WorkloadRequest(index=i, arrival_s=i * GAP_S, prompt_len=len(p), output_len=len(r), parent=None,
                            session=None, load_prompt=lambda p=p: p, load_reply=lambda r=r: r)
            for i, (p, r) in enumerate(trace)]


# ------------------------------------------------------------------ both runs
def run_engine(trace: list, cfg: SimConfig, marks: dict | None):
    """`simulate`'s output and the engine it ran (captured to read its store at the end)."""
    engines = []
    build = simulate_module.build_engine

    def capture(*args, **kwargs):
        engines.append(build(*args, **kwargs))
        return engines[-1]

    with mock.patch.object(simulate_module, "build_engine", capture):
        out = simulate(requests_of(trace), cfg, marks)
    return out, engines[0]


def flops_table(cost: ShapeCost, trace: list) -> list:
    """The FLOPs the engine stamps on a snapshot at each position a trace can save at (plain numbers)."""
    return [cost.snapshot_flops(p) for p in range(max(len(prompt) + len(reply) for prompt, reply in trace) + 1)]


def settings_differences(settings: dict, policy: str, case: dict, cost: ShapeCost) -> list:
    """The settings both runners take, against the policy's words (`kv_block`, `decode_grid`): the KV
    block ("kv": the engine's; "vllm": the padded hybrid block, rounded up to a multiple of the
    engine's block; "vllm-state": the engine's block, states on the padded one) and the decode
    grid (None: off; "block": the KV block; "state": the state block; "kernel": the kernel chunk,
    rounded up to a KV block multiple so a block-floored match can land on it; "exact": the match
    unit, `match_unit` "token" being 1)."""
    words, bs = get_policy(policy), case["block_size"]
    padded = -(-cost.vllm_block // bs) * bs  # 528 at block 16 and 48
    block = padded if words.kv_block == "vllm" else bs
    state = padded if words.kv_block == "vllm-state" else 0
    unit = 1 if words.match_unit == "token" else 0  # "token": any token; "block": 0, read as the block
    grid = {None: None, "block": block, "state": state or block,
            "kernel": -(-max(cost.kernel_chunk, block) // block) * block, "exact": unit or block}[words.decode_grid]
    got_grid = (settings["decode_snapshot_grid"] or settings["block_size"]) if settings["decode_snapshots"] else None
    want = (block, state, cost.kernel_chunk, grid, unit, case["prefill_budget"], case["max_batch_size"], policy)
    got = (settings["block_size"], settings["state_block"], settings["kernel_chunk"], got_grid,
           settings["prefix_match_unit"], settings["prefill_budget"], settings["max_batch_size"], settings["policy"].name)
    return [] if got == want else [f"settings {got} != {want}"]


def compare(case: dict, policy: str, bounded: bool, eviction: str | None) -> tuple[list, object]:
    """Every difference between the simulator and the reference on one case (empty: they agree),
    and the reference's run."""
    cost = ShapeCost.from_preset(case["shape"])
    # room for exactly k snapshots, or for k and a half (k = 1 exact: a snapshot exactly the budget's size)
    budget = case["snapshots"] * cost.state_bytes + (0 if case["exact_budget"] else cost.state_bytes // 2)
    budget_gb = budget / 1e9 if bounded else None
    cfg = SimConfig(policy, shape=case["shape"], budget_gb=budget_gb, block_size=case["block_size"],
                    prefill_budget=case["prefill_budget"], max_batch_size=case["max_batch_size"],
                    kv_pool_gb=1.0, time_scale=1.0, eviction=eviction)
    block, trace = cfg.engine_settings(cost)["block_size"], case["trace"]
    # Blocks are taken never-used first, so a pool of every request's blocks never evicts a cached
    # one; a few spare (a small pool is quick to build: 12,000 blocks took 0.2 s).
    need = sum(-(-(len(p) + len(r)) // block) for p, r in trace)
    cfg = dataclasses.replace(cfg, kv_pool_gb=(need + 4) * block * cost.kv_bytes_per_token / 1e9)
    settings = cfg.engine_settings(cost)
    assert need <= settings["num_kv_blocks"], "the KV pool must hold the whole trace (no KV eviction)"
    assert settings["snapshot_byte_budget"] == (budget if bounded else None)
    diffs = settings_differences(settings, policy, case, cost)
    oracle = get_policy(policy).needs_oracle
    marks = optimum_marks(requests_of(trace), block) if oracle else None
    out, engine = run_engine(trace, cfg, marks)
    ref_marks = oracle_marks(trace, block) if oracle else None
    ref = simulate_reference(trace, settings, cost.state_bytes, eviction or get_policy(policy).eviction,
                             flops_table(cost, trace), ref_marks)
    if marks is not None and marks != ref_marks:
        diffs.append(f"oracle marks {marks} != reference {ref_marks}")
    if len(out["records"]) != len(ref.records):
        diffs.append(f"{len(out['records'])} records != {len(ref.records)}")
    for got, want in zip(out["records"], ref.records):
        for field in ("kv_match", "restore_at", "replayed", "forwards", "chunk_ends", "snapshot_positions"):
            if getattr(got, field) != getattr(want, field):
                diffs.append(f"request {got.index} {field}: simulator {getattr(got, field)} != reference "
                             f"{getattr(want, field)}")
    m, counts = out["metrics"], ref.store.counts
    for key in ("saved", "evicted", "restored", "rejected", "declined"):
        if m[f"snapshots_{key}"] != counts[key]:
            diffs.append(f"snapshots_{key}: simulator {m[f'snapshots_{key}']} != reference {counts[key]}")
    for key, want in (("saved_by_origin", ref.store.saved_by_origin),
                      ("restored_tokens_by_origin", ref.store.restored_tokens_by_origin)):
        if m[key] != dict(sorted(want.items())):
            diffs.append(f"{key}: simulator {m[key]} != reference {want}")
    store = engine.snapshots
    if store.positions() != ref.held_positions:
        diffs.append(f"held positions: simulator {store.positions()} != reference {ref.held_positions}")
    for tokens in ref.held_tokens:
        found = store.lookup(list(tokens), len(tokens), hash_full_blocks(list(tokens), block))
        if found is None or found.position != len(tokens):
            diffs.append(f"held prefix of {len(tokens)} tokens missing from the simulator's store")
    if m["snapshot_bytes_peak"] != len(ref.store.held) * cost.state_bytes:  # held only grows (evict = replace)
        diffs.append(f"peak bytes {m['snapshot_bytes_peak']} != {len(ref.store.held)} x {cost.state_bytes}")
    return diffs, ref


# ------------------------------------------------------------------ the comparison
MODES = [(p, False, None) for p in PEERS] + [(p, True, None) for p in PEERS] \
    + [("marconi", True, "lru"), ("ours-plus", True, "lru"), ("optimum", False, None), ("optimum", True, "lru")] \
    + [(p, True, "seglen") for p in ("vllm-align", "marconi", "ours-plus")]


@pytest.mark.parametrize("policy,bounded,eviction", MODES,
                         ids=[f"{p}-{'bounded' if b else 'unbounded'}{'-' + e if e else ''}" for p, b, e in MODES])
def test_simulator_agrees_with_the_reference(policy, bounded, eviction):
    failures, seen = [], {"restored": 0, "lost": 0, "evicted": 0}
    for seed in SEEDS:
        diffs, ref = compare(random_case(seed), policy, bounded, eviction)
        if diffs:
            failures.append(f"seed {seed}: " + "; ".join(diffs[:4]))
        seen["restored"] += ref.store.counts["restored"]
        seen["lost"] += sum(r.kv_match > r.restore_at for r in ref.records)
        seen["evicted"] += ref.store.counts["evicted"]
    assert not failures, f"{len(failures)} of {len(SEEDS)} traces differ:\n" + "\n".join(failures[:5])
    # what the traces exercised, so that agreement is not agreement on nothing
    assert seen["restored"] > 0 and (seen["evicted"] > 0) == bounded, seen
    assert seen["lost"] > 0 or policy in ("vllm-align", "optimum"), seen  # both rarely restore below the match
    if policy == "optimum" and not bounded:  # oracle.py's docstring: unbounded, it restores every KV match
        assert seen["lost"] == 0, seen


# ------------------------------------------------------------------ a hand-derived trace (both runners)
def test_both_runners_give_the_hand_derived_figures():
    """aligned, block 16, prefill budget 64, one slot (first chunk 64 + 1 = 65 tokens, later 64).

    A = 100 fresh tokens, reply 3: chunk 1 proposes 65, floored to 64 (the split point
    floor(99/16)*16 - 16 = 80 is not inside); 64 is not a tail end (96 or 80): no save. Chunk 2
    runs 64..100, the last, and captures the split point 80. A's KV then covers 100 + 2 computed
    reply tokens = 102, six full blocks = 96.
    B = A + reply + 20 new = 123 tokens: KV match 96 (96 < 123, no back-off), restore at the
    deepest snapshot <= 96 = 80, replay 123 - 80 = 43 tokens in one chunk (65 >= 43), which
    captures B's split point floor(122/16)*16 - 16 = 96."""
    a, reply_a = list(range(1, 101)), [7001, 7002, 7003]
    trace = [(a, reply_a), (a + reply_a + list(range(500, 520)), [7004])]
    want = [(0, 0, 100, 2, [64, 100], [80]), (96, 80, 43, 1, [123], [96])]
    cost = ShapeCost.from_preset("bamba-9b")
    cfg = SimConfig("aligned", prefill_budget=64, max_batch_size=1, kv_pool_gb=1.0)
    ref = simulate_reference(trace, cfg.engine_settings(cost), cost.state_bytes, "lru", flops_table(cost, trace))
    sim = simulate(requests_of(trace), cfg)["records"]
    for runner in (ref.records, sim):
        got = [(r.kv_match, r.restore_at, r.replayed, r.forwards, r.chunk_ends, r.snapshot_positions) for r in runner]
        assert got == want
    assert ref.held_positions == [80, 96]


# ------------------------------------------------------------------ disagreements the reference found
def test_ours_plus_tail_capture_on_the_speculative_grid_is_not_speculative():
    """ours-plus, eviction LRU, room for one snapshot, block 16, prefill budget 1100, one slot.

    A = 100 fresh tokens fills the store with its split-point capture at floor(99/16)*16 - 16 = 80.
    B = 2070 fresh tokens: chunk 1 proposes 1101, floored to 1088; chunk 2 (1088..2070, the last)
    captures the split point floor(2069/16)*16 - 16 = 2048 (aligned's last_captures), which is
    also on the 2048-token speculative grid. The PlacementPolicy docstring makes speculative only
    the marks no request asked for; this capture the policy's own rule asks for, as under
    `aligned`, so it evicts A's snapshot. C = B again: KV match floor(2070/16)*16 = 2064 (< 2070),
    restore at 2048, replay 22 tokens (before the fix, B's capture was labelled speculative and declined,
    and C replayed all 2070)."""
    cost = ShapeCost.from_preset("bamba-9b")
    cfg = SimConfig("ours-plus", budget_gb=1.5 * cost.state_bytes / 1e9, prefill_budget=1100, max_batch_size=1,
                    kv_pool_gb=1.0, eviction="lru", prefix_match_unit=16)  # the block unit: no n-1 mark here
    b = list(range(1000, 3070))
    trace = [(list(range(1, 101)), [9000]), (b, [9001]), (list(b), [9002])]
    records = simulate(requests_of(trace), cfg)["records"]
    assert records[1].chunk_ends == [1088, 2070] and records[1].snapshot_positions == [2048]
    assert (records[2].kv_match, records[2].restore_at, records[2].replayed) == (2064, 2048, 22)


def _owner_and_follower(case: str) -> list:
    """Two requests where the follower's KV match lands where no optimum mark or decode state is."""
    a = list(range(1, 1000))
    if case == "last reply token":  # A = 383 tokens, reply 1: the KV holds 383 tokens, 23 blocks = 368
        return [(a[:383], [9000]), (a[:383] + [9000] + list(range(5000, 5019)), [9001])]
    if case == "inside the reply":  # A = 75 + 40 reply (decode state at 112); B branches at 96 into the reply
        reply = list(range(9000, 9040))
        return [(a[:75], reply), ((a[:75] + reply)[:96] + list(range(5000, 5010)), [9001])]
    reply = list(range(9000, 9032))  # "at the prompt end": A = 48 tokens (3 blocks) + 32 reply (decode state at 64)
    return [(a[:48], reply), (a[:48] + list(range(5000, 5060)), [9001])]


@pytest.mark.parametrize("case,kv", [("last reply token", 368), ("inside the reply", 96), ("at the prompt end", 48)])
def test_optimum_restores_every_kv_match(case, kv):
    """The oracle's docstring: with unbounded snapshot memory the optimum restores every KV match.

    KV matches by hand (block 16): 383 computed tokens of A -> 23 blocks = 368 (B shares 384 with
    A's prompt + reply, but A's last reply token is never computed); B shares 96 tokens of A's
    prompt + reply and has 106 tokens -> 96; B shares A's 48-token prompt -> 48. Before the
    oracle marked positions at the prompt end and in the reply (and matched against the reply
    without its last token), the restore points were 352, 48 and 16 (A's split-point captures;
    7 of 336 matched requests on seeds 0-99 restored below their KV match)."""
    assert _run_optimum(case)[1].restore_at == kv


@pytest.mark.parametrize("case,kv", [("last reply token", 368), ("inside the reply", 96), ("at the prompt end", 48)])
def test_optimum_cases_have_the_hand_derived_kv_match(case, kv):
    """The KV matches of the cases above (their docstring), so that test is about the restore alone."""
    assert _run_optimum(case)[1].kv_match == kv


def _run_optimum(case: str) -> list:
    requests = requests_of(_owner_and_follower(case))
    return simulate(requests, SimConfig("optimum", prefill_budget=100, max_batch_size=1, kv_pool_gb=1.0),
                    optimum_marks(requests))["records"]
