"""Loading transformers' own Bamba checkpoints: fp32 logits match `BambaForCausalLM` to 1e-4 max abs.

The checkpoints are written by transformers itself (`save_pretrained`, safetensors, one case
sharded) from tiny random configs whose every parameter is re-drawn at random: transformers
initializes norms, D and dt_bias to ones and biases to zeros, which would hide a swapped or
ignored parameter. On a CPU transformers' Bamba runs its pure-PyTorch path (no mamba_ssm /
causal_conv1d kernels), which the first test checks.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import BambaConfig, BambaForCausalLM  # noqa: E402

from model import HybridConfig, load_pretrained  # noqa: E402
from model.families import config_from_hf, config_to_hf
from model_helpers import one_thread, perturb_parameters  # noqa: F401  (one_thread: autouse)

HF_PARITY_ATOL = 1e-4  # fp32 logits, max abs (issue #5)
SEQ_LEN = 70  # > 4 of HF's 16-token scan chunks, not a multiple of 16

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
            mamba_n_heads=4, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16)
CASES = {
    "untied-g1-single": dict(num_hidden_layers=3, attn_layer_indices=[1], mamba_n_groups=1,
                             tie_word_embeddings=False),
    "tied-g2-sharded": dict(num_hidden_layers=4, attn_layer_indices=[2], mamba_n_groups=2, tie_word_embeddings=True),
    "biases-dtlimit-2attn": dict(num_hidden_layers=4, attn_layer_indices=[0, 3], mamba_n_groups=2,
                                 tie_word_embeddings=False, attention_bias=True, mlp_bias=True, mamba_proj_bias=True,
                                 mamba_conv_bias=False, time_step_limit=(0.01, 0.08)),
}
SHARDED = {"tied-g2-sharded"}





def _hf_checkpoint(tmp_path_factory, case: str):
    cfg = BambaConfig(**BASE, **CASES[case])
    torch.manual_seed(0)
    hf = BambaForCausalLM(cfg).eval()
    perturb_parameters(hf, seed=1)
    hf.tie_weights()
    path = tmp_path_factory.mktemp(case)
    if case in SHARDED:
        hf.save_pretrained(path, safe_serialization=True, max_shard_size="40KB")
    else:
        hf.save_pretrained(path, safe_serialization=True)
    return hf, path


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_checkpoint(request, tmp_path_factory):
    return request.param, *_hf_checkpoint(tmp_path_factory, request.param)


def test_hf_bamba_runs_its_pure_torch_path():
    from transformers.utils.import_utils import is_causal_conv1d_available, is_mamba_2_ssm_available

    assert not is_mamba_2_ssm_available() and not is_causal_conv1d_available(), (
        "mamba_ssm / causal_conv1d are installed: HF's Bamba would not be the pure-PyTorch reference here")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp32_logits_match_transformers(hf_checkpoint, backend):
    case, hf, path = hf_checkpoint
    if case in SHARDED:
        assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 1
    ids = torch.randint(0, BASE["vocab_size"], (SEQ_LEN,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    model = load_pretrained(path, backend=backend, dtype=torch.float32)
    got = model.logits(ids)
    assert got.shape == expected.shape == (SEQ_LEN, BASE["vocab_size"])
    err = (got - expected).abs().max().item()
    assert err <= HF_PARITY_ATOL, f"{case}/{backend}: max abs logit diff {err:.3g} > {HF_PARITY_ATOL}"
    assert expected.abs().max() > 0.1  # the comparison is not between two near-zero outputs
    if CASES[case]["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    else:
        assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)


# ---- config errors name the field ----------------------------------------------------------------

def _hf_dict(**overrides) -> dict:
    d = BambaConfig(**BASE, **CASES["untied-g1-single"]).to_dict()
    d.update(overrides)
    return json.loads(json.dumps(d, default=str))


def test_config_from_transformers_dict_reads_every_math_field():
    cfg = config_from_hf(_hf_dict())
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.attn_layer_indices) == (64, 3, (1,))
    assert (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state, cfg.mamba_n_groups) == (4, 32, 16, 1)
    assert cfg.head_dim == 16 and cfg.rotary_dim == 8 and cfg.rope_theta == 10000.0
    assert cfg.time_step_limit == (0.0, math.inf)
    assert cfg.layer_types == ("mamba", "attention", "mamba")
    # a transformers-v4-style file: top-level rope_theta, bare Infinity, attn_rotary_emb
    v4 = _hf_dict(rope_theta=500.0, attn_rotary_emb=8, time_step_limit=[0.0, float("inf")])
    del v4["rope_parameters"]
    cfg4 = config_from_hf(v4)
    assert cfg4.rope_theta == 500.0 and cfg4.partial_rotary_factor == 0.5


def test_config_round_trips_through_transformers():
    from model import PRESETS

    for name, cfg in PRESETS.items():
        if cfg.model_type != "bamba":
            continue  # the other families' presets: in their own parity tests
        hf_cfg = BambaConfig(**config_to_hf(cfg))
        assert config_from_hf(json.loads(hf_cfg.to_json_string())) == cfg, name
    assert config_from_hf(json.loads(BambaConfig().to_json_string())) == HybridConfig()


# ibm-fms/Bamba-9B's config.json (transformers 4.47 era): no rope fields, conversion leftovers.
BAMBA_9B_CONFIG_JSON = """{
  "architectures": ["BambaForCausalLM"], "attention_dropout": 0.0, "attn_layer_indices": [9, 18, 27],
  "attn_rotary_emb": 64, "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "mamba_chunk_size": 256,
  "mamba_conv_bias": true, "mamba_d_conv": 4, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_dt_rank": 256,
  "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 128, "mamba_proj_bias": false, "model_type": "bamba",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_logits_to_keep": 1,
  "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false, "transformers_version": "4.47.0.dev0",
  "use_cache": true, "use_mamba_kernels": true, "vocab_size": 128256
}"""


def test_bamba_9b_config_file_gives_the_preset():
    from model import PRESETS

    assert config_from_hf(json.loads(BAMBA_9B_CONFIG_JSON)) == PRESETS["bamba-9b"]


@pytest.mark.parametrize("field, overrides", [
    ("model_type", dict(model_type="mamba2")),
    ("hidden_act", dict(hidden_act="gelu")),
    ("rope_scaling", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    ("rope_parameters.rope_type", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})),
    ("quantization_config", dict(quantization_config={"quant_method": "fp8"})),
    ("num_experts", dict(num_experts=4)),
    ("mamba_d_head", dict(mamba_d_head=24)),
    ("mamba_n_groups", dict(mamba_n_groups=3)),
    ("attn_rotary_emb", dict(attn_rotary_emb=16)),
    ("partial_rotary_factor", dict(partial_rotary_factor=1.0)),
    ("attn_layer_indices", dict(attn_layer_indices=[5])),
    ("time_step_limit", dict(time_step_limit=[0.1, 0.01])),
])
def test_unsupported_config_fails_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=f"^{field.replace('.', '[.]')}:"):
        config_from_hf(_hf_dict(**overrides))


# ---- tensor errors name the tensor ---------------------------------------------------------------

@pytest.fixture(scope="module")
def single_file_checkpoint(tmp_path_factory):
    return _hf_checkpoint(tmp_path_factory, "untied-g1-single")[1]


def _edited_copy(src, dst, edit):
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_checkpoint_loads_unedited(single_file_checkpoint, tmp_path):
    load_pretrained(_edited_copy(single_file_checkpoint, tmp_path, lambda t: None))


def test_missing_tensor_is_named(single_file_checkpoint, tmp_path):
    name = "model.layers.0.mamba.dt_bias"
    path = _edited_copy(single_file_checkpoint, tmp_path, lambda t: t.pop(name))
    with pytest.raises(ValueError, match=f"^{name}: missing tensor"):
        load_pretrained(path)


def test_misshaped_tensor_is_named(single_file_checkpoint, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"

    def edit(t):
        t[name] = t[name][:-1].clone()
    with pytest.raises(ValueError, match=f"^{name}: checkpoint shape"):
        load_pretrained(_edited_copy(single_file_checkpoint, tmp_path, edit))


def test_unexpected_tensor_is_named(single_file_checkpoint, tmp_path):
    name = "model.layers.0.mamba.extra_scale"

    def edit(t):
        t[name] = torch.ones(3)
    with pytest.raises(ValueError, match=f"^{name}: unexpected tensor"):
        load_pretrained(_edited_copy(single_file_checkpoint, tmp_path, edit))


def test_unsupported_config_file_fails_before_reading_weights(single_file_checkpoint, tmp_path):
    path = _edited_copy(single_file_checkpoint, tmp_path, lambda t: None)
    cfg = json.loads((path / "config.json").read_text())
    cfg["hidden_act"] = "relu"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="^hidden_act:"):
        load_pretrained(path)
