"""experiments/common/study.py: what the skeleton owns, each rule able to fail on its own (the guide's
test, tests/test_study_guide.py, walks the common path)."""

from __future__ import annotations

import pytest

from experiments.common import outputs
from experiments.common.inputs import InputError
from experiments.common.results_io import write_json
from experiments.common.runs import ModelLoadError
from experiments.common.study import NothingToRun, Ran, Study


class Probe(Study):
    """A study whose run does what the test sets on `action`; it records which hooks ran."""
    record = "probe_study"
    prog = "probe"
    description = "probe"
    merge = True

    def __init__(self, action=None):
        self.action, self.calls = action, []

    def add_flags(self, ap):
        ap.add_argument("--nothing", action="store_true")

    def check(self, ctx):
        self.calls.append("check")
        if ctx.args.nothing:
            raise NothingToRun("probe: nothing to run here")

    def run(self, ctx):
        self.calls.append("run")
        return self.action(ctx) if self.action else [write_json(ctx.out / "data.json", {"x": 1})]

    def figures(self, ctx):
        self.calls.append("figures")
        return []

    def headline(self, ctx):
        self.calls.append("headline")
        return [("x", 1, 2)]


@pytest.fixture(autouse=True)
def folders(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(outputs, "RESULTS", tmp_path / "results")


def runs(tmp_path):
    root = tmp_path / "runs" / "probe_study"
    return sorted(root.iterdir()) if root.is_dir() else []


def usage_line(capsys, run) -> str:
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("error, line", [(InputError("trace.jsonl: empty"), "probe: error: trace.jsonl: empty"),
                                         (ModelLoadError("ckpt: no weights"), "probe: error: argument --model: ckpt: no weights")])
def test_an_input_found_bad_in_the_run_is_one_line_and_leaves_no_folder(tmp_path, capsys, error, line):
    def fail(ctx):
        raise error

    assert usage_line(capsys, lambda: Probe(fail).main([])) == line
    assert runs(tmp_path) == []


def test_nothing_to_run_exits_0_and_makes_nothing(tmp_path, capsys):
    study = Probe()
    assert study.main(["--nothing"]) == 0
    assert study.calls == ["check"] and runs(tmp_path) == []
    assert "probe: nothing to run here" in capsys.readouterr().out


def test_an_unfinished_run_draws_nothing_and_keeps_its_status(tmp_path, capsys):
    study = Probe(lambda ctx: Ran([write_json(ctx.out / "part.json", {})], status=3, finished=False))
    assert study.main([]) == 3
    assert study.calls == ["check", "run"]
    assert "wrote 1 file:" in capsys.readouterr().out


def test_the_headline_is_printed_beside_the_record_but_not_into_it(tmp_path, capsys):
    study = Probe()
    assert study.main([]) == 0 and study.calls[-2:] == ["figures", "headline"]
    assert "headline beside the committed record (results/probe_study/)" in capsys.readouterr().out
    study = Probe()
    assert study.main(["--publish"]) == 0 and "headline" not in study.calls
    assert (tmp_path / "results" / "probe_study" / "data.json").is_file()


def test_a_committed_file_that_does_not_read_is_a_log_line_not_a_failed_run(capsys):
    class Unreadable(Probe):
        def headline(self, ctx):
            raise InputError("results/probe_study/data.json: empty")

    assert Unreadable().main([]) == 0
    assert "no comparison with the committed record: results/probe_study/data.json: empty" in capsys.readouterr().out


def test_merge_reads_an_existing_folder_and_excludes_replot(tmp_path, capsys):
    assert "not allowed with argument" in usage_line(capsys, lambda: Probe().main(["--merge", "--replot"]))
    line = usage_line(capsys, lambda: Probe().main(["--merge", "--out", str(tmp_path / "absent")]))
    assert line.endswith(f"argument --merge: {tmp_path / 'absent'} is not a folder")
    (tmp_path / "f").write_text("x")
    line = usage_line(capsys, lambda: Probe().main(["--replot", "--out", str(tmp_path / "f")]))
    assert line.endswith(f"argument --replot: --out {tmp_path / 'f'} is a file, not a folder")


def test_replot_runs_only_the_figures(tmp_path):
    study = Probe()
    assert study.main([]) == 0
    study = Probe()
    assert study.main(["--replot"]) == 0 and study.calls == ["check", "figures"]
