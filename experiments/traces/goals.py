"""The issue's goals checked on a run's summary (per reading and budget): data in, verdicts out.

* `ssm_vs_kv`: with unbounded memory, ours-plus's SSM-usable hits / its KV hits at 16-token blocks
  (goal >= 0.97);
* `replay_vs_vllm_align` (goal <= 0.9) and `replay_vs_vllm_junction` (goal <= 1.0): ours-plus's
  replayed prompt tokens over theirs;
* `ssm_vs_best_other`: ours-plus's SSM hits over the best other policy's (the optimum excluded;
  goal >= 1.0);
* `forwards_vs_stopping`: ours-plus's prefill forwards over the fewest of any policy that stops a
  chunk to save a state (vllm-align, vllm-junction, trtllm, marconi; goal < 1.0);
* `ssm_vs_optimum`: ours-plus's SSM hits over the offline optimum's (goal >= 0.95).
A check whose policies were not run is None.
"""

from __future__ import annotations

OURS = "ours-plus"
STOPPING = ("vllm-align", "vllm-junction", "trtllm", "marconi")
GOALS = {"ssm_vs_kv": (">=", 0.97), "replay_vs_vllm_align": ("<=", 0.9), "replay_vs_vllm_junction": ("<=", 1.0),
         "ssm_vs_best_other": (">=", 1.0), "forwards_vs_stopping": ("<", 1.0), "ssm_vs_optimum": (">=", 0.95)}


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else a / b


def check_budget(policies: dict[str, dict], budget: str) -> dict:
    """The ratios of one budget (`by_budget` key) and whether each meets its goal."""
    at = {name: p["by_budget"][budget] for name, p in policies.items() if budget in p["by_budget"]}
    if OURS not in at:
        return {}
    ours = at[OURS]
    others = [m for n, m in at.items() if n not in (OURS, "optimum")]
    stopping = [at[n]["forwards"] for n in STOPPING if n in at]
    ratios = {
        "ssm_vs_kv": _ratio(ours["ssm_hit_tokens"], ours["kv_hit_tokens"]) if budget == "unbounded" else None,
        "replay_vs_vllm_align": _ratio(ours["replayed_tokens"], at["vllm-align"]["replayed_tokens"])
        if "vllm-align" in at else None,
        "replay_vs_vllm_junction": _ratio(ours["replayed_tokens"], at["vllm-junction"]["replayed_tokens"])
        if "vllm-junction" in at else None,
        "ssm_vs_best_other": _ratio(ours["ssm_hit_tokens"], max(m["ssm_hit_tokens"] for m in others))
        if others else None,
        "forwards_vs_stopping": _ratio(ours["forwards"], min(stopping)) if stopping else None,
        "ssm_vs_optimum": _ratio(ours["ssm_hit_tokens"], at["optimum"]["ssm_hit_tokens"]) if "optimum" in at else None,
    }
    out = {}
    for name, value in ratios.items():
        op, target = GOALS[name]
        met = None if value is None else {">=": value >= target, "<=": value <= target, "<": value < target}[op]
        out[name] = {"value": value, "goal": f"{op} {target}", "met": met}
    return out


def check(summary: dict) -> dict:
    """Per reading, per budget: `check_budget`."""
    out = {}
    for reading, data in summary["readings"].items():
        budgets = sorted({b for p in data["policies"].values() for b in p["by_budget"]},
                         key=lambda b: float("inf") if b == "unbounded" else float(b))
        out[reading] = {b: check_budget(data["policies"], b) for b in budgets}
    return out


def markdown(goals: dict) -> str:
    """One table per reading: the ratio, the goal, met or missed."""
    lines = []
    for reading, per_budget in goals.items():
        lines += [f"**{reading}**", "", "| budget (GB) | " + " | ".join(GOALS) + " |",
                  "|---|" + "---|" * len(GOALS)]
        for budget, checks in per_budget.items():
            cells = []
            for name in GOALS:
                c = checks.get(name)
                cells.append("-" if not c or c["value"] is None else
                             f"{c['value']:.3f} {'met' if c['met'] else 'MISSED'}")
            lines.append(f"| {budget} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
