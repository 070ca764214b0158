"""The shared pieces of every command's surface: where a run writes (experiments/common/outputs.py), how a
file it is given is read (experiments/common/inputs.py), and its progress line (experiments/common/progress.py)."""

import argparse
import json
import re
import sys

import pytest

from experiments.common import inputs
from experiments.common import outputs
from experiments.common import progress
from experiments.common.flags import new_parser
from experiments.common.results_io import RESULTS


def parser(record="demo_study"):
    ap = argparse.ArgumentParser(prog="demo")
    outputs.add_out_flags(ap, record)
    return ap


def usage_error(capsys, run) -> str:
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------ outputs
def test_default_out_is_a_new_timestamped_run_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    ap = parser()
    args = ap.parse_args([])
    out = outputs.resolve_out(ap, args)
    assert out == args.out and out.is_dir()
    assert out.parent == tmp_path / "runs" / "demo_study"
    assert re.fullmatch(r"\d{8}-\d{6}", out.name)
    assert not outputs.writes_record(out)


def test_publish_writes_the_committed_record_folder(monkeypatch):
    ap = parser("warm_restore")
    args = ap.parse_args(["--publish"])
    monkeypatch.setattr(outputs, "check_writable", lambda ap, folder, flag="--out": folder)
    assert outputs.resolve_out(ap, args) == RESULTS / "warm_restore"
    assert outputs.writes_record(args.out)


def test_out_and_publish_exclude_each_other(capsys, tmp_path):
    line = usage_error(capsys, lambda: parser().parse_args(["--out", str(tmp_path), "--publish"]))
    assert "not allowed with argument" in line


def test_out_under_a_regular_file_is_a_usage_error_before_anything_is_made(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ap = parser()
    args = ap.parse_args(["--out", str(blocker / "sub" / "dir")])
    line = usage_error(capsys, lambda: outputs.resolve_out(ap, args))
    assert f"argument --out: {blocker} is a file, not a folder" in line
    assert blocker.read_text() == "x"


def test_out_that_is_a_file_is_a_usage_error(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ap = parser()
    args = ap.parse_args(["--out", str(blocker)])
    assert "is a file, not a folder" in usage_error(capsys, lambda: outputs.resolve_out(ap, args))


def test_reading_takes_the_newest_run_folder_or_says_what_to_give(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    ap = parser()
    line = usage_error(capsys, lambda: outputs.resolve_out(ap, ap.parse_args([]), reading="--replot"))
    assert line.endswith("name one with --out FOLDER (or --publish for results/demo_study)")
    assert "argument --replot: no run folder under" in line
    for name in ("20261201-000000", "20261203-101010", "20261202-235959"):
        (tmp_path / "runs" / "demo_study" / name).mkdir(parents=True)
    args = ap.parse_args([])
    assert outputs.resolve_out(ap, args, reading="--replot").name == "20261203-101010"


def test_reading_a_missing_folder_is_a_usage_error(capsys, tmp_path):
    ap = parser()
    args = ap.parse_args(["--out", str(tmp_path / "absent")])
    line = usage_error(capsys, lambda: outputs.resolve_out(ap, args, reading="--merge"))
    assert line.endswith(f"argument --merge: {tmp_path / 'absent'} is not a folder")


def test_report_written_names_every_file(capsys, tmp_path):
    outputs.report_written([tmp_path / "a.json", tmp_path / "b.png"])
    out = capsys.readouterr().out
    assert "wrote 2 files:" in out and "a.json" in out and "b.png" in out


def test_beside_record_prints_both_numbers(capsys):
    outputs.beside_record([("replayed tokens", 20, 20), ("warm TTFT s", 0.08412, None)], "warm_restore")
    out = capsys.readouterr().out.splitlines()
    assert "results/warm_restore/" in out[0]
    assert re.search(r"replayed tokens\s+this run\s+20\s+committed\s+20", out[1])
    assert re.search(r"this run\s+0\.08412\s+committed\s+-", out[2])


# ------------------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("content, expected", [
    (None, "no such file (expected a results JSON)"),
    ("", "empty (expected a results JSON)"),
    ("  \n", "empty (expected a results JSON)"),
    ('{"systems": {"ours": 1', "not valid JSON"),
    ('{"other": 1}', "not a results JSON (no 'systems')"),
    ("[1, 2]", "not a results JSON (no 'systems')"),
])
def test_read_json_names_the_file_and_the_fault(tmp_path, content, expected):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(inputs.InputError) as e:
        inputs.read_json(path, keys=("systems",))
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)


def test_read_json_of_a_folder(tmp_path):
    with pytest.raises(inputs.InputError, match="not a file"):
        inputs.read_json(tmp_path)


def test_read_json_returns_the_data(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"systems": {"ours": 1}}))
    assert inputs.read_json(path, keys=("systems",)) == {"systems": {"ours": 1}}


@pytest.mark.parametrize("content, expected", [
    ("a,b\n", "has a header but no rows"),
    ("a,b\n1,2\n", "no column 'tokens'"),
])
def test_read_csv_faults(tmp_path, content, expected):
    path = tmp_path / "r.csv"
    path.write_text(content)
    with pytest.raises(inputs.InputError, match=expected):
        inputs.read_csv(path, columns=("tokens",))
    path.write_text("tokens,b\n7,2\n")
    assert inputs.read_csv(path, columns=("tokens",)) == [{"tokens": "7", "b": "2"}]


def test_missing_extra_names_its_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    with pytest.raises(inputs.InputError) as e:
        inputs.require_extra("transformers", "bench", "bench.model_prefill")
    assert str(e.value) == ("bench.model_prefill needs the optional package 'transformers': "
                            ".venv/bin/pip install -e '.[bench]'")


def test_fail_on_input_error_is_one_usage_line(capsys, tmp_path):
    ap = argparse.ArgumentParser(prog="demo")

    @inputs.fail_on_input_error(lambda: ap)
    def main(argv=None):
        inputs.read_json(tmp_path / "absent.json")

    line = usage_error(capsys, main)
    assert line == f"demo: error: {tmp_path / 'absent.json'}: no such file (expected a results JSON)"


def test_existing_files(tmp_path):
    (tmp_path / "a").write_text("1")
    assert inputs.existing_files([tmp_path / "a"], "a trace") == [tmp_path / "a"]
    with pytest.raises(inputs.InputError, match="b: no such file"):
        inputs.existing_files([tmp_path / "a", tmp_path / "b"], "a trace")


# ------------------------------------------------------------------------------------------ parsing
def test_help_shows_defaults():
    ap = new_parser("demo")
    ap.add_argument("--limit", type=int, default=7, help="only the first N")
    assert "(default: 7)" in ap.format_help()


# ----------------------------------------------------------------------------------------- progress
class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_line_rate_and_eta():
    clock = FakeClock()
    p = progress.Progress(total=40, unit="points", clock=clock)
    clock.t = 20.0
    p.done = 10
    # 10 points in 20 s = 0.5 points/s; 30 left -> 60 s
    assert p.line() == "10/40 points (25%), 0.50 points/s, elapsed 0:20, ETA 1:00"
    clock.t = 4000.0
    assert p.line("budget 4 GB").endswith("elapsed 1:06:40, ETA 3:20:00; budget 4 GB")


def test_progress_prints_at_most_once_per_interval_and_at_the_end(capsys):
    clock = FakeClock()
    with progress.Progress(total=5, unit="requests", every_s=10, clock=clock) as p:
        for t in (1, 2, 12, 13, 30):
            clock.t = t
            p.advance()
    lines = capsys.readouterr().out.strip().splitlines()
    # printed at t=12 (10 s after the start) and at t=30 (the last one); not at 1, 2, 13
    assert [re.search(r"(\d+)/5", x).group(1) for x in lines] == ["3", "5"]
