"""Kernel microbenchmarks: each module times one kernel against its peers, checks it against the
oracle before reporting, and writes a CSV plus a PNG drawn from it through `experiments.results_io`.

    python -m experiments.bench.ssd_scan          # SSD scan: in-pass capture vs none vs two passes
    python -m experiments.bench.paged_attention   # paged attention decode GB/s and prefill TFLOP/s (CUDA)
"""
