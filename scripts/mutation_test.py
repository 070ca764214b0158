"""Mutation testing of the planner, the engine and the cost model: does a one-line slip in a rule
fail a test?

    .venv/bin/python scripts/mutation_test.py                      # every target, report to runs/mutation/
    .venv/bin/python scripts/mutation_test.py --paths planner/evictions/learned_value.py --jobs 2
    .venv/bin/python scripts/mutation_test.py --out results/mutation   # publish the report
    .venv/bin/python scripts/mutation_test.py --rerun results/mutation/report.json --out results/mutation
                                                                   # after adding tests: survivors only

Each mutant is one small change at one place (operators below). A mutant is *killed* when a test
that calls the mutated function fails (or times out), *survives* when they all pass, and is
*uncovered* when no test calls the function. The score is killed / (mutants - equivalent), where the equivalent
mutants (no input tells them apart from the original) are listed with a reason in
`results/mutation/equivalent.json`, keyed by the mutant's id.

Why a small script and not mutmut or cosmic-ray: both start a fresh interpreter (or rewrite a
copy of the tree) per mutant, and a fresh interpreter here costs ~2.5 s of torch import before
the first test; with ~1,500 mutants on two cores that is an hour of imports. This script collects
the tests once, records which test calls which function (one profiled run), then forks the
collected session per mutant, swaps the mutated function's code object into the live function
(`f.__code__`), and runs only the tests that call it, fastest first, stopping at the first
failure. A mutant gets at most 5 s of those tests (their baseline time; tests slower than 1.5 s,
the end-to-end studies, are left out): what survives that is a rule no unit test pins. A mutant outside any function (a module constant, a class attribute, a settings table)
runs in a fresh interpreter with the mutated module served by an import hook: slower, but few.

Operators: comparison swaps (< <=, > >=, == !=, in / not in, is / is not), arithmetic swaps
(+ -, * //, / *, % //), integer constants n -> n + 1 (0 <-> 1 too), True <-> False, and <-> or,
a dropped `not`, min <-> max. Docstrings and the messages of `require` are left alone.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gc
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_PATHS = ("planner", "model/engine", "model/cost.py", "experiments/traces/cost.py")
# The tests that can reach the targets (the kernel and model-numerics tests cannot); a mutant runs
# only those of them that called its function in the profiled baseline.
DEFAULT_TESTS = (
    "tests/test_prefill_plan.py", "tests/test_placement_golden.py", "tests/test_eviction.py",
    "tests/test_eviction_rules.py", "tests/test_snapshot_store.py", "tests/test_scheduler.py",
    "tests/test_block_pool.py", "tests/test_traces.py", "tests/test_engine_model.py",
    "tests/test_engine_rules.py", "tests/test_cost_rules.py", "tests/test_cost_model.py",
    "tests/test_policies.py", "tests/test_reference_simulator.py", "tests/test_kv_cache_rules.py",
    "tests/test_scheduler_rules.py", "tests/test_runner_rules.py", "tests/test_effective_settings.py",
    "tests/test_multiturn.py", "tests/test_snapshot_dp.py", "tests/test_warm_restore.py",
    "tests/test_ablations.py", "tests/test_step_host_syncs.py", "tests/test_pad_slots.py",
    "tests/test_workloads.py", "tests/test_peer_vllm.py", "tests/test_layering.py",
    "tests/test_token_match.py", "tests/test_serve_under_pressure.py",
)
EQUIVALENT_FILE = ROOT / "results" / "mutation" / "equivalent.json"
MIN_TIMEOUT_S = 20.0  # a mutant's whole run, at least
TEST_TIMEOUT_FACTOR, TEST_TIMEOUT_S = 5.0, 3.0  # one test under a mutant: 5x its baseline + 3 s


# ---------------------------------------------------------------- mutants
@dataclasses.dataclass
class Mutant:
    path: str  # relative to the repo root
    line: int
    col: int
    end_col: int
    operator: str  # e.g. "< -> <="
    function: tuple | None  # the live function's code key, None: module level
    source_line: str
    status: str = "pending"  # killed, timeout, survived, uncovered, error
    tests_run: int = 0
    killed_by: str = ""
    seconds: float = 0.0
    key: str = ""  # path, enclosing function, the mutated source text, operator: stable across edits elsewhere

    @property
    def id(self) -> str:
        return self.key or f"{self.path}:{self.line}:{self.col}-{self.end_col}:{self.operator}"


CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
             ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BIN_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
             ast.Mod: ast.FloorDiv}
SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
          ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
          ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%", ast.And: "and", ast.Or: "or"}


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Ids of nodes never mutated: docstrings and the arguments of `require` (messages, names)."""
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require":
            for arg in node.args[1:] + [k.value for k in node.keywords]:
                skip.update(id(n) for n in ast.walk(arg))
        if isinstance(node, (ast.AnnAssign, ast.arg)) and getattr(node, "annotation", None) is not None:
            skip.update(id(n) for n in ast.walk(node.annotation))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            skip.update(id(n) for n in ast.walk(node.returns))
    return skip


def _sites(tree: ast.AST):
    """Every (node, label, apply, revert) mutation of the tree, in source order."""
    skip = _skipped_nodes(tree)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in CMP_SWAPS:
                    new = CMP_SWAPS[type(op)]()
                    nth = f" (#{i + 1})" if len(node.ops) > 1 else ""

                    def apply(node=node, i=i, new=new):
                        node.ops[i] = new

                    def revert(node=node, i=i, op=op):
                        node.ops[i] = op

                    yield node, f"{SYMBOL[type(op)]} -> {SYMBOL[type(new)]}{nth}", apply, revert
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BIN_SWAPS:
            op, new = node.op, BIN_SWAPS[type(node.op)]()
            yield node, f"{SYMBOL[type(op)]} -> {SYMBOL[type(new)]}", \
                (lambda node=node, new=new: setattr(node, "op", new)), (lambda node=node, op=op: setattr(node, "op", op))
        elif isinstance(node, ast.BoolOp):
            op = node.op
            new = ast.Or() if isinstance(op, ast.And) else ast.And()
            yield node, f"{SYMBOL[type(op)]} -> {SYMBOL[type(new)]}", \
                (lambda node=node, new=new: setattr(node, "op", new)), (lambda node=node, op=op: setattr(node, "op", op))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            old = node.value
            new = (not old) if isinstance(old, bool) else (1 if old == 0 else 0 if old == 1 else old + 1)
            yield node, f"{old!r} -> {new!r}", \
                (lambda node=node, new=new: setattr(node, "value", new)), (lambda node=node, old=old: setattr(node, "value", old))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            parent = parents[id(node)]
            for field, value in ast.iter_fields(parent):
                if value is node:
                    yield node, "not x -> x", \
                        (lambda p=parent, f=field, n=node: setattr(p, f, n.operand)), \
                        (lambda p=parent, f=field, n=node: setattr(p, f, n))
                elif isinstance(value, list) and any(v is node for v in value):
                    i = next(i for i, v in enumerate(value) if v is node)
                    yield node, "not x -> x", \
                        (lambda lst=value, i=i, n=node: lst.__setitem__(i, n.operand)), \
                        (lambda lst=value, i=i, n=node: lst.__setitem__(i, n))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            old = node.func.id
            new = "max" if old == "min" else "min"
            yield node, f"{old} -> {new}", \
                (lambda f=node.func, new=new: setattr(f, "id", new)), (lambda f=node.func, old=old: setattr(f, "id", old))


def code_key(code: types.CodeType) -> tuple:
    """A function's code, identified the same way in the imported module and in a fresh compile."""
    first_col = next((col for _, _, col, _ in code.co_positions() if col is not None), -1)
    return (getattr(code, "co_qualname", code.co_name), code.co_firstlineno, first_col)


def _code_tree(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_tree(const)


def _function_chain(tree: ast.AST, target: ast.AST) -> list[ast.AST]:
    """The function and lambda nodes enclosing `target`, innermost first."""
    chain: list[ast.AST] = []

    def visit(node, stack):
        if node is target:
            chain.extend(reversed(stack))
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return any(visit(child, stack) for child in ast.iter_child_nodes(node))
        # defaults and decorators are evaluated where the function is defined, not when it runs
        outer = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None),
                 *getattr(node, "decorator_list", [])]
        body = node.body if isinstance(node.body, list) else [node.body]
        return any(visit(child, stack) for child in outer) or any(visit(child, stack + [node]) for child in body)

    visit(tree, [])
    return chain


def enumerate_mutants(rel: str):
    """(mutant, mutated module code) for every site of one file."""
    path = ROOT / rel
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, str(path))
    seen: dict[str, int] = {}
    for node, label, apply, revert in list(_sites(tree)):
        chain = _function_chain(tree, node)
        text = " ".join((ast.get_source_segment(source, node) or "").split())[:80]
        apply()
        try:
            code = compile(tree, str(path), "exec")
        except (SyntaxError, ValueError):
            revert()
            continue
        revert()
        funcs = []
        for fn in chain:  # candidate code objects, innermost first; the live one is chosen later
            line = min([fn.lineno] + [d.lineno for d in getattr(fn, "decorator_list", [])])
            for c in _code_tree(code):
                if c.co_firstlineno == line and (isinstance(fn, ast.Lambda) and c.co_name == "<lambda>"
                                                 or getattr(fn, "name", None) == c.co_name):
                    funcs.append((code_key(c), c))
        scope = funcs[0][0][0] if funcs else "<module>"
        key = f"{rel}::{scope}::{text}::{label}"
        seen[key] = seen.get(key, 0) + 1
        mutant = Mutant(rel, node.lineno, node.col_offset, node.end_col_offset, label, None,
                        lines[node.lineno - 1].strip(), key=f"{key}#{seen[key]}")
        yield mutant, funcs, code


# ---------------------------------------------------------------- the module-level path (fresh interpreter)
class _MutatedModuleFinder:
    """Serves one module from a mutated AST (env MUTATION_SPEC = 'path:index')."""

    def __init__(self, rel: str, index: int):
        self.rel, self.index = rel, index
        self.module = rel[:-3].replace("/", ".").removesuffix(".__init__")

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        import importlib.util
        return importlib.util.spec_from_file_location(name, ROOT / self.rel, loader=self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        for i, (mutant, _, code) in enumerate(enumerate_mutants(self.rel)):
            if i == self.index:
                exec(code, module.__dict__)
                return
        raise RuntimeError(f"no mutant {self.index} in {self.rel}")


def pytest_configure(config):  # used as `-p mutation_test` by the fresh-interpreter path
    spec = os.environ.get("MUTATION_SPEC")
    if spec:
        rel, index = spec.rsplit(":", 1)
        sys.meta_path.insert(0, _MutatedModuleFinder(rel, int(index)))


# ---------------------------------------------------------------- the plugin that runs it all
class _Failures:
    def __init__(self):
        self.failed = ""

    def pytest_runtest_logreport(self, report):
        if report.failed and not self.failed:
            self.failed = report.nodeid


class MutationPlugin:
    def __init__(self, args):
        self.args = args
        self.mutants: list[Mutant] = []
        self.baseline_failed: list[str] = []
        self.items: list = []
        self.durations: dict[int, float] = {}
        self.kept: list[dict] = []  # --rerun: the previous report's non-survivors, unchanged

    # the profiled baseline: which test calls which function of a target file (calls, not lines:
    # a line tracer made the trace-study tests ~30x slower)
    def _baseline(self, session):
        targets = {str(ROOT / rel): rel for rel in self.args.files}
        self.calls: dict[tuple, set[int]] = {}  # (file, code key) -> tests that called it
        self.durations: dict[int, float] = {}
        recorder = _Failures()
        session.config.pluginmanager.register(recorder, "mutation-baseline")
        for i, item in enumerate(session.items):
            seen: set[types.CodeType] = set()

            def call(frame, event, arg):
                if frame.f_code.co_filename in targets:
                    seen.add(frame.f_code)
                return None

            recorder.failed = ""
            t0 = time.perf_counter()
            sys.settrace(call)
            try:
                item.ihook.pytest_runtest_protocol(item=item, nextitem=None)
            finally:
                sys.settrace(None)
            self.durations[i] = time.perf_counter() - t0
            if recorder.failed:
                self.baseline_failed.append(item.nodeid)
                continue
            for code in seen:
                self.calls.setdefault((targets[code.co_filename], code_key(code)), set()).add(i)
            print(f"\rbaseline {i + 1}/{len(session.items)}", end="", file=sys.__stderr__, flush=True)
        session.config.pluginmanager.unregister(recorder)
        print(file=sys.__stderr__)

    def _live_functions(self) -> dict[tuple, list[types.FunctionType]]:
        targets = {str(ROOT / rel) for rel in self.args.files}
        live: dict[tuple, list] = {}
        for obj in gc.get_objects():
            if isinstance(obj, types.FunctionType) and obj.__code__.co_filename in targets:
                live.setdefault(code_key(obj.__code__), []).append(obj)
        return live

    def pytest_runtestloop(self, session):
        self._baseline(session)
        live = self._live_functions()
        items = self.items = session.items
        work = []
        for rel in self.args.files:
            file_calls = [tests for (path, _), tests in self.calls.items() if path == rel]
            any_call = set().union(*file_calls) if file_calls else set()
            for index, (mutant, funcs, code) in enumerate(enumerate_mutants(rel)):
                # every live function of the chain: a lambda an object holds (a defaultdict's factory)
                # and the method that makes new ones must both run the mutated code
                chosen = [(key, c) for key, c in funcs if key in live] or None
                if chosen is not None:
                    mutant.function = chosen[0][0]
                    # tests that ran the functions or any function defined inside them
                    inner = {code_key(c) for _, outer in chosen for c in _code_tree(outer)}
                    tests = set().union(*(self.calls.get((rel, k), set()) for k in inner))
                else:  # module level, or a function no live object holds: a fresh interpreter
                    tests = any_call
                tests = self._budgeted(tests)
                self.mutants.append(mutant)
                if not tests:
                    mutant.status = "uncovered"
                    continue
                work.append((mutant, index, chosen, tests))
        if self.args.rerun:  # only the previous report's survivors; the others keep their status
            previous = {m["id"]: m for m in self.args.previous["survivors"]}
            work = [w for w in work if w[0].id in previous]
            kept = [m for m in self.args.previous["mutants"] if m["id"] not in previous]
            self.kept = kept
        if self.args.limit:
            work = work[: self.args.limit]
        print(f"{len(self.mutants)} mutants, {len(work)} covered; running with {self.args.jobs} jobs",
              file=sys.__stderr__, flush=True)
        self._run_all(work, items, live)
        return True

    def _budgeted(self, tests) -> list[int]:
        """The covering tests fastest first, none slower than --max-test-s, until their baseline
        seconds reach --test-budget-s (the first one always runs)."""
        chosen, spent = [], 0.0
        for i in sorted((i for i in tests if self.durations[i] <= self.args.max_test_s), key=self.durations.get):
            if chosen and spent + self.durations[i] > self.args.test_budget_s:
                break
            chosen.append(i)
            spent += self.durations[i]
        return sorted(chosen)  # in collection order: neighbours share module fixtures

    def _timeout(self, tests) -> float:
        per_test = sum(TEST_TIMEOUT_FACTOR * self.durations[i] + TEST_TIMEOUT_S for i in tests)
        return max(MIN_TIMEOUT_S, per_test + 10.0)

    def _start(self, mutant, index, chosen, tests, items, live):
        """Start one mutant's run; returns (pid or Popen, read end of its result pipe or None)."""
        if chosen is None:
            env = dict(os.environ, MUTATION_SPEC=f"{mutant.path}:{index}",
                       PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), os.environ.get("PYTHONPATH", "")]))
            ids = [items[i].nodeid for i in tests]
            proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                     "-p", "mutation_test", *ids], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return proc, None
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: swap the code in, run the covering tests, report the first failure
            os.close(read)
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                for key, code in chosen:
                    for fn in live[key]:
                        fn.__code__ = code
                recorder = _Failures()
                items[0].config.pluginmanager.register(recorder, "mutation-child")
                timed_out = []

                def alarm(signum, frame):  # a mutant that loops: fail the test it hangs in
                    timed_out.append(True)
                    raise TimeoutError("mutant timed out")

                signal.signal(signal.SIGALRM, alarm)
                for n, i in enumerate(tests):
                    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_FACTOR * self.durations[i] + TEST_TIMEOUT_S)
                    # the next test of the run as nextitem: fixtures it shares stay set up
                    nextitem = items[tests[n + 1]] if n + 1 < len(tests) else None
                    items[i].ihook.pytest_runtest_protocol(item=items[i], nextitem=nextitem)
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    if recorder.failed:
                        kind = "timeout" if timed_out else "killed"
                        os.write(write, f"{kind} {n + 1} {recorder.failed}".encode())
                        os._exit(1)
                os.write(write, f"survived {len(tests)} ".encode())
                os._exit(0)
            except BaseException as exc:  # noqa: BLE001 - a child must never return into pytest
                os.write(write, f"error 0 {type(exc).__name__}: {exc}".encode())
                os._exit(2)
        os.close(write)
        return pid, read

    def _run_all(self, work, items, live):
        running: dict = {}  # handle -> (mutant, read fd, deadline, t0)
        queue = list(work)
        done = 0
        while queue or running:
            while queue and len(running) < self.args.jobs:
                mutant, index, chosen, tests = queue.pop(0)
                handle, read = self._start(mutant, index, chosen, tests, items, live)
                running[handle] = (mutant, read, time.time() + self._timeout(tests), time.time(), len(tests))
            time.sleep(0.02)
            for handle, (mutant, read, deadline, t0, n_tests) in list(running.items()):
                finished = self._poll(handle, mutant, read, deadline, n_tests)
                if finished:
                    mutant.seconds = time.time() - t0
                    del running[handle]
                    done += 1
                    print(f"\r{done}/{len(work)} {mutant.status:9s} {mutant.id}"[:150].ljust(150), end="",
                          file=sys.__stderr__, flush=True)
        print(file=sys.__stderr__)

    @staticmethod
    def _poll(handle, mutant, read, deadline, n_tests) -> bool:
        if isinstance(handle, subprocess.Popen):
            if handle.poll() is None:
                if time.time() > deadline:
                    handle.kill()
                    handle.wait()
                    mutant.status, mutant.killed_by = "timeout", "timeout"
                    return True
                return False
            out = handle.stdout.read()
            failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in out.splitlines() if ln.startswith("FAILED ")]
            errored = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
            if handle.returncode == 0:
                mutant.status = "survived"
            elif failed or errored or handle.returncode == 1:
                mutant.status, mutant.killed_by = "killed", (failed or errored or ["(collection)"])[0]
            else:
                mutant.status, mutant.killed_by = "killed", f"exit {handle.returncode}"
            mutant.tests_run = n_tests
            return True
        pid, status = os.waitpid(handle, os.WNOHANG)
        if pid == 0:
            if time.time() > deadline:
                os.kill(handle, signal.SIGKILL)
                os.waitpid(handle, 0)
                os.close(read)
                mutant.status, mutant.killed_by = "timeout", "timeout"
                return True
            return False
        message = os.read(read, 4096).decode() or "error 0 child died without a word"
        os.close(read)
        kind, count, detail = (message.split(" ", 2) + ["", ""])[:3]
        mutant.status, mutant.tests_run, mutant.killed_by = kind, int(count or 0), detail
        return True


# ---------------------------------------------------------------- report
def load_equivalent() -> dict[str, str]:
    if not EQUIVALENT_FILE.exists():
        return {}
    return json.loads(EQUIVALENT_FILE.read_text())


def report(mutants: list[Mutant], baseline_failed: list[str], args, seconds: float, kept=()) -> dict:
    equivalent = load_equivalent()
    if args.rerun:  # the survivors run again, and every other mutant as the previous report had it
        again = {m["id"] for m in args.previous["survivors"]}
        mutants = [m for m in mutants if m.id in again] + \
            [Mutant(**{k: v for k, v in m.items() if k != "id"}, function=None) for m in kept]
    counts: dict[str, int] = {}
    for m in mutants:
        m_status = "equivalent" if m.id in equivalent and m.status in ("survived", "uncovered") else m.status
        counts[m_status] = counts.get(m_status, 0) + 1
    dead = counts.get("killed", 0) + counts.get("timeout", 0)
    considered = len(mutants) - counts.get("equivalent", 0) - counts.get("error", 0)
    per_file: dict[str, dict[str, int]] = {}
    for m in mutants:
        status = "equivalent" if m.id in equivalent and m.status in ("survived", "uncovered") else m.status
        per_file.setdefault(m.path, {}).setdefault(status, 0)
        per_file[m.path][status] += 1
    return {
        "command": "python scripts/mutation_test.py " + " ".join(sys.argv[1:]),
        "paths": list(args.paths), "tests": list(args.tests), "seconds": round(seconds, 1),
        "score": round(dead / considered, 4) if considered else None,
        "max_test_s": args.max_test_s, "test_budget_s": args.test_budget_s, "counts": counts, "per_file": per_file, "baseline_failed": baseline_failed,
        "source_digest": hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in args.files)).hexdigest()[:16],
        "survivors": [dataclasses.asdict(m) | {"id": m.id, "equivalent": equivalent.get(m.id)}
                      for m in mutants if m.status in ("survived", "uncovered")],
        "errors": [dataclasses.asdict(m) | {"id": m.id} for m in mutants if m.status == "error"],
        "mutants": [{"id": m.id, **{k: v for k, v in dataclasses.asdict(m).items() if k != "function"}}
                    for m in sorted(mutants, key=lambda m: (m.path, m.line, m.col, m.operator))],
    }


def markdown(result: dict) -> str:
    """The report as a page: the score, per file, and every mutant that was not killed."""
    counts = result["counts"]
    lines = [f"# Mutation report ({result['when']})", "",
             f"`{result['command']}`: {sum(counts.values())} mutants, score **{result['score']:.1%}** "
             f"(killed or timed out / all but the equivalent); {result['seconds'] / 60:.0f} min, "
             f"tests <= {result['max_test_s']} s each, <= {result['test_budget_s']} s per mutant.", "",
             "| file | killed | timeout | survived | uncovered | equivalent |", "|---|---|---|---|---|---|"]
    for path, c in sorted(result["per_file"].items()):
        lines.append(f"| `{path}` | " + " | ".join(str(c.get(k, 0)) for k in
                     ("killed", "timeout", "survived", "uncovered", "equivalent")) + " |")
    lines += ["", "## Not killed", "", "| mutant | line | status / why equivalent |", "|---|---|---|"]
    for m in result["survivors"]:
        why = f"equivalent: {m['equivalent']}" if m["equivalent"] else f"**{m['status']}**"
        cells = (m["id"], m["source_line"][:70])
        lines.append("| " + " | ".join(f"`{c}`".replace("|", "\\|") for c in cells) + f" | {why} |")
    return "\n".join(lines) + "\n"


def _files(paths) -> list[str]:
    files = []
    for p in paths:
        full = ROOT / p
        if full.is_dir():
            files += sorted(str(f.relative_to(ROOT)) for f in full.rglob("*.py"))
        elif full.is_file() and full.suffix == ".py":
            files.append(p)
        else:
            raise ValueError(f"{p!r} is neither a folder nor a .py file of the repository")
    return files


def _comma_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma list, got {text!r}")
    return items


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--paths", type=_comma_list, default=list(DEFAULT_PATHS), help="folders or files to mutate (comma list)")
    ap.add_argument("--tests", type=_comma_list, default=list(DEFAULT_TESTS),
                    help="test files or node ids to run (comma list)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)), help="mutants run at once")
    ap.add_argument("-k", dest="keyword", default="not triton",
                    help="pytest -k expression: the Triton interpreter's runs cover no planner line that the "
                         "torch backend's do not, and under the call profiler they take minutes each")
    ap.add_argument("--max-test-s", type=float, default=1.5,
                    help="leave out tests slower than this in the baseline (end-to-end studies): a surviving "
                         "mutant runs every test that calls its function, and a rule should be pinned by a "
                         "unit test of its own")
    ap.add_argument("--test-budget-s", type=float, default=5.0,
                    help="baseline seconds of covering tests one mutant may run (fastest first): a survivor "
                         "of the fastest 5 s is a rule no unit test pins")
    ap.add_argument("--rerun", metavar="REPORT",
                    help="run only the survivors of this report.json again (after adding tests); the "
                         "other mutants keep their status in the new report")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N covered mutants (0: all)")
    ap.add_argument("--out", default="runs/mutation", help="folder for report.json (results/mutation publishes)")
    return ap


def checked_args(ap: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parsed flags, each checked, the previous report read and the output folder made, before any work."""
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"argument --jobs: must be >= 1, got {args.jobs}")
    if args.limit < 0:
        ap.error(f"argument --limit: must be >= 0, got {args.limit}")
    try:
        args.files = _files(args.paths)
    except ValueError as exc:
        ap.error(f"argument --paths: {exc}")
    args.previous = None
    if args.rerun:
        try:
            args.previous = json.loads(pathlib.Path(args.rerun).read_text())
            args.previous["survivors"], args.previous["mutants"]  # noqa: B018 - the keys this needs
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"argument --rerun: {args.rerun}: not a report of this script ({type(exc).__name__}: {exc})")
    args.out_folder = ROOT / args.out
    try:
        args.out_folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        ap.error(f"argument --out: {args.out}: cannot create the folder ({exc.strerror})")
    return args


def main(argv=None) -> int:
    args = checked_args(parser(), argv)
    tests = [t for t in args.tests if (ROOT / t.split("::")[0]).exists()]
    missing = sorted(set(args.tests) - set(tests))
    if missing:
        print(f"note: skipping missing test files {missing}", file=sys.stderr)
    import pytest

    plugin = MutationPlugin(args)
    t0 = time.time()
    os.chdir(ROOT)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-k", args.keyword, *tests],
                       plugins=[plugin])
    if not plugin.mutants:
        print(f"error: no mutants were run (pytest exit {code})", file=sys.stderr)
        return 2
    result = report(plugin.mutants, plugin.baseline_failed, args, time.time() - t0, plugin.kept)
    result["slow_tests_left_out"] = sorted(plugin.items[i].nodeid for i, d in plugin.durations.items()
                                           if d > args.max_test_s)
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = args.out_folder
    (out / "report.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "report.md").write_text(markdown(result))
    print(f"score {result['score']}  {result['counts']}  -> {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
