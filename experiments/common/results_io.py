"""Writing results: atomic file replacement (a `.gz` name is written compact: `experiments.common.compact`),
the environment record, the progress log, and `--shard i/n` parsing."""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from experiments.common import compact
from kernels.checks import require

REPO = Path(__file__).resolve().parents[2]  # experiments/common/results_io.py -> the repository
RESULTS = REPO / "results"


def log(msg: str) -> None:
    """A timestamped progress line on stdout (flushed: experiments run for minutes)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def environment(device: str = "cpu") -> dict[str, Any]:
    """Device and versions, the machine (`machine.machine_info`: CPU model, ISA, cores, load, oneDNN
    and MKL) and, on the CPU, the routes its capabilities chose (`kernels.torch_cpu.capability`),
    recorded beside every result."""
    import torch

    from experiments.common.machine import machine_info
    from kernels.torch_cpu.capability import routes_record

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency
        triton_version = None
    machine = machine_info()
    if device.startswith("cuda") and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(torch.device(device))
    else:
        device_name = f"CPU ({machine['cpu_label']})"
    return {
        "device": device,
        "device_name": device_name,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "cpu_routes": routes_record() if device == "cpu" else None,
    }


def _atomic_write(path: Path, write) -> Path:
    """Replace `path` whole with what `write(text_stream)` writes (gzip'd for a `.gz` name), then remove
    the file's other form (`X` beside a new `X.gz`, or the reverse), which readers would otherwise take."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, compact.text_writer(raw, compact.is_compact(path)) as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)  # a rerun replaces the file whole; a crash leaves the old one
    except BaseException:
        os.unlink(tmp)
        raise
    compact.twin(path).unlink(missing_ok=True)
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
    """The rows of `path` (or of its `.gz` form, `compact.locate`)."""
    return list(csv.DictReader(io.StringIO(compact.read_text(path), newline="")))


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
