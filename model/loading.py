"""Build a `HybridLM` from a local HF checkpoint folder or from a named preset with random weights.

A checkpoint folder holds `config.json` (a supported family's transformers config: its
`model_type` picks the family in `model.families`) and safetensors weights, either one
`model.safetensors` or shards listed in `model.safetensors.index.json`. The family names the
checkpoint tensor behind each of our parameters (`Family.checkpoint_name`); `save_pretrained`
writes the same layout back, so transformers can load what we save.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from model.config import HybridConfig
from model.families import PRESETS, config_from_json_file, config_to_hf, get_family
from model.hybrid import HybridLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def checkpoint_names(model: HybridLM) -> dict[str, str | tuple[str, ...]]:
    """Our parameter name -> its checkpoint tensor name (a tuple: tensors stacked along dim 0).
    A tied lm_head is listed once, as the embedding."""
    family = get_family(model.config.model_type)
    return {name: family.checkpoint_name(model.config, name) for name, _ in model.named_parameters()}


def _empty_model(config: HybridConfig, backend: str, dtype: torch.dtype, device) -> HybridLM:
    """Parameters allocated in `dtype` on `device` without an fp32 CPU detour (Bamba-9B: 20 GB in bf16);
    a module with `keep_in_fp32 = True` (NemotronH's router, as in transformers) stays fp32."""
    with torch.device("meta"):
        model = HybridLM(config, backend=backend)
    model = model.to(dtype=dtype)
    for module in model.modules():
        if getattr(module, "keep_in_fp32", False):
            module.float()
    model = model.to_empty(device=device)
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


def _wanted_tensors(model: HybridLM) -> dict[str, tuple[torch.Tensor, int | None]]:
    """Checkpoint tensor name -> (our parameter, its index along dim 0 for a stacked one, else None)."""
    wanted = {}
    params = dict(model.named_parameters())
    for name, source in checkpoint_names(model).items():
        if isinstance(source, str):
            wanted[source] = (params[name], None)
        else:
            if len(source) != params[name].shape[0]:
                raise ValueError(f"{name}: {len(source)} checkpoint tensors for a stack of {params[name].shape[0]}")
            wanted.update({tensor: (params[name], j) for j, tensor in enumerate(source)})
    return wanted


def load_pretrained(path: str | Path, backend: str = "torch", dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> HybridLM:
    """A `HybridLM` with the checkpoint's weights cast to `dtype` on `device`.

    Unsupported config fields fail naming the field; a missing, unexpected or mis-shaped tensor
    fails naming the tensor (nothing is left uninitialized silently), all before a weight is read.
    """
    path = Path(path)
    config = config_from_json_file(path / "config.json")
    model = _empty_model(config, backend, dtype, device)
    files = _checkpoint_files(path)

    wanted = _wanted_tensors(model)
    if config.tie_word_embeddings:  # some writers store the tied copy too; transformers ignores it
        files.pop(get_family(config.model_type).checkpoint_name(config, "lm_head.weight"), None)
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise ValueError(f"{missing[0]}: missing tensor in checkpoint {path} ({len(missing)} missing: {missing[:8]})")
    unexpected = sorted(set(files) - set(wanted))
    if unexpected:
        raise ValueError(f"{unexpected[0]}: unexpected tensor in checkpoint {path} (not in the {config.model_type} "
                         f"layout of this config; {len(unexpected)} unexpected: {unexpected[:8]})")

    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():  # every shape before any copy
        with safe_open(file, framework="pt") as f:
            for name in names:
                param, j = wanted[name]
                shape, expected = tuple(f.get_slice(name).get_shape()), tuple(param.shape[0 if j is None else 1:])
                if shape != expected:
                    raise ValueError(f"{name}: checkpoint shape {shape} != expected {expected} for this config "
                                     f"({file.name})")
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(file, framework="pt") as f:
                for name in names:
                    param, j = wanted[name]
                    (param if j is None else param[j]).copy_(f.get_tensor(name))  # cast to the parameter's dtype
    return model


def save_pretrained(model: HybridLM, path: str | Path) -> Path:
    """config.json (the family's transformers config) and one model.safetensors under the
    checkpoint's tensor names: what `load_pretrained` and transformers' `from_pretrained` read."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = config_to_hf(model.config)
    architecture = get_family(model.config.model_type).architecture
    if architecture:
        hf = {"architectures": [architecture], **hf}
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    params = dict(model.named_parameters())
    tensors = {}
    for name, source in checkpoint_names(model).items():
        value = params[name].detach().to("cpu")
        if isinstance(source, str):
            tensors[source] = value.contiguous()
        else:
            tensors.update({tensor: value[j].contiguous() for j, tensor in enumerate(source)})
    save_file(tensors, path / SINGLE_FILE, metadata={"format": "pt"})
    return path


@torch.no_grad()
def init_random_weights(model: HybridLM, seed: int) -> HybridLM:
    """Random weights with Mamba-2's SSM initialization, generated on the model's device.

    Matrices ~ N(0, 1/fan_in) (unit-scale activations after every projection; the embedding
    N(0, 1/hidden), so a tied head gives unit-scale logits too; a MoE router's correction bias,
    one value per expert, N(0, 1/num_experts)), other biases 0, norms 1, D 1, conv as PyTorch's
    Conv1d default U(+-1/sqrt(d_conv)). A = -U(1, 16) and dt = softplus(dt_bias) log-uniform in
    [1e-3, 1e-1], as mamba_ssm initializes them: the per-token decay exp(dt * A) spans 0.2 .. 0.999,
    so some heads remember ~1000 tokens.
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
        else:  # a matrix: (out, in) for Linear, (vocab, hidden) for the embedding, (experts, out, in)
            std = 1.0 / math.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32) * std)
    for module in model.modules():  # a zero-centred norm (Qwen3-Next) stores w - 1: weight 1 is 0 there
        if getattr(module, "zero_centred", False):
            module.weight.zero_()
    return model


def from_preset(name: str, backend: str = "torch", seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> HybridLM:
    """A preset's shapes (`model.families.PRESETS`) with `init_random_weights(seed)`."""
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return init_random_weights(_empty_model(PRESETS[name], backend, dtype, device), seed)
