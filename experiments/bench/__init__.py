"""Microbenchmarks: each module times one piece against its peers, checks it against a reference
before reporting, and writes a CSV plus a PNG drawn from it through `experiments.common.results_io`.

    python -m experiments.bench.ssd_scan          # SSD scan: in-pass capture vs none vs two passes
    python -m experiments.bench.paged_attention   # paged attention decode GB/s and prefill TFLOP/s (CUDA)
    python -m experiments.bench.decode_step       # one whole-model decode step: CUDA graph vs eager (CUDA)
    python -m experiments.bench.model_prefill     # torch-backend prefill vs transformers, per model family
    python -m experiments.bench.ceilings          # the device's copy GB/s and GEMM TFLOP/s (the floors' rates)
    python -m experiments.bench.gpu_check         # the GPU session's one command (scripts/gpu_check.sh)
    python -m experiments.bench.snapshot_dtype    # bf16 / fp8 snapshots: restored logits and greedy tokens vs fp32
    python -m experiments.bench.snapshot_dtype_budget  # the same dtypes' restored tokens under a budget (simulated)

Peers (mamba_ssm's and fla's Triton SSD) load from the git-ignored peers/ that
`bash scripts/fetch_peers.sh` fills (`experiments.bench.peers`); `timing` gives every bench one
do_bench-shaped timer (CUDA events on a GPU, perf_counter on a CPU dry run); `ratios` the
peer-over-ours and share-of-ceiling columns.

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
