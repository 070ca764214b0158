"""`copy_kv_block_prefix` (Triton, under the interpreter on a CPU) and the CPU path against the oracle
`copy_kv_block_prefix_ref`; their input checks; the compile check; `ModelRunner.copy_kv_blocks`
on a model with three attention layers, on both backends."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from compile_pythons import PYTHONS, check_version, usable
from conftest import DEVICE
from kernels.checks import set_debug_checks
from kernels.kv_block_copy import copy_kv_block_prefix
from kernels.reference.paged_attention import copy_kv_block_prefix_ref
from kernels.torch_cpu.paged_attention import copy_kv_block_prefix_cpu
from model import HybridLM
from model.engine import ModelRunner
from model.families import PRESETS
from model_helpers import one_thread  # noqa: F401  (one_thread: autouse)
from step_counter import STEP, StepCounter

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
IMPLS = {"triton": copy_kv_block_prefix, "cpu": copy_kv_block_prefix_cpu}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits: NaN == NaN, and -0.0 != 0.0."""
    return t.view(BITS[t.dtype])


def _case(num_copies, block_size, num_kv_heads, head_dim, dtype, seed, rows=None, index_dtype=torch.int32):
    """Random caches, C copies: distinct dst blocks, src blocks (repeats allowed) disjoint from them;
    the rows each copy must write poisoned with NaN in both caches."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = 2 * num_copies + 3
    perm = torch.randperm(num_blocks, generator=g)
    dst = perm[:num_copies]
    src = perm[num_copies:][torch.randint(0, num_blocks - num_copies, (num_copies,), generator=g)]
    if rows is None:  # every count from 0 to block_size appears somewhere across the cases
        rows = torch.randint(0, block_size + 1, (num_copies,), generator=g)
        rows[0], rows[-1] = 0, block_size
    rows = torch.as_tensor(rows)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.randn(shape, generator=g).to(dtype) for _ in range(2)]
    for cache in caches:
        for d, n in zip(dst.tolist(), rows.tolist()):
            cache[d, :n] = float("nan")
    return [t.to(DEVICE) for t in caches] + [t.to(DEVICE, index_dtype) for t in (src, dst, rows)]


CASES = [  # (C, block_size, num_kv_heads, head_dim, dtype, rows, index dtype)
    (7, 16, 3, 80, "bf16", None, torch.int32),  # 3840 elements a block: two tiles, a row cut by the tile edge
    (7, 5, 1, 64, "fp32", None, torch.int64),
    (7, 5, 3, 80, "fp32", None, torch.int32),
    (1, 16, 1, 64, "bf16", [16], torch.int64),  # the whole block
    (1, 5, 3, 80, "bf16", [0], torch.int32),  # nothing
    (1, 16, 3, 64, "fp32", [9], torch.int32),
    (12, 8, 2, 64, "fp32", None, torch.int32),  # more copies than blocks of the other cases
]


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("num_copies,block_size,num_kv_heads,head_dim,dtype,rows,index_dtype", CASES,
                         ids=[f"C{c[0]}-bs{c[1]}-h{c[2]}-d{c[3]}-{c[4]}-{c[5]}-{str(c[6])[6:]}" for c in CASES])
def test_copy_matches_reference(impl, num_copies, block_size, num_kv_heads, head_dim, dtype, rows, index_dtype):
    kc, vc, src, dst, n = _case(num_copies, block_size, num_kv_heads, head_dim, DTYPES[dtype],
                                seed=num_copies * 100 + block_size + head_dim, rows=rows, index_dtype=index_dtype)
    before_k, before_v = kc.clone(), vc.clone()
    want_k, want_v = kc.clone(), vc.clone()
    copy_kv_block_prefix_ref(want_k, want_v, src, dst, n)
    IMPLS[impl](kc, vc, src, dst, n)
    assert torch.equal(_bits(kc), _bits(want_k)) and torch.equal(_bits(vc), _bits(want_v))
    # what the reference itself must have done: the poisoned rows written from src, everything else untouched
    written = torch.zeros(kc.shape[:2], dtype=torch.bool, device=kc.device)
    for s, d, r in zip(src.tolist(), dst.tolist(), n.tolist()):
        written[d, :r] = True
        for got, before in ((kc, before_k), (vc, before_v)):
            assert torch.equal(_bits(got[d, :r]), _bits(before[s, :r])), f"dst {d}: rows 0..{r - 1}"
    for got, before in ((kc, before_k), (vc, before_v)):
        assert not got.isnan().any(), "a poisoned row was not written"
        assert torch.equal(_bits(got[~written]), _bits(before[~written])), "a row outside the copies changed"


def test_reference_copies_rows_by_hand():
    """The oracle itself, on a 4-block cache of 3 rows: block 2 <- rows 0..1 of block 0, block 3 <- none of 1."""
    kc = torch.arange(12, dtype=torch.float32).view(4, 3, 1, 1)
    vc = -kc
    copy_kv_block_prefix_ref(kc, vc, torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([2, 0]))
    assert kc.flatten().tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 8, 9, 10, 11]
    assert vc.flatten().tolist() == [-x for x in kc.flatten().tolist()]


def _bad(name):
    kc, vc, src, dst, n = _case(3, 5, 3, 16, torch.float32, seed=1, rows=[1, 2, 5])
    args = dict(key_cache=kc, value_cache=vc, src_block_ids=src, dst_block_ids=dst, num_rows=n)
    match = {"dst-equals-src": "dst_block_ids", "dst-twice": "dst_block_ids", "dst-is-a-src": "dst_block_ids",
             "rows-over-block": "num_rows", "rows-negative": "num_rows", "src-out-of-range": "src_block_ids",
             "dst-negative": "dst_block_ids", "length": "num_rows", "float-ids": "src_block_ids",
             "two-dims": "dst_block_ids", "device": "num_rows", "cache-dtype": "value_cache",
             "cache-not-contiguous": "key_cache"}[name]
    if name == "dst-equals-src":
        args["dst_block_ids"] = torch.stack([src[0], dst[1], dst[2]])
    elif name == "dst-twice":
        args["dst_block_ids"] = torch.stack([dst[0], dst[1], dst[0]])
    elif name == "dst-is-a-src":
        args["dst_block_ids"] = torch.stack([dst[0], src[0], dst[2]])
    elif name == "rows-over-block":
        args["num_rows"] = torch.tensor([1, 6, 0])
    elif name == "rows-negative":
        args["num_rows"] = torch.tensor([1, -1, 0])
    elif name == "src-out-of-range":
        args["src_block_ids"] = src.clone().fill_(kc.shape[0])
    elif name == "dst-negative":
        args["dst_block_ids"] = torch.tensor([-1, dst[1], dst[2]])
    elif name == "length":
        args["num_rows"] = n[:2]
    elif name == "float-ids":
        args["src_block_ids"] = src.float()
    elif name == "two-dims":
        args["dst_block_ids"] = dst[:, None]
    elif name == "device":
        args["num_rows"] = torch.empty(n.shape, dtype=n.dtype, device="meta")
    elif name == "cache-dtype":
        args["value_cache"] = vc.double()
    elif name == "cache-not-contiguous":  # (num_blocks, num_kv_heads, block_size, head_dim) bytes: not our layout
        args["key_cache"] = kc.transpose(1, 2).contiguous().transpose(1, 2)
    return args, match


BAD = ["dst-equals-src", "dst-twice", "dst-is-a-src", "rows-over-block", "rows-negative", "src-out-of-range",
       "dst-negative", "length", "float-ids", "two-dims", "device", "cache-dtype", "cache-not-contiguous"]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_rejected_before_writing(name):
    """With the debug switch on (the suite's setting) all three reject the same inputs, naming the argument."""
    args, arg_name = _bad(name)
    before = _bits(args["key_cache"]).clone()
    for fn in (copy_kv_block_prefix, copy_kv_block_prefix_cpu, copy_kv_block_prefix_ref):
        with pytest.raises(ValueError, match=arg_name):
            fn(**args)
        assert torch.equal(_bits(args["key_cache"]), before), f"{fn.__name__} wrote before the error"


def test_value_checks_run_only_under_the_debug_switch():
    """Production (switch off): the index values are not read on the host (a src == dst pair, which
    the switch rejects, goes through; no rows, so nothing is written), the shapes still are checked."""
    args, _ = _bad("dst-equals-src")
    args["num_rows"] = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    before = _bits(args["key_cache"]).clone()
    prev = set_debug_checks(False)
    try:
        for fn in IMPLS.values():
            fn(**args)
            with pytest.raises(ValueError, match="num_rows"):
                fn(**{**args, "num_rows": args["num_rows"][:2]})
    finally:
        set_debug_checks(prev)
    assert torch.equal(_bits(args["key_cache"]), before)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_unchecked_rows_past_the_block_stay_in_the_block(impl):
    """Switch off, num_rows = block_size + 3 goes unchecked: the whole block is copied, no more."""
    kc, vc, src, dst, n = _case(1, 5, 3, 16, torch.float32, seed=4, rows=[5])
    want_k, want_v = kc.clone(), vc.clone()
    copy_kv_block_prefix_ref(want_k, want_v, src, dst, n)
    prev = set_debug_checks(False)
    try:
        IMPLS[impl](kc, vc, src, dst, n + 3)
    finally:
        set_debug_checks(prev)
    assert torch.equal(_bits(kc), _bits(want_k)) and torch.equal(_bits(vc), _bits(want_v))


def test_no_copies_is_a_no_op():
    kc, vc, src, dst, n = _case(1, 5, 1, 64, torch.float32, seed=3, rows=[2])
    before = _bits(kc).clone()
    for fn in IMPLS.values():
        fn(kc, vc, src[:0], dst[:0], n[:0])
    assert torch.equal(_bits(kc), before)


# ---- the compile check ---------------------------------------------------------------------------
SCRIPT = """
import dataclasses, json, sys
from kernels.compile_check import check_all, format_table
rows = check_all("kv_block_copy")
print(format_table(rows), file=sys.stderr)
print(json.dumps([dataclasses.asdict(r) for r in rows]))
"""


@pytest.mark.parametrize("python", PYTHONS)  # the current Triton and 3.6, the GPU machine's
def test_kernel_compiles_for_sm90_and_sm80_without_spills(python):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([usable(python), "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results, table = json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
    check_version(python, results)
    by_variant: dict[str, set[str]] = {}
    for r in results:
        assert r["ok"], f"{r['variant']} {r['arch']}: {r['error'][:500]}\n{table}"
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, f"{r['variant']} {r['arch']} spills\n{table}"
        assert r["local_bytes"] == 0, f"{r['variant']} {r['arch']} uses local memory\n{table}"
        assert r["registers"] > 0, f"{r['variant']} {r['arch']}: no resource usage read"
        by_variant.setdefault(r["variant"], set()).add(r["arch"])
    assert set(by_variant) == {"kv_block_copy/bf16/tile2048", "kv_block_copy/fp16/tile2048",  # bamba-9b
                               "kv_block_copy/fp32/tile2048", "kv_block_copy/bf16/tile1024",  # small
                               "kv_block_copy/fp32/tile1024", "kv_block_copy/fp32/tile512"}, by_variant  # tiny
    assert all(archs == {"sm_90", "sm_80"} for archs in by_variant.values()), by_variant


# ---- ModelRunner.copy_kv_blocks ---------------------------------------------------------------------
def _runner(backend: str) -> ModelRunner:
    """The tiny preset with three attention layers (0, 2, 3) around one Mamba layer; 9 blocks of 16."""
    cfg = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=4, attn_layer_indices=(),
                              layer_types=("attention", "mamba", "attention", "attention"))
    model = HybridLM(cfg, backend=backend).eval().to(DEVICE)
    return ModelRunner(model, model.allocate_cache(9, 16, 2))


@pytest.fixture(scope="module", params=["torch", "triton"])
def runner(request):
    return _runner(request.param)


def _fill(cache, seed):
    g = torch.Generator().manual_seed(seed)
    for pools in (cache.key_cache, cache.value_cache, cache.conv_pool, cache.ssm_pool):
        for t in pools.values():
            t.copy_(torch.randn(t.shape, generator=g))
    return {name: {i: t.clone() for i, t in getattr(cache, name).items()}
            for name in ("key_cache", "value_cache", "conv_pool", "ssm_pool")}


def test_runner_copies_every_attention_layer_and_nothing_else(runner):
    cache = runner.cache
    assert sorted(cache.key_cache) == [0, 2, 3]
    before = _fill(cache, seed=5)
    copies = [(4, 1, 7), (4, 6, 16), (0, 2, 0), (8, 3, 1)]  # block 4 shared by two requests; rows 0 and 16
    runner.copy_kv_blocks(copies)
    for name in ("key_cache", "value_cache"):
        for layer, got in getattr(cache, name).items():
            want = before[name][layer].clone()
            for src, dst, rows in copies:
                want[dst, :rows] = before[name][layer][src, :rows]
            assert torch.equal(got, want), f"{name} of layer {layer}"
            assert not torch.equal(got, before[name][layer]), f"{name} of layer {layer}: nothing copied"
    for name in ("conv_pool", "ssm_pool"):
        for layer, t in getattr(cache, name).items():
            assert torch.equal(t, before[name][layer]), f"{name} of layer {layer} changed"
    after = [t.clone() for t in cache.key_cache.values()]
    runner.copy_kv_blocks([])
    assert all(torch.equal(a, b) for a, b in zip(after, cache.key_cache.values()))


@pytest.mark.parametrize("copies,arg", [
    ([(1, 1, 3)], "dst_block_ids"), ([(1, 2, 17)], "num_rows"), ([(9, 2, 1)], "src_block_ids"),
    ([(1, 2, 1), (3, 2, 1)], "dst_block_ids"), ([(1, 2, 1), (2, 3, 1)], "dst_block_ids"), ([(1, 2)], "copies"),
    ([(1, 2, 1.5)], "copies"),
])
def test_runner_rejects_bad_copies_on_the_host(runner, copies, arg):
    before = [t.clone() for t in runner.cache.key_cache.values()]
    with pytest.raises(ValueError, match=f"^{arg}:"):
        runner.copy_kv_blocks(copies)
    assert all(torch.equal(a, b) for a, b in zip(before, runner.cache.key_cache.values()))


def test_runner_copy_on_triton_is_one_upload_and_one_launch_a_layer(monkeypatch):
    """Production path (debug switch off): no host sync, one host-to-device copy, a launch per attention layer."""
    runner = _runner("triton")
    prev = set_debug_checks(False)
    try:
        counter = StepCounter(runner.model)
        with monkeypatch.context() as m, counter.installed(m):
            runner.copy_kv_blocks([(4, 1, 7), (8, 3, 1)])
    finally:
        set_debug_checks(prev)
    assert counter.syncs.get(STEP, []) == [], counter.syncs
    assert counter.uploads == 1
    assert dict(counter.launches[STEP]) == {"kv_block_copy_kernel": 3}
