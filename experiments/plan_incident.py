"""The seed's incident at the planner level: real scheduler, prefix cache and snapshot store,
with the placeholder runner standing in for the model (milliseconds, no weights).

    python -m experiments.plan_incident [--out results/plan_incident]

For each policy: a cold 32772-token request, then a byte-identical warm one. Prints and writes
chunk ends, snapshot positions, the warm KV match, restore point and replayed tokens. The
model-level reproduction with timings is `python -m experiments.warm_restore`.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from experiments.results_io import RESULTS, environment, write_json
from model.engine import Engine, EngineConfig
from model.engine import PlaceholderRunner
from planner.scheduler import SchedulerConfig

SEED_FIGURES = {"legacy": {"warm_restore_at": 24577, "warm_replayed_tokens": 8195},
                "aligned": {"warm_restore_at": 32752, "warm_replayed_tokens": 20}}


def run_policy(policy: str, prompt_len: int, block_size: int, budget: int, interval: int, seed: int) -> dict:
    cfg = SchedulerConfig(block_size=block_size, prefill_budget=budget, max_batch_size=1,
                          num_kv_blocks=-(-prompt_len // block_size) + 8, policy=policy,
                          snapshot_interval_blocks=interval)
    engine = Engine(PlaceholderRunner(1, cfg.num_kv_blocks, block_size), EngineConfig(cfg, keep_prompt_logits=True))
    rnd = random.Random(seed)
    prompt = [rnd.randrange(32000) for _ in range(prompt_len)]
    cold = engine.add_request(prompt, 1, "cold")
    engine.run_until_done()
    warm = engine.add_request(prompt, 1, "warm")
    engine.run_until_done()
    return {
        "chunk_ends": cold.metrics.chunk_ends,
        "snapshot_positions": cold.metrics.snapshot_positions,
        "warm_kv_match": warm.metrics.kv_match_tokens,
        "warm_restore_at": warm.metrics.restore_at,
        "warm_replayed_tokens": warm.metrics.replayed_tokens,
        "warm_chunk_ends": warm.metrics.chunk_ends,
        "warm_logits_equal_cold": bool(engine.prompt_logits["cold"].equal(engine.prompt_logits["warm"])),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "plan_incident", help="output folder")
    ap.add_argument("--prompt-len", type=int, default=32772, help="prompt tokens (seed: 32772)")
    ap.add_argument("--block-size", type=int, default=16, help="KV block size (seed: 16)")
    ap.add_argument("--budget", type=int, default=8192, help="prefill budget per tick (seed: 8192)")
    ap.add_argument("--interval", type=int, default=512, help="snapshot interval in blocks (0 = off)")
    ap.add_argument("--seed", type=int, default=0, help="prompt RNG seed")
    args = ap.parse_args(argv)
    result = {"config": vars(args) | {"out": str(args.out)}, "environment": environment(), "seed_figures": SEED_FIGURES}
    for policy in ("legacy", "aligned"):
        r = run_policy(policy, args.prompt_len, args.block_size, args.budget, args.interval, args.seed)
        result[policy] = r
        print(f"{policy:>8}: chunk ends {r['chunk_ends']}  snapshots {r['snapshot_positions']}  "
              f"warm match {r['warm_kv_match']} -> restore {r['warm_restore_at']}, replay {r['warm_replayed_tokens']}")
    path = write_json(args.out / "plan_incident.json", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
