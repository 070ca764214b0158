"""Real workloads for the snapshot-placement study: one request interface, sources by name.

    from experiments.workloads import open_workload
    for req in open_workload("mooncake-conversation", "chains").requests(limit=100):
        ids = req.prompt_ids()      # computed now, not stored; req.parent: the request it continues

Sources: `mooncake-conversation` and `mooncake-synthetic` (vendored FAST'25 traces, readings
`as-given` and `chains`, `mooncake.py`), `sharegpt` (optional extra `traces`, `sharegpt.py`),
`synthetic` (the multi-turn study's seeded chat sessions with fixed replies, `synthetic.py`).
The record and the rules any source must satisfy are in `request.py`;
`python -m experiments.workloads --help` prints a workload's statistics.
"""

from __future__ import annotations

from experiments.workloads.mooncake import READINGS, TRACES as MOONCAKE_TRACES, MooncakeTrace
from experiments.workloads.request import WorkloadRequest, WorkloadSource, check_workload
from experiments.workloads.sharegpt import ShareGPT
from experiments.workloads.synthetic import SyntheticChat
from kernels.checks import require

WORKLOADS = (*MOONCAKE_TRACES, "sharegpt", "synthetic")
CHAINS_ONLY = ("sharegpt", "synthetic")  # prompts that are real histories: one reading

__all__ = ["WORKLOADS", "READINGS", "WorkloadRequest", "WorkloadSource", "MooncakeTrace", "ShareGPT",
           "SyntheticChat", "check_workload", "open_workload", "default_reading"]


def default_reading(trace: str) -> str:
    """`as-given` for Mooncake traces; `chains` for ShareGPT and synthetic (their prompts are real histories)."""
    return "chains" if trace in CHAINS_ONLY else "as-given"


def open_workload(trace: str, reading: str | None = None, **options) -> WorkloadSource:
    """The source named `trace` (one of WORKLOADS) in `reading` (default: `default_reading`).

    `options` go to the source: `vocab_size` for all; `conversation_rate`, `turn_gap_s`, `seed`,
    `source`, `encode` for ShareGPT; `request_gap_s`, `config` or `WorkloadConfig` fields (`sessions`,
    `seed`, ...) for synthetic.
    """
    require(trace in WORKLOADS, "trace", f"must be one of {WORKLOADS}, got {trace!r}")
    reading = reading or default_reading(trace)
    require(reading in READINGS, "reading", f"must be one of {READINGS}, got {reading!r}")
    if trace == "sharegpt":
        require(reading == "chains", "reading",
                "sharegpt has one reading, 'chains': its prompts are real conversation histories")
        return ShareGPT(name=f"{trace}:{reading}", **options)
    if trace == "synthetic":
        require(reading == "chains", "reading",
                "synthetic has one reading, 'chains': its prompts are real conversation histories")
        return SyntheticChat(name=f"{trace}:{reading}", **options)
    return MooncakeTrace(MOONCAKE_TRACES[trace], reading, name=f"{trace}:{reading}", **options)
