"""The eviction rules' base class (`planner/evictions/base.py`): the store calls every hook directly,
so the base must have each one doing nothing, a wrapper must hand each one to its base rule, and the
store must refuse what is not a rule (issue 32 item 6: a base class instead of `getattr` probes)."""

import inspect

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions.base import HOOKS, EvictionPolicy, WrappedEviction
from planner.evictions.registry import EVICTION_POLICIES
from planner.snapshot_store import Snapshot, SnapshotStore

# each hook's arguments, in the order the EvictionPolicy docstring gives them
ARGS = {"bind": ("store",), "saved": ("snap",), "restored": ("snap",), "evicted": ("snap",), "demoted": ("snap",),
        "touched": ("snap",), "offered": ("tokens", 4, 100, "hashes", 2.0, "chunk"),
        "looked_up": ("tokens", 4, "hashes")}


class Calls(EvictionPolicy):
    """Records every hook it hears, with its arguments."""

    name = "calls"
    needs_prefix = True

    def __init__(self):
        self.heard = []
        for hook in HOOKS:
            setattr(self, hook, lambda *args, hook=hook: self.heard.append((hook, args)))

    def choose_victim(self, snapshots, now):
        return snapshots[-1]

    def admits(self, candidate, snapshots):
        return candidate.position > 4


def snap(position, origin="chunk"):
    return Snapshot(position, None, tuple(range(position)), None, 100, origin=origin)


def test_every_hook_of_the_base_does_nothing_and_admission_declines_only_speculative_captures():
    assert set(ARGS) == set(HOOKS) and len(HOOKS) == len(set(HOOKS))
    base = EvictionPolicy()
    for hook in HOOKS:
        assert getattr(base, hook)(*ARGS[hook]) is None
    assert base.leaders() is None and base.needs_prefix is False
    assert [base.admits(snap(4, o), []) for o in ("chunk", "mark", "speculative", "decode", "oracle")] == [
        True, True, False, True, True]
    with pytest.raises(NotImplementedError, match="choose_victim"):
        base.choose_victim([snap(4)], 0)


def test_a_wrapper_hands_every_hook_and_decision_to_its_base():
    inner = Calls()
    wrapped = WrappedEviction(inner, "calls+wrapped")
    assert (wrapped.name, wrapped.needs_prefix) == ("calls+wrapped", True)
    for hook in HOOKS:
        getattr(wrapped, hook)(*ARGS[hook])
    assert inner.heard == [(hook, ARGS[hook]) for hook in HOOKS]
    held = [snap(4), snap(8)]
    assert wrapped.choose_victim(held, 0) is held[-1]
    assert (wrapped.admits(snap(4), held), wrapped.admits(snap(8), held)) == (False, True)


def test_the_store_refuses_what_is_not_an_eviction_rule():
    class LooksLikeOne:  # the shape of a rule, not the type: its missing hooks would fail mid-run
        name = "lru"

        def choose_victim(self, snapshots, now):
            return snapshots[0]

    with pytest.raises(ValueError, match="^eviction: must be a planner.evictions.base.EvictionPolicy, got LooksLikeOne$"):
        SnapshotStore(4, 100, LooksLikeOne())


def test_the_store_tells_its_rule_each_event():
    rule = Calls()
    store = SnapshotStore(4, 250, rule)
    tokens = list(range(16))
    hashes = hash_full_blocks(tokens, 4)

    class State:
        nbytes = 100

    assert store.save(tokens, 8, State(), hashes) and store.save(tokens, 12, State(), hashes)
    assert store.save(tokens, 16, State(), hashes)  # full: `admits` (16 > 4) says yes, the victim leaves
    found = store.lookup(tokens, 16, hashes)
    store.mark_restored(found)
    heard = [h for h, _ in rule.heard]
    assert heard == ["bind", "offered", "saved", "offered", "saved", "offered", "evicted", "saved", "looked_up",
                     "restored"]
    assert rule.heard[0] == ("bind", (store,)) and store.positions() == [8, 16]  # choose_victim: the newest (12)


def test_every_registered_rule_is_an_eviction_policy_built_from_its_name_alone():
    for name, cls in EVICTION_POLICIES.items():
        assert issubclass(cls, EvictionPolicy) and cls.name == name
        assert all(p.default is not inspect.Parameter.empty for p in inspect.signature(cls).parameters.values())
