"""Seeded serving workloads under KV pressure, and one way to run them (tests/test_serve_under_pressure.py).

A workload is a handful of requests whose prompts share prefixes the way chats and agents do: a
repeat, a branch that leaves an earlier prompt inside a block (so a token-granular match copies a
block's leading rows), an extension of an earlier prompt. It runs on an engine with every knob
drawn: placement, eviction, KV block, prefix match unit, prefill budget, batch slots, a device
snapshot budget of a few states, host and disk tiers (the disk one writes real files), and a KV
pool only as large as the largest request needs alone, plus 0-2 blocks. The liveness rule says
each request is served; warm == cold says each gets the tokens (and, on a model, the logits) a
cache-free engine gives the same prompt.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable

from model.engine import Engine
from model.engine.spill import FileSpill
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.registry import POLICIES
from planner.snapshot_tiers import disk_tier, host_tier

# optimum needs oracle marks that only the trace sweep supplies (an engine refuses it elsewhere)
FUZZ_POLICIES = tuple(p for p in POLICIES if p != "optimum")
FUZZ_EVICTIONS = (None,) + tuple(EVICTION_POLICIES)  # None: the policy's own
TIERS = ("none", "host", "disk", "host+disk")


@dataclasses.dataclass(frozen=True)
class Workload:
    seed: int
    policy: str
    eviction: str | None
    block_size: int
    match_unit: int  # prefix_match_unit (0: the block)
    prefill_budget: int
    max_batch_size: int
    slack_blocks: int  # KV blocks beyond the largest request's own need
    device_states: int  # the device snapshot budget, in states (0: unbounded)
    tiers: str  # one of TIERS
    requests: tuple[tuple[tuple[int, ...], int], ...]  # (prompt, max_new_tokens)

    @property
    def label(self) -> str:
        return (f"seed{self.seed}-{self.policy}-{self.eviction or 'own'}-bs{self.block_size}-u{self.match_unit}"
                f"-slack{self.slack_blocks}-{self.tiers}")


def draw_workload(seed: int, vocab: int = 256, max_prompt: int = 72) -> Workload:
    """One seeded workload (module docstring)."""
    rnd = random.Random(seed)
    bs = rnd.choice((4, 8, 16))
    unit = rnd.choice([u for u in (0, 1, 2, 4) if u == 0 or (u < bs and bs % u == 0)])
    fresh = lambda n: tuple(rnd.randrange(vocab) for _ in range(n))  # noqa: E731
    prompts: list[tuple[int, ...]] = []
    for _ in range(rnd.randint(3, 7)):
        kind = rnd.choice(("new", "repeat", "branch", "branch", "extend")) if prompts else "new"
        if kind == "new":
            p = fresh(rnd.randint(2, max_prompt))
        elif kind == "repeat":
            p = rnd.choice(prompts)
        elif kind == "branch":  # leave an earlier prompt anywhere, mostly inside a block
            base = rnd.choice(prompts)
            cut = rnd.randint(1, len(base))
            p = base[:cut] + fresh(rnd.randint(1, max(1, max_prompt - cut)))
        else:
            base = rnd.choice(prompts)
            p = (base + fresh(rnd.randint(1, 24)))[:max_prompt + 24]
        prompts.append(p)
    requests = tuple((p, rnd.randint(1, 5)) for p in prompts)
    device_states = rnd.choice((0, 1, 2, 4))
    tiers = rnd.choice(TIERS) if device_states else "none"  # an unbounded device never demotes
    return Workload(seed, rnd.choice(FUZZ_POLICIES), rnd.choice(FUZZ_EVICTIONS), bs, unit,
                    rnd.choice((bs, 2 * bs, 3 * bs + 1, 64, 4096)), rnd.randint(1, 3), rnd.choice((0, 0, 1, 2)),
                    device_states, tiers, requests)


def kv_need(block: int, requests) -> int:
    """KV blocks the largest request needs alone (prompt + outputs)."""
    return max(-(-(len(p) + n) // block) for p, n in requests)


def build_engine(w: Workload, make: Callable[..., Engine], state_bytes: int, spill_dir) -> Engine:
    """An engine for `w`: `make(**settings)` is `Engine.for_model` or `Engine.for_placeholder` bound to
    its runner's arguments; `state_bytes`: one snapshot's size, the unit of the snapshot budgets."""
    tiers = []
    if "host" in w.tiers:
        tiers.append(host_tier(state_bytes * 2 / 1e9))
    if "disk" in w.tiers:
        tiers.append(disk_tier(state_bytes * 3 / 1e9, spill=FileSpill(spill_dir)))
    return make(policy=w.policy, eviction=w.eviction, block_size=w.block_size, prefix_match_unit=w.match_unit,
                prefill_budget=w.prefill_budget, max_batch_size=w.max_batch_size,
                num_kv_blocks=lambda block: kv_need(block, w.requests) + w.slack_blocks,
                snapshot_byte_budget=state_bytes * w.device_states or None,
                snapshot_lower_tiers=tuple(tiers), keep_prompt_logits=True)


def serve(eng: Engine, w: Workload, waves: int = 2):
    """Every request of `w`, added in `waves` groups (a later group arrives after the earlier one is
    done, so its prompts meet the earlier ones' cached blocks and snapshots). Returns the requests
    in order; a request the scheduler can never serve raises RuntimeError here."""
    out = []
    size = -(-len(w.requests) // waves)
    for start in range(0, len(w.requests), size):
        for i, (prompt, new) in enumerate(w.requests[start:start + size], start):
            out.append(eng.add_request(list(prompt), new, f"r{i}"))
        eng.run_until_done()
    return out
