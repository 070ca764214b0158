"""The seed's incident at the planner level: real scheduler, prefix cache and snapshot store,
with the placeholder runner standing in for the model (no weights).

    python -m experiments.plan_incident             # into a new run folder, runs/plan_incident/<timestamp>/
    python -m experiments.plan_incident --publish   # into the committed record, results/plan_incident/

For legacy and `--policy` (default aligned): a cold 32772-token request, then a byte-identical
warm one. Prints and writes chunk ends, snapshot positions, the warm KV match, restore point and
replayed tokens, and what each policy's engine ran under (`effective_settings`; `--model` is the
model the placeholder stands in for, whose shape sizes vLLM's padded block), then prints the
restore points and replays beside the committed record's. The model-level reproduction with
timings is `python -m experiments.warm_restore`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.common.flags import (add_policy_flag, add_prefill_budget_flag, int_in_range, model_name,
                                      require_block_of_budget)
from experiments.common.inputs import read_json
from experiments.common.results_io import environment, log, write_json
from experiments.common.study import Context, Study, run_study
from experiments.common.runs import (SEED_FIGURES, SEED_SHAPE, cold_record, dense_serve, model_config, random_prompt,
                                     serve, warm_record)
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


RECORD = "plan_incident"
JSON_NAME = "plan_incident.json"


class PlanIncident(Study):
    record = RECORD
    prog = "python -m experiments.plan_incident"
    description = __doc__.splitlines()[0]
    replot = False  # nothing drawn: the JSON is the result

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--prompt-len", type=int_in_range(1), default=SEED_SHAPE["prompt_len"],
                        help="prompt tokens (seed: 32772)")
        ap.add_argument("--block-size", type=int_in_range(1), default=SEED_SHAPE["block_size"],
                        help="KV block size (seed: 16)")
        add_prefill_budget_flag(ap, SEED_SHAPE["budget"])
        ap.add_argument("--interval", type=int_in_range(0), default=512, help="snapshot interval in blocks (0 = off)")
        ap.add_argument("--seed", type=int_in_range(0), default=0, help="prompt RNG seed")
        ap.add_argument("--model", type=model_name, default="small",
                        help="the preset (or checkpoint folder) the placeholder stands in for: its shape sizes a "
                             "policy's vLLM block and kernel chunk (no weights are built)")
        add_policy_flag(ap, "compared with legacy")

    def check(self, ctx: Context) -> None:
        a = ctx.args
        require_block_of_budget(ctx.ap, a.prefill_budget, a.block_size, slots=1, budget_flag="--prefill-budget")

    def policies(self, args) -> list[str]:
        return list(dict.fromkeys(("legacy", args.policy)))

    def run(self, ctx: Context) -> list[Path]:
        args, out = ctx.args, ctx.out
        result = {"config": ctx.config() | {"out": str(out), "budget": args.prefill_budget},
                  "environment": environment(), "seed_figures": SEED_FIGURES, "effective_settings": {}}
        for policy in self.policies(args):
            engine = policy_engine(policy, args.model, args.prompt_len, args.block_size, args.prefill_budget,
                                   args.interval)
            result["effective_settings"][policy] = engine.effective_settings
            r = run_policy(engine, args.prompt_len, args.seed)
            result[policy] = r
            log(f"{policy:>8}: chunk ends {r['chunk_ends']}  snapshots {r['snapshot_positions']}  "
                f"warm match {r['warm_kv_match']} -> restore {r['warm_restore_at']}, replay {r['warm_replayed_tokens']}")
        return [write_json(out / JSON_NAME, result)]

    def headline(self, ctx: Context) -> list[tuple]:
        """Restore point and replay per policy beside the committed results/plan_incident/plan_incident.json."""
        path = self.committed(JSON_NAME)
        if path is None:
            return []
        committed = read_json(path, ("legacy",), what="a plan_incident result JSON")
        result = read_json(ctx.out / JSON_NAME)
        rows = []
        for p in self.policies(ctx.args):
            theirs = committed.get(p, {})
            rows += [(f"{p} warm_restore_at", result[p]["warm_restore_at"], theirs.get("warm_restore_at")),
                     (f"{p} warm_replayed_tokens", result[p]["warm_replayed_tokens"],
                      theirs.get("warm_replayed_tokens"))]
        return rows


STUDY = PlanIncident()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
