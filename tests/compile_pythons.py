"""The Pythons the compile tests build the kernels under: this venv's (the current Triton) and
.venv-triton36's (Triton 3.6.0, the GPU machine's; made by scripts/setup_triton36.sh, which
scripts/setup_venv.sh runs). Register counts differ between the two (kernels/ssd_configs.py), so
a kernel must compile without spills under both. Without that venv its cases skip, except under
CI (CI=true), where they fail: CI checks both versions."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRITON36 = REPO / ".venv-triton36" / "bin" / "python"
TRITON36_VERSION = "3.6.0"
PYTHONS = [pytest.param(sys.executable, id="current"), pytest.param(str(TRITON36), id="triton36")]


def usable(python: str) -> str:
    """`python`, or a skip (a fail under CI) when it is the 3.6 venv's and that venv is missing."""
    if python == str(TRITON36) and not TRITON36.exists():
        message = f"no {TRITON36.relative_to(REPO)}: bash scripts/setup_triton36.sh makes it"
        if os.environ.get("CI", "") not in ("", "0", "false"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def check_version(python: str, rows: list[dict]) -> None:
    """Every row was compiled by the Triton that `python` stands for."""
    versions = {r["triton_version"] for r in rows}
    if python == str(TRITON36):
        assert versions == {TRITON36_VERSION}, f"{TRITON36} compiled with Triton {versions}"
    else:
        import triton

        assert versions == {triton.__version__}, versions
