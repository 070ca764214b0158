#!/usr/bin/env bash
# Creates .venv beside the repo and installs the project with its dev extra.
# torch is pinned to the 2.13.0 CPU wheel first: an unpinned `torch` would pull a
# multi-GB CUDA build onto a CPU-only machine. Then .venv-triton36, Triton 3.6 for the
# compile check (scripts/setup_triton36.sh; TRITON36=0 skips it). Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[dev]"
if [ "${TRITON36:-1}" != 0 ]; then
    bash scripts/setup_triton36.sh
fi
