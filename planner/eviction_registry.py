"""Moved to `planner.evictions.registry` (a shim while importers move; removed once none is left)."""
from planner.evictions.registry import EVICTION_POLICIES, get_eviction  # noqa: F401
