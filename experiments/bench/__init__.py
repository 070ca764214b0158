"""Microbenchmarks: each module times one piece against its peers, checks it against a reference
before reporting, and writes a CSV plus a PNG drawn from it through `experiments.common.results_io`.

    python -m experiments.bench.ssd_scan          # SSD scan: in-pass capture vs none vs two passes
    python -m experiments.bench.paged_attention   # paged attention decode GB/s and prefill TFLOP/s (CUDA)
    python -m experiments.bench.decode_step       # one whole-model decode step: CUDA graph vs eager (CUDA)
    python -m experiments.bench.model_prefill     # torch-backend prefill vs transformers, per model family

Every one writes into a new `runs/<bench>/<timestamp>/` unless `--out FOLDER` or `--publish` (the
committed `results/<bench>/`) is given; shapes come from the model presets (`--model`).
"""

from __future__ import annotations

import argparse


def preset_names(text: str) -> list[str]:
    """Comma-separated model preset names (model.families.PRESETS), distinct, at least one."""
    from experiments.common.flags import name_list
    from model.families import PRESETS

    return name_list(PRESETS)(text)


def preset_name(text: str) -> str:
    """One model preset name."""
    names = preset_names(text)
    if len(names) != 1:
        raise argparse.ArgumentTypeError(f"expected one preset, got {text!r}")
    return names[0]
