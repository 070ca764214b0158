"""Scheduler and engine bookkeeping, driven end to end with the placeholder runner."""

import random

import pytest

from model.engine import Engine, EngineConfig, ModelShape
from model.engine import PlaceholderRunner
from planner.policies.base import PlanContext
from planner.policies.registry import POLICIES
from planner.prefill_state import PrefillState
from planner.prefix_cache import KVLease
from planner.request import Request
from planner.scheduler import SchedulerConfig

ALIGNED = POLICIES["aligned"]


def make_engine(capture_mode="in_pass", **sched):
    return Engine.for_placeholder(capture_mode=capture_mode, keep_prompt_logits=True, **sched)


def prompt(n, seed=0, vocab=1000):
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)]


# ---------------------------------------------------------------- the seed's incident, by the real scheduler
@pytest.mark.parametrize(
    "policy,chunk_ends,snapshots,restore,replayed,warm_ends",
    [("legacy", [8193, 16385, 24577, 32769, 32772], [8193, 16385, 24577, 32769], 24577, 8195, [32770, 32772]),
     ("aligned", [8192, 16384, 24576, 32752, 32772], [8192, 16384, 24576, 32752], 32752, 20, [32772])],
)
def test_incident_32772_tokens(policy, chunk_ends, snapshots, restore, replayed, warm_ends):
    eng = make_engine(block_size=16, prefill_budget=8192, max_batch_size=1, num_kv_blocks=4096,
                      policy=policy, snapshot_interval_blocks=512)
    p = prompt(32772)
    cold = eng.add_request(p, 1, "cold")
    eng.run_until_done()
    warm = eng.add_request(p, 1, "warm")
    eng.run_until_done()
    assert cold.metrics.chunk_ends == chunk_ends
    assert cold.metrics.snapshot_positions == snapshots
    assert warm.metrics.kv_match_tokens == 32768
    assert (warm.metrics.restore_at, warm.metrics.replayed_tokens) == (restore, replayed)
    assert warm.metrics.chunk_ends == warm_ends
    assert eng.runner.tokens_run == 32772 + replayed
    assert eng.prompt_logits["cold"].equal(eng.prompt_logits["warm"])
    assert cold.output_token_ids == warm.output_token_ids
    assert eng.scheduler.pool.num_free == 4096  # every block back in the pool (still cached)


def test_incident_without_interval_snapshots():
    eng = make_engine(block_size=16, prefill_budget=8192, num_kv_blocks=4096, policy="aligned")
    p = prompt(32772)
    cold = eng.add_request(p)
    eng.run_until_done()
    assert cold.metrics.snapshot_positions == [32752]


# ---------------------------------------------------------------- token budget
def test_budget_first_chunk_gets_the_slot_token_and_later_chunks_do_not():
    eng = make_engine(block_size=4, prefill_budget=10, max_batch_size=1, num_kv_blocks=64, policy="legacy")
    r = eng.add_request(prompt(40))
    eng.run_until_done()
    assert r.metrics.chunk_ends == [11, 21, 31, 40]


def test_prefill_chunks_share_the_budget_fifo_and_decodes_reserve_one_token_each():
    eng = make_engine(block_size=4, prefill_budget=10, max_batch_size=3, num_kv_blocks=64, policy="legacy")
    eng.add_request(prompt(5, 1), max_new_tokens=4, request_id="a")
    eng.add_request(prompt(30, 2), max_new_tokens=2, request_id="b")
    out = eng.scheduler.schedule()  # tick 1: 13 tokens, nobody holds a slot yet
    assert [(r.request.request_id, r.num_tokens) for r in out.rows] == [("a", 5), ("b", 8)]
    eng.scheduler.update(out, {"a": 7, "b": None})
    out = eng.scheduler.schedule()  # tick 2: 13 - 2 reserved; a decodes, b gets the other 11
    assert [(r.request.request_id, r.num_tokens, r.is_decode) for r in out.rows] == [("a", 1, True), ("b", 11, False)]
    assert out.tokens_reserved == 2


def test_aligned_budget_chunks_floor_to_blocks():
    eng = make_engine(block_size=4, prefill_budget=10, max_batch_size=1, num_kv_blocks=64, policy="aligned")
    r = eng.add_request(prompt(40))
    eng.run_until_done()
    # split point of 40 with bs 4: last boundary 36, split 32
    assert r.metrics.chunk_ends == [8, 16, 24, 32, 40]
    assert 32 in r.metrics.snapshot_positions


@pytest.mark.parametrize("mode,passes", [("in_pass", 1), ("two_pass", 2), ("none", 1)])
def test_last_chunk_capture_modes(mode, passes):
    eng = make_engine(mode, block_size=16, prefill_budget=8192, num_kv_blocks=512, policy="aligned")
    p = prompt(1000)  # shorter than the budget: one last chunk spanning the split point 976
    cold = eng.add_request(p)
    eng.run_until_done()
    assert cold.metrics.chunk_ends == [1000] and cold.metrics.prefill_passes == passes
    assert eng.forward_passes == passes
    warm = eng.add_request(p)
    eng.run_until_done()
    if mode == "none":
        assert cold.metrics.snapshot_positions == [] and warm.metrics.restore_at == 0
    else:
        assert cold.metrics.snapshot_positions == [976]
        assert (warm.metrics.restore_at, warm.metrics.replayed_tokens) == (976, 24)
    assert cold.output_token_ids == warm.output_token_ids


def test_two_pass_runs_segment_k_of_every_row_in_pass_k():
    """Two last chunks with a capture each and a decode row share one tick: two passes, not four."""
    eng = make_engine("two_pass", block_size=16, prefill_budget=8192, max_batch_size=3, num_kv_blocks=512,
                      policy="aligned")
    eng.add_request(prompt(20, 3), max_new_tokens=3, request_id="d")
    eng.step()  # d prefilled; it decodes in the next tick
    a, b = eng.add_request(prompt(1000, 1), request_id="a"), eng.add_request(prompt(500, 2), request_id="b")
    passes_before = eng.forward_passes
    eng.step()
    assert eng.forward_passes - passes_before == 2
    assert (a.metrics.prefill_passes, b.metrics.prefill_passes) == (2, 2)
    assert a.metrics.snapshot_positions == [976] and b.metrics.snapshot_positions == [480]
    eng.run_until_done()
    warm = eng.add_request(prompt(1000, 1), request_id="warm")
    eng.run_until_done()
    assert (warm.metrics.restore_at, warm.output_token_ids) == (976, a.output_token_ids)
    assert eng.prompt_logits["warm"].equal(eng.prompt_logits["a"])


def test_factories_build_the_runner_from_the_settings_and_reject_unknown_ones():
    eng = make_engine(block_size=4, prefill_budget=10, max_batch_size=3, num_kv_blocks=64, policy="legacy")
    assert eng.config.scheduler == SchedulerConfig(block_size=4, prefill_budget=10, max_batch_size=3,
                                                   num_kv_blocks=64, policy="legacy")
    assert (len(eng.runner.slots), eng.runner.kv.shape) == (3, (64, 4))
    explicit = Engine(PlaceholderRunner(3, 64, 4), EngineConfig(eng.config.scheduler, keep_prompt_logits=True))
    done = []
    for e in (eng, explicit):
        e.add_request(prompt(40), max_new_tokens=3, request_id="x")
        done += e.run_until_done()
    assert done[0].output_token_ids == done[1].output_token_ids
    assert done[0].metrics.chunk_ends == done[1].metrics.chunk_ends == [13, 25, 37, 40]
    with pytest.raises(ValueError, match="^blocksize: not an engine setting"):
        Engine.for_placeholder(blocksize=4)
    with pytest.raises(ValueError, match="^scheduler: not an engine setting"):  # its fields are given flat
        Engine.for_placeholder(scheduler=SchedulerConfig())
    with pytest.raises(ValueError, match="^capture_mode:"):
        Engine.for_placeholder(capture_mode="three_pass")
    with pytest.raises(ValueError, match="^eviction: must be one of"):
        Engine.for_placeholder(eviction="fifo")
    assert Engine.for_placeholder(eviction="flop_aware").snapshots.eviction.name == "flop_aware"


# ---------------------------------------------------------------- memory pressure
def test_a_request_waits_when_its_first_chunk_does_not_fit():
    eng = make_engine(block_size=4, prefill_budget=64, max_batch_size=2, num_kv_blocks=6, policy="aligned")
    a = eng.add_request(prompt(16, 1), max_new_tokens=2, request_id="a")  # 4 blocks + 1 for decode
    b = eng.add_request(prompt(12, 2), max_new_tokens=1, request_id="b")  # 3 blocks
    out = eng.scheduler.schedule()
    assert [r.request.request_id for r in out.rows] == ["a"] and b in eng.scheduler.waiting
    eng.run_until_done()
    assert a.is_finished and b.is_finished
    assert eng.scheduler.pool.num_free == 6


def test_decode_growth_preempts_the_newest_request_and_tokens_are_unchanged():
    def run(num_blocks):
        eng = make_engine(block_size=2, prefill_budget=64, max_batch_size=2, num_kv_blocks=num_blocks, policy="aligned")
        reqs = [eng.add_request(prompt(6, s), max_new_tokens=6, request_id=f"r{s}") for s in (1, 2)]
        eng.run_until_done()
        assert eng.scheduler.pool.num_free == num_blocks
        return [r.output_token_ids for r in reqs], [r.metrics.preemptions for r in reqs]

    roomy_tokens, roomy_preempt = run(64)
    tight_tokens, tight_preempt = run(7)  # each needs 6 blocks at the end: they cannot both fit
    assert roomy_preempt == [0, 0] and tight_preempt[0] == 0 and tight_preempt[1] >= 1
    assert tight_tokens == roomy_tokens


def test_request_larger_than_the_pool_is_rejected():
    eng = make_engine(block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match="KV blocks"):
        eng.add_request(prompt(16), max_new_tokens=1)


def test_bad_config():
    with pytest.raises(ValueError, match="prefill_budget"):
        SchedulerConfig(prefill_budget=0)
    with pytest.raises(ValueError, match="policy"):
        SchedulerConfig(policy="x")
    with pytest.raises(ValueError, match="^snapshot_interval_blocks:"):
        SchedulerConfig(snapshot_interval_blocks=-1)
    with pytest.raises(ValueError, match="capture_mode"):
        EngineConfig(capture_mode="three_pass")
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("r", [])


# ---------------------------------------------------------------- differential: prefix caching on vs off
@pytest.mark.parametrize("seed", range(4))
def test_random_workloads_same_tokens_with_and_without_prefix_caching(seed):
    rnd = random.Random(seed)
    system = prompt(rnd.randrange(5, 40), seed)
    work = []
    for i in range(8):
        branch = system[: rnd.randrange(1, len(system) + 1)] if rnd.random() < 0.7 else []
        work.append((branch + prompt(rnd.randrange(1, 30), 100 * seed + i), rnd.randrange(1, 6)))

    def run(enable, policy):
        eng = make_engine(block_size=4, prefill_budget=rnd.choice([8, 16, 64]), max_batch_size=3,
                          num_kv_blocks=40, policy=policy, enable_prefix_caching=enable, snapshot_interval_blocks=2)
        reqs = [eng.add_request(p, n, f"q{i}") for i, (p, n) in enumerate(work)]
        eng.run_until_done()
        assert eng.scheduler.pool.num_free == 40 and all(r.is_finished for r in reqs)
        return [r.output_token_ids for r in reqs], sum(r.metrics.replayed_tokens for r in reqs)

    base, base_tokens = run(False, "aligned")
    for policy in ("aligned", "legacy"):
        tokens, replayed = run(True, policy)
        assert tokens == base
        assert replayed <= base_tokens


# ---------------------------------------------------------------- resumable prefill state
def test_prefill_position_is_read_off_the_kv():
    lease = KVLease(4, num_computed_tokens=8, num_cached_tokens=8)
    state = PrefillState(list(range(10)), lease)
    assert (state.position, state.remaining) == (8, 2)
    lease.num_computed_tokens = 9  # whoever moves the KV moves the prefill
    assert state.position == 9


def test_prefill_needs_a_token_left_to_run():
    with pytest.raises(ValueError, match="backed off"):
        PrefillState([1, 2, 3, 4], KVLease(4, num_computed_tokens=4))


def test_prefill_commit_must_match_the_kv():
    from planner.block_pool import BlockPool
    pool = BlockPool(4)
    lease = KVLease(4, pool.allocate(3))
    state = PrefillState(list(range(10)), lease)
    plan = state.plan_next(5, ALIGNED, PlanContext(4))
    assert (plan.offset, plan.length) == (0, 4)
    assert not state.commit(plan)
    with pytest.raises(RuntimeError, match="KV says"):
        state.commit(plan)
    assert state.commit(state.plan_next(100, ALIGNED, PlanContext(4)))


def test_a_budget_sliver_does_not_admit_a_request_before_its_shared_prefix_is_published():
    system = prompt(20, 7)

    def engine():  # tick budget 11 + 2 = 13; a 30-token request's first aligned chunk is 12: 1 token left
        return make_engine(block_size=4, prefill_budget=11, max_batch_size=2, num_kv_blocks=64, policy="aligned")

    eng = engine()
    a = eng.add_request(system + prompt(10, 8), 1, "a")
    b = eng.add_request(system + [3, 4, 5], 1, "b")
    eng.step()
    assert a.metrics.chunk_ends == [12] and b in eng.scheduler.waiting  # b waits for a's blocks
    eng.run_until_done()
    assert b.metrics.kv_match_tokens == 20  # admitted in the sliver it would have matched nothing

    eng = engine()  # a prompt that fits in the sliver is admitted: it needs no more than it gets
    eng.add_request(system + prompt(10, 8), 1, "a")
    eng.add_request([7], 1, "c")
    out = eng.scheduler.schedule()
    assert [(r.request.request_id, r.num_tokens) for r in out.rows] == [("a", 12), ("c", 1)]


@pytest.mark.parametrize("policy", ["aligned", "vllm-align"])
def test_a_tick_budget_under_one_block_still_admits(policy):
    # Tick budget 8 + 2 = 10 under the 32-token block (vLLM's 528-token block with budget 256 at
    # Bamba-9B): the sliver rule must not hold a request back from a tick that runs no chunk.
    # vllm-align runs on vLLM's padded block: a model whose padded block is 32 keeps it at 32
    eng = make_engine(block_size=32, prefill_budget=8, max_batch_size=2, num_kv_blocks=64, policy=policy,
                      shape=ModelShape(vllm_block=32, kernel_chunk=256))
    system = prompt(64, 3)
    a = eng.add_request(system + prompt(36, 4), 2, "a")
    b = eng.add_request(system + prompt(36, 5), 2, "b")
    eng.run_until_done(max_ticks=200)
    assert a.is_finished and b.is_finished
    assert a.metrics.chunk_ends[0] == 10 and a.metrics.chunk_ends[-1] == 100  # a whole tick budget, then 9 a tick
    assert b.metrics.kv_match_tokens == 64  # admitted after a's chunks: its shared blocks are published


@pytest.mark.parametrize("decode_snapshots,restore", [(False, 24), (True, 36)])
def test_decode_snapshot_lets_the_next_turn_skip_the_previous_reply(decode_snapshots, restore):
    cfg = SchedulerConfig(block_size=4, prefill_budget=64, max_batch_size=1, num_kv_blocks=64, policy="aligned")
    eng = Engine(PlaceholderRunner(1, 64, 4), EngineConfig(cfg, decode_snapshots=decode_snapshots))
    turn1 = eng.add_request(prompt(30, 1), max_new_tokens=10)
    eng.run_until_done()
    # 30 prompt tokens + 9 decoded = 39 computed: 9 full blocks; the last block boundary is 36.
    assert turn1.metrics.snapshot_positions == ([24, 36] if decode_snapshots else [24])
    turn2 = eng.add_request(turn1.all_token_ids + prompt(5, 2), max_new_tokens=1)
    eng.run_until_done()
    assert turn2.metrics.kv_match_tokens == 36
    assert (turn2.metrics.restore_at, turn2.metrics.replayed_tokens) == (restore, 45 - restore)
