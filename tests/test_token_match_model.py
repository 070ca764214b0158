"""Token-granular restore on the real (tiny) models: warm equals cold.

ours-plus (a match unit of 1, the state at n - 1 captured in the prefill's launch, the state after
the last computed token kept at finish) on Bamba's and Granite's tiny presets, both backends: an
identical repeat replays 1 token, a next turn its new tokens plus the reply's last one, a branch
inside a block copies that block's leading rows; each warm request's last-prompt-token logits
equal a cold engine's on the same prompt, and its greedy tokens are identical.

Tolerance, stated once: fp32 logits 1e-5 max abs (issue 21 item 7).
"""

import random

import pytest

from model.engine import Engine
from model.loading import from_preset
from tests.model_helpers import max_abs, one_thread  # noqa: F401 (autouse fixture)

LOGIT_TOL = 1e-5


@pytest.fixture(scope="module", params=["tiny", "granite-tiny"])
def preset(request):
    return request.param


def prompt(n, seed, vocab=256):
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)]


def engine(model, **settings):
    return Engine.for_model(model, policy="ours-plus", block_size=8, prefill_budget=64, max_batch_size=1,
                            num_kv_blocks=64, keep_prompt_logits=True, **settings)


def cold(model, tokens, new):
    """The same prompt on a fresh engine with no cache: the reference logits and tokens."""
    eng = engine(model, enable_prefix_caching=False)
    req = eng.add_request(tokens, new, "cold")
    eng.run_until_done()
    return eng.prompt_logits["cold"], req.output_token_ids


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_warm_equals_cold_at_token_granularity(preset, backend):
    """A: 45 tokens (blocks of 8: 5 whole + 5 rows), 4 generated -> 48 computed, snapshots at the split
    40 - 8 = 32, at 44 = n - 1, and at 48 at finish. B = A's prompt: match 44 (5 blocks + 4 rows
    copied), replay 1. C = A's 49 tokens + 6 new: match 48 (6 whole blocks), replay 7. D branches
    from A at 42 (5 blocks + 2 rows copied): restore at the split 32, replay 50 - 32 = 18."""
    model = from_preset(preset, backend=backend, seed=0)
    eng = engine(model)
    a_prompt = prompt(45, 1)
    a = eng.add_request(a_prompt, 4, "a")
    eng.run_until_done()
    cases = {"b": (a_prompt, (44, 44, 1), 4), "c": (a.all_token_ids + prompt(6, 2), (48, 48, 7), 0),
             "d": (a_prompt[:42] + prompt(8, 3), (42, 32, 18), 2)}
    for rid, (tokens, expected, copied) in cases.items():
        req = eng.add_request(tokens, 3, rid)
        eng.run_until_done()
        m = req.metrics
        assert (m.kv_match_tokens, m.restore_at, m.replayed_tokens) == expected, rid
        assert m.kv_copied_tokens == copied, rid
        ref_logits, ref_tokens = cold(model, tokens, 3)
        assert max_abs(eng.prompt_logits[rid], ref_logits) <= LOGIT_TOL, rid
        assert req.output_token_ids == ref_tokens, rid
    pool = eng.scheduler.pool
    assert pool.num_free == pool.num_blocks
