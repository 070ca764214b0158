"""The vLLM side of `experiments.peer_vllm.study`, run as a script by the vLLM venv's python.

    /work/venv-vllm/bin/python experiments/peer_vllm/worker.py --checkpoint DIR --settings JSON --ready FILE

Imports only the standard library and vllm (the vLLM venv has none of this project). It builds
one `vllm.LLM` from the settings, writes FILE (ok or the error, with vLLM's resolved cache
settings), then serves jobs: each stdin line names a job JSON ({"requests": [{"ids", "max_tokens",
"logprobs"}]}); it runs the requests one at a time, writes `<job>.out.json` and prints
`PEER_DONE <job>`. A line `quit` ends it. Every failure is written as data, never raised away.
Each request records its wall time, the process's CPU time (`cpu_s`: on a machine shared with
other jobs the wall time also holds the time the scheduler gave them), the calling thread's
(`thread_cpu_s`) and the process's thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

DONE = "PEER_DONE"


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, default=str)
    os.replace(tmp, path)


def _threads() -> int | None:
    """This process's threads now (a busy helper thread would add CPU time beside the model's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _resolved(llm) -> dict:
    """What vLLM made of the settings: block sizes, cache mode, blocks and state page bytes."""
    cfg = llm.llm_engine.vllm_config
    cache = cfg.cache_config
    out = {}
    for name in ("block_size", "mamba_block_size", "mamba_cache_mode", "enable_prefix_caching", "prefix_match_unit",
                 "enable_mamba_shared_prefix_checkpoint", "prefix_cache_retention_interval", "hash_block_size",
                 "cache_hit_alignment_tokens", "num_gpu_blocks", "num_cpu_blocks", "mamba_page_size_padded",
                 "kv_cache_memory_bytes", "cache_dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
                 "effective_attention_block_size", "kv_cache_size_tokens"):
        out[name] = getattr(cache, name, None)
    sched = cfg.scheduler_config
    for name in ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "long_prefill_token_threshold"):
        out[name] = getattr(sched, name, None)
    out["max_model_len"] = cfg.model_config.max_model_len
    out["dtype"] = str(cfg.model_config.dtype)
    out["enforce_eager"] = cfg.model_config.enforce_eager
    out["compilation_mode"] = str(getattr(cfg.compilation_config, "mode", None))
    return out


def _run_one(llm, sampling_params_cls, req: dict) -> dict:
    params = sampling_params_cls(temperature=0.0, max_tokens=req["max_tokens"], logprobs=req.get("logprobs") or None,
                                 ignore_eos=True, detokenize=False)
    c0, th0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    out = llm.generate([{"prompt_token_ids": req["ids"]}], params, use_tqdm=False)[0]
    wall, cpu, thread = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - th0
    comp = out.outputs[0]
    top = None
    if comp.logprobs:
        top = [[[int(t), float(lp.logprob)] for t, lp in step.items()] for step in comp.logprobs]
    return {"wall_s": wall, "cpu_s": cpu, "thread_cpu_s": thread, "threads": _threads(), "tokens": list(comp.token_ids), "num_cached_tokens": out.num_cached_tokens,
            "prompt_len": len(req["ids"]), "top_logprobs": top}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--settings", required=True, help="JSON: keyword arguments of vllm.LLM")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--ready", required=True)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # before vLLM replaces set_num_threads with a no-op
    ready: dict = {"pid": os.getpid(), "settings": json.loads(args.settings)}
    try:
        import vllm
        from vllm import LLM, SamplingParams

        ready |= {"vllm": vllm.__version__, "torch": torch.__version__}
        llm = LLM(model=args.checkpoint, **ready["settings"])
        ready |= {"ok": True, "resolved": _resolved(llm), "torch_threads": torch.get_num_threads()}
    except BaseException as e:  # noqa: BLE001 - a failed start is data for the report
        _write(args.ready, ready | {"ok": False} | _error(e))
        return 0
    _write(args.ready, ready)
    for line in sys.stdin:
        job_path = line.strip()
        if job_path == "quit":
            break
        with open(job_path) as f:
            job = json.load(f)
        results = []
        for req in job["requests"]:
            try:
                results.append(_run_one(llm, SamplingParams, req))
            except BaseException as e:  # noqa: BLE001
                results.append({"prompt_len": len(req["ids"])} | _error(e))
        _write(f"{job_path}.out.json", {"results": results})
        print(f"{DONE} {job_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
