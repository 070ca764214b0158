"""The project's one argument check: a ValueError that names the argument and what it must be.

It lives in the bottom layer (`kernels/` imports nothing of the project) so the kernels, the
model core, the planner and the experiments all raise the same way: "name: what was wrong".
"""

from __future__ import annotations


def require(cond: bool, name: str, message: str) -> None:
    """Raise ValueError("name: message") unless cond holds."""
    if not cond:
        raise ValueError(f"{name}: {message}")
