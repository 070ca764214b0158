"""docs/add_a_policy.md followed once: its toy policy, registered the way step 2 says (here on a
copy of the registry, so the real one stays the nine), pinned by the guide's golden rows and run
through the engine: a repeat that shares 60 of 100 tokens restores at the guide's snapshot."""

import pytest

from model.engine import Engine
from planner.policies import registry
from planner.policies.base import PlacementPolicy, PlanContext
from planner.prefill_plan import plan_prompt


class Midpoint(PlacementPolicy):
    """Toy: one snapshot at the last block boundary at or below half the prompt, captured in the
    scan launch that computes it; no decode-time state; LRU eviction. Source: docs/add_a_policy.md."""

    name = "midpoint"
    mark_mode = "capture"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """Half the prompt, floored to the KV block."""
        half = total // 2 // ctx.block_size * ctx.block_size
        return (half,) if restore_at < half < total else ()


@pytest.fixture
def registered(monkeypatch):
    """Step 2 of the guide: one more instance in the registry's list."""
    policies = registry._by_name((*registry._REGISTERED, Midpoint()))
    monkeypatch.setattr(registry, "POLICIES", policies)
    return policies["midpoint"]


# The guide's table: (prompt, chunk ends, captures per chunk, snapshots), block 16, budget 8192.
GUIDE_ROWS = [(100, [100], ((48,),), [48]), (33, [33], ((16,),), [16]), (31, [31], ((),), [])]


@pytest.mark.parametrize("total, ends, captures, snaps", GUIDE_ROWS)
def test_the_guides_golden_rows(registered, total, ends, captures, snaps):
    ctx = PlanContext(16)
    marks = registered.marks(0, 0, total, ctx)
    plans = plan_prompt(total, 16, 8192, 0, "midpoint", marks=marks, ctx=ctx)
    assert [p.end for p in plans] == ends
    assert tuple(p.capture_offsets for p in plans) == captures
    assert [s for p in plans for s in p.snapshot_positions] == snaps


def test_the_policy_runs_in_the_engine_with_its_defaults(registered):
    eng = Engine.for_placeholder(block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=64,
                                 policy="midpoint")
    assert eng.effective_settings["policy"] == "midpoint"
    assert eng.effective_settings["eviction"] == "lru" and eng.effective_settings["decode_snapshot_grid"] == 0
    first = eng.add_request(list(range(1000, 1100)), max_new_tokens=1)
    eng.run_until_done()
    assert first.metrics.snapshot_positions == [48]
    # 60 shared tokens: KV match floored to 48, restore at the snapshot 48, replay 100 - 48.
    repeat = eng.add_request(list(range(1000, 1060)) + list(range(5000, 5040)), max_new_tokens=1)
    eng.run_until_done()
    m = repeat.metrics
    assert (m.kv_match_tokens, m.restore_at, m.replayed_tokens) == (48, 48, 52)


def test_unregistered_name_is_still_refused():
    with pytest.raises(ValueError, match="^policy: must be one of"):
        registry.get_policy("midpoint")


def test_the_guide_gives_the_policy_its_own_figure_style():
    """Step 3's style entry, added to the real table, keeps every registered policy's colour and marker
    distinct (tests/test_figure_style.py's rule), and the proof command runs that test (issue 37:
    the guide's command passed while the suite failed on the missing style)."""
    import ast
    import pathlib
    import re

    from experiments.common import figure_style as fs

    guide = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "add_a_policy.md").read_text()
    entry = ast.literal_eval("{" + re.search(r'^\s*("midpoint": \{[^}]*\}),', guide, re.M).group(1) + "}")["midpoint"]
    others = [s for name, s in fs.POLICY_STYLES.items() if name != "midpoint"]
    assert entry["color"] not in {s["color"] for s in others} and entry["marker"] not in {s["marker"] for s in others}
    proof = guide[guide.index("## 4. Prove it"):]
    assert "tests/test_figure_style.py" in proof
