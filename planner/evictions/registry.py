"""Every snapshot eviction rule by name: `EVICTION_POLICIES` maps a name to a rule's class, the same
shape as the placement policies' `planner.policies.registry.POLICIES`, and `get_eviction` is the one
place a name is resolved: `get_eviction("flop_aware", alpha=0.5)`. Adding a rule is one class in
this tuple (and its file under `planner/evictions/`).
"""

from __future__ import annotations

import inspect

from kernels.checks import require
from planner.evictions.base import EvictionPolicy
from planner.evictions.flop_aware import FlopAwareEviction
from planner.evictions.learned_value import LearnedValueEviction
from planner.evictions.lru import LRUEviction
from planner.evictions.seglen import SeglenEviction
from planner.evictions.shadow_best import ShadowBestEviction

EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUEviction, FlopAwareEviction, LearnedValueEviction, SeglenEviction, ShadowBestEviction)}


def get_eviction(policy: EvictionPolicy | str, **params) -> EvictionPolicy:
    """A fresh eviction rule named `policy`, built with `params` (a rule object is returned as is):
    the one place an eviction name is resolved. Unknown names or parameters raise naming them."""
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
