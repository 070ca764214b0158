"""Multi-turn study: the workload generator, and the study end to end on the "tiny" model."""

import dataclasses
import json

from experiments.common import sweep_parts
from experiments.common.results_io import read_csv
from experiments.multiturn import run
from experiments.multiturn.cli import main
import pytest

from experiments.workloads import KINDS, ReplyPending, SyntheticSessions, WorkloadConfig, check_workload
from experiments.workloads.synthetic import Step, make_workload


def test_workload_is_seeded_and_within_its_distributions():
    cfg = WorkloadConfig(sessions=10, seed=3)
    system, sessions, order = make_workload(cfg, vocab_size=1000)
    again = make_workload(cfg, vocab_size=1000)
    assert (system, sessions, order) == again
    assert make_workload(dataclasses.replace(cfg, seed=4), 1000)[0] != system
    assert 1024 <= len(system) <= 2048
    assert sum(s.parent is not None for s in sessions) == 3  # round(0.3 * 10)
    for s in sessions:
        assert 3 <= len(s.turns) <= 6
        assert all(16 <= len(t.user) <= 1024 and 16 <= t.max_new_tokens <= 48 for t in s.turns)
        if s.parent is not None:
            parent = sessions[s.parent]
            assert parent.parent is None and s.parent < s.sid and 1 <= s.branch_after < len(parent.turns)


def test_schedule_respects_session_order_branches_and_regenerations():
    cfg = WorkloadConfig(sessions=12, seed=1, regenerate_fraction=0.3)
    _, sessions, order = make_workload(cfg, 1000)
    seen = {}
    for i, st in enumerate(order):
        if st.copy:  # a regeneration comes right after its first sending
            assert order[i - 1] == Step(st.sid, st.turn, 0)
            continue
        assert seen.get(st.sid, -1) == st.turn - 1  # turns in order
        s = sessions[st.sid]
        if st.turn == 0 and s.parent is not None:
            assert seen.get(s.parent, -1) >= s.branch_after - 1  # after the parent's branch turn
        seen[st.sid] = st.turn
    assert sum(st.copy for st in order) > 0
    assert sum(1 for st in order if not st.copy) == sum(len(s.turns) for s in sessions)


def test_prompts_chain_turns_and_branches():
    cfg = WorkloadConfig(sessions=6, seed=2, branch_fraction=0.5)
    source = SyntheticSessions(cfg, 1000)
    system, sessions = source.system, source.sessions
    assert sum(s.parent is not None for s in sessions) == 3
    reqs = list(source.requests())
    by_step = {(r.session, r.turn, r.copy): r for r in reqs}
    assert list(by_step) == [(st.sid, st.turn, st.copy) for st in source.order]
    assert [r.request_id for r in reqs] == [f"s{st.sid}t{st.turn}c{st.copy}" for st in source.order]
    assert all(r.load_reply is None and r.arrival_s == 0.0 for r in reqs)  # generated at run time; no clock
    # stand-in replies of the right length, distinct per request so a wrong reference shows
    replies = {r.index: [r.index] * r.output_len for r in reqs}

    def prompt(sid, t):
        return by_step[(sid, t, 0)].prompt_ids(replies)

    for s in sessions:
        for t in range(len(s.turns)):
            r = by_step[(s.sid, t, 0)]
            p = r.prompt_ids(replies)
            assert len(p) == r.prompt_len and r.output_len == s.turns[t].max_new_tokens
            if t or s.parent is not None:  # holds a reply: not ready before it is generated
                with pytest.raises(ReplyPending):
                    r.prompt_ids({})
            else:
                assert r.prompt_ids({}) == p
            if t:
                assert r.kind == "next_turn" and r.parent == by_step[(s.sid, t - 1, 0)].index
                assert p == prompt(s.sid, t - 1) + replies[r.parent] + s.turns[t].user
            elif s.parent is None:
                assert r.kind == "session_start" and r.parent is None and p == system + s.turns[0].user
            else:
                k = s.branch_after - 1
                assert r.kind == "branch_start" and r.parent == by_step[(s.parent, k, 0)].index
                assert p == prompt(s.parent, k) + replies[r.parent] + s.turns[0].user
    regenerated = [r for r in reqs if r.copy]
    originals = [by_step[(r.session, r.turn, 0)] for r in regenerated]
    assert regenerated and all(r.kind == "regenerate" and r.parent == o.parent and r.index == o.index + 1
                               and r.prompt_ids(replies) == o.prompt_ids(replies)
                               for r, o in zip(regenerated, originals))
    # only a root session's first turn (either sending) continues nothing
    assert [r.parent is None for r in reqs] == [r.turn == 0 and sessions[r.session].parent is None for r in reqs]
    # the shared rules hold, with stand-ins for the generated replies
    assert check_workload(reqs) == sum(r.parent is not None for r in reqs) > 0
    assert source.describe()["n_requests"] == len(reqs)


def read(path):
    return read_csv(path)  # a plain or a gzip'd CSV (requests.csv.gz)


def test_study_end_to_end_on_the_tiny_model(tmp_path):
    out = tmp_path / "mt"
    assert main(["--model", "tiny", "--quick", "--threads", "1", "--block-size", "4",
                           "--prefill-budget", "32", "--interval", "4", "--snapshot-budget", "2",
                           "--out", str(out)]) == 0
    for f in ("summary.csv", "requests.csv.gz", "multiturn.json", "multiturn.png"):
        assert (out / f).is_file(), f
    summary = {r["config"]: r for r in read(out / "summary.csv")}
    assert list(summary) == [c.name for c in run.CONFIGS]
    requests = read(out / "requests.csv.gz")
    meta = json.loads((out / "multiturn.json").read_text())
    n = meta["n_requests"]
    assert all(int(r["requests"]) == n for r in summary.values())
    # The cache never changes an output: per request, the same tokens in every configuration.
    outputs = {}
    for r in requests:
        outputs.setdefault(r["request"], set()).add(r["output_sha"])
    assert len(outputs) == n and all(len(v) == 1 for v in outputs.values())
    off = summary["off"]
    assert float(off["token_hit_rate"]) == 0 and int(off["replayed_tokens"]) == int(off["prompt_tokens"])
    assert int(off["snapshots_saved"]) == 0  # a zero budget: nothing is kept when nothing can be restored
    budget = meta["snapshot_budget_bytes"]
    assert budget == 2 * meta["snapshot_nbytes"]
    for name, r in summary.items():
        if name == "off":
            continue
        assert 0 < float(r["token_hit_rate"]) < 1 and float(r["ssm_restore_depth"]) <= float(r["token_hit_rate"])
        assert int(r["replayed_tokens"]) < int(off["replayed_tokens"])
        if "budget" in name:
            assert int(r["snapshots_evicted"]) > 0 and int(r["snapshot_bytes_held_peak"]) <= budget
        else:
            assert int(r["snapshots_evicted"]) == 0 and r["eviction"] == "none needed"
        kinds = sum(int(r[f"replayed_{k}"]) for k in KINDS)
        assert kinds == int(r["replayed_tokens"])
    # What each configuration ran under: the policy's own eviction and decode states unless the
    # configuration names them (aligned: LRU, none; "+decode" turns them on, on the KV block)
    ran = meta["effective_settings"]
    assert ran["aligned"]["eviction"] == "lru" and ran["aligned"]["decode_snapshots"] is False
    assert ran["aligned+budget+flop"]["eviction"] == "flop_aware"
    assert (ran["aligned+decode"]["decode_snapshots"], ran["aligned+decode"]["decode_snapshot_grid"]) == (True, 0)
    assert {s["block_size"] for s in ran.values()} == {4} and ran["legacy"]["policy"] == "legacy"
    # Restore never goes past the KV match, per request.
    assert all(int(r["restore_at"]) <= int(r["kv_match_tokens"]) for r in requests)
    # The placeholder runner reproduces every planner figure (other tokens, same lengths and ticks).
    ph = tmp_path / "ph"
    assert main(["--runner", "placeholder", "--model", "tiny", "--quick", "--block-size", "4",
                           "--prefill-budget", "32", "--interval", "4", "--snapshot-budget", "2", "--out", str(ph)]) == 0
    keys = ("token_hit_rate", "ssm_restore_depth", "replayed_tokens", "snapshots_saved", "snapshots_evicted",
            "snapshots_restored")
    assert [[r[k] for k in keys] for r in read(ph / "summary.csv")] == [[r[k] for k in keys] for r in summary.values()]


def test_a_changed_output_fails_the_study_and_writes_nothing(tmp_path, monkeypatch):
    real = run.replay
    calls = []

    def corrupting(engine, *a, **k):
        rows, peak = real(engine, *a, **k)
        calls.append(1)
        if len(calls) == 2:  # the second configuration "generates" another token once
            rows[0]["output_token_ids"] = rows[0]["output_token_ids"] + [0]
        return rows, peak

    monkeypatch.setattr(run, "replay", corrupting)
    out = tmp_path / "bad"
    assert main(["--runner", "placeholder", "--quick", "--configs", "legacy", "--out", str(out)]) == 1
    assert len(calls) == 2 and not (out / "summary.csv").exists()


def test_shards_run_disjoint_configurations_and_merge_checks_them_together(tmp_path):
    out = tmp_path / "sh"
    args = ["--runner", "placeholder", "--quick", "--out", str(out)]
    assert main([*args, "--shard", "0/2"]) == 0
    assert not (out / "summary.csv").exists()
    assert main([*args, "--shard", "1/2"]) == 0
    assert main([*args, "--merge"]) == 0
    summary = read(out / "summary.csv")
    assert [r["config"] for r in summary] == [c.name for c in run.CONFIGS]
    parts = [sweep_parts.read_part(p) for p in sorted((out / "parts").iterdir())]  # .json.gz parts
    names = [c.name for c in run.CONFIGS]
    assert [[r["config"] for r in p["rows"]] for p in parts] == [names[0::2], names[1::2]]
    # The same workload and planner give the same planner figures as one unsharded run.
    whole = tmp_path / "whole"
    assert main(["--runner", "placeholder", "--quick", "--out", str(whole)]) == 0
    keys = ("token_hit_rate", "ssm_restore_depth", "replayed_tokens", "snapshots_saved", "snapshots_evicted")
    assert [[r[k] for k in keys] for r in summary] == [[r[k] for k in keys] for r in read(whole / "summary.csv")]
