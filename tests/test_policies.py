"""The placement policy type and its registry (`planner.policies`): what a policy must declare,
that it cannot change, and each registered policy's engine defaults.

The engine defaults are the table the trace study ran under before they moved onto the policies
(`planner/placements.py` `PLACEMENT_SETTINGS` until issue 19): vLLM's padded block for
vllm-align, states on it for vllm-junction; decode states on the KV block for vllm-align,
marconi, ours-plus and optimum, on the state block for vllm-junction, on the kernel chunk for
sglang; FLOP-aware eviction for Marconi (its paper), learned value for ours-plus, LRU elsewhere;
only the optimum needs the trace.
"""

import pytest

from planner.policies.base import PlacementPolicy
from planner.policies.registry import POLICIES, get_policy

ENGINE_DEFAULTS = {  # name: (kv_block, decode_grid, eviction, needs_oracle)
    "legacy": ("kv", None, "lru", False),
    "aligned": ("kv", None, "lru", False),
    "vllm-align": ("vllm", "block", "lru", False),
    "vllm-junction": ("vllm-state", "state", "lru", False),
    "sglang": ("kv", "kernel", "lru", False),
    "trtllm": ("kv", None, "lru", False),
    "marconi": ("kv", "block", "flop_aware", False),
    "ollama": ("kv", "block", "lru", False),
    "ours-plus": ("kv", "exact", "shadow_best", False),
    "ours-adaptive": ("kv", "exact", "shadow_best", False),
    "optimum": ("kv", "block", "lru", True),
}
MARK_MODES = {"vllm-junction": "stop", "trtllm": "stop", "marconi": "stop", "ollama": "stop", "sglang": "capture",
              "ours-plus": "capture", "ours-adaptive": "capture", "optimum": "capture", "legacy": "stop", "aligned": "stop", "vllm-align": "stop"}


@pytest.mark.parametrize("name", sorted(ENGINE_DEFAULTS))
def test_each_policy_carries_its_engine_defaults_and_source(name):
    policy = get_policy(name)
    assert (policy.kv_block, policy.decode_grid, policy.eviction, policy.needs_oracle) == ENGINE_DEFAULTS[name]
    assert policy.mark_mode == MARK_MODES[name] and policy.name == name
    assert policy.match_unit == ("token" if name in ("ours-plus", "ours-adaptive") else "block")
    assert len(policy.source) > 40 and type(policy).__doc__.split() == policy.source.split()


def test_the_registry_is_the_ten_policies_and_read_only():
    assert sorted(POLICIES) == sorted(ENGINE_DEFAULTS)
    with pytest.raises(TypeError):
        POLICIES["greedy"] = POLICIES["aligned"]
    with pytest.raises(AttributeError):
        POLICIES["aligned"].eviction = "flop_aware"


def _subclass(**body):
    return type("Toy", (PlacementPolicy,), body)


def test_a_policy_class_must_declare_its_name_and_source_and_valid_defaults():
    assert _subclass(name="toy", __doc__="Toy: a test.")().source == "Toy: a test."
    for body, field in (({"__doc__": "Toy."}, "name"), ({"name": "toy"}, "source"),
                        ({"name": "toy", "__doc__": "Toy.", "kv_block": "page"}, "kv_block"),
                        ({"name": "toy", "__doc__": "Toy.", "decode_grid": "token"}, "decode_grid"),
                        ({"name": "toy", "__doc__": "Toy.", "mark_mode": "skip"}, "mark_mode")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            _subclass(**body)
