"""Benchmark the Triton paged attention on CUDA: decode in GB/s, a prefill chunk in TFLOP/s, with peers.

* Device copy bandwidth is measured first, in the same run (a large copy: bytes read + written).
* Decode: batch 1..64, context 1K..128K, 32 query / 8 KV heads, head_dim 128, bf16: GB/s of K/V read
  (plus queries, outputs and block tables) against that copy bandwidth.
* Prefill chunk: 8192 queries over a 0..32K cached prefix: TFLOP/s (4 * Hq * D per visible pair).
* Peers in the same run: torch SDPA on contiguous K/V (flash backend forced where it accepts the
  call), FlexAttention over a page table (its own 128-token pages) where
  `torch.nn.attention.flex_attention` imports, and vLLM's Triton unified attention on the same
  paged cache where `bash scripts/fetch_peers.sh` fetched it (``vllm_unified``).
* Mixed batch: one fresh prefill chunk (512 / 8192 queries) beside one decode row at 32K context:
  the default plan (the decode row in its own split-K launch when `choose_launches` says so, note
  e.g. "m128n64w8s1+m16n64w4s32") against the one-launch plan (``num_splits=1``: the decode row
  rides the chunk's launch), launch alone, ms (issue 11's measured reason, either way).
* FlexAttention compiles per shape, and past Dynamo's recompile limit (8 by default) later shapes
  would run eager flex under the same label: Dynamo is reset before each shape's flex peer, so each
  compiles afresh (note "flex:page128:compiled"); on a CPU (``--device cpu``, the dry run) flex runs
  eager and says so ("flex:page128:eager").
* Ratios: ``peer_over_ours`` (a peer's ms over the Triton launch's at the same config: above 1, ours is
  faster), ``pct_copy_bw`` (GB/s over the copy ceiling) and ``pct_gemm`` (TFLOP/s over the GEMM
  ceiling), the ceilings from ``--ceilings`` (``python -m experiments.bench.ceilings``) or, without
  it, the copy measured here.
* Every config is checked against the oracle `paged_attention_ref` before it is timed; a failing
  one is not reported (the row says so), and the script exits 1.
* The Triton kernel is timed twice: the launch alone (`paged_attention.launch` of a plan made once:
  column ``ms``) and the public call with its host-side checks (``ms_call``).

Writes ``bench.csv`` (device, versions, config, numbers; rewritten after every config) and a PNG drawn
from the CSV by `plot`, into a new ``runs/bench_paged_attention/<timestamp>/`` (``--publish``:
``results/bench_paged_attention/``). The attention shape is a model preset's (``--model``).
On a machine without CUDA it says so and exits 0 without writing anything, unless ``--device cpu``
is given with TRITON_INTERPRET=1 (the GPU script's ``--dry-run``: tiny shapes through the interpreter,
timed with ``time.perf_counter``).

    python -m experiments.bench.paged_attention                    # the full sweep (H200: minutes)
    python -m experiments.bench.paged_attention --batches 1 --contexts 32768 --prefixes 0
    python -m experiments.bench.paged_attention --replot --out DIR  # redraw the PNG from DIR/bench.csv
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

from experiments.bench.ratios import add_peer_ratios, load_ceilings, pct_of
from experiments.common.results_io import environment, log, read_csv, write_csv
from experiments.common.study import Context, NothingToRun, Ran, Study, run_study
from kernels.testing import tolerance

CSV_NAME = "bench.csv"
PNG_NAME = "bench.png"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


RECORD = "bench_paged_attention"
CSV_COLUMNS = ("device", "kind", "impl", "batch", "context", "correct", "ms", "gbps", "tflops", "copy_gbps")


def int_list_or_none(lo: int):
    """Comma-separated integers >= lo, or '' for none."""
    from experiments.common.flags import int_list

    check = int_list(lo)
    return lambda text: [] if not text.strip() else check(text)


def add_flags(p) -> None:
    from experiments.common.flags import device_name, float_in_range, int_in_range, int_list
    from experiments.bench import preset_name

    p.add_argument("--model", type=preset_name, default="bamba-9b",
                   help="model preset whose attention shape to time (query heads, KV heads, head dim)")
    p.add_argument("--batches", type=int_list(1), default="1,4,16,64", metavar="B,...",
                   help="decode batch sizes, comma-separated")
    p.add_argument("--contexts", type=int_list(1), default="1024,4096,16384,32768,131072", metavar="T,...",
                   help="decode context lengths in tokens, comma-separated")
    p.add_argument("--prefill-queries", type=int_in_range(1), default=8192, help="query tokens in the prefill chunk")
    p.add_argument("--prefixes", type=int_list_or_none(0), default="0,4096,8192,16384,32768", metavar="T,...",
                   help="cached-prefix lengths for the prefill chunk, comma-separated; '' for none")
    p.add_argument("--mixed-chunks", type=int_list_or_none(1), default="512,8192", metavar="T,...",
                   help="fresh prefill chunk lengths of the mixed batches, comma-separated; '' for none")
    p.add_argument("--mixed-context", type=int_in_range(1), default=32768,
                   help="context of the decode row beside each mixed chunk")
    p.add_argument("--block-size", type=int_in_range(1), default=16, help="KV cache block (page) size")
    p.add_argument("--flex-page-size", type=int_in_range(1), default=128,
                   help="page size of the FlexAttention peer's own cache; flex needs it equal to its KV block")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="input dtype")
    p.add_argument("--max-kv-gib", type=float_in_range(0, lo_open=True), default=32.0,
                   help="skip configs whose paged K+V cache exceeds this many GiB; peers copy it once more")
    p.add_argument("--no-peers", action="store_true", help="time only the Triton kernel")
    p.add_argument("--warmup", type=int_in_range(1), default=25, help="do_bench warmup, ms")
    p.add_argument("--rep", type=int_in_range(1), default=100, help="do_bench repetition time, ms")
    p.add_argument("--seed", type=int_in_range(0, 2**32 - 1), default=0, help="random seed")
    p.add_argument("--device", type=device_name, default=None,
                   help="cuda (absent: cuda), or cpu through the Triton interpreter (TRITON_INTERPRET=1; a dry run)")
    p.add_argument("--ceilings", type=Path, default=None,
                   help="a ceilings.json (python -m experiments.bench.ceilings): copy GB/s and GEMM TFLOP/s")


def derive_args(args) -> None:
    """The device default and the preset's attention shape (query heads, KV heads, head dim) on `args`."""
    from model.families import PRESETS

    args.device = args.device or "cuda"
    c = PRESETS[args.model]
    args.num_q_heads, args.num_kv_heads, args.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


# ------------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass
class Problem:
    query: torch.Tensor  # (T, Hq, D)
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    q_len: int  # every sequence has the same q_len and seq_len here
    seq_len: int

    def args(self):
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens, self.cu_seqlens_q)


def make_problem(batch, q_len, seq_len, heads_q, heads_kv, head_dim, block_size, dtype, device) -> Problem:
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, heads_kv, head_dim)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    block_tables = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
    query = torch.randn(batch * q_len, heads_q, head_dim, dtype=dtype, device=device)
    seq_lens = torch.full((batch,), seq_len, dtype=torch.int32, device=device)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device) * q_len
    return Problem(query, key_cache, value_cache, block_tables, seq_lens, cu, q_len, seq_len)


def contiguous_kv(pb: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Hkv, seq_len, D) copies of each sequence's K and V, for SDPA."""
    batch = pb.block_tables.shape[0]
    _, bs, heads_kv, head_dim = pb.key_cache.shape

    def gather(cache):
        x = cache[pb.block_tables.long()].view(batch, -1, heads_kv, head_dim)[:, : pb.seq_len]
        return x.permute(0, 2, 1, 3).contiguous()

    return gather(pb.key_cache), gather(pb.value_cache)


def queries_4d(pb: Problem) -> torch.Tensor:
    batch = pb.block_tables.shape[0]
    return pb.query.view(batch, pb.q_len, *pb.query.shape[1:]).transpose(1, 2)  # (B, Hq, q_len, D)


# ------------------------------------------------------------------------------------------------
# Peers


def sdpa_peer(pb: Problem, k: torch.Tensor, v: torch.Tensor):
    """SDPA on contiguous K/V, bottom-right causal; flash backend forced where it takes the call."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = queries_4d(pb)
    if pb.q_len == 1:
        kwargs = {}
    elif pb.q_len == pb.seq_len:
        kwargs = {"is_causal": True}
    else:
        from torch.nn.attention.bias import causal_lower_right

        kwargs = {"attn_mask": causal_lower_right(pb.q_len, pb.seq_len)}

    def run():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)

    def run_flash():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return run()

    try:
        run_flash()
        fn, note = run_flash, "sdpa:flash"
    except RuntimeError:
        fn, note = run, "sdpa:default-dispatch"

    def call():
        return fn().transpose(1, 2).reshape(pb.query.shape)

    return call, note


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_paged_peer(pb: Problem, k: torch.Tensor, v: torch.Tensor, page_size: int, compile_fn=True):
    """FlexAttention over a page table: K/V in (1, Hkv, n_pages * page, D) physical pages in random
    order; the logical block mask is mapped to physical pages and the mask_mod maps back."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    device = pb.query.device
    batch, heads_kv, seq_len, head_dim = k.shape
    pages_per_seq = -(-seq_len // page_size)
    n_pages = batch * pages_per_seq
    page_table = torch.randperm(n_pages, device=device).view(batch, pages_per_seq)
    phys_to_log = torch.full((batch, n_pages), -1, dtype=torch.int64, device=device)
    phys_to_log.scatter_(1, page_table, torch.arange(pages_per_seq, device=device).expand(batch, -1).contiguous())

    def to_pages(x):
        pad = pages_per_seq * page_size - seq_len
        x = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(batch, heads_kv, pages_per_seq, page_size, head_dim)
        phys = torch.empty(n_pages, heads_kv, page_size, head_dim, dtype=x.dtype, device=device)
        phys[page_table.reshape(-1)] = x.permute(0, 2, 1, 3, 4).reshape(-1, heads_kv, page_size, head_dim)
        return phys.permute(1, 0, 2, 3).reshape(1, heads_kv, n_pages * page_size, head_dim)

    k_phys, v_phys = to_pages(k), to_pages(v)
    context = seq_len - pb.q_len

    def logical_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= context + q_idx) & (kv_idx < seq_len)

    logical = create_block_mask(logical_mask, batch, None, pb.q_len, pages_per_seq * page_size,
                                device=device, BLOCK_SIZE=(128, page_size))
    rows = logical.kv_indices.shape[2]

    def to_physical(indices):
        if indices is None:
            return None
        phys = torch.zeros((batch, 1, rows, n_pages), dtype=torch.int32, device=device)
        phys[..., : indices.shape[-1]] = torch.gather(page_table, 1, indices.view(batch, -1).long()).view(
            indices.shape).to(torch.int32)
        return phys

    def physical_mask(b, h, q_idx, kv_idx):
        log_page = phys_to_log[b, kv_idx // page_size]
        log_kv = log_page * page_size + kv_idx % page_size
        return (log_page >= 0) & (log_kv < seq_len) & (log_kv <= context + q_idx)

    mask = BlockMask.from_kv_blocks(
        logical.kv_num_blocks, to_physical(logical.kv_indices), logical.full_kv_num_blocks,
        to_physical(logical.full_kv_indices), BLOCK_SIZE=logical.BLOCK_SIZE, mask_mod=physical_mask,
        seq_lengths=(pb.q_len, n_pages * page_size),
    )
    if compile_fn:
        torch._dynamo.reset()  # a fresh compile for this shape: never past the recompile limit, never eager
    attend = torch.compile(flex_attention, dynamic=False) if compile_fn else flex_attention
    q = queries_4d(pb)

    def call():
        return attend(q, k_phys, v_phys, block_mask=mask, enable_gqa=True).transpose(1, 2).reshape(pb.query.shape)

    return call, f"flex:page{page_size}:{'compiled' if compile_fn else 'eager'}"


# ------------------------------------------------------------------------------------------------
# Measurement


def empty_cache(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth_gbps(device, do_bench, nbytes=4 * 2**30) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def decode_bytes(pb: Problem) -> int:
    el = pb.key_cache.element_size()
    _, _, heads_kv, head_dim = pb.key_cache.shape
    batch = pb.block_tables.shape[0]
    kv = 2 * batch * pb.seq_len * heads_kv * head_dim * el
    q_and_out = 2 * pb.query.numel() * el
    tables = -(-pb.seq_len // pb.key_cache.shape[1]) * batch * 4
    return kv + q_and_out + tables


def attention_flops(pb: Problem) -> float:
    batch = pb.block_tables.shape[0]
    context = pb.seq_len - pb.q_len
    pairs = pb.q_len * context + pb.q_len * (pb.q_len + 1) / 2  # (query, visible key) pairs
    return 4.0 * batch * pb.query.shape[1] * pb.query.shape[2] * pairs


def make_mixed_problem(chunk, context, heads_q, heads_kv, head_dim, block_size, dtype, device) -> tuple:
    """A fresh chunk of `chunk` queries, then one decode row over `context` cached tokens: the
    paged-attention arguments, block ids a random permutation."""
    lens = [chunk, context + 1]
    blocks = [-(-n // block_size) for n in lens]
    shape = (sum(blocks), block_size, heads_kv, head_dim)
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    perm = torch.randperm(sum(blocks), device=device).to(torch.int32)
    block_tables = torch.zeros(2, max(blocks), dtype=torch.int32, device=device)
    block_tables[0, :blocks[0]], block_tables[1, :blocks[1]] = perm[:blocks[0]], perm[blocks[0]:]
    query = torch.randn(chunk + 1, heads_q, head_dim, dtype=dtype, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    cu = torch.tensor([0, chunk, chunk + 1], dtype=torch.int32, device=device)
    return query, key_cache, value_cache, block_tables, seq_lens, cu


def run_mixed(chunk, args, env, do_bench, rows, device) -> bool:
    """The default plan of a mixed batch against the one-launch plan: launch alone, checked first."""
    from kernels import paged_attention as pa
    from kernels.reference.paged_attention import paged_attention_ref

    dtype = DTYPES[args.dtype]
    problem = make_mixed_problem(chunk, args.mixed_context, args.num_q_heads, args.num_kv_heads, args.head_dim,
                                 args.block_size, dtype, device)
    want = paged_attention_ref(*problem)
    base = dict(env, kind="mixed", batch=2, q_len=chunk, seq_len=args.mixed_context + 1, context=args.mixed_context,
                num_q_heads=args.num_q_heads, num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
                block_size=args.block_size, dtype=args.dtype)
    all_ok = True
    for impl, num_splits in (("triton_paged", None), ("triton_paged_one_launch", 1)):
        out = torch.empty_like(problem[0])
        checked = pa.plan(*problem, out=out, num_splits=num_splits)
        rows_ws, splits = _split_rows(checked)  # preallocated, as the model's step plan holds it
        workspace = pa.allocate_split_workspace(rows_ws, args.num_q_heads, splits, args.head_dim, problem[0].device)
        fn = lambda: pa.launch(checked, *problem, out, workspace)  # noqa: E731
        ok, err = close_enough(fn(), want, dtype)
        row = dict(base, impl=impl, note=checked.describe(), max_abs_err=f"{err:.3g}", correct=ok)
        if ok:
            ms = do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")
            row["ms"] = f"{ms:.4f}"
            log(f"  {impl:<24} {checked.describe():<26} {ms:9.4f} ms")
        else:
            log(f"  {impl:<24} {checked.describe():<26} WRONG (max abs err {err:.3g}): not reported")
        all_ok &= ok
        rows.append(row)
    return all_ok


def _split_rows(checked) -> tuple[int, int]:
    """(rows, splits) of the plan's split-K launch; (0, 1) without one (an empty workspace, unused)."""
    split = checked.split_launch()
    return (0, 1) if split is None else (split[1], split[0].num_splits)


def close_enough(got, want, dtype) -> tuple[bool, float]:
    err = (got.float() - want.float()).abs().max().item()
    ok = bool(torch.allclose(got.float(), want.float(), **tolerance(dtype))) and not torch.isnan(got).any().item()
    return ok, err


def run_config(kind, pb, args, env, do_bench, ceilings, rows):
    """Check and time the Triton kernel (and the peers) on one problem; appends a row per impl."""
    from kernels import paged_attention as pa
    from kernels.reference.paged_attention import paged_attention_ref

    dtype = pb.query.dtype
    want = paged_attention_ref(*pb.args())
    batch = pb.block_tables.shape[0]
    base = dict(env, kind=kind, batch=batch, q_len=pb.q_len, seq_len=pb.seq_len, context=pb.seq_len - pb.q_len,
                num_q_heads=pb.query.shape[1], num_kv_heads=pb.key_cache.shape[2], head_dim=pb.query.shape[2],
                block_size=pb.key_cache.shape[1], dtype=str(dtype).replace("torch.", ""),
                copy_gbps=round(ceilings["copy_gbps"], 1))
    nbytes, flops = decode_bytes(pb), attention_flops(pb)

    def report(impl, note, fn, ms_call=None):
        got = fn()
        ok, err = close_enough(got, want, dtype)
        row = dict(base, impl=impl, note=note, max_abs_err=f"{err:.3g}", correct=ok)
        if ok:
            ms = do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")
            row.update(ms=f"{ms:.4f}", gbps=f"{nbytes / (ms * 1e-3) / 1e9:.1f}",
                       pct_copy_bw=pct_of(nbytes / (ms * 1e-3) / 1e9, ceilings["copy_gbps"]),
                       tflops=f"{flops / (ms * 1e-3) / 1e12:.4g}",
                       pct_gemm=pct_of(flops / (ms * 1e-3) / 1e12, ceilings.get("gemm_tflops")),
                       ms_call="" if ms_call is None else f"{ms_call:.4f}")
            log(f"  {impl:<22} {note:<24} {ms:9.4f} ms {row['gbps']:>8} GB/s ({row['pct_copy_bw']}% of copy) "
                f"{row['tflops']:>7} TFLOP/s")
        else:
            log(f"  {impl:<22} {note:<24} WRONG (max abs err {err:.3g}): not reported")
        rows.append(row)
        return ok

    # Triton: the launch alone (checked once, by `plan`), and the public call with its host-side checks.
    out = torch.empty_like(pb.query)
    checked = pa.plan(*pb.args(), out=out)
    launch = lambda: pa.launch(checked, *pb.args(), out)  # noqa: E731
    ms_call = do_bench(lambda: pa.paged_attention(*pb.args(), out=out), warmup=args.warmup, rep=args.rep,
                       return_mode="median")
    all_ok = report("triton_paged", checked.describe(), launch, ms_call)
    if args.no_peers:
        return all_ok
    k, v = contiguous_kv(pb)
    try:
        fn, note = sdpa_peer(pb, k, v)
        all_ok &= report("sdpa_contiguous", note, fn)
    except Exception as exc:  # a peer that cannot run this shape is recorded, not fatal
        rows.append(dict(base, impl="sdpa_contiguous", note=f"unavailable: {type(exc).__name__}: {exc}"[:200]))
    if flex_available():
        try:
            fn, note = flex_paged_peer(pb, k, v, args.flex_page_size, compile_fn=pb.query.is_cuda)
            all_ok &= report("flex_paged", note, fn)
        except Exception as exc:
            rows.append(dict(base, impl="flex_paged", note=f"unavailable: {type(exc).__name__}: {exc}"[:200]))
    else:
        rows.append(dict(base, impl="flex_paged", note="unavailable: torch.nn.attention.flex_attention"))
    del k, v
    vllm_peer(pb, report, base, rows)
    return all_ok


def vllm_peer(pb, report, base: dict, rows: list) -> None:
    """vLLM's Triton unified attention on the same paged cache (peers/vllm, bash scripts/fetch_peers.sh).
    Checked like the others; a wrong result is not reported, but it does not fail the bench: it is
    another project's kernel behind stand-ins for its imports (experiments.bench.peers)."""
    from experiments.bench import peers

    fn, why = peers.load_vllm_unified_attention()
    if fn is None:
        rows.append(dict(base, impl="vllm_unified", note=f"unavailable: {why}"[:200]))
        return
    try:
        call = peers.shimmed(peers.vllm_call(fn, *pb.args(), pb.q_len, pb.seq_len))
        report("vllm_unified", f"unified_attention ({peers.versions().get('vllm', '?')})", call)
    except Exception as exc:  # noqa: BLE001
        rows.append(dict(base, impl="vllm_unified", note=f"unavailable: {type(exc).__name__}: {exc}"[:200]))


FIELDS = ["device", "torch", "triton", "python", "kind", "impl", "note", "batch", "q_len", "seq_len", "context",
          "num_q_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "correct", "max_abs_err", "ms",
          "ms_call", "gbps", "copy_gbps", "pct_copy_bw", "tflops", "pct_gemm", "peer_over_ours"]


def plot(csv_path: Path, png_path: Path) -> None:
    """Decode GB/s against context (per batch, with the copy bandwidth and the 85% goal), prefill TFLOP/s
    against prefix (with the goal: >= 0.9x SDPA's)."""
    from experiments.common import figure_style as fs

    plt = fs.pyplot()
    rows = [r for r in read_csv(csv_path) if r.get("correct") == "True" and r.get("ms")]
    fig, (ax_d, ax_p) = plt.subplots(1, 2, figsize=(14, 5))
    batches = sorted({int(r["batch"]) for r in rows if r["kind"] == "decode"})
    batch_ls = dict(zip(batches, ("-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1)))))
    for impl in ("triton_paged", "sdpa_contiguous", "flex_paged", "vllm_unified"):
        for batch in batches:
            pts = sorted((int(r["context"]), float(r["gbps"])) for r in rows
                         if r["kind"] == "decode" and r["impl"] == impl and int(r["batch"]) == batch)
            if pts:
                ax_d.plot(*zip(*pts), **fs.line(impl, linestyle=batch_ls.get(batch, "-")), label=f"{impl} B={batch}",
                          alpha=1.0 if impl == "triton_paged" else 0.6)
        pts = sorted((int(r["context"]), float(r["tflops"])) for r in rows
                     if r["kind"] == "prefill" and r["impl"] == impl)
        if pts:
            ax_p.plot(*zip(*pts), **fs.line(impl), label=impl)
    sdpa = sorted((int(r["context"]), float(r["tflops"])) for r in rows
                  if r["kind"] == "prefill" and r["impl"] == "sdpa_contiguous")
    if sdpa:
        fs.goal_marks(ax_p, [x for x, _ in sdpa], [0.9 * y for _, y in sdpa], "triton_paged >= 0.9x SDPA's")
    copy = [float(r["copy_gbps"]) for r in rows if r.get("copy_gbps")]
    if copy:
        ax_d.axhline(copy[0], color="k", lw=0.8, label=f"copy {copy[0]:.0f} GB/s")
        fs.goal_line(ax_d, 0.85 * copy[0], "decode >= 85% of copy", where="left")
    device = rows[0]["device"] if rows else "?"
    ax_d.set(xscale="log", xlabel="context (tokens)", ylabel="GB/s")
    ax_d.set_title("decode (line style: batch)", fontsize=10)
    ax_p.set(xlabel="cached prefix (tokens)", ylabel="TFLOP/s")
    ax_p.set_title("prefill chunk", fontsize=10)
    for ax in (ax_d, ax_p):
        ax.grid(alpha=0.3)
        fs.legend_outside(ax)
    fs.title(fig, "Paged attention: decode bandwidth and prefill-chunk throughput",
             device=f"{device}, measured", extra=["goals: decode >= 85% of copy, prefill >= 0.9x SDPA"])
    fs.save(fig, png_path)


def write_rows(csv_path: Path, rows: list[dict]) -> None:
    """The CSV with FIELDS as its columns, in order ("" where a row has no value); each timed row's
    `peer_over_ours` against the Triton launch of its config."""
    add_peer_ratios(rows, ("kind", "batch", "q_len", "seq_len"), "triton_paged")
    write_csv(csv_path, [{f: row.get(f, "") for f in FIELDS} for row in rows])


def replot(out: Path) -> list[Path]:
    """The PNG again from the CSV in `out` (checked first: a bad CSV is an InputError naming it)."""
    from experiments.common.inputs import InputError, read_csv as read_rows

    read_rows(out / CSV_NAME, CSV_COLUMNS, what="a bench_paged_attention CSV")
    try:
        plot(out / CSV_NAME, out / PNG_NAME)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise InputError(f"{out / CSV_NAME}: not a bench_paged_attention CSV ({type(err).__name__}: {err})") from None
    return [out / PNG_NAME]


class PagedAttentionBench(Study):
    """1 if a config failed its correctness check (its rows are not reported)."""
    record = RECORD
    prog = "python -m experiments.bench.paged_attention"
    description = __doc__.splitlines()[0]

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        args = ctx.args
        derive_args(args)
        if ctx.reading:
            return
        args.given_ceilings = load_ceilings(args.ceilings)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise NothingToRun("experiments.bench.paged_attention: no CUDA device on this machine; nothing measured, "
                               "nothing written.")
        if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            ctx.error("argument --device: cpu runs the Triton kernel only through the interpreter "
                      "(TRITON_INTERPRET=1)")

    def run(self, ctx: Context) -> Ran:
        rows, all_ok = sweep(ctx.args)
        if not all_ok:
            print("some configs failed their correctness check and were not reported", file=sys.stderr)
        return Ran([ctx.out / CSV_NAME], status=0 if all_ok else 1)

    def figures(self, ctx: Context) -> list[Path]:
        return replot(ctx.out)


STUDY = PagedAttentionBench()
parser = STUDY.parser
main = STUDY.main


def sweep(args) -> tuple[list[dict], bool]:
    """Every decode, prefill and mixed config, checked then timed; the CSV rewritten after each."""
    from experiments.bench.timing import bench_fn

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    do_bench = bench_fn(args.device)
    dtype = DTYPES[args.dtype]
    full_env = environment(args.device)
    env = dict(device=full_env["device_name"], torch=full_env["torch"], triton=full_env["triton"],
               python=full_env["python"])
    ceilings = args.given_ceilings or dict(
        copy_gbps=copy_bandwidth_gbps(device, do_bench, nbytes=4 * 2**30 if device.type == "cuda" else 2**26))
    log(f"{env['device']}: copy bandwidth {ceilings['copy_gbps']:.0f} GB/s (read + write), GEMM "
        f"{ceilings.get('gemm_tflops', '?')} TFLOP/s ({'--ceilings' if args.given_ceilings else 'copy measured here'})")
    csv_path = args.out / CSV_NAME
    rows: list[dict] = []
    all_ok = True
    kv_token_bytes = 2 * args.num_kv_heads * args.head_dim * torch.empty((), dtype=dtype).element_size()
    for batch in args.batches:
        for context in args.contexts:
            if batch * context * kv_token_bytes > args.max_kv_gib * 2**30:
                log(f"decode B={batch} ctx={context}: skipped (K+V over --max-kv-gib {args.max_kv_gib})")
                continue
            log(f"decode B={batch} ctx={context}")
            pb = make_problem(batch, 1, context + 1, args.num_q_heads, args.num_kv_heads, args.head_dim,
                              args.block_size, dtype, device)
            all_ok &= run_config("decode", pb, args, env, do_bench, ceilings, rows)
            write_rows(csv_path, rows)  # after every config: a crash or timeout keeps what was measured
            del pb
            empty_cache(device)
    for prefix in args.prefixes:
        log(f"prefill chunk q={args.prefill_queries} prefix={prefix}")
        pb = make_problem(1, args.prefill_queries, prefix + args.prefill_queries, args.num_q_heads,
                          args.num_kv_heads, args.head_dim, args.block_size, dtype, device)
        all_ok &= run_config("prefill", pb, args, env, do_bench, ceilings, rows)
        write_rows(csv_path, rows)
        del pb
        empty_cache(device)
    for chunk in args.mixed_chunks:
        log(f"mixed: chunk q={chunk} beside a decode row at ctx={args.mixed_context}")
        all_ok &= run_mixed(chunk, args, env, do_bench, rows, device)
        write_rows(csv_path, rows)
        empty_cache(device)
    write_rows(csv_path, rows)  # the file exists even when every config was skipped
    return rows, all_ok


if __name__ == "__main__":
    run_study(STUDY)
