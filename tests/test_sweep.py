"""The one sweep/resume mechanism (`experiments.common.sweep`, and its part store `sweep_parts`):
a killed run resumed gives the rows of an uninterrupted one, a resume into another study's folder
is refused before any point runs, shards merged give the unsharded rows, and the executors agree.
Expected rows are worked out from the points (`y = 10 x`), not taken from a run."""

import json

import pytest

from experiments.common import sweep, sweep_parts
from experiments.common.inputs import InputError

POINTS = [{"x": x, "name": f"p{x}"} for x in range(7)]
IDENTITY = {"trace": "synthetic", "model": "bamba-9b"}


def key(row: dict) -> tuple:
    return (row["x"],)


def tenfold(i: int, point: dict) -> dict:
    """Module level: it pickles for the process executor (spawn workers get this sys.path)."""
    return point | {"y": 10 * point["x"], "index": i}


def fails_on_odd(i: int, point: dict) -> list[dict]:
    if point["x"] % 2:
        raise sweep.PointFailed(f"x={point['x']} is odd")
    return [{"point": i, "row": 0, "y": 10 * point["x"]}]


EXPECTED = [p | {"y": 10 * p["x"], "index": i} for i, p in enumerate(POINTS)]


class Killed(Exception):
    """The kill: raised by the n-th point's measure."""


def killing_at(n: int, measured: list):
    def measure(i, point):
        if len(measured) == n:
            raise Killed
        measured.append(i)
        return tenfold(i, point)
    return measure


def journal(path, identity=IDENTITY, name="traces/test"):
    return sweep.Journal(path / "points.jsonl", name, identity, key)


def test_pending_is_every_nth_point_less_the_done_ones():
    assert [i for i, _ in sweep.pending(POINTS, (1, 3))] == [1, 4]
    assert [i for i, _ in sweep.pending(POINTS, (0, 3), done={3})] == [0, 6]
    by_name = sweep.pending(POINTS, done={"p2", "p5"}, key=lambda i, p: p["name"])
    assert [p["x"] for _, p in by_name] == [0, 1, 3, 4, 6]


@pytest.mark.parametrize("kill_at", [0, 1, 4, 6])
def test_a_killed_journal_resumed_gives_the_uninterrupted_rows_and_file(tmp_path, kill_at):
    whole = tmp_path / "whole"
    whole.mkdir()
    assert sweep.run_journal(journal(whole), POINTS, tenfold, []) == EXPECTED
    killed = tmp_path / "killed"
    killed.mkdir()
    measured = []
    with pytest.raises(Killed):
        sweep.run_journal(journal(killed), POINTS, killing_at(kill_at, measured), [])
    assert measured == list(range(kill_at))  # each finished point was recorded as it ended
    kept = journal(killed).kept()
    assert kept == EXPECTED[:kill_at]
    measured.clear()
    rows = sweep.run_journal(journal(killed), POINTS, lambda i, p: measured.append(i) or tenfold(i, p), kept)
    assert measured == list(range(kill_at, len(POINTS)))  # only what was missing
    assert rows == EXPECTED
    assert (killed / "points.jsonl").read_text() == (whole / "points.jsonl").read_text()
    lines = (whole / "points.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"sweep": "traces/test", "identity": IDENTITY} and len(lines) == 1 + len(POINTS)


def test_a_torn_last_line_is_dropped_and_a_torn_middle_line_refused(tmp_path):
    sweep.run_journal(journal(tmp_path), POINTS[:3], tenfold, [])
    path = tmp_path / "points.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:9])  # killed mid-write of the third row
    assert journal(tmp_path).kept() == EXPECTED[:2]
    path.write_text("\n".join([lines[0], lines[1][:9], lines[2]]) + "\n")
    with pytest.raises(InputError, match=r"points\.jsonl:2: not a JSON line"):
        journal(tmp_path).kept()


@pytest.mark.parametrize("other, names", [
    (dict(identity=IDENTITY | {"trace": "sharegpt"}), "trace='sharegpt' there, 'synthetic' here"),
    (dict(identity=IDENTITY | {"kv_pool_gb": 60.0}), "kv_pool_gb=60.0 there, None here"),  # a key on one side only
    (dict(name="traces/heldout"), "sweep 'traces/heldout' there, 'traces/test' here"),
])
def test_a_resume_into_another_studys_journal_is_refused_in_one_line(tmp_path, other, names):
    sweep.run_journal(journal(tmp_path, **other), POINTS[:2], tenfold, [])
    with pytest.raises(InputError) as err:
        journal(tmp_path).kept()
    assert "holds another study" in str(err.value) and names in str(err.value) and "\n" not in str(err.value)


def test_a_journal_without_a_header_is_read_as_rows_and_gets_one(tmp_path):
    """points.jsonl of a run before the header existed (the committed factorials): its rows kept."""
    (tmp_path / "points.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EXPECTED[:3]))
    kept = journal(tmp_path).kept()
    assert kept == EXPECTED[:3]
    assert sweep.run_journal(journal(tmp_path), POINTS, tenfold, kept) == EXPECTED
    assert json.loads((tmp_path / "points.jsonl").read_text().splitlines()[0])["identity"] == IDENTITY


def test_a_point_twice_is_refused(tmp_path):
    (tmp_path / "points.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [EXPECTED[0], EXPECTED[1],
                                                                                  EXPECTED[0] | {"y": 1}]))
    with pytest.raises(InputError, match=r"point \(0,\) is also in .*different rows \(a conflict\)"):
        journal(tmp_path).kept()
    with pytest.raises(InputError, match=r"b: point \(1,\) is also in a, with the same row"):
        sweep.union([("a", EXPECTED[:2]), ("b", EXPECTED[1:3])], key)


def test_journal_shards_merged_are_the_unsharded_rows(tmp_path):
    parts = []
    for i in range(3):
        folder = tmp_path / f"shard{i}"
        folder.mkdir()
        parts.append((str(folder), sweep.run_journal(journal(folder), POINTS, tenfold, [], spec=(i, 3))))
    assert [r["x"] for r in parts[1][1]] == [1, 4]
    assert sorted(sweep.union(parts, key), key=key) == EXPECTED


def test_the_process_executor_gives_the_inline_rows(tmp_path):
    rows = sweep.run_journal(journal(tmp_path), POINTS, tenfold, [], executor=sweep.processes(2))
    assert sorted(rows, key=key) == EXPECTED  # in the order they finished
    assert sorted(journal(tmp_path).kept(), key=key) == EXPECTED


def test_a_point_failed_in_a_worker_is_recorded_as_failed(tmp_path):
    part = sweep_parts.run_shard(tmp_path, "s", POINTS, {"c": 1}, (0, 1), fails_on_odd, tag=lambda p: {"x": p["x"]},
                                 executor=sweep.processes(2))
    assert sorted(part["done"]) == [0, 2, 4, 6]
    assert sorted(f["x"] for f in part["failed"]) == [1, 3, 5] and "x=3 is odd" in str(part["failed"])


def parts_measure(i, point):
    return [{"point": i, "row": r, "y": 10 * point["x"] + r} for r in range(2)]


@pytest.mark.parametrize("kill_at", [0, 3])
def test_a_killed_shard_resumed_gives_the_uninterrupted_rows(tmp_path, kill_at):
    whole = sweep_parts.run_shard(tmp_path / "whole", "s", POINTS, {"c": 1}, (0, 1), parts_measure, tag=dict)
    measured = []

    def killing(i, p):
        if len(measured) == kill_at:
            raise Killed
        measured.append(i)
        return parts_measure(i, p)

    with pytest.raises(Killed):
        sweep_parts.run_shard(tmp_path / "k", "s", POINTS, {"c": 1}, (0, 1), killing, tag=dict)
    resumed = sweep_parts.run_shard(tmp_path / "k", "s", POINTS, {"c": 1}, (0, 1), parts_measure, tag=dict,
                                    resume=True)
    assert resumed["rows"] == whole["rows"] and resumed["done"] == whole["done"] == list(range(len(POINTS)))
    assert sweep_parts.collect(tmp_path / "k", "s")[1] == sweep_parts.collect(tmp_path / "whole", "s")[1]


def test_part_shards_merged_are_the_unsharded_rows(tmp_path):
    sweep_parts.run_shard(tmp_path / "one", "s", POINTS, {"c": 1}, (0, 1), parts_measure, tag=dict)
    for i in range(3):
        sweep_parts.run_shard(tmp_path / "three", "s", POINTS, {"c": 1}, (i, 3), parts_measure, tag=dict)
    _, one, _ = sweep_parts.collect(tmp_path / "one", "s")
    parts, three, _ = sweep_parts.collect(tmp_path / "three", "s")
    assert len(parts) == 3 and three == one
    assert [(r["point"], r["y"]) for r in one] == [(i // 2, 10 * (i // 2) + i % 2) for i in range(2 * len(POINTS))]


def test_a_resume_into_another_definitions_parts_is_refused_before_any_point(tmp_path):
    sweep_parts.run_shard(tmp_path, "s", POINTS, {"c": 1}, (0, 2), parts_measure, tag=dict)
    ran = []
    for config, spec in (({"c": 2}, (0, 2)), ({"c": 1}, (0, 3))):  # another config; another split
        with pytest.raises(sweep_parts.IncompleteSweep, match=r"s\.part0of2\.json\.gz holds another study"):
            sweep_parts.run_shard(tmp_path, "s", POINTS, config, spec, lambda i, p: ran.append(i) or [], tag=dict,
                                  resume=True)
    assert ran == []


def test_the_heldout_command_refuses_a_killed_run_of_another_trace_before_any_point(tmp_path, capsys, monkeypatch):
    """No heldout.json yet (killed before its report): the journal's header is what refuses."""
    from experiments.traces import heldout

    small = ["--trace", "synthetic", "--width", "40", "--test-windows", "1", "--peers", "marconi+lru",
             "--budget-gb", "0.25"]
    config = {k: None for k in heldout.SAME_STUDY} | {"trace": "sharegpt"}
    other = sweep.Journal(tmp_path / "points.jsonl", heldout.RECORD, config, heldout.key)
    other.start([])
    other.close()
    monkeypatch.setattr(heldout, "measure", lambda p, b: pytest.fail("ran a point"))
    with pytest.raises(SystemExit) as err:
        heldout.main([*small, "--out", str(tmp_path), "--resume"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.value.code == 2 and "argument --resume" in last and "trace='sharegpt' there, 'synthetic' here" in last


def test_the_factorial_refuses_a_killed_run_of_another_window_before_any_point(tmp_path, capsys, monkeypatch):
    from experiments.traces import factorial

    argv = ["--trace", "synthetic", "--limit", "20", "--policy", "ours-plus", "--eviction", "lru", "--budget-gb", "0.2",
            "--host-gb", "0", "--jobs", "1"]
    base = factorial.base_of(factorial.parser().parse_args(argv)) | {"start": 5}
    other = sweep.Journal(tmp_path / "points.jsonl", factorial.RECORD, base, factorial.key)
    other.start([])
    other.close()
    monkeypatch.setattr(factorial, "measure", lambda job: pytest.fail("ran a point"))
    with pytest.raises(SystemExit) as err:
        factorial.main([*argv, "--out", str(tmp_path), "--resume"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.value.code == 2 and "argument --resume" in last and "start=5 there, 0 here" in last
