"""Sharded sweeps: every shard writes its own part file; a merge combines them into one CSV.

A sweep is a list of points (plain dicts). Shard i/n runs the points whose index % n == i
(`results_io.shard`) and rewrites `<out>/parts/<name>.part<i>of<n>.json.gz` after every point, so
a killed shard keeps what it finished. A part records the whole point list, the shard's
config and environment, the rows it measured, and the points that failed their correctness
check (those rows are never written). `merge` reads the parts of one sweep, refuses unless
every point of the list was measured by exactly one shard, and writes `<name>.csv` (rows) and
`<name>.json` (config, environments, failures, and per policy the `effective_settings` its rows
record); figures are plotted from that CSV. Parts are gzip'd (`experiments.common.compact`: they
carry the per-request data, 3-5x smaller); plain `.json` parts of older runs read the same.

The part is the store of `experiments.common.sweep` (the one sweep/resume mechanism) for sweeps
whose rows carry per-request data (the traces sweep, the ablations' points, the multi-turn
configurations): `run_shard` takes the shard's pending points from `sweep.pending`, measures them
through an executor (`sweep.inline` by default), records a point whose `measure` raises
`PointFailed` as failed, and rewrites the part after every point. A resume into a folder whose
parts of this sweep come from another definition or split is refused before any point runs.
Any launcher can split a sweep: run `--shard 0/4` .. `--shard 3/4` anywhere, copy the parts into
one folder, run `--merge`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Sequence

from experiments.common import compact, sweep
from experiments.common.inputs import InputError, read_json
from experiments.common.results_io import environment, log, read_csv, write_csv, write_json
from experiments.common.sweep import PointFailed  # noqa: F401 (the studies raise it as sweep_parts.PointFailed)


def fingerprint(points: Sequence[dict], config: dict) -> str:
    """Identifies one sweep definition: parts of different definitions are never merged."""
    text = json.dumps({"points": list(points), "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def part_path(out: Path, name: str, shard: tuple[int, int]) -> Path:
    i, n = shard
    return Path(out) / "parts" / f"{name}.part{i}of{n}.json.gz"


def part_files(out: Path, name: str) -> list[Path]:
    """The part files of sweep `name` in `out/parts`, compact (`.json.gz`) or plain (`.json`, older runs)."""
    folder = Path(out) / "parts"
    return sorted({*folder.glob(f"{name}.part*of*.json"), *folder.glob(f"{name}.part*of*.json.gz")})


def stale_parts(out: Path, name: str, shard: tuple[int, int], fp: str) -> list[Path]:
    """This sweep's parts that belong to another split or another definition; parts of the same
    split and definition (other shards of this run) are not stale."""
    stale = []
    for path in part_files(out, name):
        try:
            part = json.loads(compact.read_text(path))
        except (ValueError, EOFError, OSError, zlib.error):  # empty or cut (killed mid-write before atomic writes): stale
            part = {}
        if not isinstance(part, dict) or part.get("fingerprint") != fp or part.get("shard", [None, None])[1] != shard[1]:
            stale.append(path)
    return stale


def write_part(out: Path, name: str, shard: tuple[int, int], fp: str, points: Sequence[dict], config: dict,
               environment: dict, rows: list[dict], done: list[int], failed: list[dict]) -> Path:
    return write_json(part_path(out, name, shard), {
        "name": name, "shard": list(shard), "fingerprint": fp, "points": list(points), "config": config,
        "environment": environment, "done": done, "failed": failed, "rows": rows})


class IncompleteSweep(InputError):
    """The parts in a folder do not make one whole sweep (an `InputError`: a `--merge` names it in one usage line)."""


def refuse_stale(out: Path, name: str, points: Sequence[dict], config: dict, spec: tuple[int, int]) -> None:
    """A resume continues only the same sweep and split: an `IncompleteSweep` (one line naming a part)
    when `out` holds parts of this sweep from another definition or split. A study calls it in its
    check, before any work."""
    stale = stale_parts(out, name, spec, fingerprint(points, config))
    if stale:
        raise IncompleteSweep(f"{stale[0]} holds another study: a part of another definition or split of sweep "
                              f"{name!r} ({len(stale)} such part(s)); --resume continues only the same sweep and "
                              "split (rerun without it to replace them)")


def run_shard(out: Path, name: str, points: Sequence[dict], config: dict, spec: tuple[int, int],
              measure: Callable[[int, dict], list[dict]], tag: Callable[[dict], dict], device: str = "cpu",
              resume: bool = False, executor=sweep.inline) -> dict:
    """Measure the points of shard `spec` (index % n == i) with `measure(index, point) -> rows`.

    Stale parts of this sweep (another split or definition) are removed first (a rerun replaces
    them); with `resume` they are refused instead (an `IncompleteSweep` naming them, before any
    point runs), and the rows of this shard's part are kept, only the points it lacks measured (a
    killed shard restarted). The part is rewritten after every point, so a killed shard keeps
    what it finished. A `PointFailed` is logged and recorded as `{"point": index, **tag(point),
    "error": ...}`. Returns the part."""
    fp = fingerprint(points, config)
    if resume:
        refuse_stale(out, name, points, config, spec)
    for path in stale_parts(out, name, spec, fp):
        path.unlink()
        log(f"removed stale part {path}")
    # the 1-minute load average beside the timings: other jobs on the same cores inflate them
    env = environment(device) | {"loadavg_1m_start": os.getloadavg()[0]}
    rows, done, failed = [], [], []
    path = compact.locate(part_path(out, name, spec))  # a plain part of an older run resumes too
    if resume and path.exists():  # not stale: same split, same definition
        part = json.loads(compact.read_text(path))
        rows, done = part["rows"], part["done"]
        log(f"resuming {path}: {len(done)} points kept")
    t0 = time.perf_counter()
    with executor(measure, sweep.pending(points, spec, set(done))) as results:
        for idx, p, new in results:
            if isinstance(new, PointFailed):
                log(f"  POINT FAILED, not reported: {new}")
                failed.append({"point": idx, **tag(p), "error": str(new)})
            else:
                rows.extend(new)
                done.append(idx)
            env["loadavg_1m_end"] = os.getloadavg()[0]
            write_part(out, name, spec, fp, points, config, env, rows, done, failed)
    log(f"{name}: shard {spec[0]}/{spec[1]} done in {time.perf_counter() - t0:.0f} s "
        f"({len(done)} points, {len(failed)} failed)")
    return {"rows": rows, "done": done, "failed": failed}


def collect(out: Path, name: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The parts of `name` in `out`, checked to cover every point exactly once: (parts sorted by
    shard, rows sorted by point, failures)."""
    paths = part_files(out, name)
    if not paths:
        raise IncompleteSweep(f"{out}/parts: no part files for sweep {name!r}")
    parts = sorted((read_part(p) for p in paths), key=lambda p: p["shard"][0])
    fps = {p["fingerprint"] for p in parts}
    splits = {p["shard"][1] for p in parts}
    if len(fps) != 1 or len(splits) != 1:
        raise IncompleteSweep(f"{out}/parts: parts of {name!r} come from different runs "
                              f"(fingerprints {sorted(fps)}, splits {sorted(splits)}); rerun or remove the stale ones")
    n = splits.pop()
    have = {p["shard"][0] for p in parts}
    points = parts[0]["points"]
    done = sorted(i for p in parts for i in p["done"])
    failed = [f for p in parts for f in p["failed"]]
    missing_shards = sorted(set(range(n)) - have)
    missing_points = sorted(set(range(len(points))) - set(done) - {f["point"] for f in failed})
    if missing_shards or missing_points or len(done) != len(set(done)):
        raise IncompleteSweep(f"sweep {name!r}: missing shards {missing_shards} of {n}, unmeasured points "
                              f"{missing_points}, duplicated points {sorted({i for i in done if done.count(i) > 1})}")
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: (r["point"], r.get("row", 0)))
    return parts, rows, failed


PART_KEYS = ("name", "shard", "fingerprint", "points", "config", "environment", "done", "failed", "rows")


def read_part(path: Path) -> dict:
    """One part file, checked: an `InputError` naming it when it is empty, truncated or not a part."""
    part = read_json(path, PART_KEYS, what="a sweep part file")
    shard = part["shard"]
    if not (isinstance(shard, list) and len(shard) == 2 and all(isinstance(x, int) for x in shard)
            and 0 <= shard[0] < shard[1]) or not all(isinstance(part[k], list) for k in ("points", "done", "failed", "rows")):
        raise InputError(f"{path}: not a sweep part file (bad 'shard', 'points', 'done', 'failed' or 'rows')")
    return part


def merge(out: Path, name: str, per_request: Sequence[str] = ()) -> dict:
    """Combine the parts of `name` in `out`; write `<name>.csv` and `<name>.json`; return the meta.
    `per_request`: row keys holding one value per request (a TTFT list), left out of the per-point CSV
    (the parts keep them; the study writes them compact)."""
    parts, rows, failed = collect(out, name)
    write_csv(Path(out) / f"{name}.csv", [csv_row({k: v for k, v in r.items() if k not in per_request}) for r in rows])
    meta = {"name": name, "config": parts[0]["config"], "points": parts[0]["points"], "shards": len(parts),
            "environments": [p["environment"] for p in parts], "failed_points": failed, "rows": len(rows),
            "effective_settings": settings_by_policy(rows)}
    write_json(Path(out) / f"{name}.json", meta)
    return meta


def settings_by_policy(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Per policy, the distinct `effective_settings` its rows ran under, in row order (a sweep may
    run one policy at several blocks or evictions); rows without them are left out."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        settings = row.get("effective_settings")
        if settings is not None and settings not in out.setdefault(row["policy"], []):
            out[row["policy"]].append(settings)
    return {p: s for p, s in out.items() if s}


def csv_row(row: dict) -> dict:
    """Lists and dicts go into the CSV as JSON text."""
    return {k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v for k, v in row.items()}


def load_rows(path: Path) -> list[dict[str, Any]]:
    """A merged CSV back as typed values (numbers, lists, None for empty cells)."""
    out = []
    for row in read_csv(path):
        typed = {}
        for k, v in row.items():
            if v == "":
                typed[k] = None
                continue
            try:
                typed[k] = json.loads(v)
            except json.JSONDecodeError:
                typed[k] = v  # a plain string (policy, mode)
        out.append(typed)
    return out
