"""The record's compact form (`experiments.common.compact`, issue 33): per-request files are gzip'd,
written byte-stably, and read transparently by every loader (`--replot`, `--merge`, `--resume`).

Expected bytes come from the gzip format (RFC 1952: magic 1f 8b, mtime at bytes 4-7, FNAME flag 0x08),
not from our writer; the committed folders are redrawn and re-merged from what is committed.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from experiments.common import compact, sweep_parts
from experiments.common.inputs import InputError, read_csv as read_csv_guarded, read_json
from experiments.common.results_io import read_csv, write_csv, write_json

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "results" / "traces" / "synthetic-113"  # the smallest committed traces folder (2 parts)
DATA = {"ttft_s": [0.1234567, 2.5, 1e-06], "policy": "ours-plus", "budget_gb": None}


def test_a_gz_name_is_written_gzip_byte_stable_and_reads_back(tmp_path):
    path = write_json(tmp_path / "a.json.gz", DATA)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and int.from_bytes(raw[4:8], "little") == 0 and not raw[3] & 0x08
    assert json.loads(gzip.decompress(raw)) == DATA  # any gzip reader, not only ours
    assert gzip.decompress(raw).decode() == json.dumps(DATA, indent=2)  # the plain file's text, compressed
    first = raw
    write_json(path, DATA)  # a rerun that writes the same data: the same bytes (git sees no change)
    assert path.read_bytes() == first
    assert read_json(path) == DATA and read_json(tmp_path / "a.json") == DATA  # asked for the plain name too


def test_a_plain_name_stays_plain(tmp_path):
    path = write_json(tmp_path / "a.json", DATA)
    assert path.read_text() == json.dumps(DATA, indent=2)
    assert read_json(tmp_path / "a.json.gz") == DATA  # asked for the compact name, only the plain exists


def test_writing_one_form_removes_the_other(tmp_path):
    """Else a reader asked for `X` would take a stale plain `X` beside a fresh `X.gz`."""
    (tmp_path / "t.json").write_text(json.dumps({"stale": True}))
    write_json(tmp_path / "t.json.gz", DATA)
    assert not (tmp_path / "t.json").exists() and read_json(tmp_path / "t.json") == DATA
    write_json(tmp_path / "t.json", {"plain": 1})
    assert not (tmp_path / "t.json.gz").exists()


def test_csv_gz_round_trips_with_its_line_ends(tmp_path):
    rows = [{"config": "off", "ttft_s": "0.5", "note": "two\nlines"}, {"config": "aligned", "ttft_s": "0.25", "note": ""}]
    plain, packed = write_csv(tmp_path / "r.csv", rows), write_csv(tmp_path / "q.csv.gz", rows)
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()  # csv's own \r\n kept
    assert read_csv(packed) == read_csv(plain) == rows
    one_line = write_csv(tmp_path / "s.csv.gz", [{"config": "off", "ttft_s": "0.5"}])
    assert read_csv_guarded(one_line, ("config", "ttft_s")) == [{"config": "off", "ttft_s": "0.5"}]
    with pytest.raises(InputError, match=r"s\.csv\.gz: not the multi-turn CSV \(no column 'output_sha'\)"):
        read_csv_guarded(tmp_path / "s.csv", ("config", "output_sha"), what="the multi-turn CSV")  # names the .gz read


def test_a_cut_or_fake_gz_is_one_input_error_naming_it(tmp_path):
    good = write_json(tmp_path / "p.json.gz", DATA).read_bytes()
    (tmp_path / "p.json.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match=r"p\.json\.gz: cannot read it"):
        read_json(tmp_path / "p.json.gz")
    (tmp_path / "q.json.gz").write_text('{"plain": "text under a .gz name"}')
    with pytest.raises(InputError, match=r"q\.json\.gz: cannot read it"):
        read_json(tmp_path / "q.json.gz")
    with pytest.raises(InputError, match=r"r\.json\.gz: no such file"):
        read_json(tmp_path / "r.json.gz")


def _shard(out: Path, points, resume=False, measured=None):
    measured = [] if measured is None else measured

    def measure(i, p):
        measured.append(i)
        return [{"point": i, "row": 0, "policy": "p", "ttft_s": [0.5 * i, 0.25]}]

    return sweep_parts.run_shard(out, "s", points, {"c": 1}, (0, 1), measure, tag=dict, resume=resume), measured


def test_parts_are_gzip_and_a_plain_part_of_an_older_run_resumes(tmp_path):
    points = [{"x": 1}, {"x": 2}, {"x": 3}]
    _shard(tmp_path, points)
    (part,) = sweep_parts.part_files(tmp_path, "s")
    assert part.name == "s.part0of1.json.gz" and part.read_bytes()[:2] == b"\x1f\x8b"
    # an older run's plain part with two points done: --resume keeps them and measures the third
    kept = json.loads(gzip.decompress(part.read_bytes()))
    kept["done"], kept["rows"] = kept["done"][:2], kept["rows"][:2]
    part.unlink()
    (tmp_path / "parts" / "s.part0of1.json").write_text(json.dumps(kept, indent=2))
    _, measured = _shard(tmp_path, points, resume=True)
    assert measured == [2]
    (part,) = sweep_parts.part_files(tmp_path, "s")  # rewritten compact, the plain one gone
    assert part.name == "s.part0of1.json.gz"
    assert [r["point"] for r in sweep_parts.collect(tmp_path, "s")[1]] == [0, 1, 2]


def test_merge_leaves_per_request_columns_out_of_the_csv(tmp_path):
    _shard(tmp_path, [{"x": 1}, {"x": 2}])
    sweep_parts.merge(tmp_path, "s", per_request=("ttft_s",))
    rows = read_csv(tmp_path / "s.csv")
    assert [r["point"] for r in rows] == ["0", "1"] and "ttft_s" not in rows[0] and "policy" in rows[0]
    sweep_parts.merge(tmp_path, "s")  # without: every column, lists as JSON text
    assert json.loads(read_csv(tmp_path / "s.csv")[1]["ttft_s"]) == [0.5, 0.25]


@pytest.fixture
def committed(tmp_path):
    if not (RECORD / "summary.json").is_file():
        pytest.skip(f"no committed {RECORD.relative_to(REPO)}")
    out = tmp_path / RECORD.name
    shutil.copytree(RECORD, out)
    return out


def test_the_committed_traces_folder_is_compact_and_redraws(committed):
    from experiments.traces.__main__ import main

    assert (committed / "ttft.json.gz").is_file() and not (committed / "ttft.json").exists()
    assert all(p.name.endswith(".json.gz") for p in sweep_parts.part_files(committed, "traces"))
    assert "ttft_s" not in read_csv(committed / "traces.csv")[0]  # per-point rows only
    pngs = sorted(p.name for p in committed.glob("*.png"))
    for p in committed.glob("*.png"):
        p.unlink()
    assert main(["--replot", "--out", str(committed)]) == 0
    assert sorted(p.name for p in committed.glob("*.png")) == pngs and pngs


def test_merging_the_committed_parts_rewrites_the_same_bytes(committed):
    """A rerun with --publish gives the same layout: the per-point CSV and the compact TTFTs are what
    `--merge` writes from the committed parts, byte for byte."""
    from experiments.traces.__main__ import main

    before = {f: (committed / f).read_bytes() for f in ("traces.csv", "ttft.json.gz")}
    for f in before:
        (committed / f).unlink()
    assert main(["--merge", "--out", str(committed), "--no-plots"]) == 0
    assert {f: (committed / f).read_bytes() for f in before} == before
    assert not (committed / "ttft.json").exists()


def test_the_committed_peer_vllm_result_redraws_its_report(tmp_path):
    """peer_vllm.json.gz (per-request records inside) -> figure and README, the README as committed."""
    from experiments.peer_vllm.study import main

    record = REPO / "results" / "peer_vllm"
    if not (record / "peer_vllm.json.gz").is_file():
        pytest.skip("no committed results/peer_vllm/peer_vllm.json.gz")
    out = tmp_path / "pv"
    out.mkdir()
    shutil.copy(record / "peer_vllm.json.gz", out)
    assert main(["--replot", "--out", str(out)]) == 0
    assert (out / "peer_vllm.png").is_file()
    assert (out / "README.md").read_text() == (record / "README.md").read_text()
