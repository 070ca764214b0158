"""Microbenchmarks: each module times one piece against its peers, checks it against a reference
before reporting, and writes a CSV plus a PNG drawn from it through `experiments.results_io`.

    python -m experiments.bench.ssd_scan          # SSD scan: in-pass capture vs none vs two passes
    python -m experiments.bench.paged_attention   # paged attention decode GB/s and prefill TFLOP/s (CUDA)
    python -m experiments.bench.model_prefill     # torch-backend prefill vs transformers, per model family
"""
