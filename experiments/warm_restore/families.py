"""One table row per model family from the main experiment's JSON files.

    python -m experiments.warm_restore --model granite-small-cpu --out results/warm_restore/granite-small-cpu
    python -m experiments.warm_restore.families --publish   # reads results/warm_restore/**/warm_restore.json
    python -m experiments.warm_restore.families --out DIR   # reads DIR/**/warm_restore.json

Without `--out` or `--publish` it reads the newest run folder, runs/warm_restore/<timestamp>/.

Each row: the model, its family (`model_type`), the legacy and compared policy's warm restore
point and replayed tokens, the warm TTFTs and their ratio, and the warm-vs-cold logit difference.
Writes `families.csv` (the data) and `families.md` (the same table) beside the JSON files.
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.results_io import write_csv, write_text
from experiments.common.study import Context, Study, run_study
from experiments.warm_restore.study import RECORD, read_result
from experiments.warm_restore.report import BASELINE, compared, ratio_key
from model.families import PRESETS

def row(path: Path, root: Path) -> dict:
    """The table row of one warm_restore.json."""
    result = read_result(path)
    other = compared(result)
    name = result["config"].get("model", result["config"].get("preset"))
    model = result.get("model", {})
    return {
        "model": name, "family": model.get("model_type", PRESETS[name].model_type if name in PRESETS else "?"),
        "params_m": round(model["params_m"], 1) if "params_m" in model else "", "layers": model.get("layers", ""),
        "legacy_restore_at": result[BASELINE]["warm_restore_at"],
        "legacy_replayed": result[BASELINE]["warm_replayed_tokens"], "policy": other,
        "restore_at": result[other]["warm_restore_at"], "replayed": result[other]["warm_replayed_tokens"],
        "legacy_warm_ttft_s": result[BASELINE]["warm_ttft_s"], "warm_ttft_s": result[other]["warm_ttft_s"],
        "ratio": result[ratio_key(other)],
        "max_abs_logit_diff": max(result[p]["warm_vs_cold_max_abs_logit_diff"] for p in (BASELINE, other)),
        "source": path.relative_to(root).as_posix(),
    }


def markdown(rows: list[dict]) -> str:
    head = ("| model | family | params (M) | layers | legacy restore / replay | aligned restore / replay "
            "| warm TTFT legacy | warm TTFT aligned | ratio | max logit diff |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['model']} | {r['family']} | {r['params_m']} | {r['layers']} "
                     f"| {r['legacy_restore_at']} / {r['legacy_replayed']} | {r['restore_at']} / {r['replayed']} "
                     f"| {r['legacy_warm_ttft_s']:.3g} s | {r['warm_ttft_s'] * 1e3:.1f} ms | {r['ratio']:.0f} "
                     f"| {r['max_abs_logit_diff']:.1e} |")
    return "# Warm restore per model family\n\nOne row per `results/warm_restore/**/warm_restore.json` " \
           "(`python -m experiments.warm_restore.families`).\n\n" + "\n".join(lines) + "\n"


class Families(Study):
    """Reads the run folder (--out, --publish's record, or the newest run) and writes its table there."""
    record = RECORD
    prog = "python -m experiments.warm_restore.families"
    description = __doc__.splitlines()[0]
    folder = "read"
    replot = False

    def run(self, ctx: Context) -> list[Path]:
        root = ctx.out
        paths = sorted(root.rglob("warm_restore.json"))
        if not paths:
            ctx.error(f"argument --out: no warm_restore.json under {root}")
        rows = [row(p, root) for p in paths]
        print(markdown(rows))
        return [write_csv(root / "families.csv", rows), write_text(root / "families.md", markdown(rows))]


STUDY = Families()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
