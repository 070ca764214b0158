#!/usr/bin/env bash
# Creates .venv-triton36 beside the repo: Triton 3.6.0 (the GPU machine's version) and the torch
# 2.13.0 CPU wheel, nothing else. Only the compile check runs there (tests/test_compile_*.py run
# `python -m kernels.compile_check` with both venvs' Pythons): register counts differ between
# Triton versions, and the GPU machine compiles with 3.6 (kernels/ssd_configs.py).
# scripts/setup_venv.sh runs this; TRITON36=0 skips it. Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
V=.venv-triton36
WANT=3.6.0
if [ ! -x "$V/bin/python" ]; then
    "$PY" -m venv "$V"
fi
if ! "$V/bin/python" -c "import torch" 2>/dev/null; then
    "$V/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
# --no-deps: Triton needs nothing at compile time, and a CUDA torch would pin its own Triton
if [ "$("$V/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null)" != "$WANT" ]; then
    "$V/bin/python" -m pip install -q --no-deps "triton==$WANT"
fi
