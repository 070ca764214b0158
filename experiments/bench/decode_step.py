"""Benchmark one decode step of the whole model on CUDA: CUDA-graph bucket vs eager `forward_batch`.

Bamba-9B shapes (random weights, bf16, triton backend), batch 1/16/64, every row at the same
context. A step's floor is streaming the weights once: parameter bytes / the copy bandwidth
measured in the same run (a large device copy). Reported per batch: the median step time of the
graph replay (`model.decode_graph.DecodeGraphs`) and of the eager `forward_batch`, and the graph's
ratio to the floor (issue 11's goal: <= 1.15 at batch 1).

Correctness first: the graph step's logits must equal the eager step's within the bf16 tolerance
on the same inputs, else the batch is not reported and the script exits 1.

    python -m experiments.bench.decode_step --publish                       # results/bench_decode_step/
    python -m experiments.bench.decode_step --model tiny --batches 1,4      # a quick smoke run (runs/...)

On a machine without CUDA it says so and exits 0 without writing anything.
"""

from __future__ import annotations

import copy
import statistics
import sys

import torch

from experiments.common.results_io import environment, log, write_json
from kernels.testing import tolerance


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * a.numel() * a.element_size() / statistics.median(times[2:])


def time_steps(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` timed calls after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


RECORD = "bench_decode_step"


def parser():
    from experiments.bench import preset_name
    from experiments.common.flags import int_in_range, int_list, new_parser
    from experiments.common.outputs import add_out_flags

    p = new_parser(__doc__.splitlines()[0], prog="python -m experiments.bench.decode_step")
    p.add_argument("--model", type=preset_name, default="bamba-9b", help="model preset (random weights)")
    p.add_argument("--batches", type=int_list(1), default="1,16,64", metavar="B,...",
                   help="decode batch sizes, comma-separated")
    p.add_argument("--context", type=int_in_range(1), default=4096, help="tokens already in every row's cache")
    p.add_argument("--block-size", type=int_in_range(1), default=16, help="KV block size")
    p.add_argument("--repeats", type=int_in_range(1), default=20, help="timed steps per variant (median reported)")
    add_out_flags(p, RECORD)
    return p


def fill_decode_state(cache) -> None:
    """Random states and KV, as a prefill would leave them (their values do not change the time)."""
    for layer in cache.ssm_pool:
        cache.ssm_pool[layer].normal_(0, 0.1)
        cache.conv_pool[layer].normal_(0, 0.1)
    for layer in cache.key_cache:
        cache.key_cache[layer].normal_(0, 1)
        cache.value_cache[layer].normal_(0, 1)


def decode_inputs(model, batch: int, context: int, block_size: int, blocks_per_row: int):
    """A cache of `batch` rows with `context` tokens each, and `rows(step)`: the decode step's
    one-token chunks at position `context + step`."""
    from model import SequenceChunk

    cache = model.allocate_cache(batch * blocks_per_row + 1, block_size, batch)
    tables = [list(range(1 + r * blocks_per_row, 1 + (r + 1) * blocks_per_row)) for r in range(batch)]
    fill_decode_state(cache)
    ids = torch.randint(0, model.config.vocab_size, (batch,))

    def rows(step):
        return [SequenceChunk(ids[r:r + 1], context + step, tables[r], r) for r in range(batch)]

    return cache, rows


def graph_matches_eager(model, graphs, cache, rows) -> bool:
    """Whether the graph step's logits equal the eager step's (run on a copy of the cache) within
    the bf16 tolerance."""
    eager_cache = copy.deepcopy(cache)
    got = graphs.forward(rows(0))
    want = model.forward_batch(rows(0), eager_cache).logits
    tol = tolerance(torch.bfloat16)
    return all(torch.allclose(g.float(), w.float(), **tol) for g, w in zip(got, want))


def time_graph_and_eager(model, graphs, cache, rows, repeats: int) -> tuple[float, float]:
    """Median seconds of one graph-replayed step and of one eager `forward_batch` step."""
    step = [1]

    def graph_step():
        graphs.forward(rows(step[0] % repeats))

    def eager_step():
        model.forward_batch(rows(step[0] % repeats), cache)

    return time_steps(graph_step, repeats), time_steps(eager_step, repeats)


def bench_batch(model, args, batch: int, blocks_per_row: int, floor: float) -> dict | None:
    """One batch size's row (step times, and their ratio to the weight-streaming `floor`); None
    when the graph step disagrees with the eager step."""
    from model.decode_graph import DecodeGraphs

    cache, rows = decode_inputs(model, batch, args.context, args.block_size, blocks_per_row)
    graphs = DecodeGraphs(model, cache, max_blocks=blocks_per_row, use_graphs=True)
    if not graph_matches_eager(model, graphs, cache, rows):
        log(f"batch {batch}: graph step != eager step; not reported")
        return None
    t_graph, t_eager = time_graph_and_eager(model, graphs, cache, rows, args.repeats)
    return dict(batch=batch, context=args.context, graph_ms=t_graph * 1e3, eager_ms=t_eager * 1e3,
                weight_stream_ms=floor * 1e3, graph_over_floor=t_graph / floor, eager_over_floor=t_eager / floor)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module's docstring); 1 if a batch's graph step was wrong."""
    from experiments.common.outputs import precheck_out, report_written, resolve_out

    p = parser()
    args = p.parse_args(argv)
    precheck_out(p, args.out)
    if not torch.cuda.is_available():
        log("decode_step: no CUDA device; nothing measured, nothing written")
        return 0
    resolve_out(p, args)
    from model import from_preset

    torch.manual_seed(0)
    model = from_preset(args.model, backend="triton", seed=0, dtype=torch.bfloat16, device="cuda")
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    bw = copy_bandwidth()
    blocks_per_row = -(-(args.context + args.repeats + 8) // args.block_size)
    rows_out, failed = [], False
    for B in args.batches:
        row = bench_batch(model, args, B, blocks_per_row, weight_bytes / bw)
        if row is None:
            failed = True
            continue
        rows_out.append(row)
        log(str(row))
        torch.cuda.empty_cache()  # the batch's cache and graphs are gone with `bench_batch`'s frame
    path = write_json(args.out / "decode_step.json",
                      dict(environment=environment("cuda"), preset=args.model, weight_bytes=weight_bytes,
                           copy_bandwidth_Bps=bw, rows=rows_out))
    report_written([path])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
