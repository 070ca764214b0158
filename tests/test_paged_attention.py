"""`paged_attention` (Triton, interpreted on CPU) against `paged_attention_ref`, and the oracle and
the CPU path (`paged_attention_cpu`) against dense fp64 attention.

Every batch is built the hard way: block ids are a random permutation (non-contiguous tables), the
cache starts as NaN so a read of an unwritten slot or a stray block poisons the output, block-table
columns past a sequence's last block point at a never-written (NaN) block, outputs are pre-filled
with NaN, and queries are slices of a fused QKV buffer (token stride != heads * head_dim).
Sizes are scaled down for the interpreter but keep the shapes that break kernels: prefixes that end
mid-block, chunks longer than a block, more q tiles than one, empty splits, head_dim 80.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernels.paged_attention as pa
import kernels.torch_cpu.paged_attention as cpu_mod
from kernels.kv_cache_write import write_kv_cache
from kernels.paged_attention import paged_attention
from kernels.reference.paged_attention import paged_attention_ref, write_kv_cache_ref
from kernels.testing import assert_close, nan_filled
from kernels.torch_cpu.capability import CpuRoutes
from kernels.torch_cpu.paged_attention import paged_attention_cpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclasses.dataclass
class Batch:
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor

    def args(self):
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens, self.cu_seqlens_q)


def make_batch(specs, *, block_size, num_kv_heads, group, head_dim, dtype, seed=0) -> Batch:
    """specs: [(q_len, context_len)]; the sequence holds context_len + q_len tokens in the cache."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [ctx + q for q, ctx in specs]
    blocks = [-(-n // block_size) for n in seq_lens]
    poison = sum(blocks)  # one block that is never written: NaN
    num_blocks = poison + 2
    perm = torch.randperm(num_blocks, generator=g)
    poison_id = int(perm[poison])
    table = torch.full((len(specs), max(blocks) + 2), poison_id, dtype=torch.int32)
    slots, start = [], 0
    for s, (n_tok, n_blk) in enumerate(zip(seq_lens, blocks)):
        table[s, :n_blk] = perm[start : start + n_blk].to(torch.int32)
        start += n_blk
        pos = torch.arange(n_tok)
        slots.append(table[s, pos // block_size].long() * block_size + pos % block_size)
    slots = torch.cat(slots)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    value_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    k = torch.randn(len(slots), num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(len(slots), num_kv_heads, head_dim, generator=g).to(dtype)
    write_kv_cache_ref(k, v, key_cache, value_cache, slots)
    num_q_heads = num_kv_heads * group
    total_q = sum(q for q, _ in specs)
    qkv = torch.randn(total_q, num_q_heads + 2 * num_kv_heads, head_dim, generator=g).to(dtype)
    cu = torch.tensor([0] + torch.tensor([q for q, _ in specs]).cumsum(0).tolist(), dtype=torch.int32)
    batch = Batch(qkv[:, :num_q_heads], key_cache, value_cache, table, torch.tensor(seq_lens, dtype=torch.int32), cu)
    return Batch(*(t.to(DEVICE) for t in batch.args()))


def run_both(batch: Batch, **kw):
    out = nan_filled(batch.query.shape, batch.query.dtype, DEVICE)
    got = paged_attention(*batch.args(), out=out, **kw)
    assert got is out
    kw.pop("num_splits", None)
    want = paged_attention_ref(*batch.args(), **kw)
    return got, want


# (q_len, context_len) per sequence.
MIXED = [(1, 100), (63, 0), (20, 37), (1, 0), (5, 16), (0, 9), (33, 130)]
MIXED_BIG_BLOCKS = [(1, 300), (130, 0), (17, 250), (1, 127)]

CASES = [
    # id, specs, block_size, num_kv_heads, group, head_dim, dtype
    ("mixed-bs16-g4-d64-bf16", MIXED, 16, 2, 4, 64, "bf16"),
    ("mixed-bs16-g4-d64-fp16", MIXED, 16, 2, 4, 64, "fp16"),
    ("mixed-bs16-g4-d64-fp32", MIXED, 16, 2, 4, 64, "fp32"),
    ("mixed-bs16-g1-d128-bf16", MIXED, 16, 2, 1, 128, "bf16"),
    ("mixed-bs32-g4-d80-bf16", MIXED, 32, 1, 4, 80, "bf16"),
    ("mixed-bs128-g4-d128-bf16", MIXED_BIG_BLOCKS, 128, 1, 4, 128, "bf16"),
    ("mixed-bs256-g1-d80-fp32", MIXED_BIG_BLOCKS, 256, 1, 1, 80, "fp32"),
    ("mixed-bs16-g3-d64-fp16", [(7, 40), (1, 3), (2, 0)], 16, 2, 3, 64, "fp16"),  # GROUP not a power of two
    ("decode-bs16-g4-d128-fp32", [(1, 70), (1, 15), (1, 0), (3, 33)], 16, 2, 4, 128, "fp32"),
    ("chunk-bs64-g4-d256-bf16", [(40, 70)], 64, 1, 4, 256, "bf16"),
    ("tiny-preset-bs4-g2-d16-fp32", [(1, 30), (19, 0), (6, 13)], 4, 2, 2, 16, "fp32"),
    ("bs1-g2-d24-bf16", [(1, 9), (5, 3)], 1, 1, 2, 24, "bf16"),
]


@pytest.mark.parametrize("specs,block_size,num_kv_heads,group,head_dim,dtype",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_paged_attention_matches_reference(specs, block_size, num_kv_heads, group, head_dim, dtype):
    batch = make_batch(specs, block_size=block_size, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                       dtype=DTYPES[dtype], seed=len(specs) * head_dim + block_size)
    got, want = run_both(batch)
    assert_close(got, want, DTYPES[dtype], msg=f"{specs}")


CPU_CASES = [c for c in CASES if c[0] in ("mixed-bs16-g4-d64-bf16", "mixed-bs256-g1-d80-fp32",
                                          "mixed-bs16-g3-d64-fp16", "chunk-bs64-g4-d256-bf16")]


@pytest.mark.parametrize("specs,block_size,num_kv_heads,group,head_dim,dtype",
                         [c[1:] for c in CPU_CASES], ids=[c[0] for c in CPU_CASES])
def test_cpu_path_matches_reference(specs, block_size, num_kv_heads, group, head_dim, dtype):
    """The model's CPU path (GQA heads folded into the rows, row blocks) against the oracle."""
    batch = make_batch(specs, block_size=block_size, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                       dtype=DTYPES[dtype], seed=len(specs) * head_dim + block_size)
    assert_close(paged_attention_cpu(*batch.args()), paged_attention_ref(*batch.args()), DTYPES[dtype], msg=f"{specs}")


def runs_batch(seq_len, runs, *, block_size, num_kv_heads, group, head_dim, dtype, seed=0) -> Batch:
    """One decode row over `seq_len` cached tokens whose block table is `runs` (block counts) of
    consecutive ids, the runs apart from each other and out of order, every other block NaN."""
    g = torch.Generator().manual_seed(seed)
    need = -(-seq_len // block_size)
    assert sum(runs) == need
    ids, next_free = [], 3 + 2 * sum(runs)  # the runs placed high to low, a NaN block between them
    for count in runs:
        next_free -= count + 1
        ids += range(next_free, next_free + count)
    num_blocks = 3 + 2 * sum(runs) + 1
    table = torch.full((1, need + 2), num_blocks - 1, dtype=torch.int32)  # trailing columns: a NaN block
    table[0, :need] = torch.tensor(ids, dtype=torch.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    value_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    pos = torch.arange(seq_len)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=g).to(dtype)
    write_kv_cache_ref(k, v, key_cache, value_cache, slots)
    qkv = torch.randn(1, num_kv_heads * (group + 2), head_dim, generator=g).to(dtype)
    return Batch(qkv[:, : num_kv_heads * group], key_cache, value_cache, table,
                 torch.tensor([seq_len], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))


RUN_CASES = [
    # id, seq_len, runs (block counts), block_size, num_kv_heads, group, head_dim, dtype
    ("one-run-ends-mid-block-g4-fp32", 1000, [63], 16, 1, 4, 64, "fp32"),
    ("two-runs-g4-bf16", 517, [32, 1], 16, 1, 4, 64, "bf16"),
    ("four-runs-g3-kv2-fp32", 130, [3, 1, 4, 1], 16, 2, 3, 80, "fp32"),
    ("one-block-one-token-g1-fp32", 1, [1], 16, 2, 1, 64, "fp32"),
    ("three-runs-bs1-g2-bf16", 9, [4, 2, 3], 1, 1, 2, 24, "bf16"),
]


@pytest.mark.parametrize("seq_len,runs,block_size,num_kv_heads,group,head_dim,dtype",
                         [c[1:] for c in RUN_CASES], ids=[c[0] for c in RUN_CASES])
def test_decode_reads_runs_of_blocks_in_place(seq_len, runs, block_size, num_kv_heads, group, head_dim, dtype,
                                              monkeypatch):
    """A decode row whose blocks are a few runs of consecutive ids attends them where they lie (a
    flash call per run, query heads of a key head as rows, merged by log-sum-exp): same output as
    the oracle, and the in-place path is the one taken (a fallback to the gather would also pass
    the comparison)."""
    batch = runs_batch(seq_len, runs, block_size=block_size, num_kv_heads=num_kv_heads, group=group,
                       head_dim=head_dim, dtype=DTYPES[dtype], seed=seq_len)
    calls = []
    inner = cpu_mod._decode_in_place
    monkeypatch.setattr(cpu_mod, "_decode_in_place", lambda *a: calls.append(len(a[3])) or inner(*a))
    monkeypatch.setattr(cpu_mod, "cpu_routes", lambda: CpuRoutes(bf16_attention="native"))  # bf16 read as it lies
    out = nan_filled(batch.query.shape, batch.query.dtype)
    paged_attention_cpu(*batch.args(), out=out)
    assert calls == [len(runs)]
    assert_close(out, paged_attention_ref(*batch.args()), DTYPES[dtype], msg=f"{runs}")


def test_more_runs_than_max_gather_and_agree(monkeypatch):
    """Past MAX_RUNS runs the row's keys are gathered (one copy) instead; both paths agree with the oracle."""
    runs = [2] * (cpu_mod.MAX_RUNS + 1)
    batch = runs_batch(150, runs, block_size=16, num_kv_heads=1, group=4, head_dim=64, dtype=torch.float32)
    assert cpu_mod._block_runs(batch.block_tables[0, :10].long()) is None
    assert cpu_mod._block_runs(batch.block_tables[0, :2].long()) == [(int(batch.block_tables[0, 0]), 2)]
    calls = []
    monkeypatch.setattr(cpu_mod, "_decode_in_place", lambda *a: calls.append(a))
    got = paged_attention_cpu(*batch.args())
    assert calls == []
    assert_close(got, paged_attention_ref(*batch.args()), torch.float32)


SPLIT_CASES = [
    # id, specs, block_size, head_dim, dtype, num_splits. Decode tiles are 64 keys (32 for fp32) and
    # splits are a whole number of tiles, so with pages of 256 split boundaries fall mid-page.
    ("bs256-ctx300-s3-bf16", [(1, 299), (1, 40)], 256, 128, "bf16", 3),
    ("bs256-ctx300-s8-empty-splits-fp16", [(1, 299), (1, 5)], 256, 64, "fp16", 8),
    ("bs16-ctx520-s5-d80-fp32", [(1, 519), (1, 200), (1, 0)], 16, 80, "fp32", 5),
    ("bs128-ctx-2k+16-over-4-s4-bf16", [(1, 527), (2, 300)], 128, 128, "bf16", 4),
    ("bs16-ctx520-s1-bf16", [(1, 519)], 16, 64, "bf16", 1),
]


@pytest.mark.parametrize("specs,block_size,head_dim,dtype,num_splits",
                         [c[1:] for c in SPLIT_CASES], ids=[c[0] for c in SPLIT_CASES])
def test_decode_split_k_matches_reference(specs, block_size, head_dim, dtype, num_splits):
    batch = make_batch(specs, block_size=block_size, num_kv_heads=2, group=4, head_dim=head_dim,
                       dtype=DTYPES[dtype], seed=num_splits)
    got, want = run_both(batch, num_splits=num_splits)
    assert_close(got, want, DTYPES[dtype], msg=f"{specs} splits={num_splits}")


def test_split_k_on_a_prefill_chunk_matches_reference():
    """Forced splits also hold for multi-row q tiles, where a split can hold no key for some rows."""
    batch = make_batch([(40, 90), (3, 0)], block_size=16, num_kv_heads=1, group=4, head_dim=64, dtype=torch.bfloat16)
    got, want = run_both(batch, num_splits=4)
    assert_close(got, want, torch.bfloat16)


def test_scale_and_out_with_strides():
    batch = make_batch([(9, 30), (1, 60)], block_size=16, num_kv_heads=2, group=2, head_dim=64, dtype=torch.float32)
    big = nan_filled((batch.query.shape[0], batch.query.shape[1] + 1, 64), torch.float32, DEVICE)
    out = big[:, 1:]  # a view with token stride 5 * 64
    got = paged_attention(*batch.args(), scale=0.3, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.isnan(big[:, 0]).all(), "wrote outside the out view"
    assert_close(got, paged_attention_ref(*batch.args(), scale=0.3), torch.float32)
    # the scale matters: the default (64 ** -0.5 = 0.125) gives a different answer
    fresh = paged_attention(*batch.args())
    assert fresh.dtype == torch.float32 and fresh.shape == batch.query.shape and fresh.is_contiguous()
    assert_close(fresh, paged_attention_ref(*batch.args()), torch.float32)
    assert not torch.allclose(got, fresh, atol=1e-3)


def test_default_split_heuristic_runs_split_k(monkeypatch):
    """num_splits=None on a long decode takes the split path (2 splits: 1100 keys, >= 512 a split)."""
    chosen = []
    choose = pa.choose_config
    monkeypatch.setattr(pa, "choose_config", lambda *a, **k: chosen.append(choose(*a, **k)) or chosen[-1])
    batch = make_batch([(1, 1099)], block_size=32, num_kv_heads=2, group=4, head_dim=64, dtype=torch.bfloat16)
    got, want = run_both(batch)
    assert [c.num_splits for c in chosen] == [2]
    assert_close(got, want, torch.bfloat16)


def test_cache_offsets_past_int32():
    """Blocks whose first element lies past 2^31 (batch 64 x 128K x 8 x 128 is 8.6e9 elements a cache).

    The caches are contiguous views into one storage: 2^31 elements of lead, then K, then V, each
    2^31 + 16K elements of 16-token blocks of 1 x 128. Only the six blocks the batch uses (the last
    ones, all past 2^31) are ever written; an int32 block_id * stride or slot * stride wraps below
    the cache into the lead, so the bug reads and writes the wrong rows instead of crashing.
    """
    block_size, head_dim, n_used = 16, 128, 6
    block_numel = block_size * head_dim
    num_blocks = 2**31 // block_numel + 8
    n, lead = num_blocks * block_numel, 2**31
    storage = torch.empty(lead + 2 * n, dtype=torch.bfloat16, device=DEVICE)
    key_cache = storage[lead:lead + n].view(num_blocks, block_size, 1, head_dim)
    value_cache = storage[lead + n:].view(num_blocks, block_size, 1, head_dim)
    specs = [(1, 40), (20, 13)]  # (q_len, context): a decode and a chunk over a prefix
    seq_lens = [q + ctx for q, ctx in specs]
    table = torch.arange(num_blocks - n_used, num_blocks, dtype=torch.int32).view(2, 3)
    pos = [torch.arange(n_tok) for n_tok in seq_lens]
    slots = torch.cat([table[s, p // block_size].long() * block_size + p % block_size for s, p in enumerate(pos)])
    g = torch.Generator().manual_seed(11)
    k, v = (torch.randn(len(slots), 1, head_dim, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    write_kv_cache(k, v, key_cache, value_cache, slots.to(DEVICE, torch.int32))
    assert torch.equal(key_cache.view(-1, 1, head_dim)[slots.to(DEVICE)], k), "K written at the wrong slots"
    assert torch.equal(value_cache.view(-1, 1, head_dim)[slots.to(DEVICE)], v), "V written at the wrong slots"
    query = torch.randn(21, 2, head_dim, generator=g).to(DEVICE, torch.bfloat16)
    args = (query, key_cache, value_cache, table.to(DEVICE), torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
            torch.tensor([0, 1, 21], dtype=torch.int32, device=DEVICE))
    want = paged_attention_ref(*args)
    for num_splits in (1, 2):
        got = paged_attention(*args, out=nan_filled(query.shape, query.dtype, DEVICE), num_splits=num_splits)
        assert_close(got, want, torch.bfloat16, msg=f"splits={num_splits}")


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    specs=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 150)), min_size=1, max_size=5),
    block_size=st.sampled_from([16, 48, 128]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([64, 80]),
    dtype=st.sampled_from(sorted(DTYPES)),
    num_splits=st.sampled_from([None, 1, 3]),
)
def test_random_batches_match_reference(specs, block_size, group, head_dim, dtype, num_splits):
    """Seeded random batches: any mix of q_len (0 included) and context, pages of 48 (not a power of 2)."""
    if sum(q for q, _ in specs) == 0:
        specs = specs + [(1, 0)]
    batch = make_batch(specs, block_size=block_size, num_kv_heads=1, group=group, head_dim=head_dim,
                       dtype=DTYPES[dtype], seed=len(specs))
    got, want = run_both(batch, num_splits=num_splits)
    assert_close(got, want, DTYPES[dtype], msg=f"{specs} splits={num_splits}")


def test_split_heuristic_splits_only_long_decodes():
    kw = dict(dtype=torch.bfloat16, head_dim=128, group=4, num_kv_heads=8, sm_count=132, num_splits=None)
    # batch 1 at 32K: 8 programs alone would fill 6% of 132 SMs; 32 splits make 256 programs
    assert pa.choose_config(decode=True, num_seqs=1, max_seq_len=32768, **kw).num_splits == 32
    assert pa.choose_config(decode=True, num_seqs=64, max_seq_len=1024, **kw).num_splits == 1
    assert pa.choose_config(decode=True, num_seqs=1, max_seq_len=1000, **kw).num_splits == 1  # < 2 x 512 keys
    assert pa.choose_config(decode=False, num_seqs=1, max_seq_len=32768, **kw).num_splits == 1
    assert pa.is_decode(1, 4) and pa.is_decode(4, 4) and not pa.is_decode(5, 4)


# ---------------------------------------------------------------------------------------------
# Mixed batches: the trailing decode rows in a split-K launch of their own (`choose_launches`).

MIXED_SPLIT_CASES = [
    # id, specs (q_len, context), block_size, num_kv_heads, group, head_dim, dtype, first decode-part
    # row, its splits. Decode rows of 1025+ keys split in 2 or 4 (>= 512 keys a split); the chunks
    # are short, so they visit far fewer keys per SM than the decode rows hold. A decode row is
    # q_len * group <= 16: q_len 2 at group 2 is one, q_len 9 is not.
    ("chunk-over-prefix+2-decodes-bs16-g4-d64-bf16", [(37, 50), (1, 1300), (1, 2100)], 16, 2, 4, 64, "bf16", 1, 4),
    ("2-chunks+q0+q2-bs48-g2-d80-fp16", [(20, 0), (9, 33), (1, 1030), (0, 70), (2, 1100)], 48, 1, 2, 80, "fp16",
     2, 2),
    ("decode-then-chunk-then-decode-bs32-g4-d64-fp32", [(1, 1100), (6, 3), (1, 1063)], 32, 1, 4, 64, "fp32", 2, 2),
]


@pytest.mark.parametrize("specs,block_size,num_kv_heads,group,head_dim,dtype,first,splits",
                         [c[1:] for c in MIXED_SPLIT_CASES], ids=[c[0] for c in MIXED_SPLIT_CASES])
def test_mixed_batch_splits_its_decode_rows(specs, block_size, num_kv_heads, group, head_dim, dtype, first, splits):
    batch = make_batch(specs, block_size=block_size, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                       dtype=DTYPES[dtype], seed=len(specs) + head_dim)
    checked = pa.plan(*batch.args())
    assert checked.decode_part is not None and checked.decode_part.first_seq == first
    assert checked.decode_part.first_token == sum(q for q, _ in specs[:first])
    assert checked.decode_part.config.num_splits == splits and checked.config.num_splits == 1
    got, want = run_both(batch)
    assert_close(got, want, DTYPES[dtype], msg=f"{specs}: two launches")
    one, _ = run_both(batch, num_splits=1)  # one launch: the decode rows ride the chunk's
    assert_close(one, want, DTYPES[dtype], msg=f"{specs}: one launch")


def test_mixed_batch_launches_attention_twice_and_merges_once(monkeypatch):
    batch = make_batch([(40, 20), (1, 1100)], block_size=16, num_kv_heads=1, group=4, head_dim=64,
                       dtype=torch.bfloat16)
    launched = []
    for kernel in (pa.paged_attention_kernel, pa.paged_attention_merge_kernel):
        monkeypatch.setattr(kernel, "run", lambda *a, _run=kernel.run, _n=kernel.fn.__name__, **k:
                            launched.append(_n) or _run(*a, **k))
    got, want = run_both(batch)
    assert launched == ["paged_attention_kernel", "paged_attention_kernel", "paged_attention_merge_kernel"]
    assert_close(got, want, torch.bfloat16)


def test_mixed_batch_rule_at_bamba_shapes():
    """32/8 heads of 128, bf16, 132 SMs: a 32K decode row leaves a short chunk's launch (8 programs
    of 32768 keys become 256 of 1024), stays in a long one, and forced splits keep one launch."""
    kw = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, max_blocks=2048, dtype=torch.bfloat16,
              device="meta")
    short = pa.plan_from_host([512, 1], [512, 32768], **kw)
    assert short.describe() == "m128n64w8s1+m16n64w4s32"
    part = short.decode_part
    assert (part.first_seq, part.first_token) == (1, 512)
    assert short.split_launch() == (part.config, 1)
    assert tuple(short.workspace.acc.shape) == (1, 32, 32, 128) and tuple(short.workspace.m.shape) == (1, 32, 32)
    meta = short.meta
    assert pa._prefill_keys_per_sm(meta, 1, 32, 8, 132) == pytest.approx(34816 / 132)  # 264 keys an SM
    for q in (5900, 8192):  # 33K and 64K keys an SM: the row rides the chunk's first wave
        long = pa.plan_from_host([q, 1], [q, 32768], **kw)
        assert long.decode_part is None and long.workspace is None and long.describe() == "m128n64w8s1"
    assert pa.plan_from_host([5700, 1], [5700, 32768], **kw).decode_part is not None  # 31K keys an SM
    short_rows = pa.plan_from_host([512, 1], [512, 900], **kw)  # < 2 x 512 keys: the decode rows would not split
    assert short_rows.decode_part is None
    forced = pa.plan_from_host([512, 1], [512, 32768], num_splits=1, **kw)
    assert forced.decode_part is None and forced.workspace is None
    interleaved = pa.plan_from_host([1, 512], [32768, 512], **kw)  # a decode row before the chunk rides it
    assert interleaved.decode_part is None


# ---------------------------------------------------------------------------------------------
# Split-K workspaces passed in: no allocation in the launcher.


class _NoAllocTorch:
    """`torch` as the launcher module sees it, with its allocating constructors failing the test."""

    ALLOCATORS = ("empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "ones")

    def __getattr__(self, name):
        if name in self.ALLOCATORS:
            raise AssertionError(f"torch.{name} called in kernels.paged_attention")
        return getattr(torch, name)


@pytest.mark.parametrize("specs", [[(1, 1099), (1, 700)], [(30, 12), (1, 1099), (1, 700)]],
                         ids=["decode", "mixed"])
def test_split_k_runs_in_the_workspace_it_is_given(specs, monkeypatch):
    batch = make_batch(specs, block_size=32, num_kv_heads=2, group=4, head_dim=64, dtype=torch.bfloat16, seed=5)
    checked = pa.plan(*batch.args())
    assert checked.workspace is None  # the tensor-checked plan leaves the workspace to the launch
    cfg, rows = checked.split_launch()
    assert (cfg.num_splits, rows) == (2, 2)
    ws = pa.allocate_split_workspace(rows + 1, 8, cfg.num_splits, 64, DEVICE)  # one row more than needed
    for t in (ws.acc, ws.m, ws.l):
        t.fill_(float("nan"))
    out = nan_filled(batch.query.shape, batch.query.dtype, DEVICE)
    with monkeypatch.context() as m:
        m.setattr(pa, "torch", _NoAllocTorch())
        pa.launch(checked, *batch.args(), out, workspace=ws)
        with pytest.raises(AssertionError, match="torch.empty"):  # the fallback allocates: the guard can fail
            pa.launch(checked, *batch.args(), nan_filled(out.shape, out.dtype, DEVICE))
    assert not torch.isnan(ws.acc[:rows]).any() and not torch.isnan(ws.l[:rows]).any(), "partials not written there"
    assert torch.isnan(ws.acc[rows:]).all(), "wrote past the launch's rows"
    want = paged_attention_ref(*batch.args())
    assert_close(out, want, torch.bfloat16, msg="given workspace")
    unsplit, _ = run_both(batch, num_splits=1)
    assert_close(out, unsplit, torch.bfloat16, msg="split vs one split")
    fresh = pa.launch(checked, *batch.args(), nan_filled(out.shape, out.dtype, DEVICE))  # allocates its own
    assert torch.equal(fresh, out)


@pytest.mark.parametrize("specs", [[(1, 1099)], [(30, 12), (1, 1099)]], ids=["decode", "mixed"])
def test_workspace_of_the_wrong_shape_is_refused(specs):
    """Before any launch: in a mixed batch the chunk's launch (no workspace) would come first."""
    batch = make_batch(specs, block_size=32, num_kv_heads=2, group=4, head_dim=64, dtype=torch.bfloat16)
    checked = pa.plan(*batch.args())
    out = nan_filled(batch.query.shape, batch.query.dtype, DEVICE)
    for bad in (pa.allocate_split_workspace(1, 8, 4, 64, DEVICE),  # 4 splits for a 2-split launch
                pa.allocate_split_workspace(0, 8, 2, 64, DEVICE)):  # no row
        with pytest.raises(ValueError, match="workspace"):
            pa.launch(checked, *batch.args(), out, workspace=bad)
    assert torch.isnan(out).all()


def test_reference_matches_dense_attention_and_row_blocking():
    """The oracle, and the CPU path (a chunk after a cached prefix: two flash calls merged by their
    log-sum-exps), against per-sequence dense SDPA in fp64."""
    batch = make_batch([(1, 37), (63, 0), (20, 100), (0, 5)], block_size=16, num_kv_heads=2, group=3, head_dim=32,
                       dtype=torch.float32)
    q, kc, vc, bt, sl, cu = (t.cpu() for t in batch.args())
    want = torch.empty(q.shape, dtype=torch.float64)
    for s in range(len(sl)):
        n, (a, b) = int(sl[s]), cu[s : s + 2].tolist()
        pos = torch.arange(n)
        slot = bt[s, pos // 16].long() * 16 + pos % 16
        k = kc.view(-1, 2, 32)[slot].double().repeat_interleave(3, 1).transpose(0, 1)
        v = vc.view(-1, 2, 32)[slot].double().repeat_interleave(3, 1).transpose(0, 1)
        visible = pos[None, :] <= (n - (b - a) + torch.arange(b - a))[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q[a:b].double().transpose(0, 1), k, v, attn_mask=visible)
        want[a:b] = o.transpose(0, 1)
    torch.testing.assert_close(paged_attention_ref(q, kc, vc, bt, sl, cu).double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(paged_attention_cpu(q, kc, vc, bt, sl, cu).double(), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Bad inputs: ValueError before anything is launched or written, from the kernel and (where the
# limit is not the kernel's own) from the oracle.


def _bad_batch(name):
    b = make_batch([(3, 20), (1, 40)], block_size=16, num_kv_heads=2, group=2, head_dim=64, dtype=torch.float16)
    args = dict(query=b.query, key_cache=b.key_cache, value_cache=b.value_cache, block_tables=b.block_tables,
                seq_lens=b.seq_lens, cu_seqlens_q=b.cu_seqlens_q)
    kw = {}
    if name == "query-dtype-vs-cache":
        args["query"] = b.query.float()
    elif name == "cache-dtype-pair":
        args["value_cache"] = b.value_cache.bfloat16()
    elif name == "device-mismatch":
        args["seq_lens"] = torch.empty(b.seq_lens.shape, dtype=torch.int32, device="meta")
    elif name == "heads-not-multiple":
        args["query"] = torch.zeros(4, 3, 64, dtype=torch.float16, device=DEVICE)
    elif name == "block-table-too-short":
        args["block_tables"] = b.block_tables[:, :2]  # seq 1 has 41 tokens: 3 blocks of 16
    elif name == "block-id-out-of-range":
        bt = b.block_tables.clone()
        bt[1, 2] = b.key_cache.shape[0]
        args["block_tables"] = bt
    elif name == "block-tables-int64":
        args["block_tables"] = b.block_tables.long()
    elif name == "seq-len-below-q-len":
        args["seq_lens"] = torch.tensor([2, 41], dtype=torch.int32, device=DEVICE)
    elif name == "cu-seqlens-end":
        args["cu_seqlens_q"] = torch.tensor([0, 3, 5], dtype=torch.int32, device=DEVICE)
    elif name == "cu-seqlens-decreasing":
        args["cu_seqlens_q"] = torch.tensor([0, 5, 4], dtype=torch.int32, device=DEVICE)
        args["query"] = torch.zeros(4, 4, 64, dtype=torch.float16, device=DEVICE)
    elif name == "out-shape":
        kw["out"] = torch.empty(4, 4, 32, dtype=torch.float16, device=DEVICE)
    elif name == "cache-not-contiguous":
        # (num_blocks, num_kv_heads, block_size, head_dim) memory seen through our shape
        args["key_cache"] = b.key_cache.transpose(1, 2).contiguous().transpose(1, 2)
    elif name == "query-int":
        args["query"] = b.query.to(torch.int32)
    # the kernel's own limits
    elif name == "group-65":
        args["query"] = torch.zeros(4, 130, 64, dtype=torch.float16, device=DEVICE)
    elif name == "head-dim-512":
        small = make_batch([(3, 20), (1, 40)], block_size=16, num_kv_heads=2, group=2, head_dim=512,
                           dtype=torch.float16)
        args = dict(zip(args, small.args()))
    elif name == "query-head-dim-strided":
        args["query"] = torch.zeros(4, 4, 128, dtype=torch.float16, device=DEVICE)[..., ::2]
    elif name == "num-splits-0":
        kw["num_splits"] = 0
    elif name == "num-splits-65":
        kw["num_splits"] = 65
    return args, kw


# What each error must name (the argument, or the limit).
MATCH = {
    "query-dtype-vs-cache": "dtype", "cache-dtype-pair": "value_cache dtype", "device-mismatch": "device",
    "heads-not-multiple": "multiple of num_kv_heads", "block-table-too-short": "block_tables has 2 columns",
    "block-id-out-of-range": "block id outside", "block-tables-int64": "block_tables dtype",
    "seq-len-below-q-len": r"seq_lens\[0\]", "cu-seqlens-end": "cu_seqlens_q must run from 0",
    "cu-seqlens-decreasing": "non-decreasing", "out-shape": "out must be", "cache-not-contiguous": "contiguous",
    "query-int": "query dtype", "group-65": r"num_q_heads // num_kv_heads must be in 1..64",
    "head-dim-512": r"head_dim must be in 1..256", "query-head-dim-strided": "unit stride",
    "num-splits-0": "num_splits", "num-splits-65": "num_splits",
}
KERNEL_ONLY = {"group-65", "head-dim-512", "query-head-dim-strided", "num-splits-0", "num-splits-65"}
BAD = ["query-dtype-vs-cache", "cache-dtype-pair", "device-mismatch", "heads-not-multiple", "block-table-too-short",
       "block-id-out-of-range", "block-tables-int64", "seq-len-below-q-len", "cu-seqlens-end", "cu-seqlens-decreasing",
       "out-shape", "cache-not-contiguous", "query-int", *sorted(KERNEL_ONLY)]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_raises_before_launch(name, monkeypatch):
    args, kw = _bad_batch(name)
    launched = []
    monkeypatch.setattr(pa, "launch", lambda *a, **k: launched.append(1))
    with pytest.raises(ValueError, match=MATCH[name]):
        paged_attention(**args, **kw)
    assert not launched
    if name not in KERNEL_ONLY:
        kw.pop("num_splits", None)
        with pytest.raises(ValueError, match=MATCH[name]):
            paged_attention_ref(**args, **kw)
        with pytest.raises(ValueError, match=MATCH[name]):
            paged_attention_cpu(**args, **kw)
    else:  # a limit of the kernel alone: the oracle runs it
        kw.pop("num_splits", None)
        assert not torch.isnan(paged_attention_ref(**args, **kw)).any()


def test_bad_input_leaves_out_untouched():
    args, _ = _bad_batch("block-table-too-short")
    out = nan_filled(args["query"].shape, args["query"].dtype, DEVICE)
    with pytest.raises(ValueError, match="block_tables"):
        paged_attention(**args, out=out)
    assert torch.isnan(out).all()
