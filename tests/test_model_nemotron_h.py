"""The NemotronH family (Nemotron-H, Nemotron 3 Nano): every layer kind (M, *, -, E), parity with
transformers' own `NemotronHForCausalLM`, the engine's paths, and the errors for what it refuses.

Parity checkpoints are written by transformers itself (`save_pretrained`) from small random
configs whose every parameter and the router's correction bias are re-drawn (transformers
initializes norms, D and dt_bias to ones, biases and the correction bias to zeros, which would
hide a swapped or ignored tensor). fp32 logits must match to 1e-4 max abs on the torch backend
and on the Triton kernels under the interpreter. One checkpoint ties router scores on purpose
(duplicated router rows and correction biases): the same experts must win the ties.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from model import PRESETS, HybridConfig, HybridLM, SequenceChunk, from_preset, load_pretrained, save_pretrained
from model.engine import Engine
from model.families import config_from_hf, config_to_hf
from model.families.nemotron_h_moe import SigmoidGroupedTopKRouter
from model.linear import native_half_matmuls
from model.norms import RMSNorm
from model_helpers import max_abs, one_thread, perturb_parameters, tokens  # noqa: F401  (one_thread: autouse)

transformers = pytest.importorskip("transformers")
from transformers import NemotronHConfig, NemotronHForCausalLM  # noqa: E402

LOGIT_ATOL = 1e-4  # fp32 logits, max abs
STATE_ATOL = 1e-5  # fp32 SSM/conv states, max abs
SEQ_LEN = 70  # > 4 of the 16-token scan chunks, not a multiple of 16
VOCAB = 96

BASE = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            intermediate_size=80, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, conv_kernel=4, chunk_size=16,
            moe_intermediate_size=32, moe_shared_expert_intermediate_size=48)
CASES = {
    # every kind; 8 experts in 4 groups, the 2 best groups, 3 experts per token, normalized x 2.5; dt
    # clamped below at 0.05 (without the clamp the logits move by 7e-3); MLP and shared-expert biases
    "moe-grouped": dict(hybrid_override_pattern="M*-EME*", n_groups=2, n_routed_experts=8, num_experts_per_tok=3,
                        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, time_step_min=0.05,
                        mlp_bias=True),
    # dense layers only, every bias on, one B/C group, sharded checkpoint
    "dense-biases-sharded": dict(hybrid_override_pattern="M-*M-", n_groups=1, mlp_bias=True, use_bias=True,
                                 mamba_proj_bias=True, use_conv_bias=False),
    # router ties: group 1 is a copy of group 0 and experts 2 and 3 share a row (see _tie_router_scores)
    "moe-ties": dict(hybrid_override_pattern="ME*E", n_groups=2, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                     topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0),
}
SHARDED = {"dense-biases-sharded"}
# router logits of order 1 (sigmoid not saturated); the selection bias moved off zero
PERTURB = dict(std_by_suffix={"gate.weight": 0.3}, buffer_std_by_suffix={"e_score_correction_bias": 0.1})




@torch.no_grad()
def _tie_router_scores(model: torch.nn.Module) -> None:
    """Exact ties for every token: group 1's router rows and biases copy group 0's (a tie between the
    groups), and expert 2's row copies expert 3's (a tie inside each group)."""
    for name, module in model.named_modules():
        if name.endswith("mixer.gate"):
            module.weight[2] = module.weight[3]
            module.e_score_correction_bias[2] = module.e_score_correction_bias[3]
            module.weight[4:] = module.weight[:4]
            module.e_score_correction_bias[4:] = module.e_score_correction_bias[:4]


def _hf_checkpoint(tmp_path_factory, case: str):
    torch.manual_seed(0)
    hf = NemotronHForCausalLM(NemotronHConfig(**BASE, **CASES[case])).eval()
    perturb_parameters(hf, seed=1, **PERTURB)
    if case == "moe-ties":
        _tie_router_scores(hf)
    path = tmp_path_factory.mktemp(case)
    hf.save_pretrained(path, **({"max_shard_size": "40KB"} if case in SHARDED else {}))
    return hf, path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> (transformers model, checkpoint folder), each written once per module."""
    made = {}

    def get(case):
        if case not in made:
            made[case] = _hf_checkpoint(tmp_path_factory, case)
        return made[case]
    return get


@pytest.fixture(params=sorted(CASES))
def hf_checkpoint(request, checkpoints):
    return request.param, *checkpoints(request.param)


def _ids(n: int = SEQ_LEN, seed: int = 2) -> torch.Tensor:
    return tokens(n, seed, VOCAB)


# ---- parity with transformers -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fp32_logits_match_transformers(hf_checkpoint, backend):
    case, hf, path = hf_checkpoint
    if case in SHARDED:
        assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 1
    ids = _ids()
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    model = load_pretrained(path, backend=backend, dtype=torch.float32)
    assert model.config.layer_types == tuple({"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[ch]
                                             for ch in CASES[case]["hybrid_override_pattern"])
    got = model.logits(ids)
    assert got.shape == expected.shape == (SEQ_LEN, VOCAB)
    err = max_abs(got, expected)
    assert err <= LOGIT_ATOL, f"{case}/{backend}: max abs logit diff {err:.3g} > {LOGIT_ATOL}"
    assert expected.abs().max() > 0.1  # the comparison is not between two near-zero outputs


def _moe_inputs(model: HybridLM, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """The normed hidden states every MoE layer's router sees on a plain forward."""
    seen, hooks = {}, []
    for i, layer in enumerate(model.layers):
        if model.config.layer_types[i] == "moe":
            hooks.append(layer.feed_forward.gate.register_forward_hook(
                lambda mod, args, out, i=i: seen.__setitem__(i, args[0].clone())))
    model.logits(ids)
    for h in hooks:
        h.remove()
    return seen


def test_tied_router_scores_really_tie_and_pick_what_transformers_picks(checkpoints):
    """The tie checkpoint ties every token's groups and experts 2/3 exactly; picking another expert
    than transformers would move the logits far beyond the tolerance (the tied experts differ: a
    reversed tie-break moved them by 2.7)."""
    hf, path = checkpoints("moe-ties")
    model = load_pretrained(path)
    for i, x in _moe_inputs(model, _ids()).items():
        gate = model.layers[i].feed_forward.gate
        scores = torch.sigmoid(torch.nn.functional.linear(x, gate.weight)) + gate.e_score_correction_bias
        assert torch.equal(scores[:, 4:], scores[:, :4]) and torch.equal(scores[:, 2], scores[:, 3])
        theirs = hf.model.layers[i].mixer.gate
        w, e = gate(x)
        _, w_hf, e_hf = theirs(x)
        assert torch.equal(e, e_hf) and torch.equal(w, w_hf)
        experts = model.layers[i].feed_forward.experts
        assert not torch.equal(experts.up_proj[0], experts.up_proj[4])


@pytest.mark.parametrize("n_group, topk_group, norm", [(1, 1, True), (4, 2, True), (8, 3, False), (2, 1, False)])
def test_router_matches_transformers_bit_for_bit_with_ties(n_group, topk_group, norm):
    """Same inputs -> the same expert ids and weights, exactly, through saturated sigmoids (many
    scores of exactly 1.0), duplicated rows and equal correction biases."""
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter

    cfg = NemotronHConfig(hidden_size=32, n_routed_experts=16, num_experts_per_tok=4, n_group=n_group,
                          topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=2.5)
    theirs = NemotronHTopkRouter(cfg)
    g = torch.Generator().manual_seed(n_group)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(16, 32, generator=g))
        theirs.weight[9] = theirs.weight[1]
        theirs.weight[5] = theirs.weight[4]
        theirs.e_score_correction_bias.copy_(torch.randint(0, 3, (16,), generator=g).float() * 0.25)
    ours = SigmoidGroupedTopKRouter(32, config_from_hf(
        {**json.loads(cfg.to_json_string()), "layers_block_type": ["moe"]}).moe)
    ours.load_state_dict({"weight": theirs.weight, "e_score_correction_bias": theirs.e_score_correction_bias})
    x = torch.randn(300, 32, generator=g) * torch.tensor([0.1, 1.0, 30.0]).repeat_interleave(100)[:, None]
    w, e = ours(x)
    _, w_hf, e_hf = theirs(x)
    assert torch.equal(e, e_hf) and torch.equal(w, w_hf)
    assert (torch.sigmoid(x @ theirs.weight.T) == 1.0).sum(-1).max() > 4  # saturated: ties across rows too


def test_moe_block_matches_transformers_bit_for_bit_in_bf16():
    """bf16 experts and shared expert, fp32 router: the same dtype casts and the same per-token sum
    as transformers' NemotronHMoE (with its default grouped_mm experts) give identical bits."""
    cfg = NemotronHConfig(vocab_size=64, hidden_size=64, hybrid_override_pattern="E", n_routed_experts=8,
                          num_experts_per_tok=3, n_group=4, topk_group=2, moe_intermediate_size=32,
                          moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5, mlp_bias=True)
    torch.manual_seed(0)
    hf = NemotronHForCausalLM(cfg).eval()
    assert hf.config._experts_implementation == "grouped_mm"
    theirs = hf.model.layers[0].mixer
    perturb_parameters(theirs, seed=4, **PERTURB)
    theirs.to(torch.bfloat16).gate.float()
    ours = HybridLM(config_from_hf(json.loads(cfg.to_json_string()))).layers[0].feed_forward
    ours.load_state_dict(theirs.state_dict())
    ours.to(torch.bfloat16).gate.float()
    x = torch.randn(200, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        expected = theirs(x[None])[0]
    with native_half_matmuls():  # transformers' bf16 products: the same kernel on both sides
        got = ours(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    # Our CPU default computes each bf16 product in fp32 and rounds once (model/linear.py): the
    # same values up to summation order, so within a few bf16 ulps (2^-8 relative each).
    fast = ours(x)
    assert torch.allclose(fast.float(), expected.float(), rtol=2 ** -6, atol=2 ** -6 * expected.float().abs().max())


def test_rms_norm_multiplies_the_weight_in_fp32_like_transformers():
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHRMSNorm

    theirs = NemotronHRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        theirs.weight.copy_(1 + torch.randn(64, generator=torch.Generator().manual_seed(6)))
    x = torch.randn(100, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    ours = {flag: RMSNorm(64, 1e-5, weight_in_fp32=flag) for flag in (True, False)}
    for norm in (theirs, *ours.values()):
        norm.load_state_dict(theirs.state_dict())
        norm.to(torch.bfloat16)
    with torch.no_grad():
        expected = theirs(x)
        assert torch.equal(ours[True](x), expected)
        assert not torch.equal(ours[False](x), expected)  # Bamba's rounding: the flag matters in bf16


def test_save_pretrained_round_trips_and_transformers_reads_it(tmp_path):
    model = from_preset("nemotron-h-tiny", seed=3)
    save_pretrained(model, tmp_path)
    ids = tokens(30, 1)
    assert torch.equal(load_pretrained(tmp_path).logits(ids), model.logits(ids))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert isinstance(theirs, NemotronHForCausalLM)
    with torch.no_grad():
        err = max_abs(model.logits(ids), theirs(ids[None]).logits[0])
    assert err <= LOGIT_ATOL, err


def test_bf16_load_keeps_the_router_in_fp32_and_tracks_fp32(checkpoints):
    """Router weights and correction bias stay fp32 in a bf16 model (transformers keeps them so).
    Against fp32 only a sanity bound per token, on the median token: bf16 rounding flips the routing
    of a few tokens (transformers' own bf16 run moves some logits by 2 on this checkpoint)."""
    path = checkpoints("moe-grouped")[1]
    fp32 = load_pretrained(path).logits(_ids())
    model = load_pretrained(path, dtype=torch.bfloat16)
    gate = model.layers[3].feed_forward.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert model.layers[3].feed_forward.experts.up_proj.dtype == torch.bfloat16
    got = model.logits(_ids())
    assert got.dtype == torch.bfloat16
    per_token = (got.float() - fp32).abs().amax(dim=-1)
    assert per_token.median() <= 0.05 * fp32.abs().max(), per_token


# ---- the engine's paths on the tiny preset ------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return {backend: from_preset("nemotron-h-tiny", backend=backend, seed=0) for backend in ("torch", "triton")}


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_chunked_equals_whole_with_captures(tiny, backend):
    model = tiny[backend]
    assert set(model.config.layer_types) == {"mamba", "attention", "mlp", "moe"}
    cache = model.allocate_cache(4, 16, 2)
    assert sorted(cache.ssm_pool) == [0, 3] and sorted(cache.key_cache) == [2]
    seq = tokens(40, 0)
    out = [model.forward_batch([SequenceChunk(seq[a:b], a, [0, 1, 2], 1, capture_offsets=caps, all_logits=True)],
                               cache) for a, b, caps in ((0, 17, (5, 16)), (17, 40, ()))]
    assert len(out[0].captured[0]) == 2 and len(out[0].captured[0][0].ssm) == 2
    err = max_abs(torch.cat([o.logits[0] for o in out]), model.logits(seq))
    assert err <= LOGIT_ATOL, err


def _engine(model, capture_mode="in_pass", **sched):
    return Engine.for_model(model, capture_mode=capture_mode, keep_prompt_logits=True, **sched)


def _prompt(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_warm_restore_equals_cold(tiny, backend):
    eng = _engine(tiny[backend], block_size=4, prefill_budget=32, max_batch_size=1, num_kv_blocks=40,
                  policy="aligned")
    p = _prompt(70, 0)
    cold = eng.add_request(p, 3, "cold")
    eng.run_until_done()
    warm = eng.add_request(p, 3, "warm")
    eng.run_until_done()
    assert 0 < warm.metrics.restore_at < len(p) and warm.metrics.replayed_tokens < len(p)
    assert max_abs(eng.prompt_logits["warm"], eng.prompt_logits["cold"]) <= LOGIT_ATOL
    assert max_abs(eng.prompt_logits["cold"], tiny[backend].logits(torch.tensor(p))[-1]) <= LOGIT_ATOL
    assert warm.output_token_ids == cold.output_token_ids


def test_in_pass_capture_equals_two_pass(tiny):
    p = _prompt(100, 1)  # one chunk (budget 256) spanning the split point 92
    saved, logits = {}, {}
    for mode in ("in_pass", "two_pass"):
        eng = _engine(tiny["torch"], mode, block_size=4, prefill_budget=256, num_kv_blocks=40)
        cold = eng.add_request(p, 1, "cold")
        eng.run_until_done()
        warm = eng.add_request(p, 1, "warm")
        eng.run_until_done()
        assert cold.metrics.prefill_passes == (2 if mode == "two_pass" else 1)
        snaps = list(eng.snapshots._lru.values())
        assert [s.position for s in snaps] == [92] and warm.metrics.replayed_tokens == 8
        saved[mode], logits[mode] = snaps[0].state, eng.prompt_logits["warm"]
        assert max_abs(eng.prompt_logits["warm"], eng.prompt_logits["cold"]) <= LOGIT_ATOL
    for a, b in zip(saved["in_pass"].conv + saved["in_pass"].ssm, saved["two_pass"].conv + saved["two_pass"].ssm):
        assert max_abs(a, b) <= STATE_ATOL
    assert max_abs(logits["in_pass"], logits["two_pass"]) <= LOGIT_ATOL


def test_greedy_decode_matches_the_plain_forward(tiny):
    """Decode rows (one token, the MoE routing a batch of mixed rows) against the plain forward."""
    model = tiny["torch"]
    eng = _engine(model, block_size=4, prefill_budget=32, max_batch_size=2, num_kv_blocks=64)
    reqs = [eng.add_request(_prompt(n, s), 6, f"r{s}") for s, n in ((2, 37), (3, 50))]
    eng.run_until_done()
    for req in reqs:
        ids = list(req.prompt_token_ids)
        for _ in range(6):
            ids.append(int(model.logits(torch.tensor(ids))[-1].argmax()))
        assert req.output_token_ids == ids[len(req.prompt_token_ids):]


# ---- presets -------------------------------------------------------------------------------------------

def _params(name: str) -> tuple[HybridLM, int]:
    with torch.device("meta"):
        model = HybridLM(PRESETS[name])
    return model, sum(p.numel() for p in model.parameters())


def test_published_shapes():
    model, total = _params("nemotron-h-8b")
    assert total == 8_100_852_736  # Nemotron-H-8B-Base-8K's tensors, summed
    kinds = PRESETS["nemotron-h-8b"].layer_types
    assert (kinds.count("mamba"), kinds.count("mlp"), kinds.count("attention")) == (24, 24, 4)
    assert model.layers[0].mamba.in_proj.weight.shape == (18560, 4096)
    model, total = _params("nemotron-3-nano")
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert 31.5e9 < total < 31.7e9 and 3.5e9 < total - experts * (1 - 6 / 128) < 3.7e9  # 31.6 B total, ~3.5 B active
    kinds = PRESETS["nemotron-3-nano"].layer_types
    assert (kinds.count("mamba"), kinds.count("moe"), kinds.count("attention")) == (23, 23, 6)
    assert model.layers[0].mamba.in_proj.weight.shape == (10304, 2688)
    assert not hasattr(model.layers[0], "pre_ff_layernorm") and not hasattr(model.layers[1], "input_layernorm")


def test_reduced_presets_hold_every_layer_kind():
    for name, lo, hi in (("nemotron-h-small-cpu", 10e6, 30e6), ("nemotron-h-tiny", 1e5, 1e6)):
        assert set(PRESETS[name].layer_types) == {"mamba", "attention", "mlp", "moe"}, name
        assert lo < _params(name)[1] < hi, name


# NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json as quoted in public code (auto_map shortened).
NANO_CONFIG_JSON = """{
  "architectures": ["NemotronHForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_nemotron_h.NemotronHConfig"}, "bos_token_id": 1, "chunk_size": 128,
  "conv_kernel": 4, "eos_token_id": 2, "expand": 2, "head_dim": 128, "hidden_dropout": 0.0, "hidden_size": 2688,
  "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", "initializer_range": 0.02,
  "intermediate_size": 1856, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64, "mamba_hidden_act": "silu",
  "mamba_num_heads": 64, "mamba_proj_bias": false, "mamba_ssm_cache_dtype": "float32",
  "max_position_embeddings": 262144, "mlp_bias": false, "mlp_hidden_act": "relu2", "model_type": "nemotron_h",
  "moe_intermediate_size": 1856,
  "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "n_groups": 8, "n_routed_experts": 128,
  "n_shared_experts": 1, "norm_eps": 1e-05, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts_per_tok": 6,
  "num_hidden_layers": 52, "num_key_value_heads": 2, "num_logits_to_keep": 1, "pad_token_id": 0,
  "partial_rotary_factor": 1.0, "rescale_prenorm_residual": true, "residual_in_fp32": false, "rope_theta": 10000,
  "routed_scaling_factor": 2.5, "sliding_window": null, "ssm_state_size": 128, "tie_word_embeddings": false,
  "time_step_floor": 0.0001, "time_step_max": 0.1, "time_step_min": 0.001, "topk_group": 1, "torch_dtype": "bfloat16",
  "transformers_version": "4.55.4", "use_bias": false, "use_cache": true, "use_conv_bias": true,
  "use_mamba_kernels": true, "vocab_size": 131072
}"""


def test_nano_config_file_gives_the_preset_and_transformers_agrees():
    hf = json.loads(NANO_CONFIG_JSON)
    assert config_from_hf(hf) == PRESETS["nemotron-3-nano"]
    # what transformers itself writes back for it (layers_block_type, time_step_limit, ...) too
    assert config_from_hf(json.loads(NemotronHConfig.from_dict(hf).to_json_string())) == \
        PRESETS["nemotron-3-nano"]


def test_presets_round_trip_through_transformers_config():
    for name, cfg in PRESETS.items():
        if cfg.model_type == "nemotron_h":
            written = json.loads(NemotronHConfig(**config_to_hf(cfg)).to_json_string())
            assert config_from_hf(written) == cfg, name
    defaults = config_from_hf({"model_type": "nemotron_h"})  # transformers' defaults for absent fields
    assert config_from_hf(json.loads(NemotronHConfig().to_json_string())) == defaults
    assert defaults.layer_types == ("mamba", "moe", "attention", "mlp") and defaults.time_step_limit[0] == 0.001


def test_legacy_field_names_and_layer_type_names_are_read():
    base = dict(model_type="nemotron_h", hybrid_override_pattern="M*-")
    cfg = config_from_hf({**base, "mamba_n_groups": 4, "mamba_d_conv": 3, "mamba_chunk_size": 64})
    assert (cfg.mamba_n_groups, cfg.mamba_d_conv, cfg.mamba_chunk_size) == (4, 3, 64)
    legacy = config_from_hf({"model_type": "nemotron_h", "layers_block_type": ["mamba", "attention", "mlp"]})
    assert legacy.layer_types == ("mamba", "attention", "mlp") == config_from_hf(base).layer_types


# ---- refusals name the field or tensor ----------------------------------------------------------------

def _hf_dict(**overrides) -> dict:
    d = json.loads(NemotronHConfig(**BASE, **CASES["moe-grouped"]).to_json_string())
    d.update(overrides)
    return d


@pytest.mark.parametrize("field, overrides", [
    ("hybrid_override_pattern", dict(layers_block_type=None, hybrid_override_pattern="M*X-")),
    ("hybrid_override_pattern", dict(hybrid_override_pattern="M*-E")),  # disagrees with layers_block_type
    ("layers_block_type", dict(layers_block_type=["mamba", "sliding_attention"])),
    ("num_hidden_layers", dict(num_hidden_layers=9)),
    ("mlp_hidden_act", dict(mlp_hidden_act="silu")),
    ("mamba_hidden_act", dict(mamba_hidden_act="gelu")),
    ("attention_bias", dict(attention_bias=True)),
    ("residual_in_fp32", dict(residual_in_fp32=True)),
    ("tie_word_embeddings", dict(tie_word_embeddings=True)),
    ("sliding_window", dict(sliding_window=128)),
    ("mamba_ssm_cache_dtype", dict(mamba_ssm_cache_dtype="bfloat16")),
    ("mamba_proj_bias", dict(mamba_proj_bias=True)),
    ("moe_latent_size", dict(moe_latent_size=16)),
    ("num_nextn_predict_layers", dict(num_nextn_predict_layers=1)),
    ("n_shared_experts", dict(n_shared_experts=2)),
    ("moe_shared_expert_intermediate_size", dict(moe_shared_expert_intermediate_size=0)),
    ("n_group", dict(n_group=3)),
    ("n_group", dict(n_group=8)),  # one expert per group: groups are scored by their two best
    ("topk_group", dict(topk_group=5)),
    ("num_experts_per_tok", dict(num_experts_per_tok=5)),  # more than the 2 best groups hold
    ("time_step_limit", dict(time_step_limit=[0.01, 0.1])),
    ("attention_head_dim", dict(attention_head_dim=16)),
    ("norm_eps", dict(norm_eps=1e-6)),
    ("n_groups", dict(n_groups=3)),
    ("num_key_value_heads", dict(num_key_value_heads=3)),
    ("mamba_n_groups", dict(mamba_n_groups=1)),  # a legacy name disagreeing with the current one
    ("quantization_config", dict(quantization_config={"quant_method": "fp8"})),
    ("moe_router_type", dict(moe_router_type="softmax")),  # a field nobody reads
])
def test_unsupported_config_fails_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=f"^{field}:"):
        config_from_hf(_hf_dict(**overrides))


@pytest.fixture
def moe_checkpoint(checkpoints):
    return checkpoints("moe-grouped")[1]


def _edited_copy(src, dst, edit_tensors=lambda t: None, edit_config=lambda c: None):
    cfg = json.loads((src / "config.json").read_text())
    edit_config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    edit_tensors(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_checkpoint_loads_unedited(moe_checkpoint, tmp_path):
    load_pretrained(_edited_copy(moe_checkpoint, tmp_path))


@pytest.mark.parametrize("name, edit, message", [
    ("backbone.layers.3.mixer.experts.5.up_proj.weight", lambda t, n: t.pop(n), "missing tensor"),
    ("backbone.layers.3.mixer.gate.e_score_correction_bias", lambda t, n: t.pop(n), "missing tensor"),
    ("backbone.layers.2.mixer.up_proj.weight", lambda t, n: t.__setitem__(n, t[n][:-1].clone()), "checkpoint shape"),
    ("backbone.layers.3.mixer.experts.0.down_proj.weight", lambda t, n: t.__setitem__(n, t[n][:, :-1].clone()),
     "checkpoint shape"),
    ("backbone.layers.2.mixer.experts.0.up_proj.weight", lambda t, n: t.__setitem__(n, torch.ones(3)),
     "unexpected tensor"),  # layer 2 is an MLP layer
])
def test_bad_tensors_are_named(moe_checkpoint, tmp_path, name, edit, message):
    path = _edited_copy(moe_checkpoint, tmp_path, lambda t: edit(t, name))
    with pytest.raises(ValueError, match=f"^{name.replace('.', '[.]')}: {message}"):
        load_pretrained(path)


def test_unsupported_config_fails_before_reading_weights(moe_checkpoint, tmp_path):
    path = _edited_copy(moe_checkpoint, tmp_path, edit_config=lambda c: c.update(hybrid_override_pattern="M*-EMX*",
                                                                                  layers_block_type=None))
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="^hybrid_override_pattern: .*'X'"):
        load_pretrained(path)


def test_triton_refuses_a_conv_width_its_kernels_do_not_take_at_load(moe_checkpoint, tmp_path):
    path = _edited_copy(moe_checkpoint, tmp_path, edit_config=lambda c: c.update(conv_kernel=3))
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="^mamba_d_conv:"):
        load_pretrained(path, backend="triton")


def test_moe_layer_without_moe_config_is_refused():
    cfg = dataclasses.replace(PRESETS["nemotron-h-tiny"], moe=None)
    with pytest.raises(ValueError, match="^moe:"):
        HybridLM(cfg)
