"""Where the model studies write, and what they read back (issue 22: runs and the record are separate).

A run writes a new `runs/<study>/<timestamp>/` unless `--out` names a folder; `--replot` and
`--merge` read `--out` (default: the newest run folder); the committed record's files read back.
Every case here is seconds: the planner alone, or redrawing committed data.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.ablations import study as ablations
from experiments.common import outputs
from experiments.plan_incident import study as plan_incident
from experiments.warm_restore import study as warm_restore
from experiments.multiturn import cli as multiturn
from model import PRESETS
from model.families import FAMILIES

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    return tmp_path / "runs"


def test_a_run_writes_a_new_run_folder_and_prints_the_record_beside_it(runs, capsys):
    assert plan_incident.main(["--prompt-len", "260", "--block-size", "4", "--prefill-budget", "64"]) == 0
    (folder,) = (runs / "plan_incident").iterdir()
    result = json.loads((folder / "plan_incident.json").read_text())
    assert (result["aligned"]["warm_restore_at"], result["aligned"]["warm_replayed_tokens"]) == (252, 8)
    assert result["config"]["prefill_budget"] == result["config"]["budget"] == 64
    out = capsys.readouterr().out.splitlines()
    if (RESULTS / "plan_incident" / "plan_incident.json").is_file():
        assert any("headline beside the committed record" in line for line in out)
        assert any("aligned warm_replayed_tokens" in line and "committed" in line for line in out)
    assert out[-1].endswith(f"wrote 1 file: {folder / 'plan_incident.json'}") or "wrote 1 file:" in out[-1]


def test_replot_reads_the_newest_run_folder(runs):
    committed = RESULTS / "warm_restore" / "warm_restore.json"
    if not committed.is_file():
        pytest.skip("no committed warm_restore.json")
    older, newer = runs / "warm_restore" / "20260101-000000", runs / "warm_restore" / "20260102-000000"
    for folder in (older, newer):
        folder.mkdir(parents=True)
        shutil.copy(committed, folder / "warm_restore.json")
    (runs / "warm_restore" / "not-a-run").mkdir()  # sorts after the timestamps; never taken as one
    assert warm_restore.main(["--replot"]) == 0
    assert (newer / "warm_restore.png").is_file() and (newer / "README.md").is_file()
    assert not (older / "warm_restore.png").exists()


def test_ablations_all_takes_any_out_folder(tmp_path):
    """`all` writes each sweep into <out>/<sweep>/: here the committed record copied, redrawn."""
    if not (RESULTS / "ablations" / "budget" / "budget.csv").is_file():
        pytest.skip("no committed ablations")
    out = tmp_path / "abl"
    shutil.copytree(RESULTS / "ablations", out)
    for png in out.glob("*/*.png"):
        png.unlink()
    assert ablations.main(["all", "--replot", "--out", str(out)]) == 0
    assert sorted(p.parent.name for p in out.glob("*/*.png")) == sorted(s.name for s in ablations.SWEEPS.values())


def test_multiturn_merges_and_replots_the_committed_parts(tmp_path):
    if not (RESULTS / "multiturn" / "parts").is_dir():
        pytest.skip("no committed multi-turn parts")
    out = tmp_path / "mt"
    shutil.copytree(RESULTS / "multiturn", out)
    summary = (out / "summary.csv").read_text()
    for f in ("summary.csv", "multiturn.png"):
        (out / f).unlink()
    assert multiturn.main(["--merge", "--out", str(out)]) == 0  # the committed parts merge to the same summary
    assert (out / "summary.csv").read_text() == summary
    (out / "multiturn.png").unlink()
    assert multiturn.main(["--replot", "--out", str(out)]) == 0
    assert (out / "multiturn.png").is_file()


# Each family's smallest preset (by hidden size)
SMALLEST_PER_FAMILY = sorted(min((n for n, c in PRESETS.items() if c.model_type == t), key=lambda n: PRESETS[n].hidden_size)
                             for t in FAMILIES)


@pytest.mark.parametrize("preset", SMALLEST_PER_FAMILY)
def test_every_family_has_a_layer_summary(preset):
    """A study's record draws the layer pattern with one symbol per layer kind: a family whose kind has
    none ended a whole warm_restore run in a KeyError (Qwen3-Next's 'linear_attention')."""
    from experiments.common.runs import LAYER_SYMBOLS, model_summary
    from model import from_preset
    from model.config import LAYER_TYPES

    assert set(LAYER_TYPES) <= set(LAYER_SYMBOLS) and len(set(LAYER_SYMBOLS.values())) == len(LAYER_SYMBOLS)
    model = from_preset(preset, seed=0)
    assert len(model_summary(model)["layers"]) == model.config.num_hidden_layers
