"""The simulated points whose every row `tests/test_sim_digest.py` pins by digest (issue 32, item 1:
speed with the same results), and the digest itself.

A point's digest is sha256 over its per-request records (every field, TTFT included, floats by
`repr`: bit-exact) and its metrics (all but `wall_s`), in a canonical JSON. The points cover each
eviction code path the speed work touches: LRU (unbounded and gated), learned value over a device
and a 256 GB host tier, seglen, shadow_best's four shadows (with a tight KV pool too, where an
admission is retried), FLOP-aware over a host tier and Belady's MIN for the optimum; and each decode
path: a decode-snapshot grid of every token (ours-plus), of the block (marconi), of vLLM's padded block
(vllm-align, vllm-junction) and of the kernel chunk (sglang), none (trtllm), marked decode states (the
optimum), and decode rows preempted at a block boundary (the 2-3 GB KV pools).

    .venv/bin/python -m tests.sim_digest_points --limit 200 [--limit 1000]   # print digests (to record)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time

TRACE = "mooncake-conversation"

# name -> (reading, policy, budget_gb, eviction, host_gb, kv_pool_gb)
POINTS = {
    "vllm-align-unbounded": ("chains", "vllm-align", None, None, None, 60.0),
    "ours-plus-4gb-shadow_best": ("chains", "ours-plus", 4.0, "shadow_best", None, 60.0),
    "ours-plus-4gb-shadow_best-kvpool3": ("chains", "ours-plus", 4.0, "shadow_best", None, 3.0),
    "ours-plus-4gb-learned_value-host256": ("chains", "ours-plus", 4.0, "learned_value", 256.0, 60.0),
    "ours-plus-4gb-shadow_best-host256": ("chains", "ours-plus", 4.0, "shadow_best", 256.0, 60.0),
    "marconi-0.25gb-seglen": ("chains", "marconi", 0.25, "seglen", None, 60.0),
    "marconi-0.25gb-seglen-kvpool3": ("chains", "marconi", 0.25, "seglen", None, 3.0),
    "vllm-junction-0.25gb-flop_aware-host256": ("as-given", "vllm-junction", 0.25, "flop_aware", 256.0, 60.0),
    "trtllm-0.25gb-lru": ("as-given", "trtllm", 0.25, "lru", None, 60.0),
    "optimum-4gb": ("chains", "optimum", 4.0, None, None, 60.0),
    # Added with the decode fast path (f634569), recorded on the code before it (ad068c8): the optimum's
    # decode-time marks under a 3 GB KV pool, and SGLang's kernel-chunk decode grid (256) under a 2 GB
    # pool (895 preemptions in 120 requests, many at a decode row's block boundary mid-tick).
    "optimum-4gb-kvpool3": ("chains", "optimum", 4.0, None, None, 3.0),
    "sglang-0.25gb-lru-kvpool2": ("as-given", "sglang", 0.25, "lru", None, 2.0),
}

# The long window `tests/test_sim_digest.py` always checks: (point, requests).
LONG_POINT = ("ours-plus-4gb-shadow_best", 3000)


def _canonical(value):
    """JSON-ready with floats as their exact repr (so a last-bit change shows)."""
    if isinstance(value, float):
        return {"f": "inf" if math.isinf(value) else repr(value)}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if hasattr(value, "name") and not isinstance(value, (str, int)):  # a tier or policy object in settings
        return repr(value)
    return value


def run_point(name: str, limit: int) -> dict:
    """Simulate one named point on the first `limit` requests: its metrics and records."""
    from experiments.traces.simulate import SimConfig, simulate
    from experiments.traces.sweep import load_requests, oracle_for

    reading, policy, budget, eviction, host, kv_pool = POINTS[name]
    cfg = SimConfig(policy, budget_gb=budget, eviction=eviction, host_gb=host, kv_pool_gb=kv_pool)
    requests = load_requests(TRACE, reading, limit)
    marks = uses = None
    if policy == "optimum":
        marks, uses = oracle_for(TRACE, reading, limit, None, cfg.block_size)
    return simulate(requests, cfg, marks, uses)


# Settings recorded in `effective_settings` after the digests were taken, at the value every recorded
# run had: left out of the digest at that value (so a run under another value still shows), else a
# new key would change every digest while no row did (0e767bf added snapshot_dtype).
ADDED_SETTINGS = {"snapshot_dtype": "float32"}


def digest(out: dict) -> str:
    metrics = {k: v for k, v in out["metrics"].items() if k != "wall_s"}
    if isinstance(metrics.get("effective_settings"), dict):
        metrics["effective_settings"] = {k: v for k, v in metrics["effective_settings"].items()
                                         if ADDED_SETTINGS.get(k, object()) != v}
    rows = [dataclasses.asdict(r) for r in out["records"]]
    text = json.dumps(_canonical({"metrics": metrics, "records": rows}), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, action="append", required=True)
    ap.add_argument("--point", action="append", default=None)
    args = ap.parse_args()
    for limit in args.limit:
        for name in args.point or POINTS:
            t0 = time.process_time()
            out = run_point(name, limit)
            print(json.dumps({"limit": limit, "point": name, "digest": digest(out),
                              "seconds": round(time.process_time() - t0, 2),
                              "ssm_hit_tokens": out["metrics"]["ssm_hit_tokens"]}), flush=True)


if __name__ == "__main__":
    main()
