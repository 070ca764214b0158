"""`experiments.bench.cpu_prefill` on small shapes: it runs, writes its rows, and its FLOP floor is
the one derived here by hand from granite-dense-cpu's config (not from `model.cost`).

No timing is asserted (GFLOP/s <= ceiling would be a timed test); what is checked: the rows of
every system and repeat, the ceiling taken at the model's own GEMM shapes (derived here from the
layer widths), the breakdown's categories, the warm request replaying one token and its floor
measured, and vLLM's absence said in the record when the given python cannot import it.
"""

from __future__ import annotations

import csv
import json

import pytest

from experiments.bench import cpu_prefill
from model import PRESETS

pytest.importorskip("transformers")
TOKENS = 40  # not a multiple of the block (16) nor of the scan's chunk


def granite_dense_cpu_flops(T: int) -> float:
    """By hand from granite-dense-cpu (hidden 256; layers M M M A M M; Mamba: 8 heads x 64 = d_inner
    512, 1 group of state 128, conv 4, chunk 256; attention 4 query heads x 64, 1 KV head; shared
    SwiGLU MLP of 1024 after every layer; vocab 16384, tied head)."""
    hidden, d_inner, state, heads, head_dim = 256, 512, 128, 8, 64
    conv_dim = d_inner + 2 * state  # x, B, C through the conv: 768
    mamba = hidden * (2 * d_inner + 2 * state + heads) + d_inner * hidden  # in_proj (z, xBC, dt) + out_proj
    attention = hidden * (4 * 64 + 2 * 64) + 4 * 64 * hidden  # q, k, v + o
    mlp = 3 * hidden * 1024  # gate + up (fused) and down
    matmuls = 2 * T * (5 * mamba + attention + 6 * mlp)
    conv = 2 * T * 5 * conv_dim * 4
    # SSD, per Mamba layer and token: B^T x and C h (4 H P N) + the causal chunk's C B^T and its product with x
    scan = 5 * T * (4 * heads * head_dim * state + 256 * (state + d_inner))
    attn = 4 * (4 * 64) * T * (T + 1) // 2  # one layer, causal: Q K^T and P V over T (T + 1) / 2 pairs
    head = 2 * 16384 * hidden
    return float(matmuls + conv + scan + attn + head)


def test_flop_floor_is_the_hand_count():
    f = cpu_prefill.flop_floor(PRESETS["granite-dense-cpu"], TOKENS)
    assert f["total"] == granite_dense_cpu_flops(TOKENS)
    assert f["head"] == 2 * 16384 * 256
    assert cpu_prefill.flop_floor(PRESETS["granite-dense-cpu"], 2 * TOKENS)["total"] == granite_dense_cpu_flops(2 * TOKENS)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_prefill")
    argv = ["--model", "granite-dense-cpu", "--tokens", str(TOKENS), "--dtype", "float32", "--repeats", "2", "--warm-repeats", "2",
            "--peers", "transformers,vllm", "--vllm-python", "/bin/false", "--ceiling-min-s", "0.002",
            "--out", str(out)]
    assert cpu_prefill.main(argv) == 0
    return out


def test_rows_for_every_system_and_repeat(run):
    rows = list(csv.DictReader(open(run / "rows.csv")))
    timed = [r for r in rows if r.get("system")]
    assert sorted((r["system"], r["repeat"]) for r in timed) == [
        ("ours", "0"), ("ours", "1"), ("transformers", "0"), ("transformers", "1")]
    assert all(float(r["cpu_s"]) > 0 and float(r["wall_s"]) > 0 and r["tokens"] == str(TOKENS) for r in timed)
    warm = [r for r in rows if r.get("warm_cpu_s")]
    assert len(warm) == 4 and all(r["warm_replayed_tokens"] == "1" for r in warm)  # 2 prompts x 2 warm repeats
    assert all(float(r["decode_step_cpu_s"]) > 0 and float(r["decode_forward_cpu_s"]) > 0 for r in warm)


def test_summary_rates_ceiling_at_the_models_gemm_shapes(run):
    s = json.loads((run / "summary.json").read_text())
    assert "vLLM absent" in s["vllm"] and "/bin/false" in s["vllm"]
    d = s["by_dtype"]["float32"]
    assert set(d["systems"]) == {"ours", "transformers"}
    ours = d["systems"]["ours"]
    assert ours["cached_tokens_max"] == 0  # every timed prompt is fresh: a cold prefill
    assert ours["gflops_by_cpu"] == pytest.approx(granite_dense_cpu_flops(TOKENS) / ours["median_cpu_s"] / 1e9)
    assert d["ceiling"]["gflops"] > 0 and d["floor_s"] == pytest.approx(
        granite_dense_cpu_flops(TOKENS) / (d["ceiling"]["gflops"] * 1e9))
    # the projections of the 40-token prefill (K x N of each weight) and the head on the last row
    widths = {(256, 1288), (512, 256), (256, 256), (256, 64), (256, 2048), (1024, 256)}
    shapes = {tuple(int(x) for x in k.split("x")) for k in d["breakdown"]["gemm_shapes"]}
    assert shapes == {(TOKENS, k, n) for k, n in widths} | {(1, 256, 16384)}
    calls = d["breakdown"]["gemm_shapes"]
    assert calls[f"{TOKENS}x256x1288"] == 5 and calls[f"{TOKENS}x256x2048"] == 6 and calls[f"{TOKENS}x256x64"] == 2
    ceilings = list(csv.DictReader(open(run / "ceilings.csv")))
    assert {(int(r["m"]), int(r["k"]), int(r["n"])) for r in ceilings} == shapes
    assert {r["route"] for r in ceilings} >= {"torch_mm"}
    b = d["breakdown"]
    assert set(b["seconds"]) == set(cpu_prefill.CATEGORIES)
    assert b["seconds"]["gemm"] > 0 and b["seconds"]["attention"] > 0 and b["seconds"]["ssm_scan"] > 0
    assert sum(b["seconds"].values()) == pytest.approx(b["profiled_cpu_s"], rel=0.3)  # medians of shares
    assert d["warm"]["warm_replayed_tokens_max"] == 1 and d["warm"]["decode_step_cpu_s"] > 0
    assert d["agreement"]["transformers"] == {"same_first_token": 2, "prompts": 2}
    assert s["environment"]["machine"]["cpu_model"] and s["environment"]["cpu_routes"]["routes"]
    assert (run / "cpu_prefill.png").stat().st_size > 0


def test_cpu_slug_names_the_cpu_and_its_widest_matmul_isa():
    assert cpu_prefill.cpu_slug({"cpu_model": "AMD EPYC", "isa": {"avx2": True, "avx512f": True,
                                                                  "avx512_bf16": True}}) == "amd-epyc-avx512bf16"
    assert cpu_prefill.cpu_slug({"cpu_model": "Intel(R) Core(TM) i7-1185G7 CPU @ 3.00GHz",
                                 "isa": {"avx2": True}}) == "intel-core-i7-1185g7-avx2"
    assert cpu_prefill.cpu_slug({"cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
                                 "isa": {"avx512f": True, "avx512_bf16": True, "amx_bf16": True}}) == \
        "intel-xeon-platinum-8480-amx"


def test_bad_flags_end_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cpu_prefill.main(["--peers", "sglang"])
    assert e.value.code == 2 and "--peers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cpu_prefill.main(["--model", "no-such-preset"])
    assert e.value.code == 2 and "--model" in capsys.readouterr().err
