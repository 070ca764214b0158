"""House rules: short functions everywhere but kernels/ (issue 19), and experiments build engines
only through `Engine.for_*`."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
# the kernel and model benchmarks follow their own layout (experiments/bench_*.py)
SOURCES = sorted(p for p in EXPERIMENTS.rglob("*.py") if not p.name.startswith("bench_") and "bench" not in p.parts)
# The function-length rule covers every package but kernels/ (Triton kernels and their launchers are
# exempt), the benchmarks included.
LENGTH_CHECKED = ("experiments", "model", "planner", "scripts")
LENGTH_SOURCES = sorted(p for d in LENGTH_CHECKED for p in (ROOT / d).rglob("*.py"))
MAX_FUNCTION_LINES = 60
# "path:function" allowed over the limit, each with its reason:
LONG_FUNCTION_EXCEPTIONS: set[str] = set()  # "path:function" allowed over the limit, each with its reason


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_sources_found():
    names = {p.relative_to(EXPERIMENTS).as_posix() for p in SOURCES}
    assert {"common/runs.py", "warm_restore/study.py", "ablations/study.py", "multiturn/run.py", "workloads/synthetic.py"} <= names
    checked = {p.relative_to(ROOT).as_posix() for p in LENGTH_SOURCES}
    assert {"experiments/bench/decode_step.py", "model/batch.py", "planner/scheduler.py", "scripts/mutation_test.py"} <= checked
    assert not any(name.startswith("kernels/") for name in checked)


def test_no_function_longer_than_60_lines():
    """Every function outside kernels/ is at most 60 lines (`def` to its last line), but the listed
    exceptions, which must still exist and still be over the limit (else drop them)."""
    long, excepted = [], set()
    for p in LENGTH_SOURCES:
        rel = p.relative_to(ROOT).as_posix()
        for f in functions(p):
            if f.end_lineno - f.lineno + 1 <= MAX_FUNCTION_LINES:
                continue
            if f"{rel}:{f.name}" in LONG_FUNCTION_EXCEPTIONS:
                excepted.add(f"{rel}:{f.name}")
            else:
                long.append(f"{rel}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)")
    assert long == []
    assert excepted == LONG_FUNCTION_EXCEPTIONS, f"no longer over the limit: {LONG_FUNCTION_EXCEPTIONS - excepted}"


BUILDERS = {"for_model", "for_placeholder", "for_runner"}  # model.engine.Engine: the policy's defaults applied


def test_engines_are_built_only_through_the_policy_aware_constructors():
    """No experiment calls `Engine(...)` (which takes a config as given): every engine is built by
    `Engine.for_model` / `for_placeholder` / `for_runner`, which apply the policy's engine defaults."""
    direct, builders = [], set()
    for p in SOURCES:
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "Engine":
                builders.add(func.attr)
            elif getattr(func, "id", None) == "Engine":
                direct.append(p.relative_to(EXPERIMENTS).as_posix())
    assert direct == [] and builders <= BUILDERS and {"for_model", "for_placeholder", "for_runner"} <= builders


def test_experiments_are_grouped_by_study():
    """experiments/ holds one package per study plus `common/` (issue 19): no loose modules, and each
    study a user runs with `python -m experiments.<study>` has its `__main__`."""
    loose = sorted(p.name for p in EXPERIMENTS.glob("*.py") if p.name != "__init__.py")
    assert not loose, loose
    for study in ("warm_restore", "plan_incident", "ablations", "multiturn", "traces", "workloads", "peer_vllm"):
        assert (EXPERIMENTS / study / "__main__.py").is_file(), study
    assert (EXPERIMENTS / "common" / "__init__.py").is_file()
