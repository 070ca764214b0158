"""One skeleton for every command: a study declares its flags, its run, its figures and its headline;
`Study.main` owns the rest, in this order.

1. The parser: `new_parser` (every default in --help), the study's flags (`add_flags`), and the
   skeleton's: `--out` / `--publish` (results/<record>/), `--replot` (and `--merge` for a sharded study).
2. Input checks, before any folder exists: argparse's type checks, then the study's `check(ctx)`
   (cross-flag usage errors, input files read; `NothingToRun`: nothing to do here, exit 0). An `InputError` raised anywhere, or a checkpoint
   that does not load (`runs.ModelLoadError`), ends in one usage line naming it, exit code 2.
3. The folder (`resolve_out`): a new `runs/<record>/<UTC timestamp>/` unless --out / --publish, made
   and probed for writing before the run; a reading invocation (--replot, --merge, `folder = "read"`)
   takes --out, --publish's record folder, or the newest run folder. A run that ends in an error
   line leaves no empty folder behind.
4. `--replot`: no run; `figures(ctx)` redraws from the data in the folder; then the written-files line.
5. The run: `run(ctx)` measures and writes its data into `ctx.out`, returning the files (or a `Ran`:
   files, exit status, and `finished=False` for one shard of a sweep, which draws nothing yet).
6. After a finished run: `figures(ctx)`, the headline beside the committed record (`headline(ctx)`'s
   (label, this run, committed) rows through `beside_record`; never when the run wrote into the record
   itself nor when nothing is committed; an unreadable committed file is one log line, not an error), and the `wrote ...`
   line listing every file (`report_written`). The exit code is the run's status.

A command module ends with `STUDY = MyStudy()`, `parser = STUDY.parser`, `main = STUDY.main`; its
`__main__` runs `main()`. docs/add_a_study.md walks a toy study through every step.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Iterable, NoReturn, Sequence, Union

from experiments.common import compact
from experiments.common.flags import HelpFormatter, add_replot_flag, new_parser
from experiments.common.inputs import InputError
from experiments.common.outputs import (abandon, add_out_flags, beside_record, check_writable, precheck_out,
                                        record_folder, report_written, resolve_out, writes_record)
from experiments.common.progress import Progress
from experiments.common.results_io import log
from experiments.common.runs import ModelLoadError

Row = tuple  # (label, this run's value, the committed value)
SKELETON_FLAGS = ("publish", "replot", "merge")  # never part of a run's recorded config


@dataclasses.dataclass
class Ran:
    """What a run did: the files it wrote, its exit status, whether it finished (one shard of a
    sweep has not: no figures and no headline until `--merge` combines the parts), and what it
    measured, for `figures` and `headline` (`ctx.result`; they may read the files instead)."""
    written: list[Path] = dataclasses.field(default_factory=list)
    status: int = 0
    finished: bool = True
    result: Any = None


@dataclasses.dataclass
class Context:
    """What a study's hooks are handed: the parser (for usage errors), the parsed flags, the folder."""
    ap: argparse.ArgumentParser
    args: argparse.Namespace
    out: Path | None = None
    replotting: bool = False
    reading: str | None = None  # the flag whose existing folder this invocation reads (--replot, --merge), or None
    result: Any = None  # the run's `Ran.result`, once it has run
    inputs: dict = dataclasses.field(default_factory=dict)  # what `check` read, for `run` (read once)

    def error(self, message: str) -> NoReturn:
        """One usage line (exit code 2); name the flag: 'argument --x: ...'."""
        self.ap.error(message)

    def config(self, drop: Iterable[str] = ()) -> dict:
        """The flags as a JSON-able dict (paths as text), without the skeleton's and `drop`."""
        drop = set(drop) | set(SKELETON_FLAGS)
        return {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()
                if not k.startswith("_") and k not in drop}

    def progress(self, total: int, unit: str, every_s: float = 10.0) -> Progress:
        """`with ctx.progress(n, "points") as p: ... p.advance()`: one line per `every_s`, and at the end."""
        return Progress(total, unit, every_s)

    def make_out(self) -> Path:
        """Make and probe `--out` now (`folder = "optional"`: only once there is something to write)."""
        return check_writable(self.ap, self.out)


class NothingToRun(Exception):
    """Raised by `check` where the command has nothing to do on this machine (a GPU bench without a
    GPU): its message is logged, nothing is made, exit code 0."""


Headline = Union[Sequence[Row], dict]  # rows for the study's record, or {record label: rows}


class Study:
    """Subclass, set `record`, `prog`, `description`, and override the hooks the study has."""

    record: str = ""        # results/<record>/ is its committed record; runs/<record>/<timestamp>/ its run folders
    prog: str = ""          # "python -m experiments.<study>"
    description: str = ""   # --help's first line
    # "new": each run gets a fresh folder (default); "read": the command reads --out / --publish / the newest
    # run folder and writes its table there; "optional": the study adds its own --out, absent = write nothing
    folder: str = "new"
    replot: bool = True     # offers --replot (figures from the data in the folder)
    merge: bool = False     # offers --merge (exclusive with --replot): combine a sharded sweep's parts
    merge_help: str = "do not run: merge the part files in --out, check, plot"
    subcommands: bool = False  # add_flags makes subparsers and calls `add_skeleton_flags` on each

    # ------------------------------------------------------------------ declared by the study
    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        """The study's own flags (the shared vocabulary: experiments.common.flags)."""

    def check(self, ctx: Context) -> None:
        """Before any folder is made: flags that are fine alone but not together (`ctx.error`), and
        input files read (raise `InputError` naming the file)."""

    def reading(self, args: argparse.Namespace) -> str | None:
        """The flag whose folder this invocation reads instead of making one (default: --replot, --merge)."""
        if getattr(args, "replot", False):
            return "--replot"
        if getattr(args, "merge", False):
            return "--merge"
        return "--out" if self.folder == "read" else None

    def run(self, ctx: Context) -> Ran | list[Path]:
        """Measure, write the data into `ctx.out`; the files written (or a `Ran`)."""
        raise NotImplementedError

    def figures(self, ctx: Context) -> list[Path]:
        """Draw from the data in `ctx.out` (after a run, and for --replot); the files written. Data
        that does not draw: raise `InputError` naming the file."""
        return []

    def headline(self, ctx: Context) -> Headline:
        """(label, this run, committed) rows for `beside_record`; `committed(name)` finds the record's file."""
        return []

    # ------------------------------------------------------------------ owned by the skeleton
    def committed(self, name: str, record: str | None = None) -> Path | None:
        """The committed record's file `name` (or its compact .gz form), None when there is none."""
        path = compact.locate(record_folder(record or self.record) / name)
        return path if path.is_file() else None

    def add_skeleton_flags(self, ap: argparse.ArgumentParser, record: str | None = None) -> None:
        """--out / --publish for `record` (default the study's), --replot, and --merge where offered."""
        if self.folder != "optional":
            add_out_flags(ap, record or self.record)
        if self.merge:
            group = ap.add_mutually_exclusive_group()
            group.add_argument("--merge", action="store_true", help=self.merge_help)
            if self.replot:
                add_replot_flag(group)
        elif self.replot:
            add_replot_flag(ap)

    def subparser(self, sub, name: str, help: str, record: str) -> argparse.ArgumentParser:
        """A subcommand's parser with the skeleton's flags for its own record folder."""
        p = sub.add_parser(name, help=help, formatter_class=HelpFormatter)
        self.add_skeleton_flags(p, record)
        return p

    def parser(self) -> argparse.ArgumentParser:
        ap = new_parser(self.description, prog=self.prog)
        if not self.subcommands:
            self.add_skeleton_flags(ap)
        self.add_flags(ap)
        return ap

    def main(self, argv: list[str] | None = None) -> int:
        ap = self.parser()
        try:
            return self._main(ap, argv)
        except InputError as e:
            ap.error(str(e))

    def _main(self, ap: argparse.ArgumentParser, argv) -> int:
        args = ap.parse_args(argv)
        ctx = Context(ap, args, getattr(args, "out", None), replotting=bool(getattr(args, "replot", False)))
        reading = ctx.reading = self.reading(args)
        if reading is None:  # a folder to make: one that cannot be is refused before the checks read anything
            precheck_out(ap, ctx.out)
        elif ctx.out is not None and Path(ctx.out).is_file():  # a folder to read, and --out names a file
            ap.error(f"argument {reading}: --out {ctx.out} is a file, not a folder")
        try:
            self.check(ctx)
        except NothingToRun as e:
            log(str(e))
            return 0
        if self.folder != "optional":
            ctx.out = resolve_out(ap, args, reading=reading)
        if ctx.replotting:
            report_written(self.figures(ctx))
            return 0
        if reading is None and self.folder == "new":
            log(f"writing to {ctx.out}")
        try:
            ran = self.run(ctx)
        except (InputError, ModelLoadError) as e:  # an input found bad in the run: one line, no empty folder left
            if ctx.out is not None and reading is None:
                abandon(ctx.out)
            ap.error(f"argument --model: {e}" if isinstance(e, ModelLoadError) else str(e))
        ran = ran if isinstance(ran, Ran) else Ran(list(ran))
        ctx.result = ran.result
        written = list(ran.written)
        if ran.finished:
            written += self.figures(ctx)
            self.show_headline(ctx)
        written = list(dict.fromkeys(written))  # a file the run and the figures both name: listed once
        if written or self.folder != "optional":
            report_written(written)
        return ran.status

    def show_headline(self, ctx: Context) -> None:
        """The headline beside the committed record, unless this run wrote into the record."""
        if ctx.out is None or writes_record(ctx.out):
            return
        try:
            headline = self.headline(ctx)
        except InputError as e:  # the committed file is another run's: say so, keep this run's result
            log(f"no comparison with the committed record: {e}")
            return
        pairs = headline.items() if isinstance(headline, dict) else [(getattr(ctx.args, "_record", self.record), headline)]
        for record, rows in pairs:
            if any(committed is not None for _, _, committed in rows):  # nothing committed: nothing to set beside
                beside_record(rows, record)


def run_study(study: Study, argv: list[str] | None = None) -> None:
    """`python -m ...`: exit with the study's status."""
    sys.exit(study.main(argv))
