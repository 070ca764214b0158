"""The generic top-level package names resolve to this repo, and nothing mistakes them for others."""

import importlib
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_top_level_packages_come_from_the_repo_root():
    for name in ("kernels", "model", "planner", "experiments"):
        module = importlib.import_module(name)
        assert pathlib.Path(module.__file__).resolve().parent == REPO / name, (name, module.__file__)


def test_transformers_does_not_take_our_kernels_package_for_hf_kernels():
    """transformers probes an optional `kernels` hub package by name; ours must not pass for it."""
    code = "from transformers.utils.import_utils import is_kernels_available; print(is_kernels_available())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_packages_import_from_another_directory(tmp_path):
    """Installed (editable) imports work outside the repo root too, e.g. from a results folder."""
    code = "import kernels, model, planner, experiments; print(planner.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert pathlib.Path(out.stdout.strip()).resolve().parent == REPO / "planner"
