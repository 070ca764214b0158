"""Writing results: atomic file replacement, the environment record, the progress log, and `--shard i/n`
parsing."""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from kernels.checks import require

REPO = Path(__file__).resolve().parents[2]  # experiments/common/results_io.py -> the repository
RESULTS = REPO / "results"


def log(msg: str) -> None:
    """A timestamped progress line on stdout (flushed: experiments run for minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def environment(device: str = "cpu") -> dict[str, Any]:
    """Device and versions, recorded beside every result."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    if device.startswith("cuda") and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(torch.device(device))
    else:
        device_name = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return {
        "device": device,
        "device_name": device_name,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)  # a rerun replaces the file whole; a crash leaves the old one
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def write_json(path: Path, data: Any) -> Path:
    return _atomic_write(path, lambda f: json.dump(data, f, indent=2, default=str))


def write_text(path: Path, text: str) -> Path:
    return _atomic_write(path, lambda f: f.write(text))


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)

    def write(f):
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)

    return _atomic_write(path, write)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def save_figure(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=130, bbox_inches="tight")
    os.replace(tmp, path)
    return path


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` -> (i, n) with 0 <= i < n; a sweep runs the points whose index % n == i."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard: expected i/n (e.g. 0/4), got {text!r}") from None
    require(n >= 1 and 0 <= i < n, "--shard", f"need n >= 1 and 0 <= i < n, got {text!r}")
    return i, n


def shard(points: Iterable[Any], spec: tuple[int, int]) -> list[Any]:
    i, n = spec
    return [p for k, p in enumerate(points) if k % n == i]
