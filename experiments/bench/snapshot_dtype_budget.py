"""What a smaller snapshot dtype buys under a budget: the trace simulator's restored tokens with fp8
snapshots against the states' own dtype, at the same budgets, with the restore's measured error beside.

The simulator is model-free: only the bytes the store counts change (`ShapeCost.snapshot_bytes`).
Its states are bf16 (vLLM's default, `experiments.traces.cost`), so bfloat16 snapshots change nothing
there and float8_e4m3fn halves a snapshot (plus 4 bytes a tensor); against this engine's own fp32 SSM
states the factors would be 2x and 4x. The accuracy beside each figure is the committed
`results/snapshot_dtype/snapshot_dtype.json` (`experiments.bench.snapshot_dtype`: tiny presets of
five families, random weights) for the restore the simulated policy makes: ours-plus's own (1 token
replayed), aligned's for the others (a block-floored restore and a replay): the worst restored-logits
error of the dtype over every family, the shape's family's, and the greedy tokens equal to an fp32
restore's.

    python -m experiments.bench.snapshot_dtype_budget --limit 1000 --budget-gb 0.25,4
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.flags import add_limit_flag, add_policy_list_flag, float_list, name_list
from experiments.common.inputs import InputError, read_json
from experiments.common.outputs import record_folder
from experiments.common.results_io import environment, log, write_json, write_text
from experiments.common.study import Context, Study, run_study
from experiments.traces.cost import SHAPES, ShapeCost
from experiments.traces.simulate import SimConfig, simulate
from experiments.traces.sweep import load_requests
from experiments.workloads import READINGS
from model.engine.snapshot_codec import DEFAULT_SNAPSHOT_DTYPE, SNAPSHOT_DTYPES
from planner.policies.registry import POLICIES

DATA, REPORT = "budget.json", "budget.md"
ACCURACY = "snapshot_dtype.json"  # experiments.bench.snapshot_dtype's record
# the tiny preset's family (experiments.bench.snapshot_dtype) measured for each cost-model shape
SHAPE_FAMILY = {"bamba-9b": "bamba", "granite-4.0-h-small": "granite moe", "nemotron-h-8b": "nemotron-h",
                "qwen3-next-80b": "qwen3-next"}
ONLINE = tuple(p for p in sorted(POLICIES) if not POLICIES[p].needs_oracle)


def accuracy(dtype: str, policy: str) -> dict | None:
    """The committed accuracy of `dtype` over every family, for the restore `policy` makes (module
    docstring): worst logits errors and greedy agreement."""
    path = record_folder("snapshot_dtype") / ACCURACY
    if not path.is_file():
        return None
    measured = "ours-plus" if policy == "ours-plus" else "aligned"
    rows = [r for r in read_json(path, ("summary",), what="a snapshot_dtype record")["summary"]
            if r["snapshot_dtype"] == dtype and r.get("policy") == measured]
    if not rows:
        return None
    worst = max(rows, key=lambda r: r["logits_err_vs_fp32_restore_max"] / r["logits_abs_max"])
    return {"record": str(path.relative_to(record_folder("snapshot_dtype").parent.parent)), "measured_policy": measured,
            "families": len(rows),
            "logits_err_vs_fp32_restore_max": max(r["logits_err_vs_fp32_restore_max"] for r in rows),
            "worst_family": worst["family"],
            "worst_relative_logits_err": worst["logits_err_vs_fp32_restore_max"] / worst["logits_abs_max"],
            "per_family": {r["family"]: {"logits_err_vs_fp32_restore_max": r["logits_err_vs_fp32_restore_max"],
                                         "logits_abs_max": r["logits_abs_max"],
                                         "greedy_agree": r["greedy_agree"], "decoded": r["decoded"]} for r in rows},
            "greedy_agree": sum(r["greedy_agree"] for r in rows), "decoded": sum(r["decoded"] for r in rows)}


def report(data: dict) -> str:
    """Restored tokens per policy, budget and dtype, the measured error beside (from the data)."""
    rows = data["rows"]
    first = rows[0] if rows else {}
    lines = [f"# Snapshot dtype under a budget (SIMULATED: {first.get('trace')}, {first.get('reading')}, "
             f"{first.get('requests')} requests, {first.get('shape')} shapes, bf16 states in the cost model)", "",
             "| policy | eviction | budget GB | snapshot dtype | bytes a snapshot | restored tokens | vs the first dtype "
             "| worst logits error (family) | the shape's family's | greedy = fp32 restore's |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc, fam = r.get("accuracy"), r.get("shape_family_accuracy")
        worst = (f"{acc['logits_err_vs_fp32_restore_max']:.2e} ({acc['worst_family']}, {acc['measured_policy']} restore)"
                 if acc else "exact")
        own = f"{fam['logits_err_vs_fp32_restore_max']:.2e}" if fam else "-"
        greedy = f"{acc['greedy_agree']}/{acc['decoded']}" if acc else "-"
        lines.append(f"| {r['policy']} | {r['eviction']} | {r['budget_gb']:g} | {r['snapshot_dtype']} | "
                     f"{r['snapshot_bytes']:,} | {r['restored_tokens']:,} | {r['restored_vs_reference']:.3f}x | "
                     f"{worst} | {own} | {greedy} |")
    return "\n".join(lines) + "\n"


class SnapshotDtypeBudget(Study):
    record = "snapshot_dtype"
    prog = "python -m experiments.bench.snapshot_dtype_budget"
    description = __doc__.split("\n")[0]
    replot = False

    def add_flags(self, ap):
        ap.add_argument("--trace", default="mooncake-conversation", help="the workload (experiments.workloads)")
        ap.add_argument("--reading", type=name_list(READINGS), default="chains", help="the trace's reading(s)")
        ap.add_argument("--model", choices=sorted(SHAPES), default="bamba-9b", help="the cost model's shape")
        add_policy_list_flag(ap, ("vllm-align", "marconi", "ours-plus"), ONLINE)
        ap.add_argument("--budget-gb", type=float_list(0, lo_open=True), default="0.25,4",
                        help="device snapshot budgets (GB), finite: an unbounded store holds everything either way")
        ap.add_argument("--snapshot-dtype", type=name_list(SNAPSHOT_DTYPES), default="float32,float8_e4m3fn",
                        help="snapshot dtypes, the first the reference")
        add_limit_flag(ap, 1000)

    def run(self, ctx: Context) -> list[Path]:
        a = ctx.args
        rows = []
        for reading in a.reading:
            requests = load_requests(a.trace, reading, a.limit)
            if not requests:
                raise InputError(f"--trace {a.trace}: no requests (reading {reading})")
            for policy in a.policy:
                for budget in a.budget_gb:
                    ref = None
                    for dtype in a.snapshot_dtype:
                        cfg = SimConfig(policy, shape=a.model, budget_gb=budget,
                                        snapshot_dtype=None if dtype == DEFAULT_SNAPSHOT_DTYPE else dtype)
                        m = simulate(requests, cfg)["metrics"]
                        row = {"trace": a.trace, "reading": reading, "requests": m["requests"], "shape": a.model,
                               "policy": policy, "eviction": m["eviction"], "budget_gb": budget,
                               "snapshot_dtype": dtype, "snapshot_bytes": ShapeCost.from_preset(a.model).snapshot_bytes(dtype),
                               "snapshot_bytes_saved_per_request": m["snapshot_bytes_saved_per_request"],
                               "restored_tokens": m["ssm_hit_tokens"], "kv_hit_tokens": m["kv_hit_tokens"],
                               "replayed_tokens": m["replayed_tokens"], "snapshots_evicted": m["snapshots_evicted"],
                               "snapshots_restored": m["snapshots_restored"], "ttft_s_p50": m["ttft_s_p50"],
                               "ttft_s_p90": m["ttft_s_p90"], "effective_settings": m["effective_settings"]}
                        ref = ref or row
                        row["restored_vs_reference"] = row["restored_tokens"] / max(ref["restored_tokens"], 1)
                        acc = accuracy(dtype, policy) if dtype != DEFAULT_SNAPSHOT_DTYPE else None
                        row["accuracy"] = acc
                        row["shape_family_accuracy"] = (acc or {}).get("per_family", {}).get(SHAPE_FAMILY.get(a.model))
                        rows.append(row)
                        log(f"{reading} {policy} {budget:g} GB {dtype}: restored {row['restored_tokens']:,} "
                            f"({row['restored_vs_reference']:.3f}x of {a.snapshot_dtype[0]})")
        config = ctx.config() | {"simulated": True, "state_dtype_in_cost_model": "bfloat16"}
        data = {"config": config, "environment": environment("cpu"), "rows": rows}
        return [write_json(ctx.out / DATA, data), write_text(ctx.out / REPORT, report(data))]


STUDY = SnapshotDtypeBudget()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
