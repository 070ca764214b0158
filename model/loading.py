"""Build a `HybridLM` from a local HF checkpoint folder or from a named preset with random weights.

A checkpoint folder holds `config.json` (transformers' `BambaConfig`) and safetensors weights,
either one `model.safetensors` or shards listed in `model.safetensors.index.json`. The tensor
names are transformers' own; the only map is dropping the `model.` prefix of the decoder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open

from model.config import PRESETS, HybridConfig
from model.hybrid import HybridLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def hf_name(name: str) -> str:
    """Our parameter name -> the checkpoint's (`layers.3.mamba.A_log` -> `model.layers.3.mamba.A_log`)."""
    return name if name.startswith("lm_head.") else f"model.{name}"


def _empty_model(config: HybridConfig, backend: str, dtype: torch.dtype, device) -> HybridLM:
    """Parameters allocated in `dtype` on `device` without an fp32 CPU detour (Bamba-9B: 20 GB in bf16)."""
    with torch.device("meta"):
        model = HybridLM(config, backend=backend)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.tie_weights()  # to_empty may re-create the tied tensor; tie again
    return model.eval()


def _checkpoint_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    if (path / SINGLE_FILE).is_file():
        with safe_open(path / SINGLE_FILE, framework="pt") as f:
            return {name: path / SINGLE_FILE for name in f.keys()}
    raise FileNotFoundError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}")


def load_pretrained(path: str | Path, backend: str = "torch", dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> HybridLM:
    """A `HybridLM` with the checkpoint's weights cast to `dtype` on `device`.

    Unsupported config fields fail naming the field; a missing, unexpected or mis-shaped tensor
    fails naming the tensor (nothing is left uninitialized silently).
    """
    path = Path(path)
    config = HybridConfig.from_json_file(path / "config.json")
    model = _empty_model(config, backend, dtype, device)
    files = _checkpoint_files(path)

    expected = dict(model.named_parameters())  # tied lm_head shares embed_tokens: listed once
    wanted = {hf_name(name): param for name, param in expected.items()}
    if config.tie_word_embeddings:
        files.pop("lm_head.weight", None)  # some writers store the tied copy too; transformers ignores it
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise ValueError(f"{missing[0]}: missing tensor in checkpoint {path} ({len(missing)} missing: {missing[:8]})")
    unexpected = sorted(set(files) - set(wanted))
    if unexpected:
        raise ValueError(f"{unexpected[0]}: unexpected tensor in checkpoint {path} (not in the Bamba layout of this "
                         f"config; {len(unexpected)} unexpected: {unexpected[:8]})")

    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(file, framework="pt") as f:
                for name in names:
                    param = wanted[name]
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(param.shape):
                        raise ValueError(f"{name}: checkpoint shape {shape} != expected {tuple(param.shape)} "
                                         f"for this config ({file.name})")
                    param.copy_(f.get_tensor(name).to(dtype))
    return model


@torch.no_grad()
def init_random_weights(model: HybridLM, seed: int) -> HybridLM:
    """Random weights with Mamba-2's SSM initialization, generated on the model's device.

    Matrices ~ N(0, 1/fan_in) (unit-scale activations after every projection; the embedding
    N(0, 1/hidden), so a tied head gives unit-scale logits too),
    biases 0, norms 1, D 1, conv as PyTorch's Conv1d default U(+-1/sqrt(d_conv)). A = -U(1, 16)
    and dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1], as mamba_ssm initializes them: the
    per-token decay exp(dt * A) spans 0.2 .. 0.999, so some heads remember ~1000 tokens.
    Why not transformers' init (N(0, 0.02), dt_bias = 1, A = -1..-H): with it B and C come out
    of the conv ~10x smaller and the SSM state moves the logits of "small" by 0.02 (std) against
    0.28 here, so a wrongly restored state would hide under the warm == cold tolerance.
    """
    g = torch.Generator(device=model.device)
    g.manual_seed(seed)

    def uniform(t, lo, hi):
        return t.copy_(torch.rand(t.shape, generator=g, device=t.device, dtype=torch.float32) * (hi - lo) + lo)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("conv1d.weight") or name.endswith("conv1d.bias"):
            bound = 1.0 / math.sqrt(model.config.mamba_d_conv)
            uniform(p, -bound, bound)
        elif leaf == "A_log":
            p.copy_(torch.log(uniform(torch.empty(p.shape, device=p.device), 1.0, 16.0)))
        elif leaf == "dt_bias":
            dt = torch.exp(uniform(torch.empty(p.shape, device=p.device), math.log(1e-3), math.log(1e-1)))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        elif leaf == "D" or "norm" in name:
            p.fill_(1.0)
        elif leaf == "bias":
            p.zero_()
        else:  # a matrix: (out, in) for Linear, (vocab, hidden) for the embedding
            std = 1.0 / math.sqrt(p.shape[1])
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32) * std)
    return model


def from_preset(name: str, backend: str = "torch", seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> HybridLM:
    """A preset's shapes (`model.config.PRESETS`) with `init_random_weights(seed)`."""
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return init_random_weights(_empty_model(PRESETS[name], backend, dtype, device), seed)
