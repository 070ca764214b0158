"""Every placement policy by name: the one list (`POLICIES`) and the one lookup (`get_policy`).

Adding a policy is one line in `_REGISTERED` (and its file under `planner/policies/`).
"""

from __future__ import annotations

import types
from typing import Iterable, Mapping

from kernels.checks import require
from planner.evictions.registry import EVICTION_POLICIES
from planner.policies.aligned import Aligned
from planner.policies.base import PlacementPolicy
from planner.policies.legacy import Legacy
from planner.policies.marconi import Marconi
from planner.policies.ollama import Ollama
from planner.policies.optimum import Optimum
from planner.policies.ours_adaptive import OursAdaptive
from planner.policies.ours_plus import OursPlus
from planner.policies.sglang import SGLang
from planner.policies.trtllm import TensorRTLLM
from planner.policies.vllm import VllmAlign, VllmJunction


def _by_name(policies: Iterable[PlacementPolicy]) -> dict[str, PlacementPolicy]:
    """The policies keyed by name; each name once, each eviction a known one."""
    out: dict[str, PlacementPolicy] = {}
    for policy in policies:
        require(policy.name not in out, "name", f"{policy.name!r} is registered twice")
        require(policy.eviction in EVICTION_POLICIES, "eviction",
                f"{policy.name!r}: must be one of {sorted(EVICTION_POLICIES)}, got {policy.eviction!r}")
        out[policy.name] = policy
    return out


_REGISTERED = (Aligned(), Legacy(), VllmAlign(), VllmJunction(), SGLang(), TensorRTLLM(), Marconi(), Ollama(),
               OursPlus(), Optimum(), OursAdaptive())
POLICIES: Mapping[str, PlacementPolicy] = types.MappingProxyType(_by_name(_REGISTERED))  # read-only


def get_policy(policy: PlacementPolicy | str) -> PlacementPolicy:
    """The policy named `policy` (a `PlacementPolicy` is returned as is): the one place a name is resolved.

    Called once at an edge (a CLI flag, a sweep point, a public constructor: `resolve_settings`,
    `SchedulerConfig`, `SimConfig`); every layer below is handed the object, so a policy in no
    registry runs too (tests/test_policy_resolved_once.py)."""
    if isinstance(policy, PlacementPolicy):
        return policy
    require(policy in POLICIES, "policy", f"must be one of {sorted(POLICIES)}, got {policy!r}")
    return POLICIES[policy]
