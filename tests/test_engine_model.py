"""The engine on the real (tiny) models, Bamba's and Granite's: the scaled-down incident on both backends, capture modes,
greedy decode against the plain forward, and prefix caching never changing tokens.

Tolerances, stated once: fp32 logits 1e-4 max abs (BRIEF section 3); fp32 states 1e-5.
"""

import random

import pytest
import torch

from model.engine import Engine
from model.loading import from_preset
from tests.model_helpers import max_abs, one_thread  # noqa: F401 (autouse fixture)

LOGIT_TOL = 1e-4
STATE_TOL = 1e-5


@pytest.fixture(scope="module", params=["tiny", "granite-tiny"])
def models(request):
    return {backend: from_preset(request.param, backend=backend, seed=0) for backend in ("torch", "triton")}


def make_engine(model, capture_mode="in_pass", decode_snapshots=False, **sched):
    return Engine.for_model(model, capture_mode=capture_mode, keep_prompt_logits=True,
                            decode_snapshots=decode_snapshots, **sched)


def prompt(n, seed, vocab=256):
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)]


# The incident at 1/128 scale: block 4, budget 64, a 260-token prompt. Legacy ends one token
# past each boundary (65, 129, 193, 257), the split point 252 falls inside [193, 257), and the
# warm request matches 256 tokens of KV but restores at 193; aligned saves 252 and replays 8.
SCALED = {"legacy": ([65, 129, 193, 257, 260], 193, 67), "aligned": ([64, 128, 192, 252, 260], 252, 8)}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("policy", ["legacy", "aligned"])
def test_scaled_incident_end_to_end(models, backend, policy):
    ends, restore, replayed = SCALED[policy]
    eng = make_engine(models[backend], block_size=4, prefill_budget=64, max_batch_size=1, num_kv_blocks=80,
                      policy=policy)
    p = prompt(260, 0)
    cold = eng.add_request(p, 1, "cold")
    eng.run_until_done()
    warm = eng.add_request(p, 1, "warm")
    eng.run_until_done()
    assert cold.metrics.chunk_ends == ends
    assert (warm.metrics.kv_match_tokens, warm.metrics.restore_at, warm.metrics.replayed_tokens) == (256, restore, replayed)
    assert max_abs(eng.prompt_logits["warm"], eng.prompt_logits["cold"]) <= LOGIT_TOL
    plain = models[backend].logits(torch.tensor(p))[-1]
    assert max_abs(eng.prompt_logits["cold"], plain) <= LOGIT_TOL
    assert warm.output_token_ids == cold.output_token_ids


def test_in_pass_and_two_pass_save_the_same_snapshot_and_none_saves_nothing(models):
    p = prompt(100, 1)  # one last chunk (budget 256) spanning the split point 92
    saved, logits = {}, {}
    for mode in ("in_pass", "two_pass", "none"):
        eng = make_engine(models["torch"], mode, block_size=4, prefill_budget=256, num_kv_blocks=40)
        cold = eng.add_request(p, 1, "cold")
        eng.run_until_done()
        warm = eng.add_request(p, 1, "warm")
        eng.run_until_done()
        assert cold.metrics.chunk_ends == [100]
        assert cold.metrics.prefill_passes == (2 if mode == "two_pass" else 1)
        snaps = list(eng.snapshots._lru.values())
        if mode == "none":
            assert snaps == [] and warm.metrics.restore_at == 0 and warm.metrics.replayed_tokens == 100
        else:
            assert [s.position for s in snaps] == [92] and warm.metrics.replayed_tokens == 8
            saved[mode] = snaps[0].state
        logits[mode] = eng.prompt_logits["warm"]
        assert max_abs(eng.prompt_logits["warm"], eng.prompt_logits["cold"]) <= LOGIT_TOL
    for a, b in zip(saved["in_pass"].conv + saved["in_pass"].ssm, saved["two_pass"].conv + saved["two_pass"].ssm):
        assert max_abs(a, b) <= STATE_TOL
    assert max_abs(logits["in_pass"], logits["two_pass"]) <= LOGIT_TOL


def test_greedy_decode_matches_the_plain_forward(models):
    model = models["torch"]
    eng = make_engine(model, block_size=4, prefill_budget=32, max_batch_size=2, num_kv_blocks=64)
    reqs = [eng.add_request(prompt(n, s), 6, f"r{s}") for s, n in ((2, 37), (3, 50))]
    eng.run_until_done()
    for req in reqs:
        ids = list(req.prompt_token_ids)
        for _ in range(6):
            ids.append(int(model.logits(torch.tensor(ids))[-1].argmax()))
        assert req.output_token_ids == ids[len(req.prompt_token_ids):]


@pytest.mark.parametrize("seed", range(3))
def test_prefix_caching_never_changes_tokens(models, seed):
    """Random multi-request workloads with shared prefixes, on a pool small enough to make requests
    wait and be preempted: the greedy tokens are the same with caching on (either policy) and off."""
    rnd = random.Random(seed)
    system = prompt(rnd.randrange(20, 60), 100 + seed)
    work = []
    for i in range(8):
        head = system[: rnd.randrange(8, len(system) + 1)] if rnd.random() < 0.8 else []
        work.append((head + prompt(rnd.randrange(1, 24), 1000 * seed + i), rnd.randrange(4, 16)))
    num_blocks = max(-(-(len(p) + n) // 4) for p, n in work) + 3  # the largest request fits, three do not
    preemptions = 0
    runs = {}
    for caching, policy in ((False, "aligned"), (True, "aligned"), (True, "legacy")):
        eng = make_engine(models["torch"], block_size=4, prefill_budget=32, max_batch_size=3, num_kv_blocks=num_blocks,
                          policy=policy, enable_prefix_caching=caching, snapshot_interval_blocks=2)
        reqs = [eng.add_request(p, n, f"q{i}") for i, (p, n) in enumerate(work)]
        eng.run_until_done()
        assert all(r.is_finished for r in reqs)
        assert eng.scheduler.pool.num_free == num_blocks  # every block released
        assert (eng.snapshots.bytes_held > 0) == caching  # no prefix caching: nothing is saved
        eng.snapshots.clear()
        assert eng.snapshots.bytes_held == 0 and len(eng.snapshots) == 0
        runs[(caching, policy)] = [r.output_token_ids for r in reqs]
        preemptions += sum(r.metrics.preemptions for r in reqs)
        if caching:
            assert sum(r.metrics.kv_match_tokens for r in reqs) > 0  # the cache was actually used
    assert runs[(True, "aligned")] == runs[(False, "aligned")] == runs[(True, "legacy")]
    assert preemptions > 0  # the tight pool exercised preemption


def test_decode_snapshot_restore_equals_a_cold_next_turn(models):
    """Turn 2 restores the state saved inside turn 1's reply; its logits equal a cold run's."""
    logits, replayed = {}, {}
    for caching in (False, True):
        eng = make_engine(models["torch"], decode_snapshots=True, block_size=4, prefill_budget=64, num_kv_blocks=64,
                          enable_prefix_caching=caching)
        t1 = eng.add_request(prompt(30, 5), 10, "t1")
        eng.run_until_done()
        t2 = eng.add_request(t1.all_token_ids + prompt(5, 6), 4, "t2")
        eng.run_until_done()
        logits[caching], replayed[caching] = (eng.prompt_logits["t2"], t2.output_token_ids), t2.metrics.replayed_tokens
    assert replayed == {False: 45, True: 9}  # restored at 36, the last block boundary of turn 1's KV
    assert max_abs(logits[True][0], logits[False][0]) <= LOGIT_TOL
    assert logits[True][1] == logits[False][1]
