"""Moved to `planner.evictions.shadow_best` (a shim while importers move; removed once none is left)."""
from planner.evictions.shadow_best import CANDIDATES, GatedEviction, ShadowBestEviction  # noqa: F401
