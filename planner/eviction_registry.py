"""Every snapshot eviction policy by name: `EVICTION_POLICIES` maps a name to a policy class, the
same shape as the chunk policies' `planner.policies.registry.POLICIES`, and `get_eviction` is the one
place a name is resolved: `get_eviction("flop_aware", alpha=0.5)`.

A module of its own because shadow_best (`planner.shadow_eviction`) builds the other rules and the
registry lists shadow_best: kept in `planner.eviction`, the two modules imported each other.
"""

from __future__ import annotations

import inspect

from kernels.checks import require
from planner.eviction import FlopAwareEviction, LearnedValueEviction, SeglenEviction
from planner.shadow_eviction import ShadowBestEviction
from planner.snapshot_store import EvictionPolicy, LRUEviction

EVICTION_POLICIES: dict[str, type] = {cls.name: cls for cls in (LRUEviction, FlopAwareEviction, LearnedValueEviction,
                                                                 SeglenEviction, ShadowBestEviction)}


def get_eviction(policy: EvictionPolicy | str, **params) -> EvictionPolicy:
    """A fresh eviction policy named `policy`, built with `params` (a policy object is returned as
    is): the one place an eviction name is resolved. Unknown names or parameters raise naming them."""
    if not isinstance(policy, str):
        require(not params, "params", f"given with a policy object, not a name: {sorted(params)}")
        return policy
    require(policy in EVICTION_POLICIES, "eviction", f"must be one of {sorted(EVICTION_POLICIES)}, got {policy!r}")
    cls = EVICTION_POLICIES[policy]
    accepted = sorted(inspect.signature(cls).parameters)
    for name in params:
        require(name in accepted, name,
                f"not a parameter of eviction policy {policy!r} (it takes {accepted or 'none'})")
    return cls(**params)
