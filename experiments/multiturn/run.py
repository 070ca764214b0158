"""Running the multi-turn study: every workload request through one fresh engine per configuration.

The driver keeps `concurrency` requests in flight (one engine, `max_batch_size` = concurrency, so
prefill chunks and decode tokens share ticks) and submits the next request of the workload as
soon as a slot is free, its session has nothing in flight, and the reply it extends has been
generated. Every configuration sees the same requests in the same order; only the cache behaves
differently. The KV pool holds every request's prompt and reply at once, so no KV block is
evicted and the token hit rate is the same for all cached configurations: SSM snapshots decide
the rest.

Every engine applies the policy's engine defaults (its KV block, decode-state grid, eviction:
`model.engine.settings`); a configuration's explicit eviction or decode states win, and each
summary row records what its engine ran under (`effective_settings`).

Configurations (`configs_for(policy, evictions)`; the defaults, aligned and lru,flop_aware, give
these 9):
* `off`: prefix caching off (the reference: every prompt computed from token 0);
* `legacy` / `aligned` with unbounded snapshot memory (no eviction, so the eviction is moot: the
  policy's own);
* `legacy` / `aligned` x `lru` / `flop_aware` (named `flop`) with a snapshot byte budget of
  `snapshot_budget` snapshots, which forces evictions;
* `aligned+decode` (unbounded) and `aligned+decode+budget+lru`: the engine also keeps the state at
  the last block boundary of each reply (`EngineConfig.decode_snapshots`), where the next turn's
  block-floored match lands, so a next turn replays its new message, not the previous reply.

The generated tokens of every configuration must equal those of the first one run (`off` when
it runs), token for token: a configuration that differs fails (`sweep_parts.PointFailed`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable

from experiments.common import sweep_parts
from experiments.common.progress import Progress
from experiments.common.results_io import log
from experiments.common.runs import kv_blocks_for
from experiments.workloads.request import KINDS, ReplyPending, WorkloadRequest
from model.engine import Engine, ModelShape
from model.hybrid import HybridLM
from planner.evictions.registry import get_eviction

NAME = "multiturn"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One configuration; None keeps the policy's own engine default (`model.engine.settings`)."""

    name: str
    policy: str
    caching: bool = True
    snapshot_budget: bool = False  # bounded by the study's snapshot byte budget
    eviction: str | None = None  # a planner.evictions.registry.EVICTION_POLICIES name (only matters when bounded)
    decode_snapshots: bool | None = None  # True: also keep the state at the last grid point of each reply


EVICTION_SHORT = {"flop_aware": "flop"}  # in configuration names


def configs_for(policy: str = "aligned", evictions=("lru", "flop_aware")) -> tuple[RunConfig, ...]:
    """Caching off; legacy and `policy` unbounded, then bounded under each eviction; `policy` with
    decode snapshots, unbounded and bounded under the first eviction."""
    policies = tuple(dict.fromkeys(("legacy", policy)))
    short = [EVICTION_SHORT.get(e, e) for e in evictions]
    return (RunConfig("off", policy, caching=False),
            *(RunConfig(p, p) for p in policies),
            *(RunConfig(f"{p}+budget+{s}", p, snapshot_budget=True, eviction=e)
              for p in policies for e, s in zip(evictions, short)),
            RunConfig(f"{policy}+decode", policy, decode_snapshots=True),
            RunConfig(f"{policy}+decode+budget+{short[0]}", policy, snapshot_budget=True, eviction=evictions[0],
                      decode_snapshots=True))


CONFIGS = configs_for()


@dataclasses.dataclass
class Study:
    """What every configuration of one study shares."""

    requests: list[WorkloadRequest]
    block_size: int
    prefill_budget: int
    interval: int
    concurrency: int
    snapshot_budget_bytes: int
    flops: Callable[[int], float]
    flop_alpha: float = 1.0
    model: HybridLM | None = None  # None: the model-free placeholder runner
    vocab_size: int = 64
    shape: ModelShape | None = None  # the placeholder's: the model it stands in for (its policies' blocks)

    def kv_blocks(self, block_size: int) -> int:
        """Every request's prompt and reply at once, nothing shared: no KV block is ever evicted."""
        return kv_blocks_for([r.prompt_len + r.output_len for r in self.requests], block_size, slack=64)

    @property
    def kv_pool_blocks(self) -> int:
        """`kv_blocks` at the study's block (a policy on a larger block gets a pool of its own block)."""
        return self.kv_blocks(self.block_size)


def engine_for(study: Study, cfg: RunConfig) -> Engine:
    """A fresh engine for one configuration: the policy's engine defaults (its KV block, decode
    states, eviction) applied by `Engine.for_model` / `for_placeholder`, the configuration's
    explicit choices over them."""
    eviction = cfg.eviction
    if eviction == "flop_aware":
        eviction = get_eviction(eviction, alpha=study.flop_alpha)
    # caching off: a zero budget rejects every save (the snapshots could never be used)
    budget = 0 if not cfg.caching else (study.snapshot_budget_bytes if cfg.snapshot_budget else None)
    settings = dict(block_size=study.block_size, prefill_budget=study.prefill_budget, max_batch_size=study.concurrency,
                    num_kv_blocks=study.kv_blocks, policy=cfg.policy, snapshot_interval_blocks=study.interval,
                    enable_prefix_caching=cfg.caching, capture_mode="in_pass", snapshot_byte_budget=budget,
                    eviction=eviction, decode_snapshots=cfg.decode_snapshots, snapshot_flops=study.flops)
    if study.model is not None:
        return Engine.for_model(study.model, keep_prompt_logits=False, **settings)
    return Engine.for_placeholder(shape=study.shape, vocab_size=study.vocab_size, **settings)


def request_row(label: str, wr: WorkloadRequest, req) -> dict:
    m = req.metrics
    return {"config": label, "request": req.request_id, "session": wr.session, "turn": wr.turn, "copy": wr.copy,
            "kind": wr.kind, "prompt_tokens": len(req.prompt_token_ids), "kv_match_tokens": m.kv_match_tokens,
            "restore_at": m.restore_at, "replayed_tokens": m.replayed_tokens, "ttft_s": m.ttft_s,
            "generated_tokens": len(req.output_token_ids),
            "output_sha": hashlib.sha256(json.dumps(req.output_token_ids).encode()).hexdigest()[:16],
            "output_token_ids": list(req.output_token_ids),
            "snapshots_saved_by_request": len(m.snapshot_positions), "preemptions": m.preemptions}


def replay(engine: Engine, requests: list[WorkloadRequest], concurrency: int, label: str) -> tuple[list[dict], int]:
    """Every request through `engine`, `concurrency` at a time: one row per request, and the peak
    snapshot bytes held."""
    pending = list(requests)
    inflight: dict[str, WorkloadRequest] = {}
    replies: dict[int, list[int]] = {}  # request index -> its generated reply
    rows: list[dict] = []
    peak_bytes = 0
    progress = Progress(len(requests), "requests", every_s=10.0)
    while pending or inflight:
        while pending and len(inflight) < concurrency:
            wr = pending[0]
            if any(w.session == wr.session for w in inflight.values()):
                break  # its previous turn (or the first sending of a regenerate) is still running
            try:
                prompt = wr.prompt_ids(replies)
            except ReplyPending:
                break  # the reply it extends is not generated yet (a branch's parent turn)
            pending.pop(0)
            engine.add_request(prompt, wr.output_len, wr.request_id)
            inflight[wr.request_id] = wr
        if not inflight:
            raise RuntimeError(f"replay: nothing in flight and {pending[0].request_id} cannot be sent")
        for req in engine.step().finished:
            wr = inflight.pop(req.request_id)
            replies[wr.index] = list(req.output_token_ids)
            rows.append(request_row(label, wr, req))
            progress.advance(note=label)
        peak_bytes = max(peak_bytes, engine.snapshots.bytes_held)
    return rows, peak_bytes


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(cfg: RunConfig, engine: Engine, rows: list[dict], budget_bytes: int | None, peak_bytes: int,
              wall_s: float) -> dict:
    prompt = sum(r["prompt_tokens"] for r in rows)
    st = engine.snapshots.stats
    ttft = [r["ttft_s"] for r in rows]
    return {
        "config": cfg.name, "policy": cfg.policy if cfg.caching else "off", "prefix_caching": cfg.caching,
        "snapshot_budget_bytes": budget_bytes if cfg.snapshot_budget else None,
        "eviction": cfg.eviction if cfg.snapshot_budget else "none needed",
        "requests": len(rows), "prompt_tokens": prompt,
        "token_hit_rate": sum(r["kv_match_tokens"] for r in rows) / prompt,
        "ssm_restore_depth": sum(r["restore_at"] for r in rows) / prompt,
        "replayed_tokens": sum(r["replayed_tokens"] for r in rows),
        "replayed_fraction": sum(r["replayed_tokens"] for r in rows) / prompt,
        "ttft_median_s": statistics.median(ttft), "ttft_p90_s": percentile(ttft, 90),
        "ttft_mean_s": statistics.fmean(ttft),
        "snapshots_saved": st.saved, "snapshot_bytes_saved": st.saved_bytes,
        "snapshots_evicted": st.evicted, "snapshot_bytes_evicted": st.evicted_bytes,
        "snapshots_restored": st.restored, "snapshot_bytes_held_end": engine.snapshots.bytes_held,
        "snapshot_bytes_held_peak": peak_bytes,
        "generated_tokens": sum(r["generated_tokens"] for r in rows), "wall_s": wall_s,
        "effective_settings": engine.effective_settings,
    } | {f"replayed_{k}": sum(r["replayed_tokens"] for r in rows if r["kind"] == k) for k in KINDS} \
      | {f"requests_{k}": sum(r["kind"] == k for r in rows) for k in KINDS}


def mismatches(reference: dict, outputs: dict) -> list[str]:
    """Requests whose output (token list, or its sha256 prefix) differs from the reference's."""
    return sorted(k for k in reference.keys() | outputs.keys() if outputs.get(k) != reference.get(k))


def run_configs(study: Study, configs: list[RunConfig], config: dict, out: Path, spec: tuple[int, int],
                device: str = "cpu") -> dict:
    """This shard's configurations through `sweep_parts.run_shard`; returns the part. Outputs are
    checked here against the shard's first configuration, and across shards by the merge."""
    reference: list[tuple[str, dict]] = []
    progress = Progress(len(range(spec[0], len(configs), spec[1])), "configurations", every_s=0.0)

    def one(idx: int, point: dict) -> list[dict]:
        cfg = configs[idx]
        engine = engine_for(study, cfg)
        log(f"config {cfg.name}: caching {cfg.caching}, snapshot budget "
            f"{study.snapshot_budget_bytes if cfg.snapshot_budget else 'unbounded'}, {engine.effective_settings}")
        t0 = time.perf_counter()
        rows, peak = replay(engine, study.requests, study.concurrency, cfg.name)
        wall = time.perf_counter() - t0
        progress.advance(note=cfg.name)
        outputs = {r["request"]: r["output_token_ids"] for r in rows}
        reference[:] = reference or [(cfg.name, outputs)]
        bad = mismatches(reference[0][1], outputs)
        if bad:
            raise sweep_parts.PointFailed(f"config {cfg.name} generated other tokens than {reference[0][0]} for "
                                          f"{bad[:5]} ({len(bad)} requests)")
        s = summarize(cfg, engine, rows, study.snapshot_budget_bytes, peak, wall)
        log(f"  {cfg.name}: hit rate {s['token_hit_rate']:.3f}, restore depth {s['ssm_restore_depth']:.3f}, "
            f"replayed {s['replayed_tokens']}, TTFT median {s['ttft_median_s'] * 1e3:.0f} ms p90 "
            f"{s['ttft_p90_s'] * 1e3:.0f} ms, snapshots saved {s['snapshots_saved']} evicted "
            f"{s['snapshots_evicted']}, {wall:.0f} s")
        # parts keep a hash of each output (the full token lists were compared above)
        return [s | {"point": idx, "request_rows": [{k: v for k, v in r.items() if k != "output_token_ids"}
                                                    for r in rows]}]

    points = [dataclasses.asdict(c) for c in configs]
    return sweep_parts.run_shard(out, NAME, points, config, spec, one, lambda p: {"config": p["name"]}, device)
