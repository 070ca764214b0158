"""The Qwen3-Next family (Gated DeltaNet + gated attention + MoE with a shared expert): config
mapping, parity with transformers' own `Qwen3NextForCausalLM`, the engine's paths, the refusals.

Parity checkpoints are written by transformers itself (`save_pretrained`) from small random
configs with every parameter re-drawn (`perturb_parameters`: transformers initializes the
zero-centred norms to 0 and the gated norm to 1, which would hide a dropped `1 +` or a swapped
norm), the conv weights at PyTorch's Conv1d scale (std 0.5; at 0.1 the keys leave the conv near
zero and their l2norm multiplies fp32 rounding 20x in one layer: transformers' own fp32 forward
then sits 1.3e-3 from its fp64 one).

Tolerance, one for every fp32 logit comparison here: 5e-4 max abs, on logits of max |6 .. 7.5| over
70 tokens. Measured on these checkpoints: ours vs transformers' fp64 forward 1.3e-4 (MoE) and
3.0e-4 (dense), transformers' own fp32 forward vs its fp64 one 1.9e-4 and 2.0e-4, transformers'
chunked vs recurrent fp32 delta rule 2.3e-4 and 0.8e-4: the model's fp32 conditioning, not ours.
Any slip in the math (a norm, a split, a gate) moves logits by > 1e-2.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from model import PRESETS, HybridConfig, HybridLM, SequenceChunk, from_preset, load_pretrained, save_pretrained
from model.engine import Engine
from model.families import config_from_hf, config_to_hf
from model_helpers import max_abs, one_thread, perturb_parameters, prefilled, tokens  # noqa: F401  (one_thread: autouse)

transformers = pytest.importorskip("transformers")
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM  # noqa: E402

LOGIT_ATOL = 5e-4  # fp32 logits, max abs (see the module docstring)
STATE_ATOL = 1e-5  # fp32 states, max abs
# The bucket step's pools: a 4-row batch (one pad) rounds its projections unlike the 3-row one, and two
# DeltaNet layers carry that into layer 2's conv inputs of |3|: measured 1.1e-5 (3.5e-6 relative).
BUCKET_STATE_ATOL = 5e-5
SEQ_LEN = 70  # > one 64-token delta-rule chunk, not a multiple of 16
VOCAB = 96

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts_per_tok=2)
CASES = {
    "moe": dict(num_experts=4),  # DDDA, 4 experts top 2 renormalized, shared expert 48
    # dense SwiGLU layers, attention first and last (ADDA), 4 value heads over 1 key head, rotary on half
    "dense": dict(num_experts=0, layer_types=["full_attention", "linear_attention", "linear_attention",
                                              "full_attention"], linear_num_key_heads=1,
                  rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": 0.5}),
}

PERTURB = dict(std_by_suffix={"conv1d.weight": 0.5})


def _hf_checkpoint(tmp_path_factory, case: str):
    torch.manual_seed(0)
    hf = Qwen3NextForCausalLM(Qwen3NextConfig(**{**BASE, **CASES[case]})).eval()
    perturb_parameters(hf, seed=1, **PERTURB)
    path = tmp_path_factory.mktemp(case)
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(case):
        if case not in made:
            made[case] = _hf_checkpoint(tmp_path_factory, case)
        return made[case]
    return get


def _ids(n: int = SEQ_LEN, seed: int = 2) -> torch.Tensor:
    return tokens(n, seed, VOCAB)


# ---- parity with transformers -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fp64_logits(checkpoints):
    """case -> transformers' own forward in fp64 (eager experts: grouped_mm has no fp64)."""
    made = {}

    def get(case):
        if case not in made:
            path = checkpoints(case)[1]
            hf64 = Qwen3NextForCausalLM.from_pretrained(path, dtype=torch.float64,
                                                        experts_implementation="eager").eval()
            with torch.no_grad():
                made[case] = hf64(_ids()[None]).logits[0]
        return made[case]
    return get


@pytest.mark.parametrize("case, backend", [("moe", "torch"), ("dense", "torch"), ("moe", "triton")])
def test_fp32_logits_match_transformers(checkpoints, fp64_logits, case, backend):
    hf, path = checkpoints(case)
    ids = _ids()
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    model = load_pretrained(path, backend=backend, dtype=torch.float32)
    assert model.config.layer_types == tuple("attention" if t == "full_attention" else t
                                             for t in hf.config.layer_types)
    got = model.logits(ids)
    assert got.shape == expected.shape == (SEQ_LEN, VOCAB)
    err, err64 = max_abs(got, expected), max_abs(got.double(), fp64_logits(case))
    assert err <= LOGIT_ATOL and err64 <= LOGIT_ATOL, f"{case}/{backend}: vs fp32 {err:.3g}, vs fp64 {err64:.3g}"
    assert expected.abs().max() > 0.1  # the comparison is not between two near-zero outputs


def test_bf16_tracks_fp32_as_closely_as_transformers_bf16(checkpoints):
    """bf16 rounding on these random weights moves logits far (transformers' own bf16 forward: median
    per-token max error 0.24 of logits up to 7.5; ours 0.26): ours may be at most 1.5x as far from
    the fp32 forward, on the median token."""
    hf, path = checkpoints("moe")
    ids = _ids()
    with torch.no_grad():
        fp32 = hf(ids[None]).logits[0]
        theirs = Qwen3NextForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()(ids[None]).logits[0]
    model = load_pretrained(path, dtype=torch.bfloat16)
    got = model.logits(ids)
    assert got.dtype == torch.bfloat16 and model.layers[0].linear_attn.in_proj_qkvz.weight.dtype == torch.bfloat16
    ours_err = (got.float() - fp32).abs().amax(dim=-1).median()
    theirs_err = (theirs.float() - fp32).abs().amax(dim=-1).median()
    assert ours_err <= 1.5 * theirs_err, (ours_err, theirs_err)


def test_checkpoint_names_cover_every_tensor_transformers_writes(checkpoints):
    from safetensors import safe_open

    from model.loading import checkpoint_names

    _, path = checkpoints("moe")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        written = set(f.keys())
    model = load_pretrained(path)
    ours = set()
    for source in checkpoint_names(model).values():
        ours.update([source] if isinstance(source, str) else source)
    assert ours == written


def test_save_pretrained_round_trips_and_transformers_reads_it(tmp_path):
    model = from_preset("qwen3-next-tiny", seed=3)
    perturb_parameters(model, seed=4, **PERTURB)  # norms off their init (the preset's zero-centred ones start at 0)
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3NextForCausalLM"]
    ids = tokens(30, 1)
    assert torch.equal(load_pretrained(tmp_path).logits(ids), model.logits(ids))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert isinstance(theirs, Qwen3NextForCausalLM)
    with torch.no_grad():
        err = max_abs(model.logits(ids), theirs(ids[None]).logits[0])
    assert err <= LOGIT_ATOL, err


def test_zero_centred_norm_and_norm_then_gate_follow_transformers():
    """One module each against transformers' own, weights off their init."""
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm, Qwen3NextRMSNormGated

    from model.gated_deltanet import NormThenGateRMSNorm
    from model.norms import RMSNorm

    g = torch.Generator().manual_seed(0)
    x, z, w = (torch.randn(5, 16, generator=g) for _ in range(3))
    ours, theirs = RMSNorm(16, 1e-6, zero_centred=True), Qwen3NextRMSNorm(16, eps=1e-6)
    gated, theirs_gated = NormThenGateRMSNorm(16, 1e-6), Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        for m in (ours, theirs, gated, theirs_gated):
            m.weight.copy_(w[0])
        assert torch.equal(ours(x), theirs(x))
        assert torch.equal(gated(x, z), theirs_gated(x, z))


# ---- config mapping ---------------------------------------------------------------------------------

def test_transformers_defaults_give_the_80b_preset():
    """transformers' Qwen3NextConfig() is Qwen3-Next-80B-A3B's shapes (its docstring's checkpoint)."""
    written = json.loads(Qwen3NextConfig().to_json_string())
    assert config_from_hf(written) == PRESETS["qwen3-next-80b-a3b"]
    assert config_from_hf({"model_type": "qwen3_next"}) == PRESETS["qwen3-next-80b-a3b"]


def test_presets_round_trip_through_transformers_config():
    for name, cfg in PRESETS.items():
        if cfg.model_type == "qwen3_next":
            written = json.loads(Qwen3NextConfig(**config_to_hf(cfg)).to_json_string())
            assert config_from_hf(written) == cfg, name


def test_published_80b_shapes():
    with torch.device("meta"):
        model = HybridLM(PRESETS["qwen3-next-80b-a3b"])
    total = sum(p.numel() for p in model.parameters())
    assert total == pytest.approx(79.67e9, rel=1e-4), total  # "80B" (79.67 B, vectors 0.0003% of it)
    assert model.config.layer_types.count("linear_attention") == 36


def test_cost_model_counts_the_80b_states_and_active_experts():
    """By hand from the published shapes: a DeltaNet layer's conv state (2 x 16 x 128 + 32 x 128 =
    8192 channels x 3 taps, bf16) and delta-rule state (32 x 128 x 128 fp32); 36 such layers a
    snapshot. Against Bamba-9B's Mamba layer: conv (8192 + 2 x 128) x 3 bf16 + 128 x 64 x 128 fp32."""
    from model.cost import ModelCost

    qwen, bamba = ModelCost(PRESETS["qwen3-next-80b-a3b"]), ModelCost(PRESETS["bamba-9b"])
    per_layer = 8192 * 3 * 2 + 32 * 128 * 128 * 4
    assert qwen.linear_attention_state_bytes_per_layer(2, ssm_dtype_bytes=4) == per_layer == 2_146_304
    assert qwen.snapshot_bytes(2, ssm_dtype_bytes=4) == 36 * per_layer
    assert qwen.state_bytes_per_layer(2, ssm_dtype_bytes=4) == per_layer  # vLLM's padded block reads this
    assert bamba.state_bytes_per_layer(2, ssm_dtype_bytes=4) == (8192 + 256) * 3 * 2 + 128 * 64 * 128 * 4
    # a token: 10 of 512 experts (3 x 2048 x 512 each) + the shared one and its gate + the router
    expert, layers = 3 * 2048 * 512, 48
    ff_active = layers * (10 * expert + expert + 2048 + 2048 * 512)
    deltanet = 36 * (2048 * (2 * 2048 + 2 * 4096 + 64) + 4096 * 2048 + 8192 * 4)  # projections + conv taps
    attention = 12 * (2048 * (2 * 4096 + 2 * 512) + 4096 * 2048)  # q_proj doubled by the output gate
    assert qwen.active_params == ff_active + deltanet + attention
    assert qwen.kv_bytes_per_token(2) == 12 * 2 * 2 * 256 * 2
    # the chunked delta rule a token, chunk 64, per value head: 6 K V + L (3 K + 2 V) + L^2 / 3
    assert qwen.scan_flops_per_token() == 36 * 32 * (6 * 128 * 128 + 64 * 640 + 64 * 64 // 3)


def test_legacy_interval_and_top_level_rope_fields_are_read():
    cfg = config_from_hf({"model_type": "qwen3_next", "num_hidden_layers": 6, "full_attention_interval": 3,
                                     "rope_theta": 1e7, "partial_rotary_factor": 0.5})
    assert cfg.layer_types == ("linear_attention", "linear_attention", "attention") * 2
    assert (cfg.rope_theta, cfg.partial_rotary_factor) == (1e7, 0.5)


def test_gated_attention_needs_both_its_gate_and_its_norms():
    import dataclasses

    with pytest.raises(ValueError, match="attention_output_gate"):
        dataclasses.replace(PRESETS["qwen3-next-tiny"], attention_qk_norm=False)


@pytest.mark.parametrize("field, overrides", [
    ("mlp_only_layers", {"mlp_only_layers": [1]}),
    ("decoder_sparse_step", {"decoder_sparse_step": 2}),
    ("hidden_act", {"hidden_act": "gelu"}),
    ("rope_parameters.rope_type", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}),
    ("layer_types", {"num_hidden_layers": 2, "layer_types": ["linear_attention", "mamba"]}),
    ("some_new_field", {"some_new_field": 1}),
    ("linear_num_value_heads", {"linear_num_key_heads": 3, "linear_num_value_heads": 4}),
])
def test_unsupported_config_fails_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        config_from_hf({"model_type": "qwen3_next", **overrides})


# ---- the engine's paths on the tiny preset ------------------------------------------------------------

@pytest.fixture(scope="module")
def tinies():
    """backend -> the tiny preset with the same weights: norms off 0, A_log and dt_bias spread."""
    made = {}
    for backend in ("torch", "triton"):
        model = from_preset("qwen3-next-tiny", backend=backend, seed=0)
        perturb_parameters(model, seed=5, **PERTURB)
        made[backend] = model
    return made


@pytest.fixture
def tiny(tinies):
    return tinies["torch"]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_chunked_equals_whole_with_captures(tinies, backend):
    """Prefill in two chunks (the second from the state the first left in the slot), capturing
    inside, on and right after the chunk boundary; then the captures must be the states a prefill
    that stops there leaves."""
    model = tinies[backend]
    cache = model.allocate_cache(8, 16, 3)
    assert sorted(cache.ssm_pool) == [0, 1, 2] and sorted(cache.key_cache) == [3]
    assert cache.ssm_pool[0].shape[1:] == (4, 16, 16) and cache.conv_pool[0].shape[1:] == (2 * 32 + 64, 3)
    seq = tokens(90, 0)
    caps = (1, 5, 16, 69)
    out = [model.forward_batch([SequenceChunk(seq[a:b], a, [0, 1, 2, 3, 4, 5], 1, capture_offsets=c, all_logits=True)],
                               cache) for a, b, c in ((0, 70, caps), (70, 90, ()))]
    err = max_abs(torch.cat([o.logits[0] for o in out]), model.logits(seq))
    assert err <= LOGIT_ATOL, err
    for o, snap in zip(caps, out[0].captured[0]):
        model.forward_batch([SequenceChunk(seq[:o], 0, [0, 1, 2, 3, 4, 5], 2)], cache)
        direct = cache.read_state(2)
        assert len(snap.ssm) == 3
        for a, b in zip(snap.conv + snap.ssm, direct.conv + direct.ssm):
            assert max_abs(a, b) <= STATE_ATOL, o


def test_decode_steps_match_the_plain_forward(tiny):
    """A prefill then one-token decode rows (two sequences in one batch) against the whole forward."""
    model = tiny
    cache = model.allocate_cache(16, 16, 2)
    seqs = [tokens(40, 1), tokens(27, 2)]
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7]]
    model.forward_batch([SequenceChunk(s[:-5], 0, blocks[r], r) for r, s in enumerate(seqs)], cache)
    for step in range(5):
        rows = [SequenceChunk(s[len(s) - 5 + step:len(s) - 4 + step], len(s) - 5 + step, blocks[r], r)
                for r, s in enumerate(seqs)]
        out = model.forward_batch(rows, cache)
        for r, s in enumerate(seqs):
            expected = model.logits(s[:len(s) - 4 + step])[-1]
            assert max_abs(out.logits[r], expected) <= LOGIT_ATOL, (step, r)


def _prompt(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_warm_restore_equals_cold(tinies, backend):
    tiny = tinies[backend]
    eng = Engine.for_model(tiny, capture_mode="in_pass", keep_prompt_logits=True, block_size=4, prefill_budget=32,
                           max_batch_size=1, num_kv_blocks=40, policy="aligned")
    p = _prompt(70, 0)
    cold = eng.add_request(p, 3, "cold")
    eng.run_until_done()
    warm = eng.add_request(p, 3, "warm")
    eng.run_until_done()
    assert 0 < warm.metrics.restore_at < len(p) and warm.metrics.replayed_tokens < len(p)
    assert max_abs(eng.prompt_logits["warm"], eng.prompt_logits["cold"]) <= LOGIT_ATOL
    assert max_abs(eng.prompt_logits["cold"], tiny.logits(torch.tensor(p))[-1]) <= LOGIT_ATOL
    assert warm.output_token_ids == cold.output_token_ids


def test_fixed_shape_decode_step_equals_forward_batch(tinies):
    """`HybridLM.forward_decode_rows` (the CUDA-graph step, here eager on the triton backend): three
    rows in a bucket of 4, the pad row touches no DeltaNet state (the slots no row owns stay NaN)."""
    import copy

    from model.decode_graph import DecodeGraphs

    model = tinies["triton"]
    lens, slots, block = [9, 14, 5], [4, 0, 2], 4
    cache, ids, tables = prefilled(model, lens, slots, block)
    ref_cache = copy.deepcopy(cache)
    for i in (1, 3, 5):
        cache.conv_pool[0][i].fill_(float("nan"))
        cache.ssm_pool[0][i].fill_(float("nan"))
    graphs = DecodeGraphs(model, cache, max_blocks=8, use_graphs=False)
    for step in range(3):
        rows = [SequenceChunk(i[n + step:n + step + 1], n + step, t, sl) for i, t, sl, n in zip(ids, tables, slots, lens)]
        for r, (g, w) in enumerate(zip(graphs.forward(rows), model.forward_batch(rows, ref_cache).logits)):
            assert max_abs(g, w) <= LOGIT_ATOL, (step, r)
    for layer in cache.ssm_pool:
        assert max_abs(cache.ssm_pool[layer][slots], ref_cache.ssm_pool[layer][slots]) <= BUCKET_STATE_ATOL, layer
        assert max_abs(cache.conv_pool[layer][slots], ref_cache.conv_pool[layer][slots]) <= BUCKET_STATE_ATOL, layer
    assert torch.isnan(cache.ssm_pool[0][[1, 3, 5]]).all() and torch.isnan(cache.conv_pool[0][[1, 3, 5]]).all()


def _first_seed_per_policy() -> list[int]:
    """One fuzz workload per placement policy (the first seed from 1000 that draws it): every policy
    with its own eviction, tiers and block sizes as the fuzz draws them."""
    from tests.serve_fuzz import FUZZ_POLICIES, draw_workload

    seeds, s = {}, 1000
    while len(seeds) < len(FUZZ_POLICIES):
        seeds.setdefault(draw_workload(s).policy, s)
        s += 1
    return sorted(seeds.values())


RESTORED: list[int] = []  # requests that started from a restored state, per workload


@pytest.mark.parametrize("seed", _first_seed_per_policy())
def test_every_policy_serves_the_cold_logits(tinies, seed, tmp_path):
    """tests/test_serve_under_pressure.py's model fuzz on this family: warm (restored DeltaNet and
    conv states, token-granular matches, copy-on-write, tiers) == each request alone and cold."""
    from tests.serve_fuzz import build_engine, draw_workload, serve

    model, w = tinies["torch"], draw_workload(seed)
    make = lambda **s: Engine.for_model(model, **s)  # noqa: E731
    eng = build_engine(w, make, model.allocate_cache(1, 16, 1).state_bytes_per_slot, tmp_path)
    reqs = serve(eng, w)
    assert not eng.has_work
    RESTORED.append(sum(bool(r.metrics.restore_at) for r in reqs))
    for req, (prompt, new) in zip(reqs, w.requests):
        cold = make(policy="aligned", block_size=16, prefill_budget=4096, max_batch_size=1, num_kv_blocks=64,
                    enable_prefix_caching=False, keep_prompt_logits=True)
        alone = cold.add_request(list(prompt), new, "cold")
        cold.run_until_done()
        assert max_abs(eng.prompt_logits[req.request_id], cold.prompt_logits["cold"]) <= LOGIT_ATOL, (w.label, req)
        assert req.output_token_ids == alone.output_token_ids, (w.label, req.request_id)


def test_the_policy_workloads_restore_states():
    """The workloads above must restore DeltaNet states (else warm == cold would hold vacuously)."""
    if len(RESTORED) < len(_first_seed_per_policy()):
        pytest.skip("the policy workloads did not all run in this session")
    assert sum(RESTORED) >= len(RESTORED), RESTORED
