#!/usr/bin/env bash
# Fetch the peer kernels the GPU benches time beside ours into peers/ (git-ignored, never committed):
#   fla-core 0.6.0 (its wheel: pure Python + Triton; `chunk_simple_gla` is SSD with B/C per head)
#   mamba_ssm 2.3.2.post1 (no wheel: its sdist, of which only mamba_ssm/ops/triton and utils are kept;
#     the package __init__ imports a CUDA extension, so experiments/bench/peers.py loads the Triton
#     modules under a stand-in package and never runs that __init__)
#   vllm 0.33.0: of its 336 MB wheel only the Triton unified attention kernel (46 KB) and its helpers
#     file are kept; experiments/bench/peers.py gives it stand-ins for the few vllm modules it imports
#     (envs, logger, platforms, triton_utils, kv_cache_interface). FETCH_VLLM=0 skips the download.
#
#   bash scripts/fetch_peers.sh            # -> peers/fla/fla/..., peers/mamba_ssm/mamba_ssm/..., peers/VERSIONS
#   PEERS_DIR=/elsewhere bash scripts/fetch_peers.sh
#
# On the GPU machine (no network) the folder travels with the run: device tool `carry: ["peers"]`
# (about 6.5 MiB unpacked). The benches find it at ./peers, or at $PEERS_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${PEERS_DIR:-peers}
PIP=${PIP:-.venv/bin/python -m pip}
FLA=fla-core==0.6.0
MAMBA=mamba-ssm==2.3.2.post1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$PIP download --no-deps -q -d "$tmp" "$FLA"
# an sdist: pip prepares its metadata (setup.py egg_info); MAMBA_SKIP_CUDA_BUILD keeps that from
# looking for nvcc, and --no-build-isolation from installing torch into a build environment
MAMBA_SKIP_CUDA_BUILD=TRUE $PIP download --no-deps --no-binary=:all: --no-build-isolation -q -d "$tmp" "$MAMBA"
rm -rf "$DEST/fla" "$DEST/mamba_ssm"
mkdir -p "$DEST/fla" "$DEST/mamba_ssm"
python3 -m zipfile -e "$tmp"/fla_core-*.whl "$DEST/fla"
tar xzf "$tmp"/mamba_ssm-*.tar.gz -C "$tmp"
src=$(echo "$tmp"/mamba_ssm-*/)
mkdir -p "$DEST/mamba_ssm/mamba_ssm/ops"
cp -r "$src/mamba_ssm/ops/triton" "$DEST/mamba_ssm/mamba_ssm/ops/"
cp -r "$src/mamba_ssm/utils" "$DEST/mamba_ssm/mamba_ssm/"
cp "$src/mamba_ssm/ops/__init__.py" "$DEST/mamba_ssm/mamba_ssm/ops/"  # empty; mamba_ssm/__init__.py is left out
cp "$src/LICENSE" "$DEST/mamba_ssm/"
VLLM=vllm==0.33.0
rm -rf "$DEST/vllm"
if [ "${FETCH_VLLM:-1}" != 0 ]; then
    $PIP download --no-deps -q -d "$tmp" "$VLLM"
    ops=vllm/v1/attention/ops
    python3 - "$tmp"/vllm-*.whl "$DEST/vllm" "$ops/triton_unified_attention.py" "$ops/triton_attention_helpers.py" <<'PY'
import sys, zipfile
from pathlib import Path
wheel, dest, *names = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    licence = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")]
    for name in names + licence[:1]:
        out = Path(dest) / ("LICENSE" if name in licence else Path(name).name)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(name))
PY
    rm -f "$tmp"/vllm-*.whl
fi
printf '%s\n%s\n' "$FLA" "$MAMBA" > "$DEST/VERSIONS"
[ -f "$DEST/vllm/triton_unified_attention.py" ] && echo "$VLLM" >> "$DEST/VERSIONS"
echo "peers in $DEST ($(du -sh "$DEST" | cut -f1)): $(tr '\n' ' ' < "$DEST/VERSIONS")"
