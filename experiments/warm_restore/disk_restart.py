"""The warm request restored from disk by a fresh process (the main experiment's `disk_restart` step).

During the headline the compared policy's engine has a disk tier below its device over a scratch
folder, unused: its device budget holds a snapshot at every position. After the headline its store
moves every snapshot there (`SnapshotStore.spill_all`, a clean shutdown) and writes the cold
request's logits beside them; then this module runs in a new Python process, which builds the same
model and engine over the folder: the disk tier finds the snapshots (`model.engine.spill.FileSpill`,
keyed by the model's identity and the prefix), and the process serves

1. the prompt's first `--restore-at` tokens: the KV cache is not persisted, and the scheduler
   restores a snapshot only under a KV match, so a fresh process's first request of the prompt
   recomputes it (this one: cold, its KV blocks cached afterwards; `kv_rebuild`);
2. the warm request: its KV match reaches `--restore-at`, the snapshot there is read back from its
   file (sha256-checked) and restored, and the rest is replayed; its logits are compared with the
   first process's cold logits. It is served twice more, its snapshot moved back to disk before
   each (`ttft_s_again`): the first restore of a process also pays its first-use costs.

    python -m experiments.warm_restore.disk_restart --folder DIR --restore-at N [the study's flags]

It writes `disk_restart.json` into the folder (what `study.disk_restart` records under "disk_restart").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from experiments.common.flags import add_model_flags, add_prefill_budget_flag, int_in_range
from experiments.common.results_io import log
from experiments.common.runs import build_model, dense_serve, max_abs_diff, random_prompt, serve, set_threads
from experiments.common.study import Context, Study, run_study
from model.engine import Engine
from model.engine.spill import FileSpill
from model.hybrid import HybridLM
from planner.snapshot_tiers import GB, disk_tier

COLD_LOGITS = "cold_logits.pt"
RESULT = "disk_restart.json"


def disk_engine(model: HybridLM, policy: str, args, folder: Path) -> Engine:
    """The study's engine (`study.policy_engine`'s settings) with a disk tier over `folder` (a
    `FileSpill`) below a device budget of a snapshot at every position, so the headline never spills:
    the same plans and restores. Both processes build it here (the study imports this module)."""
    budget = model.allocate_cache(1, args.block_size, 1).state_bytes_per_slot * (args.prompt_len + 1)
    settings = dense_serve(args.block_size, args.prefill_budget, [args.prompt_len], policy, args.interval)
    return Engine.for_model(model, capture_mode="in_pass", keep_prompt_logits=True, snapshot_byte_budget=budget,
                            snapshot_lower_tiers=(disk_tier(budget / GB, spill=FileSpill(folder, args.device)),),
                            **settings)


class DiskRestart(Study):
    """The warm_restore study's second process: no run folder (it writes into --folder), no figures."""
    prog = "python -m experiments.warm_restore.disk_restart"
    description = "Serve the warm-restore prompt from a disk tier an earlier process spilled to."
    folder = "optional"
    replot = False

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--folder", type=Path, required=True, help="the disk tier's folder (cold_logits.pt beside)")
        ap.add_argument("--restore-at", type=int_in_range(1), required=True,
                        help="the snapshot the warm request should restore (the first process's warm restore point)")
        add_model_flags(ap)
        ap.add_argument("--policy", default="aligned")
        ap.add_argument("--prompt-len", type=int_in_range(21), required=True)
        ap.add_argument("--block-size", type=int_in_range(1), required=True)
        add_prefill_budget_flag(ap, 8192)
        ap.add_argument("--interval", type=int_in_range(0), default=512)

    def run(self, ctx: Context) -> list[Path]:
        """Writes RESULT into --folder (the parent process reads it); no run folder of its own."""
        args = ctx.args
        started = time.perf_counter()
        set_threads(args.threads)
        model = build_model(args.model, device=args.device, seed=args.seed, dtype=args.dtype, backend=args.backend)
        t0 = time.perf_counter()
        engine = disk_engine(model, args.policy, args, args.folder)
        store = engine.snapshots
        found = {"adopted": store.stats.adopted, "adopted_positions": store.positions("disk"),
                 "open_s": time.perf_counter() - t0}  # the weights' digest, the index replayed
        prompt = random_prompt(args.prompt_len, model.config.vocab_size, args.seed)
        rebuild = serve(engine, prompt[: args.restore_at], "kv-rebuild")
        warm = serve(engine, prompt, "warm-from-disk")
        # the same again, the snapshot moved back to disk first: a restore from disk past the process's first
        again = [(store.spill_all(), serve(engine, prompt, f"warm-from-disk-{i}"))[1].metrics.ttft_s for i in range(2)]
        cold_logits = torch.load(args.folder / COLD_LOGITS)
        m = warm.metrics
        result = found | {
            "kv_rebuild": {"tokens": args.restore_at, "restore_at": rebuild.metrics.restore_at,
                           "ttft_s": rebuild.metrics.ttft_s, "snapshot_positions": rebuild.metrics.snapshot_positions},
            "kv_match": m.kv_match_tokens, "restore_at": m.restore_at, "replayed_tokens": m.replayed_tokens,
            "ttft_s": m.ttft_s, "ttft_s_again": again, "restore_transfer_s": m.restore_transfer_s,
            "promoted_from_disk": store.stats.promoted["disk"] - len(again), "spill_failures": store.stats.spill_failures,
            "max_abs_logit_diff_vs_cold": max_abs_diff(engine.prompt_logits[warm.request_id], cold_logits),
            "first_token": warm.output_token_ids[0], "process_s": time.perf_counter() - started,
        }
        (args.folder / RESULT).write_text(json.dumps(result, indent=1))
        log(f"disk restart: {result['adopted']} snapshots found, warm restore {m.restore_at}, replay {m.replayed_tokens}, "
            f"TTFT {m.ttft_s:.3f} s, logit diff vs cold {result['max_abs_logit_diff_vs_cold']:.2e}")
        return []


STUDY = DiskRestart()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
