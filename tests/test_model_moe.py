"""The MoE layer: sorted dispatch (per-expert loop and grouped matmuls) against a per-token
reference, checkpoint tensors stacked from one tensor per expert, and the dense MLPs' row tiles on the CPU."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.utils._python_dispatch

from kernels.testing import assert_close
from model import PRESETS, HybridLM, load_pretrained, save_pretrained
from model.families import FAMILIES, Family, granite
from model.loading import init_random_weights
from model.mlp import swiglu_halves
import model.mlp as mlp_mod
from model.mlp import FusedSwiGLU, ReluSquaredMLP, SwiGLU
from model.moe import SoftmaxTopKRouter, expert_offsets, run_experts
from model_helpers import max_abs, one_thread, tokens  # noqa: F401  (one_thread: autouse)

FP32_ATOL = 1e-5  # max abs, outputs O(1); bf16 uses the kernels' stated bf16 tolerance (kernels.testing)


def _per_token_reference(x, weights, index, w_in, w_out):
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            h = swiglu_halves(w_in[e].float() @ x[t].float())
            out[t] += weights[t, j].float() * (w_out[e].float() @ h)
    return out


def _inputs(T, H, I, E, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    w_in = (torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype)
    w_out = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    # k distinct experts per token, never the last one: an empty slice in the dispatch
    index = torch.rand(T, E - 1, generator=g).argsort(-1)[:, :k]
    weights = torch.softmax(torch.randn(T, k, generator=g), -1).to(dtype)
    return x, weights, index, w_in, w_out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("T, H, I, E, k", [(37, 32, 24, 5, 3), (1, 64, 16, 4, 2), (130, 32, 8, 9, 1)])
def test_sorted_dispatch_matches_per_token_reference(T, H, I, E, k, dtype, grouped):
    if grouped and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    x, weights, index, w_in, w_out = _inputs(T, H, I, E, k, dtype)
    got = run_experts(x, weights, index, w_in, w_out, swiglu_halves, grouped=grouped)
    assert got.dtype == dtype and got.shape == x.shape
    expected = _per_token_reference(x, weights, index, w_in, w_out)
    if dtype == torch.float32:
        assert max_abs(got, expected) <= FP32_ATOL
    else:
        assert_close(got, expected, dtype, "bf16 experts")


@torch.no_grad()
def test_router_softmax_is_over_the_top_k_logits():
    router = SoftmaxTopKRouter(32, 6, 3)
    router.weight.copy_(torch.randn(6, 32, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(2))
    weights, index = router(x)
    logits = x @ router.weight.T
    assert torch.equal(index, logits.topk(3, dim=-1).indices)
    assert torch.allclose(weights, torch.softmax(logits.gather(1, index), -1))
    assert (weights[:, :-1] >= weights[:, 1:]).all() and weights.dtype == x.dtype


# ---- one checkpoint tensor per expert (Nemotron-H's layout) ---------------------------------------

def _split_experts_name(config, name):
    """Granite's names, except that the stacked expert matrices are stored one tensor per expert."""
    m = re.match(r"^layers\.(\d+)\.feed_forward\.block_sparse_moe\.experts\.(gate_up_proj|down_proj)$", name)
    if m:
        return tuple(f"model.layers.{m[1]}.experts.{e}.{m[2]}.weight" for e in range(config.moe.num_experts))
    return granite.checkpoint_name(config, name)


SPLIT = Family(
    model_type="granite-split-experts",
    config_from_hf=lambda hf: dataclasses.replace(granite.config_from_hf({**hf, "model_type": granite.MODEL_TYPE}),
                                                  model_type="granite-split-experts"),
    config_to_hf=lambda c: {**granite.config_to_hf(c), "model_type": "granite-split-experts"},
    feed_forward=granite.feed_forward,
    checkpoint_name=_split_experts_name,
)


def test_stacked_checkpoint_tensors_load_and_save(monkeypatch, tmp_path):
    from safetensors.torch import load_file, save_file

    monkeypatch.setitem(FAMILIES, SPLIT.model_type, SPLIT)
    cfg = dataclasses.replace(PRESETS["granite-tiny"], model_type=SPLIT.model_type)
    model = init_random_weights(HybridLM(cfg).eval(), seed=1)
    save_pretrained(model, tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved["model.layers.2.experts.3.down_proj.weight"].shape == (64, 32)
    ids = tokens(20, 0)
    assert torch.equal(load_pretrained(tmp_path).logits(ids), model.logits(ids))
    name = "model.layers.0.experts.1.gate_up_proj.weight"
    del saved[name]
    save_file(saved, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"^{name}: missing tensor"):
        load_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# The grouped path's offsets stay on the device: no host read (issue 11).

HOST_READS = {"_local_scalar_dense", "_unique2", "unique_dim", "unique_consecutive", "nonzero", "masked_select",
              "nonzero_static", "bincount"}  # bincount: CUDA sizes its output from the ids' max, read on the host


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """Names of the aten ops a block dispatches (ops inside an op, e.g. _grouped_mm's CPU loop, are not seen)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("E, counts", [(5, [0, 3, 0, 4, 0]), (4, [2, 2, 2, 2]), (6, [0, 0, 0, 0, 0, 7]), (1, [3])],
                         ids=["empty-first-middle-last", "even", "all-in-the-last", "one-expert"])
def test_expert_offsets_equal_the_cumsum_of_the_counts(E, counts):
    ids = torch.repeat_interleave(torch.arange(E), torch.tensor(counts))
    ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(E))]
    offsets = expert_offsets(ids.sort(stable=True).values, E)
    assert offsets.dtype == torch.int32 and offsets.shape == (E,)
    assert offsets.tolist() == torch.bincount(ids, minlength=E).cumsum(0).tolist()


def test_grouped_dispatch_reads_nothing_on_the_host(monkeypatch):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    x, weights, index, w_in, w_out = _inputs(37, 32, 24, 5, 3, torch.float32)
    tolists = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolists.append(t.shape) or real_tolist(t))
    for grouped in (True, False):
        with _OpLog() as log:
            got = run_experts(x, weights, index, w_in, w_out, swiglu_halves, grouped=grouped)
        reads = sorted(set(log.ops) & HOST_READS) + ["tolist"] * len(tolists)
        tolists.clear()
        if grouped:
            assert reads == [] and "_grouped_mm" in log.ops, reads
            want = got
        else:  # the per-expert loop reads its slice bounds: the log sees it
            assert reads == ["bincount", "tolist"], reads
            assert max_abs(got, want) <= FP32_ATOL


def test_nemotron_experts_grouped_equal_the_loop_without_host_reads(monkeypatch):
    """Nemotron-H's relu^2 experts through the grouped path (forced on the CPU) == the loop, with
    no host read; the loop is what the family parity tests check against transformers."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    import model.families.nemotron_h_moe as nemotron

    experts = nemotron.ReluSquaredExperts(32, 6, 16)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        experts.up_proj.copy_(torch.randn(6, 16, 32, generator=g) / 32 ** 0.5)
        experts.down_proj.copy_(torch.randn(6, 32, 16, generator=g) / 4)
    x = torch.randn(41, 32, generator=g)
    index = torch.rand(41, 5, generator=g).argsort(-1)[:, :3]  # expert 5 never chosen: an empty group
    weights = torch.rand(41, 3, generator=g)
    with torch.no_grad():
        loop = experts(x, weights, index)
        monkeypatch.setattr(nemotron, "use_grouped_mm", lambda *a: True)
        with _OpLog() as log:
            grouped = experts(x, weights, index)
    assert sorted(set(log.ops) & HOST_READS) == [] and "_grouped_mm" in log.ops
    assert max_abs(grouped, loop) <= FP32_ATOL and loop.abs().max() > 0.1


@pytest.mark.parametrize("mlp", ["swiglu", "fused_swiglu", "relu_squared"])
@pytest.mark.parametrize("tokens", [mlp_mod.CPU_ROW_TILE + 1, 2 * mlp_mod.CPU_ROW_TILE + 37])
@torch.no_grad()
def test_dense_mlps_run_in_row_tiles_with_the_untiled_values(mlp, tokens, monkeypatch):
    """Past CPU_ROW_TILE rows a dense MLP runs a tile at a time (a last partial tile included): the
    same values as one pass over every row. A tile dropped, doubled or misplaced changes rows."""
    g = torch.Generator().manual_seed(tokens)
    module = {"swiglu": lambda: SwiGLU(32, 48, bias=True), "fused_swiglu": lambda: FusedSwiGLU(32, 48),
              "relu_squared": lambda: ReluSquaredMLP(32, 48, bias=False)}[mlp]()
    for p in module.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / 6)
    x = torch.randn(tokens, 32, generator=g)
    tiled = module(x)
    monkeypatch.setattr(mlp_mod, "CPU_ROW_TILE", tokens)  # one tile: the untiled pass
    whole = module(x)
    assert tiled.shape == whole.shape == x.shape
    assert max_abs(tiled, whole) <= 1e-6
