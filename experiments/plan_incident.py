"""The seed's incident at the planner level: real scheduler, prefix cache and snapshot store,
with the placeholder runner standing in for the model (no weights).

    python -m experiments.plan_incident [--out results/plan_incident]

For legacy and `--policy` (default aligned): a cold 32772-token request, then a byte-identical
warm one. Prints and writes chunk ends, snapshot positions, the warm KV match, restore point and
replayed tokens, and what each policy's engine ran under (`effective_settings`; `--model` is the
model the placeholder stands in for, whose shape sizes vLLM's padded block). The model-level reproduction with timings is `python -m experiments.warm_restore`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.flags import add_policy_flag, int_in_range, model_name, require_block_of_budget
from experiments.results_io import RESULTS, environment, write_json
from experiments.runs import (SEED_FIGURES, SEED_SHAPE, cold_record, dense_serve, model_config, random_prompt, serve,
                              warm_record)
from model.engine import Engine, ModelShape


def policy_engine(policy: str, model: str, prompt_len: int, block_size: int, budget: int, interval: int) -> Engine:
    """The seed's dense serve over the placeholder standing in for `model` (a preset or checkpoint
    folder; its shape in float32, as warm_restore runs it), the policy's engine defaults applied by
    `Engine.for_placeholder`."""
    settings = dense_serve(block_size, budget, [prompt_len], policy, interval)
    shape = ModelShape.of(model_config(model), dtype_bytes=4)
    return Engine.for_placeholder(shape=shape, keep_prompt_logits=True, **settings)


def run_policy(engine: Engine, prompt_len: int, seed: int) -> dict:
    prompt = random_prompt(prompt_len, 32000, seed)
    cold = serve(engine, prompt, "cold")
    warm = serve(engine, prompt, "warm")
    return cold_record(cold) | warm_record(warm) | {
        "warm_logits_equal_cold": bool(engine.prompt_logits["cold"].equal(engine.prompt_logits["warm"]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "plan_incident", help="output folder")
    ap.add_argument("--prompt-len", type=int_in_range(1), default=SEED_SHAPE["prompt_len"],
                    help="prompt tokens (seed: 32772)")
    ap.add_argument("--block-size", type=int_in_range(1), default=SEED_SHAPE["block_size"],
                    help="KV block size (seed: 16)")
    ap.add_argument("--budget", type=int_in_range(1), default=SEED_SHAPE["budget"],
                    help="prefill budget per tick (seed: 8192)")
    ap.add_argument("--interval", type=int_in_range(0), default=512, help="snapshot interval in blocks (0 = off)")
    ap.add_argument("--seed", type=int_in_range(0), default=0, help="prompt RNG seed")
    ap.add_argument("--model", "--preset", dest="model", type=model_name, default="small",
                    help="the preset (or checkpoint folder) the placeholder stands in for: its shape sizes a "
                         "policy's vLLM block and kernel chunk (no weights are built; default small)")
    add_policy_flag(ap, "compared with legacy")
    args = ap.parse_args(argv)
    require_block_of_budget(ap, args.budget, args.block_size, slots=1)
    result = {"config": vars(args) | {"out": str(args.out)}, "environment": environment(), "seed_figures": SEED_FIGURES,
              "effective_settings": {}}
    for policy in dict.fromkeys(("legacy", args.policy)):
        engine = policy_engine(policy, args.model, args.prompt_len, args.block_size, args.budget, args.interval)
        result["effective_settings"][policy] = engine.effective_settings
        r = run_policy(engine, args.prompt_len, args.seed)
        result[policy] = r
        print(f"{policy:>8}: chunk ends {r['chunk_ends']}  snapshots {r['snapshot_positions']}  "
              f"warm match {r['warm_kv_match']} -> restore {r['warm_restore_at']}, replay {r['warm_replayed_tokens']}")
    path = write_json(args.out / "plan_incident.json", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
