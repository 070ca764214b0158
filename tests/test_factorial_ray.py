"""The factorial's points as Ray tasks (`--ray`, `--ray-address`): a clear usage error without the
optional extra, and on a local Ray the same rows as the process pool."""

import json
import sys

import pytest

from experiments.common import outputs
from experiments.traces import factorial

# ours-plus with its own eviction, the optimum, ours-plus unbounded: 3 points, about a second each
SMALL = ["--trace", "synthetic", "--limit", "40", "--policy", "ours-plus", "--eviction", "shadow_best",
         "--budget-gb", "0.25", "--host-gb", "0"]


@pytest.mark.parametrize("flags", [["--ray"], ["--ray-address", "127.0.0.1:6379"]])
def test_without_ray_installed_it_is_one_usage_line_naming_the_extra(tmp_path, monkeypatch, capsys, flags):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    with pytest.raises(SystemExit) as exc:
        factorial.main([*SMALL, *flags, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "Traceback" not in err
    assert "--ray" in last and "pip install -e '.[sweeps]'" in last
    assert list(tmp_path.iterdir()) == []  # nothing written, not even the output folder


def rows_of(out) -> list[dict]:
    rows = json.loads((out / "factorial.json").read_text())["rows"]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_a_local_ray_run_gives_the_pool_rows_and_resumes(tmp_path):
    pytest.importorskip("ray")
    assert factorial.main([*SMALL, "--jobs", "1", "--out", str(tmp_path / "pool")]) == 0
    ray_out = tmp_path / "ray"
    assert factorial.main([*SMALL, "--ray", "--jobs", "2", "--out", str(ray_out)]) == 0
    pool = rows_of(tmp_path / "pool")
    assert len(pool) == 3 and rows_of(ray_out) == pool
    lines = (ray_out / "points.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3  # the header (the study's identity), a row a point
    (ray_out / "points.jsonl").write_text("\n".join(lines[:2]) + "\n")  # as if killed after the first row
    assert factorial.main([*SMALL, "--ray", "--jobs", "2", "--resume", "--out", str(ray_out)]) == 0
    assert rows_of(ray_out) == pool and len((ray_out / "points.jsonl").read_text().splitlines()) == 1 + 3
