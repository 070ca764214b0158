"""Moved to `planner.evictions` (a shim while importers move; removed once none is left)."""
from planner.evictions.flop_aware import FlopAwareEviction  # noqa: F401
from planner.evictions.learned_value import LearnedValueEviction  # noqa: F401
from planner.evictions.next_use import NextUseEviction  # noqa: F401
from planner.evictions.seglen import SEGLEN_WEIGHT, SeglenEviction  # noqa: F401
