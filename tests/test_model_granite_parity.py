"""GraniteMoeHybrid: fp32 logits match transformers' `GraniteMoeHybridForCausalLM` to 1e-4 max abs.

The checkpoints are written by transformers itself (`save_pretrained`; one case sharded) from
small random configs covering dense and MoE, RoPE and NoPE, tied and untied embeddings, biases
and a time-step limit, with non-trivial muP multipliers; every parameter is re-drawn at random
(transformers initializes norms, D and dt_bias to constants, which would hide a swapped or
ignored one). One MoE case duplicates a router row in every layer, so two experts' router
logits tie exactly: the same experts must be chosen as in transformers.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM  # noqa: E402

from model import HybridConfig, SequenceChunk, load_pretrained  # noqa: E402
from model.families import config_from_hf, config_to_hf
from model_helpers import one_thread, perturb_parameters  # noqa: F401,E402  (one_thread: autouse)

HF_PARITY_ATOL = 1e-4  # fp32 logits, max abs
SEQ_LEN = 70  # > 4 of the 16-token scan chunks, not a multiple of 16

BASE = dict(vocab_size=96, hidden_size=64, shared_intermediate_size=48, intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=4, mamba_d_state=16, mamba_d_conv=4,
            mamba_expand=2, mamba_chunk_size=16, embedding_multiplier=3.0, residual_multiplier=0.5,
            attention_multiplier=0.2, logits_scaling=2.5)
CASES = {
    "moe-rope-untied": dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                            num_experts_per_tok=2, position_embedding_type="rope", tie_word_embeddings=False),
    "moe-nope-tied-sharded": dict(num_hidden_layers=4, layer_types=["attention", "mamba", "mamba", "attention"],
                                  num_local_experts=5, num_experts_per_tok=3, position_embedding_type="nope",
                                  mamba_n_groups=2, tie_word_embeddings=True),
    "dense-rope-tied-biases": dict(num_hidden_layers=3, layer_types=["mamba", "mamba", "attention"],
                                   num_local_experts=0, position_embedding_type="rope", tie_word_embeddings=True,
                                   attention_bias=True, mamba_proj_bias=True, mamba_conv_bias=False,
                                   time_step_limit=(0.01, 0.08), rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 500.0}),
    "dense-nope-untied": dict(num_hidden_layers=3, layer_types=["attention", "mamba", "mamba"], num_local_experts=0,
                              position_embedding_type=None, mamba_n_groups=2, tie_word_embeddings=False),
    "moe-router-ties": dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                            num_experts_per_tok=2, position_embedding_type="nope", tie_word_embeddings=False),
}
SHARDED = {"moe-nope-tied-sharded"}
TIED_ROUTER_ROWS = (0, 2)  # in "moe-router-ties", router row 2 is a copy of row 0 in every layer




def _hf_checkpoint(tmp_path_factory, case: str):
    cfg = GraniteMoeHybridConfig(**BASE, **CASES[case])
    torch.manual_seed(0)
    hf = GraniteMoeHybridForCausalLM(cfg).eval()
    perturb_parameters(hf, seed=1)
    if case == "moe-router-ties":
        with torch.no_grad():
            for layer in hf.model.layers:
                w = layer.block_sparse_moe.router.weight
                w[TIED_ROUTER_ROWS[1]] = w[TIED_ROUTER_ROWS[0]]
    hf.tie_weights()
    path = tmp_path_factory.mktemp(case)
    hf.save_pretrained(path, safe_serialization=True, **({"max_shard_size": "40KB"} if case in SHARDED else {}))
    return hf, path


@pytest.fixture(scope="module", params=sorted(CASES))
def hf_checkpoint(request, tmp_path_factory):
    return request.param, *_hf_checkpoint(tmp_path_factory, request.param)


def _ids(seed: int = 2) -> torch.Tensor:
    return torch.randint(0, BASE["vocab_size"], (SEQ_LEN,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp32_logits_match_transformers(hf_checkpoint, backend):
    case, hf, path = hf_checkpoint
    if case in SHARDED:
        assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 1
    ids = _ids()
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    model = load_pretrained(path, backend=backend, dtype=torch.float32)
    assert model.config.model_type == "granitemoehybrid"
    got = model.logits(ids)
    assert got.shape == expected.shape == (SEQ_LEN, BASE["vocab_size"])
    err = (got - expected).abs().max().item()
    assert err <= HF_PARITY_ATOL, f"{case}/{backend}: max abs logit diff {err:.3g} > {HF_PARITY_ATOL}"
    assert expected.abs().max() > 0.1  # the comparison is not between two near-zero outputs
    if CASES[case]["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    else:
        assert not torch.equal(model.lm_head.weight, model.embed_tokens.weight)


def test_chunked_forward_batch_matches_transformers(hf_checkpoint):
    """The engine's path (paged KV, state pools, a capture) on each case, against transformers."""
    case, hf, path = hf_checkpoint
    ids = _ids(3)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    model = load_pretrained(path)
    cache = model.allocate_cache(8, 16, 2)
    got = [model.forward_batch([SequenceChunk(ids[a:b], a, [4, 1, 7, 2, 0], 1, capture_offsets=caps,
                                              all_logits=True)], cache).logits[0]
           for a, b, caps in ((0, 29, (11,)), (29, 30, ()), (30, SEQ_LEN, (16, 17)))]
    err = (torch.cat(got) - expected).abs().max().item()
    assert err <= HF_PARITY_ATOL, f"{case}: max abs logit diff {err:.3g}"


def test_router_ties_choose_the_experts_transformers_chooses(tmp_path_factory):
    """Experts 0 and 2 get bit-equal router logits for every token; where the tie straddles the
    top-k cut only one of them is chosen, and a different choice than transformers' would move
    the logits far beyond the tolerance (their expert weights differ)."""
    hf, path = _hf_checkpoint(tmp_path_factory, "moe-router-ties")
    model = load_pretrained(path)
    seen = []
    hooks = [layer.feed_forward.block_sparse_moe.router.register_forward_hook(
        lambda mod, inp, out: seen.append((F.linear(inp[0], mod.weight).float(), out[1])))
        for layer in model.layers]
    ids = _ids(4)
    got = model.logits(ids)
    for h in hooks:
        h.remove()
    a, b = TIED_ROUTER_ROWS
    straddling = 0
    for logits, index in seen:
        assert torch.equal(logits[:, a], logits[:, b])
        straddling += int(((index == a).any(-1) ^ (index == b).any(-1)).sum())
    assert straddling >= 10, straddling
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    err = (got - expected).abs().max().item()
    assert err <= HF_PARITY_ATOL, err
    moe = model.layers[0].feed_forward.block_sparse_moe.experts
    assert not torch.equal(moe.gate_up_proj[a], moe.gate_up_proj[b])


# ---- config errors name the field ----------------------------------------------------------------

def _hf_dict(case="moe-rope-untied", **overrides) -> dict:
    d = GraniteMoeHybridConfig(**BASE, **CASES[case]).to_dict()
    d.update(overrides)
    return json.loads(json.dumps(d, default=str))


def test_config_reads_every_math_field():
    cfg = config_from_hf(_hf_dict())
    assert cfg.model_type == "granitemoehybrid" and cfg.layer_types == ("mamba", "attention", "mamba")
    assert (cfg.intermediate_size, cfg.moe.intermediate_size, cfg.moe.num_experts, cfg.moe.top_k) == (48, 32, 4, 2)
    assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.attention_scale, cfg.logits_scaling) == \
        (3.0, 0.5, 0.2, 2.5)
    assert cfg.position_embedding == "rope" and cfg.rotary_dim == cfg.head_dim == 16
    assert (cfg.mamba_n_heads, cfg.mamba_d_head, cfg.mamba_d_state, cfg.rms_norm_eps) == (4, 32, 16, 1e-6)
    dense = config_from_hf(_hf_dict("dense-nope-untied"))
    assert dense.moe is None and dense.position_embedding == "none"
    # a published-style file: legacy layer names, "nope", top-level rope_theta, inert muP init fields
    legacy = _hf_dict(layer_types=["mamba", "attention", "mamba"], position_embedding_type="nope", rope_theta=1e4,
                      init_method="mup", normalization_function="rmsnorm")
    del legacy["rope_parameters"]
    assert config_from_hf(legacy).position_embedding == "none"
    assert config_from_hf(_hf_dict(head_dim=8, position_embedding_type="nope")).head_dim == 8
    # transformers' attribute name for the same list
    renamed = _hf_dict(layers_block_type=["attention", "mamba", "attention"])
    del renamed["layer_types"]
    assert config_from_hf(renamed).attn_layer_indices == (0, 2)


def test_presets_round_trip_through_transformers():
    from model import PRESETS

    for name, cfg in PRESETS.items():
        if cfg.model_type == "granitemoehybrid":
            hf_cfg = GraniteMoeHybridConfig(**config_to_hf(cfg))
            assert config_from_hf(json.loads(hf_cfg.to_json_string())) == cfg, name


@pytest.mark.parametrize("field, overrides", [
    ("layer_types", dict(layer_types=["mamba", "sliding_attention", "mamba"])),
    ("layer_types", dict(layer_types=["mamba", "attention"])),
    ("layers_block_type", dict(layers_block_type=["mamba", "mamba", "mamba"])),
    ("hidden_act", dict(hidden_act="gelu")),
    ("rope_scaling", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    ("rope_parameters.rope_type", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0})),
    ("rope_parameters.partial_rotary_factor", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                    "partial_rotary_factor": 0.5})),
    ("position_embedding_type", dict(position_embedding_type="alibi")),
    ("normalization_function", dict(normalization_function="layernorm")),
    ("quantization_config", dict(quantization_config={"quant_method": "fp8"})),
    ("num_shared_experts", dict(num_shared_experts=2)),
    ("num_experts_per_tok", dict(num_experts_per_tok=5)),
    ("num_local_experts", dict(num_local_experts=-1)),
    ("mamba_d_head", dict(mamba_d_head=24)),
    ("mamba_expand", dict(mamba_expand=1.5)),
    ("time_step_limit", dict(time_step_limit=[0.1, 0.01])),
])
def test_unsupported_config_fails_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=f"^{field.replace('.', '[.]')}:"):
        config_from_hf(_hf_dict(**overrides))


# ---- load errors: before any weight is used ------------------------------------------------------

@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    return _hf_checkpoint(tmp_path_factory, "moe-rope-untied")[1]


def _edited_copy(src, dst, edit_tensors=None, edit_config=None):
    cfg = json.loads((src / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_checkpoint_loads_unedited(moe_checkpoint, tmp_path):
    load_pretrained(_edited_copy(moe_checkpoint, tmp_path))


@pytest.mark.parametrize("name", ["model.layers.0.block_sparse_moe.input_linear.weight",
                                  "model.layers.1.block_sparse_moe.router.layer.weight",
                                  "model.layers.2.shared_mlp.output_linear.weight", "model.norm.weight"])
def test_missing_tensor_is_named(moe_checkpoint, tmp_path, name):
    with pytest.raises(ValueError, match=f"^{name}: missing tensor"):
        load_pretrained(_edited_copy(moe_checkpoint, tmp_path, lambda t: t.pop(name)))


def test_misshaped_expert_tensor_is_named(moe_checkpoint, tmp_path):
    name = "model.layers.2.block_sparse_moe.output_linear.weight"

    def edit(t):
        t[name] = t[name][:, :, :-1].clone()
    with pytest.raises(ValueError, match=f"^{name}: checkpoint shape"):
        load_pretrained(_edited_copy(moe_checkpoint, tmp_path, edit))


def test_conv_width_the_kernels_do_not_take_fails_at_load(moe_checkpoint, tmp_path):
    def edit_config(cfg):
        cfg["mamba_d_conv"] = 3

    def edit_tensors(t):
        for k in [k for k in t if k.endswith("conv1d.weight")]:
            t[k] = t[k][..., 1:].clone()
    path = _edited_copy(moe_checkpoint, tmp_path, edit_tensors, edit_config)
    load_pretrained(path, backend="torch")  # the torch reference takes any width
    with pytest.raises(ValueError, match="^mamba_d_conv:"):
        load_pretrained(path, backend="triton")
