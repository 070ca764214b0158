#!/usr/bin/env bash
# The GPU session's one command (device tool), sized to the lease: experiments/bench/gpu_check.py
# runs the steps (ceilings, paged, ssd, decode, warm, tests) under one deadline (default 530 s),
# skips and logs a step that would not fit, and writes each step's tarball into $OUT as it ends,
# plus summary.json and summary.txt (8 files at most). Flags pass through:
#
#   bash scripts/gpu_check.sh                                   # everything, < 9 minutes
#   bash scripts/gpu_check.sh --steps ssd,tests --deadline-s 300
#   bash scripts/gpu_check.sh --dry-run --out /tmp/dry          # the same steps on the CPU, tiny shapes
#
# On the GPU machine: fetch the peers here first (bash scripts/fetch_peers.sh) and carry them:
#   run(command="bash scripts/gpu_check.sh", carry=["peers"], timeout_s=570)
# torch 2.11, Triton 3.6 and no network there: nothing is installed; python3 holds torch.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" -m experiments.bench.gpu_check "$@"
