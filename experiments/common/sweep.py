"""One sweep/resume mechanism for every study: points, an executor, a store that records each point as it ends.

A sweep is a list of points (plain dicts); a point is known by its key (the config values that name
it, or its index in the list). `pending` gives the points still to run: shard i/n keeps every n-th
point (`--shard i/n`), then the ones a store already recorded are skipped (`--resume`). An executor
measures them and yields each result as it ends, so the caller records it at once and a killed run
keeps what it finished: `inline` (this process), `processes(n)` (a spawn Pool of n), `ray_tasks`
(Ray tasks of one CPU, on a local Ray or a cluster; the optional extra 'sweeps'). A point whose
`measure` raises `PointFailed` comes back as that error (recorded as failed, no row); any other
exception ends the sweep.

Two stores keep to one contract (a point recorded as it ends; a resume keeps the same study's
points and runs the rest; a store of another study or config is refused in one line naming the
file, before any work):
* `Journal`: one JSONL file, a header line naming the sweep and its identity (the config every
  point shares) and then a row a line, appended as each point ends: `traces.factorial` and
  `traces.heldout` (`points.jsonl`).
* a part (`experiments.common.sweep_parts`): one shard's rows in one gzip'd JSON rewritten after
  every point, merged by a check that every point was measured exactly once: the traces sweep, the
  ablations, the multi-turn study (their rows carry per-request lists).
`union` merges rows of several stores (shards), refusing a point recorded twice.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any, Callable, Container, Hashable, Iterable, Iterator, Sequence

from experiments.common.inputs import InputError, read_text
from experiments.common.results_io import log, shard

Measure = Callable[[int, dict], Any]  # (index in the sweep, point) -> its result


class PointFailed(AssertionError):
    """A point whose result failed its correctness check: recorded as failed, its rows never written."""


def pending(points: Sequence[dict], spec: tuple[int, int] = (0, 1), done: Container[Hashable] = (),
            key: Callable[[int, dict], Hashable] | None = None) -> list[tuple[int, dict]]:
    """(index, point) for shard `spec` (index % n == i) whose key (`key(index, point)`; default the
    index) is not in `done`, in sweep order."""
    key = key or (lambda i, p: i)
    return [(i, p) for i, p in shard(list(enumerate(points)), spec) if key(i, p) not in done]


def _attempt(measure: Measure, i: int, point: dict) -> tuple[int, Any]:
    try:
        return i, measure(i, point)
    except PointFailed as err:
        return i, err


@contextlib.contextmanager
def inline(measure: Measure, todo: Sequence[tuple[int, dict]]) -> Iterator[Iterator[tuple[int, dict, Any]]]:
    """The points measured here, one after another (closures welcome: nothing is pickled)."""
    yield ((i, p, _attempt(measure, i, p)[1]) for i, p in todo)


def processes(jobs: int):
    """An executor of `jobs` spawn processes (`measure` must pickle: a module-level function or a
    `functools.partial` of one); results in the order they finish."""
    @contextlib.contextmanager
    def run(measure: Measure, todo: Sequence[tuple[int, dict]]):
        by_index = dict(todo)
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            yield ((i, by_index[i], r) for i, r in pool.imap_unordered(_attempt_job, [(measure, i, p) for i, p in todo]))
    return run


def _attempt_job(job: tuple[Measure, int, dict]) -> tuple[int, Any]:
    return _attempt(*job)


def ray_tasks(address: str | None = None, num_cpus: int | None = None, label: Callable[[dict], str] = str):
    """An executor of Ray tasks (one CPU each) on a local Ray (`num_cpus`; None: all) or the cluster at
    `address`; results in the order they finish (`ray.wait`). Logs where each ran (`label(point)`),
    which stays out of the data."""
    @contextlib.contextmanager
    def run(measure: Measure, todo: Sequence[tuple[int, dict]]):
        by_index = dict(todo)
        with ray_session(address, num_cpus) as ray:
            task = ray.remote(num_cpus=1)(_attempt_on_node)

            def results():
                waiting = [task.remote(measure, i, p) for i, p in todo]
                while waiting:
                    done, waiting = ray.wait(waiting, num_returns=1)
                    i, result, where = ray.get(done[0])
                    log(f"{label(by_index[i])} ran on {where}")
                    yield i, by_index[i], result
            yield results()
    return run


def _attempt_on_node(measure: Measure, i: int, point: dict) -> tuple[int, Any, str]:
    import ray

    node = ray.get_runtime_context().get_node_id()[:8]
    return (*_attempt(measure, i, point), f"node {node} ({socket.gethostname()} pid {os.getpid()})")


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator:
    """Ray, initialised here and shut down after (unless the caller already did): a local Ray with
    `num_cpus` (None: all), or the cluster at `address`. Workers import this repository through
    PYTHONPATH, so every node needs it at the same path."""
    try:
        import ray
    except ImportError as err:
        raise ModuleNotFoundError("--ray needs the optional extra 'sweeps': pip install -e '.[sweeps]'") from err
    root = str(Path(__file__).resolve().parents[2])
    started = not ray.is_initialized()
    if started:  # "local": a fresh Ray even beside a `ray start` cluster, which num_cpus could not resize
        target = "local" if address is None and num_cpus is not None else address
        try:
            ray.init(address=target, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                     log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": root, "OMP_NUM_THREADS": "1"}})
        except ConnectionError as err:  # a wrong address, or a token-auth cluster joined without the token
            raise InputError(f"--ray-address {address}: {err} (is it up? `ray status`; a cluster started with "
                             "token auth needs RAY_AUTH_MODE=token here too)") from None
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def union(stores: Iterable[tuple[str, list[dict]]], key: Callable[[dict], Hashable]) -> list[dict]:
    """The rows of several stores (`(name, rows)`: shards of one sweep) as one list, in store order; a
    point (key) recorded twice is refused, naming both stores and whether the rows agree."""
    seen: dict[Hashable, tuple[str, dict]] = {}
    out = []
    for name, rows in stores:
        for row in rows:
            k = key(row)
            if k in seen:
                other, first = seen[k]
                agree = "the same row" if first == row else "different rows (a conflict)"
                raise InputError(f"{name}: point {k} is also in {other}, with {agree}; a point is measured once")
            seen[k] = (name, row)
            out.append(row)
    return out


class Journal:
    """A sweep's rows in one JSONL file (`path`): a header line `{"sweep": name, "identity": {...}}`,
    then one row a line, appended (and flushed) as each point ends. `key(row)` names a row's point;
    `identity` is what every point shares (trace, model, engine settings): a resume into a journal
    of another sweep or identity is refused. A file with no header (written before the header
    existed) is read as rows, its identity unknown (the study's report is the check there)."""

    def __init__(self, path: Path, sweep: str, identity: dict, key: Callable[[dict], Hashable]):
        self.path, self.sweep, self.identity, self.key = Path(path), sweep, identity, key
        self._file = None

    def header(self) -> dict:
        return {"sweep": self.sweep, "identity": self.identity}

    def kept(self) -> list[dict]:
        """The rows a resume keeps (a torn last line, a killed write, is dropped); refuses in one line a
        file that is unreadable, another sweep's or identity's, or holds a point twice. Read before any
        work: a study calls this in its check."""
        if not self.path.is_file():
            return []
        rows, header = [], None
        lines = read_text(self.path, f"a {self.sweep} points file").splitlines()
        for n, line in enumerate(lines):
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines) - 1:
                    break  # the line a kill cut short
                raise InputError(f"{self.path}:{n + 1}: not a JSON line (a sweep's points file has one row a line)")
            if n == 0 and isinstance(item, dict) and item.keys() == {"sweep", "identity"}:
                header = item
            elif not isinstance(item, dict):
                raise InputError(f"{self.path}:{n + 1}: not a row (a JSON object)")
            else:
                rows.append(item)
        if header is not None:
            mine = json.loads(json.dumps(self.header(), default=str))  # as it reads back (tuples as lists)
            if header["sweep"] != mine["sweep"]:
                raise InputError(f"{self.path} holds another study: sweep {header['sweep']!r} there, "
                                 f"{self.sweep!r} here")
            there, here = header["identity"], mine["identity"]
            differ = [f"{k}={there.get(k)!r} there, {here.get(k)!r} here" for k in sorted(there.keys() | here.keys())
                      if there.get(k) != here.get(k)]
            if differ:
                raise InputError(f"{self.path} holds another study: " + "; ".join(differ))
        return union([(str(self.path), rows)], self.key)

    def start(self, kept: list[dict]) -> None:
        """Open for appending: the header and the kept rows written whole (atomically), then each
        `append`. Without `kept` a rerun starts the file afresh."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(json.dumps(x) + "\n" for x in [self.header(), *kept]))
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")

    def append(self, row: dict) -> None:
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def run_journal(journal: Journal, points: Sequence[dict], measure: Measure, kept: list[dict],
                executor=inline, spec: tuple[int, int] = (0, 1), advance: Callable[[dict], None] | None = None
                ) -> list[dict]:
    """The points of shard `spec` whose key is not among `kept`'s, measured by `executor` and each row
    appended to `journal` as it ends; returns the kept rows and the new ones (in the order they
    finished). The executor starts first: one that fails (no Ray at that address) leaves the file as
    it was. `advance(row)`: after each row (progress)."""
    have = {journal.key(r) for r in kept}
    todo = pending(points, spec, have, key=lambda i, p: journal.key(p))
    rows = list(kept)
    with executor(measure, todo) as results:
        journal.start(kept)
        try:
            for _, point, result in results:
                if isinstance(result, PointFailed):
                    raise result  # a journal records rows only; its studies have no failed points
                journal.append(result)
                rows.append(result)
                if advance is not None:
                    advance(result)
        finally:
            journal.close()
    return rows
