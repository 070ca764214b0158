"""A workload's statistics: request count, token counts, chained requests, prefix-reuse bounds."""

from __future__ import annotations

from experiments.workloads.request import WorkloadSource, check_limit
from experiments.workloads.reuse import PrefixReuse

BLOCK_SIZES = (512, 16)  # Mooncake's hash block, and the engine's KV block


def summarize(source: WorkloadSource, limit: int | None = None, block_sizes=BLOCK_SIZES) -> dict:
    """One pass over the first `limit` requests; prompts are computed one request at a time."""
    check_limit(limit)
    reuse = PrefixReuse(block_sizes)
    n = chained = prompt_tokens = output_tokens = max_prompt = 0
    first = last = 0.0
    for req in source.requests(limit):
        if n == 0:
            first = req.arrival_s
        n += 1
        chained += req.parent is not None
        prompt_tokens += req.prompt_len
        output_tokens += req.output_len
        max_prompt = max(max_prompt, req.prompt_len)
        last = req.arrival_s
        reuse.add(req)
    return {
        "workload": source.name,
        "requests": n,
        "chained_requests": chained,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_mean": prompt_tokens / n if n else 0.0,
        "prompt_tokens_max": max_prompt,
        "output_tokens": output_tokens,
        "span_s": last - first,
        # reusable prompt tokens / prompt tokens for an infinite cache (reuse.py), per block size
        "reuse_upper_bound": {cache: {str(b): f for b, f in per.items()} for cache, per in reuse.fractions().items()},
    }


def format_summary(s: dict) -> str:
    n = max(s["requests"], 1)
    lines = [
        f"workload            {s['workload']}",
        f"requests            {s['requests']:,} ({s['chained_requests']:,} continue an earlier one, "
        f"{s['chained_requests'] / n:.1%})",
        f"prompt tokens       {s['prompt_tokens']:,} (mean {s['prompt_tokens_mean']:,.0f}, "
        f"max {s['prompt_tokens_max']:,})",
        f"output tokens       {s['output_tokens']:,}",
        f"arrivals span       {s['span_s']:,.1f} s",
        "reuse upper bound   (reusable prompt tokens / prompt tokens, infinite cache)",
    ]
    for cache, per in s["reuse_upper_bound"].items():
        cells = ", ".join(f"block {b}: {f:.2%}" for b, f in sorted(per.items(), key=lambda kv: -int(kv[0])))
        lines.append(f"  cache of {cache:<16}{cells}")
    return "\n".join(lines)
