"""Reading what a user gives a command, guarded: one line naming the file and what is wrong.

Every file an entry point reads (a results JSON for `--replot`, sweep parts for `--merge`, CSVs for
`--plot-only`, trace files) goes through these readers. They raise `InputError`, a ValueError
whose message starts with the file; the entry point turns it into argparse's usage error (exit
code 2, no traceback) with `fail_on_input_error`. A missing optional extra is the same kind of
error, carrying its install command (`require_extra`).
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import json
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from experiments.common import compact


class InputError(ValueError):
    """A file or an environment a command was given is not usable; the message says which and why."""


def read_json(path: Path, keys: Sequence[str] = (), what: str = "a results JSON") -> Any:
    """The parsed JSON at `path`; an InputError if it is missing, empty, not JSON, or (for a dict)
    lacks any of `keys`."""
    path = compact.locate(path)  # the errors below name the file read
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); is it truncated?") from None
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise InputError(f"{path}: not {what} (no {', '.join(repr(k) for k in missing)})")
    return data


def read_text(path: Path, what: str = "a file") -> str:
    """The text of `path`, or of its other form `path.gz` / `path` without `.gz` where only that exists
    (the record's compact form, `experiments.common.compact`)."""
    path = compact.locate(path)
    if not path.exists():
        raise InputError(f"{path}: no such file (expected {what})")
    if not path.is_file():
        raise InputError(f"{path}: not a file (expected {what})")
    try:
        text = compact.read_text(path)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:  # a cut .gz: EOFError
        raise InputError(f"{path}: cannot read it ({e})") from None
    if not text.strip():
        raise InputError(f"{path}: empty (expected {what})")
    return text


def read_csv(path: Path, columns: Sequence[str] = (), what: str = "a results CSV") -> list[dict[str, str]]:
    """The rows of a CSV with at least one row and every one of `columns`; else an InputError."""
    path = compact.locate(path)  # the errors below name the file read
    text = read_text(path, what)
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise InputError(f"{path}: has a header but no rows (expected {what})")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise InputError(f"{path}: not {what} (no column {', '.join(repr(c) for c in missing)})")
    return rows


def require_extra(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or an InputError with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"{what} needs the optional package {module!r}: "
                         f".venv/bin/pip install -e '.[{extra}]'") from None


def fail_on_input_error(parser: Callable[[], argparse.ArgumentParser]):
    """Decorate `main(argv)`: an InputError raised anywhere in it ends in `parser().error(message)`
    (usage and one error line on stderr, exit code 2)."""

    def wrap(main):
        @functools.wraps(main)
        def guarded(argv=None):
            try:
                return main(argv)
            except InputError as e:
                parser().error(str(e))

        return guarded

    return wrap


def existing_files(paths: Iterable[Path], what: str) -> list[Path]:
    """`paths` as a list, each an existing regular file; else an InputError naming the first bad one."""
    out = []
    for p in map(Path, paths):
        if not p.is_file():
            raise InputError(f"{p}: {'not a file' if p.exists() else 'no such file'} (expected {what})")
        out.append(p)
    return out
