"""Where a run writes: its own run folder by default, the committed record only when asked.

`results/` is the published record. A run writes there only with `--publish` (the study's
record folder) or an explicit `--out results/...`; by default it writes to
`runs/<study>/<UTC timestamp>/` (ignored by git). The folder is created and probed for writing
when the flags are parsed, before any work, so a bad `--out` costs one usage line, not a run.

Commands that only read a folder back (`--replot`, `--merge`) take `--out` or `--publish` as
the folder to read; with neither they read the newest run folder of their study.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
from pathlib import Path
from typing import Iterable

from experiments.common.results_io import REPO, RESULTS, log

RUNS = REPO / "runs"


def add_out_flags(ap: argparse.ArgumentParser, record: str) -> None:
    """`--out FOLDER` and `--publish` (= `--out results/<record>`), mutually exclusive.

    `record` is the study's committed folder under results/ (e.g. "warm_restore")."""
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, default=None,
                       help=f"output folder (default: a new runs/{record}/<timestamp>/; results/ only when asked)")
    group.add_argument("--publish", action="store_true",
                       help=f"write into the committed record, results/{record}/ (same as --out results/{record})")
    ap.set_defaults(_record=record)


def record_folder(record: str) -> Path:
    return RESULTS / record


def newest_run(record: str) -> Path | None:
    """The newest run folder of a study (names are UTC timestamps, so they sort by time)."""
    root = RUNS / record
    stamp = re.compile(r"\d{8}-\d{6}")  # a study's sub-studies may keep their own folders beside its runs
    runs = sorted(p for p in root.iterdir() if p.is_dir() and stamp.fullmatch(p.name)) if root.is_dir() else []
    return runs[-1] if runs else None


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")


def check_writable(ap: argparse.ArgumentParser, folder: Path, flag: str = "--out") -> Path:
    """Create `folder` (and its parents) and probe that a file can be written there; otherwise a usage
    error naming the flag and what is wrong, before any work."""
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            ap.error(f"argument {flag}: {parent} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        ap.error(f"argument {flag}: cannot write into {folder} ({e.strerror or e})")
    return folder


def precheck_out(ap: argparse.ArgumentParser, folder: Path | None, flag: str = "--out") -> None:
    """Without creating anything: a usage error if a part of `folder`'s path is a regular file (for
    a command that reads its inputs before it creates the folder, so a bad input leaves nothing)."""
    if folder is None:
        return
    for parent in [Path(folder), *Path(folder).parents]:
        if parent.exists() and not parent.is_dir():
            ap.error(f"argument {flag}: {parent} is a file, not a folder")


def resolve_out(ap: argparse.ArgumentParser, args: argparse.Namespace, reading: str | None = None) -> Path:
    """The folder this run writes to (or, with `reading` = the reading flag's name, reads from), set
    on `args.out` and returned. Writing: created and probed now. Reading: must exist."""
    record = args._record
    if args.publish:
        args.out = record_folder(record)
    if reading is not None:
        if args.out is None:
            args.out = newest_run(record)
            if args.out is None:
                ap.error(f"argument {reading}: no run folder under {RUNS / record}; name one with --out FOLDER "
                         f"(or --publish for results/{record})")
        if not args.out.is_dir():
            ap.error(f"argument {reading}: {args.out} is not a folder")
        return args.out
    if args.out is None:
        args.out = RUNS / record / _timestamp()
    return check_writable(ap, args.out)


def writes_record(folder: Path) -> bool:
    """Whether `folder` is inside the committed results/."""
    try:
        Path(folder).resolve().relative_to(RESULTS.resolve())
        return True
    except ValueError:
        return False


def report_written(paths: Iterable[Path]) -> None:
    """The final line of a run: every file it wrote."""
    paths = [Path(p) for p in paths]
    shown = [_short(p) for p in paths]
    log(f"wrote {len(paths)} file{'s' if len(paths) != 1 else ''}: {', '.join(shown)}")


def _short(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def beside_record(rows: Iterable[tuple[str, object, object]], record: str) -> None:
    """Print this run's headline figures beside the committed ones (label, this run, committed)."""
    rows = list(rows)
    if not rows:
        return
    log(f"headline beside the committed record (results/{record}/):")
    width = max(len(label) for label, _, _ in rows)
    for label, ours, committed in rows:
        print(f"    {label:<{width}}  this run {_fmt(ours):>12}   committed {_fmt(committed):>12}", flush=True)


def _fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def abandon(folder: Path) -> None:
    """Remove a run folder `resolve_out` created when the run stops before writing into it (a
    checkpoint that does not load): an error leaves nothing behind. A folder with files stays."""
    try:
        Path(folder).rmdir()
    except OSError:
        pass
