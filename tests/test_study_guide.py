"""docs/add_a_study.md builds a working study: its `python` blocks, in order, are one module, run
here through every step the guide names (run folder, --publish, the headline beside the record,
--replot, a bad flag and a bad input as one usage line)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from experiments.common import outputs
from experiments.common.results_io import REPO

GUIDE = REPO / "docs" / "add_a_study.md"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The guide's module, imported from its code blocks; run folders and the record under tmp_path."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 6, "the guide's steps are its python blocks"
    path = tmp_path / "toy_tail_replay.py"
    path.write_text("\n".join(blocks))
    spec = importlib.util.spec_from_file_location("toy_tail_replay", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "toy_tail_replay", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(outputs, "RESULTS", tmp_path / "results")
    return module


def usage_line(capsys, run) -> str:
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def run_folders(root: Path) -> list[Path]:
    folder = root / "runs" / "toy_tail_replay"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_a_run_makes_its_folder_with_data_and_figure(toy, tmp_path, capsys):
    assert toy.main(["--prompt-len", "100,32772"]) == 0
    [run] = run_folders(tmp_path)
    assert re.fullmatch(r"\d{8}-\d{6}", run.name)
    rows = toy.read_csv(run / toy.CSV_NAME)
    # the rule: one block below the last boundary under the prompt (32772 -> 32768 - 16 = 32752: 20 replayed,
    # the seed's figure; 100 -> 96 - 16 = 80)
    assert [(r["prompt_len"], r["split_point"], r["warm_replayed_tokens"]) for r in rows] == \
        [("100", "80", "20"), ("32772", "32752", "20")]
    assert (run / toy.PNG_NAME).stat().st_size > 0
    out = capsys.readouterr().out
    assert f"writing to {run}" in out
    assert "wrote 2 files:" in out and toy.CSV_NAME in out and toy.PNG_NAME in out
    assert "headline beside" not in out  # no committed record yet


def test_publish_writes_the_record_and_the_next_run_prints_beside_it(toy, tmp_path, capsys):
    assert toy.main(["--publish", "--prompt-len", "100,1000"]) == 0
    record = tmp_path / "results" / "toy_tail_replay"
    assert {p.name for p in record.iterdir()} == {toy.CSV_NAME, toy.PNG_NAME}
    assert run_folders(tmp_path) == []  # --publish makes no run folder
    assert "headline beside" not in capsys.readouterr().out  # not beside itself
    assert toy.main(["--prompt-len", "1000", "--block-size", "64"]) == 0
    out = capsys.readouterr().out
    # 1000 at block 64: 960 - 64 = 896, 104 replayed; the record (block 16): 992 - 16 = 976, 24 replayed
    assert "headline beside the committed record (results/toy_tail_replay/)" in out
    assert re.search(r"prompt 1000 warm replayed\s+this run\s+104\s+committed\s+24", out)


def test_replot_redraws_the_newest_run_without_running(toy, tmp_path, capsys):
    assert toy.main(["--prompt-len", "500"]) == 0
    [run] = run_folders(tmp_path)
    png = run / toy.PNG_NAME
    png.unlink()
    capsys.readouterr()
    assert toy.main(["--replot"]) == 0
    assert png.stat().st_size > 0 and run_folders(tmp_path) == [run]
    out = capsys.readouterr().out
    assert "wrote 1 file:" in out and "writing to" not in out
    (run / toy.CSV_NAME).write_text("prompt_len,block_size\n")
    line = usage_line(capsys, lambda: toy.main(["--replot", "--out", str(run)]))
    assert line.endswith(f"{run / toy.CSV_NAME}: has a header but no rows (expected a tail-replay CSV)")


@pytest.mark.parametrize("argv, names", [
    (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
    (["--prompt-len", "8", "--block-size", "16"], "argument --prompt-len: every length must exceed --block-size"),
    (["--replot"], "argument --replot: no run folder under"),
])
def test_a_bad_flag_is_one_line_and_leaves_nothing(toy, tmp_path, capsys, argv, names):
    line = usage_line(capsys, lambda: toy.main(argv))
    assert ": error: " in line and names in line
    assert run_folders(tmp_path) == [] and not (tmp_path / "results").exists()


def test_help_lists_the_skeleton_flags_and_the_study_defaults(toy):
    text = toy.parser().format_help()
    for flag in ("--out", "--publish", "--replot", "--prompt-len", "--block-size"):
        assert flag in text
    assert "(default: 16)" in text
