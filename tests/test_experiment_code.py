"""House rules of experiments/: short functions, and engines built in one place (experiments/runs.py)."""

import ast
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
# the kernel and model benchmarks follow their own layout (experiments/bench_*.py)
SOURCES = sorted(p for p in EXPERIMENTS.rglob("*.py") if not p.name.startswith("bench_") and "bench" not in p.parts)
MAX_FUNCTION_LINES = 80


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_sources_found():
    names = {p.relative_to(EXPERIMENTS).as_posix() for p in SOURCES}
    assert {"runs.py", "warm_restore.py", "ablations.py", "multiturn/run.py", "workloads/synthetic.py"} <= names


def test_no_function_longer_than_80_lines():
    long = [f"{p.relative_to(EXPERIMENTS)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in SOURCES for f in functions(p) if f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_engines_are_constructed_only_in_runs():
    """`runs.make_engine` (and `make_placeholder_engine`) are the one place an experiment builds an Engine."""
    callers = []
    for p in SOURCES:
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func  # Engine(...), or Engine.for_model(...) / Engine.for_placeholder(...)
            if isinstance(func, ast.Attribute) and func.attr.startswith("for_"):
                func = func.value
            if getattr(func, "id", getattr(func, "attr", None)) == "Engine":
                callers.append(p.relative_to(EXPERIMENTS).as_posix())
    assert set(callers) == {"runs.py"}
