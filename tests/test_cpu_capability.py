"""kernels/torch_cpu/capability.py: the route rule on fake capability sets (the module docstring's
table), the probe's margins, the override's errors, the record; and the bf16 attention route of
the CPU paged path against the fp32 oracle."""

import dataclasses
import json

import pytest
import torch

from kernels.reference.paged_attention import paged_attention_ref
from kernels.testing import assert_close
from kernels.torch_cpu import capability as cap
from kernels.torch_cpu.capability import CpuCapabilities, CpuProbe, CpuRoutes, choose_routes, forced_routes
from kernels.torch_cpu.paged_attention import paged_attention_cpu
from tests.test_paged_attention import make_batch

AVX2_LAPTOP = CpuCapabilities(avx2=True, onednn=True, onednn_bf16=True, glibc=True)  # oneDNN "supports" bf16 in software
EPYC_ZEN4 = dataclasses.replace(AVX2_LAPTOP, avx512=True, avx512_bf16=True)
SAPPHIRE_RAPIDS = dataclasses.replace(EPYC_ZEN4, amx_bf16=True, amx_fp16=True, avx512_fp16=True)
NO_ONEDNN = CpuCapabilities(avx2=True, avx512=True, avx512_bf16=True, glibc=True)
TIE = CpuProbe(fp32_mkl_s=1.0, fp32_onednn_s=1.0, fresh_touch_s=1.0, held_touch_s=1.0)


def test_half_precision_routes_follow_the_instructions_the_cpu_has():
    assert choose_routes(AVX2_LAPTOP, TIE) == CpuRoutes()  # everything as fp32 products / fp32 attention
    epyc = choose_routes(EPYC_ZEN4, TIE)  # AVX512-BF16 without AMX: bf16 GEMMs, attention upcast
    assert (epyc.bf16_matmul, epyc.bf16_attention, epyc.fp16_matmul) == ("native", "fp32", "fp32_products")
    spr = choose_routes(SAPPHIRE_RAPIDS, TIE)
    assert (spr.bf16_matmul, spr.bf16_attention, spr.fp16_matmul) == ("native", "native", "native")
    amx_only = dataclasses.replace(AVX2_LAPTOP, amx_bf16=True)
    assert (choose_routes(amx_only, TIE).bf16_matmul, choose_routes(amx_only, TIE).bf16_attention) == ("native", "native")
    # the instructions without torch's oneDNN bf16 support: fp32 products
    assert choose_routes(NO_ONEDNN, TIE).bf16_matmul == "fp32_products"
    assert choose_routes(dataclasses.replace(SAPPHIRE_RAPIDS, onednn_bf16=False), TIE).bf16_attention == "fp32"


def test_fp32_route_is_onednn_only_where_measured_faster_by_the_margin():
    def with_times(mkl, dnn):
        return dataclasses.replace(TIE, fp32_mkl_s=mkl, fp32_onednn_s=dnn)

    assert choose_routes(EPYC_ZEN4, with_times(11.0, 2.0)).fp32_matmul == "onednn"  # the EPYC's probe
    assert choose_routes(EPYC_ZEN4, with_times(1.0, cap.ONEDNN_MARGIN * 1.01)).fp32_matmul == "mkl"
    assert choose_routes(EPYC_ZEN4, with_times(1.0, cap.ONEDNN_MARGIN * 0.99)).fp32_matmul == "onednn"
    assert choose_routes(NO_ONEDNN, with_times(11.0, 2.0)).fp32_matmul == "mkl"  # no oneDNN to run
    assert choose_routes(EPYC_ZEN4, None).fp32_matmul == "mkl"  # unmeasured: torch's default
    assert choose_routes(EPYC_ZEN4, with_times(11.0, None)).fp32_matmul == "mkl"


def test_allocator_reuses_memory_only_where_page_faults_were_measured_costly():
    def with_touch(fresh, held):
        return dataclasses.replace(TIE, fresh_touch_s=fresh, held_touch_s=held)

    assert choose_routes(EPYC_ZEN4, with_touch(0.113, 0.0022)).allocator == "reuse"  # the EPYC VM's probe
    assert choose_routes(EPYC_ZEN4, with_touch(cap.PAGE_FAULT_RATIO * 0.99, 1.0)).allocator == "default"
    assert choose_routes(EPYC_ZEN4, with_touch(cap.PAGE_FAULT_RATIO * 1.01, 1.0)).allocator == "reuse"
    assert choose_routes(dataclasses.replace(EPYC_ZEN4, glibc=False), with_touch(1.0, 0.01)).allocator == "default"
    assert choose_routes(EPYC_ZEN4, None).allocator == "default"


def test_override_parses_names_and_values_and_refuses_anything_else():
    assert cap.parse_override("") == {}
    assert cap.parse_override("fp32_matmul=mkl, allocator=default") == {"fp32_matmul": "mkl", "allocator": "default"}
    for bad in ("fp32_matmul", "fp32_matmul=blas", "matmul=mkl", "bf16_attention=fp16"):
        with pytest.raises(ValueError, match=cap.ENV_OVERRIDE):
            cap.parse_override(bad)
    with pytest.raises(ValueError, match="bf16_matmul"):
        CpuRoutes(bf16_matmul="fast")


def test_routes_are_decided_once_and_recorded():
    first = cap.cpu_routes()
    assert cap.cpu_routes() is first  # cached: the probe runs once a process
    record = json.loads(json.dumps(cap.routes_record()))
    assert record["routes"] == dataclasses.asdict(first)
    assert set(record["capabilities"]) == {f.name for f in dataclasses.fields(CpuCapabilities)}
    assert record["probe_s"]["fp32_mkl_s"] > 0
    with forced_routes(fp32_matmul="mkl", bf16_matmul="fp32_products") as forced:
        assert cap.cpu_routes() is forced and forced.bf16_attention == first.bf16_attention
    assert cap.cpu_routes() is first


def test_detected_flags_agree_with_torchs_own_cpuinfo():
    caps = cap.detect()
    for flag, torch_name in (("avx2", "_is_avx2_supported"), ("avx512", "_is_avx512_supported"),
                             ("avx512_bf16", "_is_avx512_bf16_supported")):
        fn = getattr(torch.cpu, torch_name, None)
        if fn is not None:
            assert getattr(caps, flag) == bool(fn()), flag


@pytest.mark.parametrize("route", ["native", "fp32"])
def test_bf16_attention_route_is_within_bf16_tolerance_of_the_fp32_oracle(route):
    """Both routes against the oracle (fp32 math on the bf16 inputs), a prefill chunk over a cached
    prefix (the masked row-block path), a fresh prompt (SDPA's own causal mask) and a decode row."""
    batch = make_batch([(37, 45), (50, 0), (1, 70)], block_size=16, num_kv_heads=2, group=3, head_dim=64,
                       dtype=torch.bfloat16, seed=11)
    with forced_routes(bf16_attention=route):
        got = paged_attention_cpu(*batch.args())
    want = paged_attention_ref(*batch.args())
    assert got.dtype == torch.bfloat16
    assert_close(got, want, torch.bfloat16, f"route {route}")
    with forced_routes(bf16_attention="fp32" if route == "native" else "native"):
        other = paged_attention_cpu(*batch.args())
    assert not torch.equal(got, other)  # the route changes the arithmetic (else this test could not tell them apart)


@pytest.fixture(scope="module")
def dense_prompt():
    from model.families import PRESETS

    vocab = PRESETS["granite-dense-cpu"].vocab_size
    return torch.randint(0, vocab, (300,), generator=torch.Generator().manual_seed(7))


def test_fp32_model_logits_on_the_onednn_route_match_the_mkl_route_to_fp32_tolerance(dense_prompt):
    """An fp32 run stays fp32 whatever the route: the whole model's logits (300 tokens, every
    linear above ONEDNN_MIN_ROWS rows) within fp32's tolerance of the MKL route's."""
    from model.loading import from_preset

    model = from_preset("granite-dense-cpu", seed=0)
    with forced_routes(fp32_matmul="mkl"):
        want = model.logits(dense_prompt)
    with forced_routes(fp32_matmul="onednn"):
        got = model.logits(dense_prompt)
    assert_close(got, want, torch.float32, "fp32 logits, oneDNN vs MKL route")


def test_bf16_model_logits_on_the_native_routes_match_the_fp32_product_routes(dense_prompt):
    """A bf16 run on the native matmul route against the same bf16 model on fp32 products (the
    plain path's attention is SDPA on either route): within bf16's tolerance (the kernels differ in
    summation order, not in rounding)."""
    from model.loading import from_preset

    model = from_preset("granite-dense-cpu", seed=0, dtype=torch.bfloat16)
    with forced_routes(bf16_matmul="fp32_products", bf16_attention="fp32"):
        want = model.logits(dense_prompt)
    with forced_routes(bf16_matmul="native", bf16_attention="native"):
        got = model.logits(dense_prompt)
    assert got.dtype == torch.bfloat16 and not torch.equal(got, want)  # the route took effect
    assert_close(got, want, torch.bfloat16, "bf16 logits, native vs fp32-product routes")


def test_probe_times_cpu_tensors_even_under_a_meta_default_device(monkeypatch):
    """A checkpoint load builds the first model (and so runs the probe) under torch.device("meta"):
    there every product took 4-22 us and the routes fell by chance. Each timed callable must make
    CPU tensors whatever the default device."""
    seen = []

    def record(fns, repeats, warm=True):
        for f in fns.values():
            out = f()
            seen.extend(t.device.type for t in (out if isinstance(out, list) else [out]))
        return {k: 1.0 for k in fns}

    monkeypatch.setattr(cap, "_min_time", record)
    with torch.device("meta"):
        cap.probe(cap.detect(), repeats=1)
    assert seen and set(seen) == {"cpu"}, seen
