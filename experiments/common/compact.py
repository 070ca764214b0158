"""The record's compact form: per-request files are gzip, written byte-stable and read back transparently.

A file whose name ends in `.gz` is written gzip-compressed (level 9, mtime 0 and no stored name, so
writing the same data again gives the same bytes and git sees no change). A reader asked for `X`
reads `X.gz` when only that exists, and the other way round (`locate`), so a loader names the file
as it always did and reads old plain run folders and the compact record alike. The two forms of one
file are never kept side by side: writing one removes the other (`results_io`), or a reader would
take the stale one. Per-request data (TTFT lists, sweep parts, request rows) is ~3-5x smaller gzip'd:
the whole Mooncake trace's `ttft.json` 2.68 MB -> 0.61 MB.
"""

from __future__ import annotations

import contextlib
import gzip
import io
from pathlib import Path

SUFFIX = ".gz"


def is_compact(path: Path) -> bool:
    return Path(path).name.endswith(SUFFIX)


def twin(path: Path) -> Path:
    """The other form of the same file: `X.gz` for `X`, `X` for `X.gz`."""
    path = Path(path)
    return path.with_name(path.name[: -len(SUFFIX)] if is_compact(path) else path.name + SUFFIX)


def locate(path: Path) -> Path:
    """`path` if it exists (or neither form does: the caller's error then names the file it asked for),
    else its twin."""
    path = Path(path)
    if path.exists() or not twin(path).exists():
        return path
    return twin(path)


def read_text(path: Path) -> str:
    """The text of `path` or of its twin (`locate`), decompressed if it is a `.gz`, newlines as stored
    (a CSV's quoted fields keep theirs). Raises OSError, UnicodeDecodeError, or EOFError /
    gzip.BadGzipFile for a cut or non-gzip `.gz`."""
    path = locate(path)
    data = path.read_bytes()
    return (gzip.decompress(data) if is_compact(path) else data).decode("utf-8")


@contextlib.contextmanager
def text_writer(raw, compact: bool):
    """A text stream into the open binary file `raw`: gzip'd byte-stably (mtime 0, no stored name) when
    `compact`. Newlines are written as given (the csv module's own)."""
    if not compact:
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
            yield f
        return
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8", newline="") as f:
        yield f
