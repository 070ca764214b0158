#!/usr/bin/env bash
# Fetch the peer kernels the GPU benches time beside ours into peers/ (git-ignored, never committed):
#   fla-core 0.6.0 (its wheel: pure Python + Triton; `chunk_simple_gla` is SSD with B/C per head)
#   mamba_ssm 2.3.2.post1 (no wheel: its sdist, of which only mamba_ssm/ops/triton and utils are kept;
#     the package __init__ imports a CUDA extension, so experiments/bench/peers.py loads the Triton
#     modules under a stand-in package and never runs that __init__)
# vLLM's Triton unified attention is not fetched: the kernel file (vllm 0.33.0:
# vllm/v1/attention/ops/triton_unified_attention.py, 46 KB) comes only in the 336 MB wheel, and it
# imports vllm.envs, vllm.logger, vllm.platforms.current_platform, vllm.triton_utils and
# vllm.v1.kv_cache_interface: it needs stand-ins for those before it can be loaded by path.
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
printf '%s\n%s\n' "$FLA" "$MAMBA" > "$DEST/VERSIONS"
echo "peers in $DEST ($(du -sh "$DEST" | cut -f1)): $(tr '\n' ' ' < "$DEST/VERSIONS")"
