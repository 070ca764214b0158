"""Benchmark one decode step of the whole model: CUDA-graph bucket vs eager `forward_batch`, against
the bytes a step must move.

Bamba-9B shapes (random weights, bf16, triton backend), batch 1/16/64, every row at the same
context. Each timed step decodes the next position (the step clock advances one token a step, for
the graph and the eager steps alike, on one cache), so every step writes a fresh KV row and reads
one more. A step's floor (`step_bytes`) is what it must read and write once, over the copy
bandwidth measured in the same run (`--ceilings`, else a large device copy here):

* weights: every parameter the step reads: all but the embedding table, of which it reads only the
  batch's rows (a tied LM head reads the whole table once); of a MoE layer's experts at least top_k;
* KV: each attention layer reads K and V of the context and writes one token's;
* SSM state (fp32) and conv state: each Mamba layer reads and writes its slot's;
* logits: written once.

At batch 64 the SSM state read + write (about 15.6 GB at Bamba-9B) is about the weights' size, so a
weights-only floor would be half the real one. Reported per batch: the median step time of the graph
replay (`model.decode_graph.DecodeGraphs`) and of the eager `forward_batch`, each component of the
floor, and the times over the floor (issue 11's goal: graph <= 1.15 x floor at batch 1).

Correctness first: the graph step's logits must equal the eager step's within the bf16 tolerance
on the same inputs, else the batch is not reported and the script exits 1.

    python -m experiments.bench.decode_step --publish                       # results/bench_decode_step/
    python -m experiments.bench.decode_step --model tiny --batches 1,4      # a quick smoke run (runs/...)

Without CUDA it says so and exits 0 without writing anything, unless `--device cpu` is given with
TRITON_INTERPRET=1 (the GPU script's `--dry-run`: eager steps through the interpreter, no graphs).
"""

from __future__ import annotations

import copy
import os
import statistics

import torch

from experiments.common.results_io import environment, log, write_json
from experiments.common.study import Context, NothingToRun, Ran, Study, run_study
from kernels.testing import tolerance

RECORD = "bench_decode_step"
WARMUP_STEPS = 3


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a large copy (read + write counted): 1 GiB on CUDA, 64 MiB on a CPU (a dry run)."""
    from experiments.bench.ceilings import copy_gbps
    from experiments.bench.timing import bench_fn

    nbytes = 1 << 30 if device.startswith("cuda") else 1 << 26
    return copy_gbps(device, nbytes, bench_fn(device), 25, 200) * 1e9


class StepClock:
    """The decode position of the next step: `context + step`, one token further each call of
    `next()`; it refuses to pass the `capacity` tokens the block tables hold."""

    def __init__(self, context: int, capacity: int):
        self.context, self.capacity, self.step = context, capacity, 0

    def next(self) -> int:
        pos = self.context + self.step
        if pos + 1 > self.capacity:
            raise RuntimeError(f"decode step {self.step}: position {pos} is past the {self.capacity} tokens "
                               "the block tables hold")
        self.step += 1
        return pos


def steps_needed(repeats: int) -> int:
    """Steps one batch runs: the correctness step, then warm-up and timed steps of graph and eager."""
    return 1 + 2 * (WARMUP_STEPS + repeats)


def time_steps(fn, repeats: int, device: str) -> float:
    """Median seconds of `fn()` over `repeats` timed calls after WARMUP_STEPS warm-up calls."""
    import time

    for _ in range(WARMUP_STEPS):
        fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _moe_unread_bytes(model, batch: int) -> int:
    """Expert bytes a step need not read: of E experts per MoE layer, a step reads at least top_k."""
    from model.moe import SparseMoE

    unread = 0
    for m in model.modules():
        if isinstance(m, SparseMoE):
            E, k = m.experts.gate_up_proj.shape[0], m.router.top_k
            expert_bytes = sum(p.numel() * p.element_size() for p in m.experts.parameters())
            unread += expert_bytes * (E - min(E, k)) // E
    return unread


def step_bytes(model, batch: int, context: int) -> dict[str, int]:
    """Bytes one decode step of `batch` rows at `context` cached tokens must read and write, by part
    (see the module docstring); 'total' is their sum."""
    cfg, es = model.config, torch.empty((), dtype=model.dtype).element_size()
    emb = model.embed_tokens.weight
    tied = model.lm_head.weight is emb
    params = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied table counts once
    table = emb.numel() * emb.element_size()
    parts = dict(
        weights=params - (0 if tied else table) - _moe_unread_bytes(model, batch),
        embedding_rows=0 if tied else batch * cfg.hidden_size * emb.element_size(),
        kv_read=len(cfg.attn_layer_indices) * 2 * batch * context * cfg.num_key_value_heads * cfg.head_dim * es,
        kv_write=len(cfg.attn_layer_indices) * 2 * batch * cfg.num_key_value_heads * cfg.head_dim * es,
        ssm_state_rw=len(cfg.mamba_layer_indices) * 2 * batch * cfg.mamba_n_heads * cfg.mamba_d_head
        * cfg.mamba_d_state * 4,
        conv_state_rw=len(cfg.mamba_layer_indices) * 2 * batch * cfg.conv_dim * (cfg.mamba_d_conv - 1) * es,
        logits_write=batch * cfg.vocab_size * es,
    )
    parts["total"] = sum(parts.values())
    return parts


def add_flags(p) -> None:
    from experiments.bench import preset_name
    from experiments.common.flags import device_name, int_in_range, int_list
    from pathlib import Path

    p.add_argument("--model", type=preset_name, default="bamba-9b", help="model preset (random weights)")
    p.add_argument("--batches", type=int_list(1), default="1,16,64", metavar="B,...",
                   help="decode batch sizes, comma-separated")
    p.add_argument("--context", type=int_in_range(1), default=4096, help="tokens already in every row's cache")
    p.add_argument("--block-size", type=int_in_range(1), default=16, help="KV block size")
    p.add_argument("--repeats", type=int_in_range(1), default=20, help="timed steps per variant (median reported)")
    p.add_argument("--device", type=device_name, default=None,
                   help="cuda (absent: cuda), or cpu through the Triton interpreter (TRITON_INTERPRET=1; eager only, "
                        "a dry run)")
    p.add_argument("--ceilings", type=Path, default=None,
                   help="a ceilings.json (python -m experiments.bench.ceilings): its copy GB/s is the floor's rate")


def fill_decode_state(cache) -> None:
    """Random states and KV, as a prefill would leave them (never zeros: METHOD.md)."""
    for layer in cache.ssm_pool:
        cache.ssm_pool[layer].normal_(0, 0.1)
        cache.conv_pool[layer].normal_(0, 0.1)
    for layer in cache.key_cache:
        cache.key_cache[layer].normal_(0, 1)
        cache.value_cache[layer].normal_(0, 1)


def decode_inputs(model, batch: int, context: int, block_size: int, blocks_per_row: int):
    """A cache of `batch` rows with `context` tokens each, and `rows(pos)`: the decode step's
    one-token chunks at position `pos`."""
    from model import SequenceChunk

    cache = model.allocate_cache(batch * blocks_per_row + 1, block_size, batch)
    tables = [list(range(1 + r * blocks_per_row, 1 + (r + 1) * blocks_per_row)) for r in range(batch)]
    fill_decode_state(cache)
    ids = torch.randint(0, model.config.vocab_size, (batch,))

    def rows(pos):
        return [SequenceChunk(ids[r:r + 1], pos, tables[r], r) for r in range(batch)]

    return cache, rows


def graph_matches_eager(model, graphs, cache, rows, pos: int) -> bool:
    """Whether the graph step's logits equal the eager step's (run on a copy of the cache) within
    the bf16 tolerance, at position `pos`."""
    eager_cache = copy.deepcopy(cache)
    got = graphs.forward(rows(pos))
    want = model.forward_batch(rows(pos), eager_cache).logits
    tol = tolerance(torch.bfloat16)
    return all(torch.allclose(g.float(), w.float(), **tol) for g, w in zip(got, want))


def time_graph_and_eager(model, graphs, cache, rows, clock: StepClock, repeats: int, device: str):
    """Median seconds of one graph-replayed step and of one eager `forward_batch` step, each step at
    the clock's next position."""
    def graph_step():
        graphs.forward(rows(clock.next()))

    def eager_step():
        model.forward_batch(rows(clock.next()), cache)

    return time_steps(graph_step, repeats, device), time_steps(eager_step, repeats, device)


def bench_batch(model, args, batch: int, blocks_per_row: int, bw: float) -> dict | None:
    """One batch size's row (step times, the floor's parts, times over the floor); None when the
    graph step disagrees with the eager step."""
    from model.decode_graph import DecodeGraphs

    cache, rows = decode_inputs(model, batch, args.context, args.block_size, blocks_per_row)
    graphs = DecodeGraphs(model, cache, max_blocks=blocks_per_row, use_graphs=args.device.startswith("cuda"))
    clock = StepClock(args.context, blocks_per_row * args.block_size)
    if not graph_matches_eager(model, graphs, cache, rows, clock.next()):
        log(f"batch {batch}: graph step != eager step; not reported")
        return None
    t_graph, t_eager = time_graph_and_eager(model, graphs, cache, rows, clock, args.repeats, args.device)
    parts = step_bytes(model, batch, args.context)
    floor = parts["total"] / bw
    return dict(batch=batch, context=args.context, steps_run=clock.step, graphs=graphs.use_graphs,
                graph_ms=t_graph * 1e3, eager_ms=t_eager * 1e3, floor_ms=floor * 1e3,
                floor_bytes={k: v for k, v in parts.items()}, graph_over_floor=t_graph / floor,
                eager_over_floor=t_eager / floor)


def check_device(p, args) -> None:
    """`NothingToRun` where the bench has nothing to time (no CUDA); a usage error for a CPU run without
    the interpreter."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise NothingToRun("decode_step: no CUDA device; nothing measured, nothing written")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        p.error("argument --device: cpu runs the triton backend only through the interpreter (TRITON_INTERPRET=1)")


class DecodeStepBench(Study):
    """1 if a batch's graph step was wrong."""
    record = RECORD
    prog = "python -m experiments.bench.decode_step"
    description = __doc__.splitlines()[0]
    replot = False

    def add_flags(self, ap) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        from experiments.bench.ratios import load_ceilings

        ctx.args.device = ctx.args.device or "cuda"
        ctx.inputs["ceilings"] = load_ceilings(ctx.args.ceilings)
        check_device(ctx.ap, ctx.args)

    def run(self, ctx: Context) -> Ran:
        from model import from_preset

        args, ceilings = ctx.args, ctx.inputs["ceilings"]
        torch.manual_seed(0)
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
        model = from_preset(args.model, backend="triton", seed=0, dtype=dtype, device=args.device)
        bw = ceilings["copy_gbps"] * 1e9 if ceilings else copy_bandwidth(args.device)
        blocks_per_row = -(-(args.context + steps_needed(args.repeats)) // args.block_size)
        rows_out, failed = [], False
        for B in args.batches:
            row = bench_batch(model, args, B, blocks_per_row, bw)
            failed |= row is None
            if row is not None:
                rows_out.append(row)
                log(str(row))
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()  # the batch's cache and graphs are gone with `bench_batch`'s frame
        path = write_json(args.out / "decode_step.json",
                          dict(environment=environment(args.device), preset=args.model, dtype=str(dtype).split(".")[-1],
                               copy_bandwidth_Bps=bw, copy_from="ceilings" if ceilings else "measured here",
                               rows=rows_out))
        return Ran([path], status=1 if failed else 0)


STUDY = DecodeStepBench()
parser = STUDY.parser
main = STUDY.main


if __name__ == "__main__":
    run_study(STUDY)
