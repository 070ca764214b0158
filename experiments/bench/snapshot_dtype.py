"""What storing snapshots in a smaller dtype costs in accuracy, in the real model: restored logits and
greedy tokens under bfloat16 and float8_e4m3fn snapshots (`model.engine.snapshot_codec`) against an
fp32 restore and a cold run, per family's tiny preset, prompt length and seed.

Per point (preset, prompt length, prompt seed), placement policy and snapshot dtype: one engine
(16-token blocks, 128 prompt tokens a tick) serves a cold request for the prompt, then its repeat,
which restores a snapshot and replays the rest: under aligned the tail snapshot (the split point,
one block below the last block boundary: 20-28 tokens replayed here), under ours-plus the state
after the last computed token (1 token replayed: the least a replay can wash out of the error);
the repeat decodes 32 greedy tokens. Recorded: the stored snapshot's bytes (and
their ratio to fp32's), the restored state's error (max over tensors of max |x - x'| / max |x|),
the repeat's last-prompt-token logits against the fp32-snapshot engine's repeat and against the cold
request (max abs, and the logits' own max abs for scale), the cold logits' top-1 margin, and how
many of the 32 decoded tokens equal the fp32 restore's (and where the first one differs).

    python -m experiments.bench.snapshot_dtype                         # runs/snapshot_dtype/<timestamp>/
    python -m experiments.bench.snapshot_dtype --publish               # results/snapshot_dtype/

Random-weight tiny presets (`model.loading.from_preset`, seeded): their logits are not a trained
model's, so the greedy agreement is a stress figure (near-uniform logits flip on small errors), the
logits error the portable one. fp32 everywhere but the snapshots.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from experiments.common import figure_style as fs
from experiments.common.flags import DEFAULT_THREADS, THREADS_HELP, add_policy_list_flag, int_in_range, int_list, name_list
from experiments.common.inputs import read_json
from experiments.common.results_io import environment, log, write_csv, write_json, write_text
from experiments.common.study import Context, Study, run_study
from model.engine import Engine
from model.engine.snapshot_codec import SNAPSHOT_DTYPES
from model.families import PRESETS
from model.loading import from_preset

# one tiny preset a family: Bamba, Granite-4.0-H dense and MoE, Nemotron-H, Qwen3-Next
PRESETS_BY_FAMILY = {"tiny": "bamba", "granite-dense-cpu": "granite dense", "granite-tiny": "granite moe",
                     "nemotron-h-tiny": "nemotron-h", "qwen3-next-tiny": "qwen3-next"}
# a colour per family in this study's figure (the shared palette's text-hash fallback gave two of them one brown)
FAMILY_COLORS = {"bamba": "#1b9e77", "granite dense": "#d95f02", "granite moe": "#7570b3", "nemotron-h": "#e7298a",
                 "qwen3-next": "#66a61e"}
DTYPES = tuple(SNAPSHOT_DTYPES)
POLICIES = ("aligned", "ours-plus")  # float32 first: the reference the others are measured against
BLOCK, PREFILL_BUDGET = 16, 128
DATA, TABLE, FIGURE, REPORT = "snapshot_dtype.json", "snapshot_dtype.csv", "snapshot_dtype.png", "snapshot_dtype.md"


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(vocab) for _ in range(n)]


def _state_error(exact, restored) -> float:
    """Max over the state's tensors of max |x - x'| / max |x| (0 for an all-zero tensor restored exactly)."""
    worst = 0.0
    for x, y in zip((*exact.conv, *exact.ssm), (*restored.conv, *restored.ssm)):
        scale = x.abs().max().item()
        err = (x.double() - y.double()).abs().max().item()
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


def serve(model, prompt: list[int], decode: int, snapshot_dtype: str, policy: str) -> dict:
    """Cold request, then its repeat restored from a snapshot (module docstring)."""
    eng = Engine.for_model(model, policy=policy, block_size=BLOCK, prefill_budget=PREFILL_BUDGET, max_batch_size=1,
                           num_kv_blocks=2 * (len(prompt) + decode) // BLOCK + 8, keep_prompt_logits=True,
                           snapshot_dtype=snapshot_dtype)
    written = []
    write = eng.runner.write_state
    eng.runner.write_state = lambda slot, state: (written.append(state), write(slot, state))
    cold = eng.add_request(prompt, decode, "cold")
    eng.run_until_done()
    warm = eng.add_request(prompt, decode, "warm")
    eng.run_until_done()
    if warm.metrics.restore_at == 0 or len(written) != 1:
        raise RuntimeError(f"{len(prompt)}-token prompt: the repeat did not restore one snapshot")
    snap = eng.snapshots.lookup(prompt, warm.metrics.restore_at, warm.block_hashes, observe=False)
    return {"cold_logits": eng.prompt_logits["cold"], "warm_logits": eng.prompt_logits["warm"],
            "cold_tokens": cold.output_token_ids, "warm_tokens": warm.output_token_ids, "restored": written[0],
            "restore_at": warm.metrics.restore_at, "replayed": warm.metrics.replayed_tokens,
            "snapshot_bytes": snap.nbytes, "effective": eng.effective_settings}


def measure(preset: str, prompt_len: int, seed: int, decode: int, policies=POLICIES, dtypes=DTYPES) -> list[dict]:
    """One point's rows, one per policy and snapshot dtype (float32, the first, the policy's reference)."""
    model = from_preset(preset, seed=0)
    prompt = _prompt(prompt_len, seed, model.config.vocab_size)
    rows = []
    for policy in policies:
        rows += _compare(preset, prompt, seed, policy, {d: serve(model, prompt, decode, d, policy) for d in dtypes})
    return rows


def _compare(preset: str, prompt: list[int], seed: int, policy: str, runs: dict) -> list[dict]:
    ref = next(iter(runs.values()))
    prompt_len = len(prompt)
    top2 = ref["cold_logits"].float().topk(2).values
    rows = []
    for d, r in runs.items():
        agree = [a == b for a, b in zip(r["warm_tokens"], ref["warm_tokens"])]
        rows.append({
            "family": PRESETS_BY_FAMILY.get(preset, PRESETS[preset].model_type), "preset": preset,
            "prompt_len": prompt_len, "seed": seed, "policy": policy, "snapshot_dtype": d, "restore_at": r["restore_at"],
            "replayed": r["replayed"], "snapshot_bytes": r["snapshot_bytes"],
            "bytes_vs_fp32": r["snapshot_bytes"] / ref["snapshot_bytes"],
            "state_rel_err": _state_error(ref["restored"], r["restored"]),
            "logits_err_vs_fp32_restore": (r["warm_logits"].double() - ref["warm_logits"].double()).abs().max().item(),
            "logits_err_vs_cold": (r["warm_logits"].double() - ref["cold_logits"].double()).abs().max().item(),
            "logits_abs_max": ref["cold_logits"].abs().max().item(),
            "cold_top1_margin": (top2[0] - top2[1]).item(),
            "decoded": len(agree), "greedy_agree": sum(agree),
            "first_divergence": next((i for i, same in enumerate(agree) if not same), len(agree)),
            "greedy_agree_with_cold": sum(a == b for a, b in zip(r["warm_tokens"], ref["cold_tokens"])),
        })
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per family, policy and dtype: the worst logits errors and state error, and the greedy agreement summed."""
    out = {}
    for r in rows:
        s = out.setdefault((r["family"], r["policy"], r["snapshot_dtype"]), {
            "family": r["family"], "preset": r["preset"], "policy": r["policy"], "snapshot_dtype": r["snapshot_dtype"],
            "points": 0, "replayed_min": r["replayed"], "replayed_max": r["replayed"],
            "bytes_vs_fp32": r["bytes_vs_fp32"], "state_rel_err_max": 0.0, "logits_err_vs_fp32_restore_max": 0.0,
            "logits_err_vs_cold_max": 0.0, "logits_abs_max": 0.0, "greedy_agree": 0, "decoded": 0,
            "first_divergence_min": None})
        s["points"] += 1
        s["replayed_min"], s["replayed_max"] = min(s["replayed_min"], r["replayed"]), max(s["replayed_max"], r["replayed"])
        s["state_rel_err_max"] = max(s["state_rel_err_max"], r["state_rel_err"])
        s["logits_err_vs_fp32_restore_max"] = max(s["logits_err_vs_fp32_restore_max"], r["logits_err_vs_fp32_restore"])
        s["logits_err_vs_cold_max"] = max(s["logits_err_vs_cold_max"], r["logits_err_vs_cold"])
        s["logits_abs_max"] = max(s["logits_abs_max"], r["logits_abs_max"])
        s["greedy_agree"] += r["greedy_agree"]
        s["decoded"] += r["decoded"]
        first = r["first_divergence"] if r["first_divergence"] < r["decoded"] else None
        if first is not None:
            s["first_divergence_min"] = first if s["first_divergence_min"] is None else min(s["first_divergence_min"], first)
    return list(out.values())


def report(data: dict) -> str:
    """The per family and dtype table (worst over prompt lengths and seeds), from the data."""
    c = data["config"]
    lines = [f"# Snapshot dtype: the restore's error ({data['environment']['device_name']})", "",
             f"Tiny presets, random weights (seed 0), fp32 model; prompts {c['prompt_len']} x seeds {c['seed']}; "
             f"block {c['block_size']}; the repeat restores a snapshot (aligned: the tail one; ours-plus: the "
             f"last computed token's), replays the rest and decodes {c['decode']} greedy tokens. Errors are the "
             "worst over those points; the reference is the same policy's fp32 restore.", "",
             "| family | preset | policy | replayed | snapshot dtype | bytes vs fp32 | state error / amax "
             "| logits error vs fp32 restore | vs cold | max abs logits | greedy tokens = fp32 restore's "
             "| first divergence |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in data["summary"]:
        first = "-" if s["first_divergence_min"] is None else s["first_divergence_min"]
        replayed = f"{s['replayed_min']}-{s['replayed_max']}" if s["replayed_min"] != s["replayed_max"] else s["replayed_min"]
        lines.append(f"| {s['family']} | {s['preset']} | {s['policy']} | {replayed} | {s['snapshot_dtype']} | "
                     f"{s['bytes_vs_fp32']:.3f} | "
                     f"{s['state_rel_err_max']:.2e} | {s['logits_err_vs_fp32_restore_max']:.2e} | "
                     f"{s['logits_err_vs_cold_max']:.2e} | {s['logits_abs_max']:.2f} | "
                     f"{s['greedy_agree']}/{s['decoded']} | {first} |")
    return "\n".join(lines) + "\n"


class SnapshotDtypeBench(Study):
    record = "snapshot_dtype"
    prog = "python -m experiments.bench.snapshot_dtype"
    description = __doc__.split("\n")[0]

    def add_flags(self, ap):
        ap.add_argument("--model", type=name_list(PRESETS), default=",".join(PRESETS_BY_FAMILY),
                        help="tiny presets, one per family (comma list)")
        ap.add_argument("--prompt-len", type=int_list(2 * BLOCK + 1), default="100,300,1000",
                        help="prompt lengths (each past two blocks, so a tail snapshot exists)")
        ap.add_argument("--seed", type=int_list(0), default="0,1", help="prompt seeds (weights: seed 0)")
        add_policy_list_flag(ap, POLICIES, what="placement policies whose restore is measured")
        ap.add_argument("--decode", type=int_in_range(1), default=32, help="greedy tokens decoded after the restore")
        ap.add_argument("--threads", type=int_in_range(0), default=DEFAULT_THREADS, help=THREADS_HELP)

    def run(self, ctx: Context) -> list[Path]:
        a = ctx.args
        if a.threads:
            torch.set_num_threads(a.threads)
        points = [(m, n, s) for m in a.model for n in a.prompt_len for s in a.seed]
        rows = []
        with ctx.progress(len(points), "points") as progress:
            for m, n, s in points:
                rows.extend(measure(m, n, s, a.decode, a.policy))
                progress.advance()
        summary = summarize(rows)
        for s in summary:
            log(f"{s['family']:>14} {s['policy']:>9} {s['snapshot_dtype']:>13}: bytes x{s['bytes_vs_fp32']:.3f}, logits err "
                f"<= {s['logits_err_vs_fp32_restore_max']:.2e} vs fp32 restore (|logits| <= {s['logits_abs_max']:.2f}), "
                f"greedy {s['greedy_agree']}/{s['decoded']}")
        config = ctx.config() | {"block_size": BLOCK, "prefill_budget": PREFILL_BUDGET,
                                 "weights_seed": 0, "model_dtype": "float32"}
        data = {"config": config, "environment": environment("cpu"), "summary": summary, "rows": rows}
        return [write_json(ctx.out / DATA, data), write_csv(ctx.out / TABLE, rows)]

    def figures(self, ctx: Context) -> list[Path]:
        data = read_json(ctx.out / DATA, ("rows", "config", "summary"), what="a snapshot_dtype run")
        summary = [r for r in data["summary"] if r["snapshot_dtype"] != DTYPES[0]]
        plt = fs.pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
        families = list(dict.fromkeys(r["family"] for r in summary))
        series = list(dict.fromkeys((r["policy"], r["snapshot_dtype"]) for r in summary))
        width = 0.8 / max(len(series), 1)
        for k, (policy, dtype) in enumerate(series):
            got = {r["family"]: r for r in summary if (r["policy"], r["snapshot_dtype"]) == (policy, dtype)}
            xs = [i + (k - (len(series) - 1) / 2) * width for i, f in enumerate(families) if f in got]
            style = dict(color=fs.color(policy), marker="o" if dtype == "bfloat16" else "^")
            label = f"{policy}, {dtype}"
            axes[0].scatter(xs, [got[f]["logits_err_vs_fp32_restore_max"] / got[f]["logits_abs_max"] for f in families
                                 if f in got], label=label, **style)
            axes[1].bar(xs, [got[f]["greedy_agree"] / got[f]["decoded"] for f in families if f in got], width,
                        color=style["color"], hatch="" if dtype == "bfloat16" else "//", edgecolor="white", label=label)
        for ax in axes:
            ax.set_xticks(range(len(families)), families, rotation=20, fontsize=8)
        axes[0].set(yscale="log", ylabel="max |logits error| / max |logits|",
                    title="restored logits vs the same policy's fp32 restore (worst point)")
        axes[0].legend(fontsize=7)
        axes[1].set(ylim=(0, 1.05), ylabel="greedy tokens equal to the fp32 restore's",
                    title=f"{data['config']['decode']} decoded tokens after the restore")
        axes[1].legend(fontsize=7, loc="lower left")
        fs.title(fig, "Snapshots stored in bf16 / fp8: the restore's error", model="tiny presets, random weights",
                 workload=f"prompts {data['config']['prompt_len']}, seeds {data['config']['seed']}")
        return [fs.save(fig, ctx.out / FIGURE), write_text(ctx.out / REPORT, report(data))]


STUDY = SnapshotDtypeBench()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
