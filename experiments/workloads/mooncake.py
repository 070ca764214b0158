"""Mooncake FAST'25 request traces as a workload source, in two readings.

A trace line is `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`;
`hash_ids` has one id per 512-token block of the prompt, the last (partial) block included, and
two prompts whose lists share their first k ids share their first k*512 tokens. No text is given.

*as-given*: prompt token j is token j % 512 of the pseudo-random block expanded from
`hash_ids[j // 512]` (`tokens.py`), so requests share exactly their common leading full blocks.

*chains*: 512-token hashing hides that a conversation's next turn contains the whole earlier
prompt and its reply: the earlier prompt's partial last block and the reply change the block in
which they end, so the hashes agree only up to the earlier prompt's last full block. Rule: request
c (line order) continues the earlier request p when
  (a) c's hash list starts with p's full blocks: `c.hash_ids[:F] == p.hash_ids[:F]` with
      `F = p.input_length // 512 >= 1`;
  (b) p is the first request of the trace whose hash list starts with those F ids. A prefix that
      an earlier request had already sent is no evidence of which request c continues: block 0
      starts all 12,031 conversation-trace prompts (the service's system prompt), and in the
      synthetic trace up to 24 requests start with the same 77-block document;
  (c) `c.input_length > p.input_length + p.output_length`: room for p's prompt, p's reply and at
      least one new token.
When several p qualify, c continues the one with the largest F: the longest shared prefix, which
is the latest turn of the conversation (each turn contains the one before). Rule (b) admits at
most one p per F, so there is no tie to break. Then c's prompt is p's prompt (in this reading,
recursively) + p's reply (`output_length` tokens expanded from p's line index) + c's as-given
tokens from position `p.input_length + p.output_length` on. So a continuation starts with its
parent's prompt and reply byte-identically, sharing ends where the reply ends instead of at a
512-token block, and beyond that point requests share what their hash lists say. Measured with
this rule: 3,663 of the 12,031 conversation-trace requests and 225 of the 3,993 synthetic-trace
requests continue an earlier one (tests/test_workloads.py recomputes both).

Lines are checked as they are read (so with `limit` only the first `limit`): a bad line raises
ValueError naming `file:line` and the field. Token ids are computed per request when asked for.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path
from typing import IO, Iterator

import numpy as np

from experiments.workloads.request import WorkloadRequest, check_limit
from experiments.workloads.tokens import BLOCK, REPLY, expand
from kernels.checks import require

BLOCK_TOKENS = 512  # Mooncake's hash block size
DATA = Path(__file__).resolve().parent / "data" / "mooncake"
TRACES = {
    "mooncake-conversation": DATA / "conversation_trace.jsonl.gz",
    "mooncake-synthetic": DATA / "synthetic_trace.jsonl.gz",
}
READINGS = ("as-given", "chains")
DEFAULT_VOCAB = 16384  # the "small" preset's vocabulary; pass the model's own


class MooncakeTrace:
    """A Mooncake trace file (.jsonl or .jsonl.gz) read `as-given` or as `chains` (module docstring)."""

    def __init__(self, path: str | Path, reading: str = "as-given", vocab_size: int = DEFAULT_VOCAB,
                 name: str | None = None):
        require(reading in READINGS, "reading", f"must be one of {READINGS}, got {reading!r}")
        require(isinstance(vocab_size, int) and 1 <= vocab_size < 2**32, "vocab_size",
                f"must be an int in [1, 2**32), got {vocab_size!r}")
        self.path = Path(path)
        self.reading = reading
        self.vocab_size = vocab_size
        self.name = name or f"{self.path.name}:{reading}"

    def requests(self, limit: int | None = None) -> Iterator[WorkloadRequest]:
        check_limit(limit)
        lines: list[_Line] = []  # every line so far: a continuation's prompt needs its ancestors
        linker = _ContinuationLinker() if self.reading == "chains" else None
        for line in _read_lines(self.path, limit):
            parent = linker.link(line, lines) if linker else None
            line.parent = parent
            line.root = line.index if parent is None else lines[parent].root
            lines.append(line)
            yield WorkloadRequest(
                index=line.index, arrival_s=line.timestamp_ms / 1000.0, prompt_len=line.input_length,
                output_len=line.output_length, parent=parent, session=line.root if linker else None,
                load_prompt=lambda line=line: self._prompt(line, lines),
                load_reply=lambda line=line: expand(REPLY, line.index, np.arange(line.output_length),
                                                    self.vocab_size))

    def describe(self) -> dict:
        """The source as data: the trace file, its reading, the token id range."""
        return {"name": self.name, "trace_file": self.path.name, "reading": self.reading, "vocab_size": self.vocab_size}

    def _prompt(self, line: "_Line", lines: list["_Line"]) -> np.ndarray:
        """The prompt's token ids: one expansion call over the chain's segments (module docstring)."""
        chain = [line]
        while chain[-1].parent is not None:
            chain.append(lines[chain[-1].parent])
        chain.reverse()
        kinds, keys, offsets = [], [], []
        start = 0
        for i, ln in enumerate(chain):
            if i:  # the previous request's reply, then this request's own tokens after it
                prev = chain[i - 1]
                kinds.append(np.full(prev.output_length, REPLY))
                keys.append(np.full(prev.output_length, prev.index))
                offsets.append(np.arange(prev.output_length))
                start = prev.input_length + prev.output_length
            pos = np.arange(start, ln.input_length)
            kinds.append(np.full(len(pos), BLOCK))
            keys.append(np.asarray(ln.hash_ids, dtype=np.int64)[pos // BLOCK_TOKENS])
            offsets.append(pos % BLOCK_TOKENS)
        return expand(np.concatenate(kinds), np.concatenate(keys), np.concatenate(offsets), self.vocab_size)


class _Line:
    """One checked trace line, plus its parent and chain root once linked."""

    __slots__ = ("index", "timestamp_ms", "input_length", "output_length", "hash_ids", "parent", "root")

    def __init__(self, index, timestamp_ms, input_length, output_length, hash_ids):
        self.index, self.timestamp_ms = index, timestamp_ms
        self.input_length, self.output_length, self.hash_ids = input_length, output_length, hash_ids
        self.parent: int | None = None
        self.root = index

    @property
    def full_blocks(self) -> int:
        return self.input_length // BLOCK_TOKENS


class _ContinuationLinker:
    """Rules (a)-(c) of the module docstring, one request at a time.

    A trie over hash lists: node = a distinct leading id sequence, created by the first request
    whose list starts with it. `ends[node]` = that first request when its full blocks end exactly
    there, i.e. the one request rule (b) admits at that depth.
    """

    def __init__(self):
        self.children: dict[tuple[int, int], int] = {}  # (node, hash id) -> child node; node 0 = root
        self.ends: dict[int, int] = {}

    def link(self, line: _Line, lines: list[_Line]) -> int | None:
        node, parent = 0, None
        for depth, h in enumerate(line.hash_ids, start=1):
            child = self.children.get((node, h))
            if child is None:  # from here on this request is the first: create its nodes
                child = len(self.children) + 1
                self.children[(node, h)] = child
                if depth == line.full_blocks:
                    self.ends[child] = line.index
            else:
                p = self.ends.get(child)
                if p is not None and line.input_length > lines[p].input_length + lines[p].output_length:
                    parent = p  # deeper than any earlier candidate: the longest shared prefix wins
            node = child
        return parent


def _read_lines(path: Path, limit: int | None) -> Iterator[_Line]:
    """Checked lines of the trace file, in order; ValueError naming file:line and field if bad."""
    last_ts, lineno = None, 0
    try:
        with _open(path) as f:
            for lineno, text in enumerate(f, start=1):
                if limit is not None and lineno > limit:
                    return
                line = _parse(text, f"{path}:{lineno}", lineno - 1)
                require(last_ts is None or line.timestamp_ms >= last_ts, f"{path}:{lineno} timestamp",
                        f"{line.timestamp_ms} is before the previous line's {last_ts} (not in arrival order)")
                last_ts = line.timestamp_ms
                yield line
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read the trace (line {lineno + 1}: {type(err).__name__}: {err})") from err


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _parse(text: str, where: str, index: int) -> _Line:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object ({err.msg} at column {err.colno})") from None
    require(isinstance(obj, dict), where, f"expected a JSON object, got {type(obj).__name__}")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        require(field in obj, f"{where} {field}", "missing")
    ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    require(_is_number(ts) and ts >= 0, f"{where} timestamp", f"must be a number >= 0 (ms), got {ts!r}")
    require(_is_int(n_in) and n_in >= 1, f"{where} input_length", f"must be an int >= 1, got {n_in!r}")
    require(_is_int(n_out) and n_out >= 1, f"{where} output_length", f"must be an int >= 1, got {n_out!r}")
    require(isinstance(ids, list) and all(_is_int(h) and 0 <= h < 2**63 for h in ids), f"{where} hash_ids",
            "must be a list of ints in [0, 2**63)")
    blocks = math.ceil(n_in / BLOCK_TOKENS)
    require(len(ids) == blocks, f"{where} hash_ids",
            f"has {len(ids)} ids, input_length {n_in} needs ceil({n_in}/{BLOCK_TOKENS}) = {blocks}")
    return _Line(index, ts, n_in, n_out, ids)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
