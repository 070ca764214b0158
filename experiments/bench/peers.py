"""Peer kernels timed beside ours, loaded from the git-ignored folder `bash scripts/fetch_peers.sh`
fills (./peers, or $PEERS_DIR), with the adapters that feed them our SSD inputs.

* fla-core's `chunk_gated_delta_rule` (peers/fla): the gated delta rule bench's peer, its adapter in
  `experiments.bench.gated_delta_rule` (the same problem's layout with a batch axis; no conversion).
* fla-core's `chunk_simple_gla` (peers/fla): simple GLA is SSD with B/C expanded per head:
  q = C, k = B (each group's rows repeated over its H/G heads), v = x * dt, g = dt * A (natural-log
  decay), scale 1, state [K=N, V=P] per head; y = o + D * x. The expansion and softplus(dt + bias)
  are done once outside the timed call (they cost fla H/G times the B/C bytes, counted in its row).
* vLLM's Triton `unified_attention` (peers/vllm: the kernel file and its helpers from the 0.33.0
  wheel) over our paged KV layout (blocks, block size, KV heads, head dim), the same block tables,
  seq_lens and cu_seqlens_q; it imports a few vllm modules, given here as stand-ins (`_vllm_stand_ins`).
* mamba_ssm's `mamba_chunk_scan_combined` (peers/mamba_ssm): our layout with a batch axis of 1.
  Its package __init__ imports the CUDA extension (selective_scan_cuda), so a stand-in package
  whose __path__ is the fetched folder is put in sys.modules and only the Triton modules import.

Every peer is checked against our fp32 oracle (`kernels.reference.ssd.ssd_scan_sequential`) before
it is timed (`check_against_oracle`); a bench reports no time for a peer that fails it.

On a CPU the kernels run only under TRITON_INTERPRET=1 and need `interpreter_shims()`: Triton's
autotuner cannot benchmark there (no driver: the first config is taken) and mamba_ssm enters
`torch.cuda.device(x.device.index)`. fla 0.6.0's kernels do not run under the interpreter
(chunk_h.py calls `.to` on a program id, a Python int there), so its CPU check uses fla's own
`naive_recurrent_simple_gla` through the same adapter.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from pathlib import Path

import torch

from experiments.common.results_io import REPO


def peers_dir() -> Path:
    return Path(os.environ.get("PEERS_DIR") or REPO / "peers")


def versions() -> dict[str, str]:
    """name -> version from peers/VERSIONS (lines 'name==version'); {} when the folder is absent."""
    path = peers_dir() / "VERSIONS"
    if not path.is_file():
        return {}
    pairs = (line.strip().split("==", 1) for line in path.read_text().splitlines() if "==" in line)
    return {name: version for name, version in pairs}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def interpreter_shims():
    """Under TRITON_INTERPRET=1 only: autotuners take their first config, torch.cuda.device is a no-op."""
    if not interpreting():
        yield
        return
    import triton.runtime.autotuner as autotuner

    prune, cuda_device = autotuner.Autotuner.prune_configs, torch.cuda.device
    autotuner.Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
    torch.cuda.device = lambda index: contextlib.nullcontext()
    try:
        yield
    finally:
        autotuner.Autotuner.prune_configs, torch.cuda.device = prune, cuda_device


def shimmed(call):
    """`call` under `interpreter_shims()` (no-ops on a GPU)."""
    def run():
        with interpreter_shims():
            return call()

    return run


@contextlib.contextmanager
def _stand_ins_dropped(package: str):
    """Leave no `package` module behind that was not imported before: a stand-in left in
    sys.modules (no __spec__) made transformers' `is_mamba_2_ssm_available` raise in every later
    test of the same process, and a stand-in vllm would pass for an installed one. The loaded
    functions keep their modules alive through their globals."""
    before = {name for name in sys.modules if name == package or name.startswith(package + ".")}
    try:
        yield
    finally:
        for name in [n for n in sys.modules if (n == package or n.startswith(package + ".")) and n not in before]:
            del sys.modules[name]


def load_mamba_ssd():
    """(mamba_chunk_scan_combined, '') or (None, why not)."""
    root = peers_dir() / "mamba_ssm" / "mamba_ssm"
    if not (root / "ops" / "triton" / "ssd_combined.py").is_file():
        return None, f"mamba_ssm: not fetched ({root}; bash scripts/fetch_peers.sh)"
    with _stand_ins_dropped("mamba_ssm"):
        if "mamba_ssm" not in sys.modules:
            stand_in = types.ModuleType("mamba_ssm")
            stand_in.__path__ = [str(root)]  # the Triton modules import; the package __init__ never runs
            sys.modules["mamba_ssm"] = stand_in
        try:
            from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        except Exception as err:  # noqa: BLE001  (a peer that does not import is recorded, not fatal)
            return None, f"mamba_ssm: import failed ({type(err).__name__}: {err})"[:200]
    return mamba_chunk_scan_combined, ""


def _fla_import(module: str, name: str):
    root = peers_dir() / "fla"
    if not (root / "fla" / "ops" / "simple_gla").is_dir():
        return None, f"fla: not fetched ({root}; bash scripts/fetch_peers.sh)"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        mod = __import__(module, fromlist=[name])
    except Exception as err:  # noqa: BLE001
        return None, f"fla: import failed ({type(err).__name__}: {err})"[:200]
    return getattr(mod, name), ""


def load_fla_simple_gla():
    """(chunk_simple_gla, '') or (None, why not)."""
    return _fla_import("fla.ops.simple_gla", "chunk_simple_gla")


def load_fla_naive():
    """fla's own pure-torch recurrence of simple GLA (the CPU stand-in for its kernel)."""
    return _fla_import("fla.ops.simple_gla.naive", "naive_recurrent_simple_gla")


def load_fla_gated_delta():
    """(chunk_gated_delta_rule, '') or (None, why not): the gated delta rule bench's peer."""
    return _fla_import("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")


def load_fla_gated_delta_naive():
    """fla's own token-by-token gated delta rule (the CPU stand-in for its kernel)."""
    return _fla_import("fla.ops.gated_delta_rule.naive", "naive_recurrent_gated_delta_rule")


# ---------------------------------------------------------------------------------------------
# adapters: our single-sequence inputs (experiments.bench.ssd_scan.make_inputs) -> a peer's call,
# returning (y (T, H, P), final state (1, H, P, N) fp32) in our layout


def _dt_processed(inp: dict) -> torch.Tensor:
    dt = inp["dt"].float() + (inp["dt_bias"].float() if inp.get("dt_bias") is not None else 0)
    return torch.nn.functional.softplus(dt)


def fla_inputs(inp: dict) -> dict:
    """q, k, v, g, initial_state for `chunk_simple_gla` (batch 1, B/C expanded per head)."""
    x, H = inp["x"], inp["x"].shape[1]
    G = inp["B"].shape[1]
    dt = _dt_processed(inp)  # (T, H) fp32

    def per_head(t):  # (T, G, N) -> (1, T, H, N): head h reads group h // (H / G)
        return t.repeat_interleave(H // G, dim=1)[None].contiguous()

    v = (x.float() * dt[..., None]).to(x.dtype)[None]
    g = (dt * inp["A"].float()[None])[None]  # (1, T, H) fp32, log decay <= 0
    h0 = inp["initial_states"].transpose(-1, -2).contiguous() if inp.get("initial_states") is not None else None
    return dict(q=per_head(inp["C"]), k=per_head(inp["B"]), v=v, g=g, initial_state=h0)


def fla_call(fn, inp: dict, prepared: dict | None = None):
    """A closure running `fn` (chunk_simple_gla, or fla's naive recurrence) on our inputs."""
    a = prepared or fla_inputs(inp)
    D, x = inp.get("D"), inp["x"]

    def run():
        o, ht = fn(a["q"], a["k"], a["v"], a["g"], scale=1.0, initial_state=a["initial_state"],
                   output_final_state=True)
        y = o[0].float() + (D.float()[None, :, None] * x.float() if D is not None else 0)
        return y.to(x.dtype), ht.float().transpose(-1, -2)

    return run


def mamba_call(fn, inp: dict, chunk: int):
    """A closure running `mamba_chunk_scan_combined` on our inputs."""
    def run():
        y, final = fn(inp["x"][None], inp["dt"][None], inp["A"], inp["B"][None], inp["C"][None], chunk,
                      D=inp.get("D"), dt_bias=inp.get("dt_bias"), dt_softplus=True,
                      initial_states=inp.get("initial_states"), return_final_states=True)
        return y[0], final.float()

    return run


def check_against_oracle(run, inp: dict, dtype) -> tuple[bool, str]:
    """Whether the peer's (y, final) equal the fp32 oracle's within `dtype`'s tolerance (NaN fails),
    and the largest absolute errors as a note."""
    from kernels.reference.ssd import ssd_scan_sequential
    from kernels.testing import tolerance

    with interpreter_shims():
        y, final = run()
    ref = ssd_scan_sequential(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inp.items()})
    tol = tolerance(dtype)
    errs, ok = [], True
    for name, got, want in (("y", y, ref.y), ("final", final, ref.final_states)):
        got = got.float().cpu()
        if got.shape != want.shape or torch.isnan(got).any():
            return False, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)} or NaN"
        ok &= bool(torch.allclose(got, want.float(), **tol))
        errs.append(f"{name} max abs err {(got - want.float()).abs().max().item():.3g}")
    return ok, ", ".join(errs)


# ---------------------------------------------------------------------------------------------
# vLLM's Triton unified attention


def _module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _Logger:
    """vllm.logger's logger as the kernel file uses it (debug_once, info_once, warning_once)."""

    def __init__(self, name: str):
        import logging

        self._log = logging.getLogger(name)

    def __getattr__(self, attr):
        return getattr(self._log, attr.removesuffix("_once"))


class _Platform:
    """vllm.platforms.current_platform, the two calls the kernel file makes."""

    @staticmethod
    def fp8_dtype():
        return torch.float8_e4m3fn

    @staticmethod
    def is_device_capability_family(family: int) -> bool:  # 100: Blackwell's tuned large-head path
        if not torch.cuda.is_available():
            return False
        major, _ = torch.cuda.get_device_capability()
        return major * 10 == family


def _vllm_stand_ins(ops: Path) -> None:
    """The vllm modules the kernel file imports, as stand-ins; vllm.v1.attention.ops is the fetched folder."""
    import enum

    import triton
    import triton.language as tl

    class KVQuantMode(enum.IntEnum):  # vllm/v1/kv_cache_interface.py, the values the kernel compares
        NONE = 0
        FP8_PER_TENSOR = 1
        INT8_PER_TOKEN_HEAD = 2
        FP8_PER_TOKEN_HEAD = 3
        INT4_PER_TOKEN_HEAD = 4

    _module("vllm", ops.parent, envs=_module("vllm.envs", VLLM_BATCH_INVARIANT=False, VLLM_TRITON_USE_TD=False))
    _module("vllm.logger", init_logger=_Logger)
    _module("vllm.platforms", current_platform=_Platform())
    _module("vllm.triton_utils", triton=triton, tl=tl)
    _module("vllm.v1", ops.parent)
    _module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode)
    _module("vllm.v1.attention", ops.parent)
    _module("vllm.v1.attention.ops", ops)


def load_vllm_unified_attention():
    """(unified_attention, '') or (None, why not)."""
    ops = peers_dir() / "vllm"
    if not (ops / "triton_unified_attention.py").is_file():
        return None, f"vllm: not fetched ({ops}; bash scripts/fetch_peers.sh)"
    if "vllm" in sys.modules:
        return None, "vllm: a vllm package is already imported; the stand-ins would shadow it"
    with _stand_ins_dropped("vllm"):
        _vllm_stand_ins(ops)
        try:
            from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        except Exception as err:  # noqa: BLE001
            return None, f"vllm: import failed ({type(err).__name__}: {err})"[:200]
    return unified_attention, ""


def vllm_call(fn, query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, q_len: int, seq_len: int,
              scale: float | None = None):
    """A closure running vLLM's unified attention on our paged problem (causal, bottom-right aligned)."""
    out = torch.empty_like(query)
    one = torch.ones(1, dtype=torch.float32, device=query.device)  # fp8 descales: unread for 16-bit KV
    scale = query.shape[-1] ** -0.5 if scale is None else scale

    def run():
        fn(q=query, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=q_len,
           seqused_k=seq_lens, max_seqlen_k=seq_len, softmax_scale=scale, causal=True, window_size=(-1, -1),
           block_table=block_tables, softcap=0, q_descale=one, k_descale=one, v_descale=one)
        return out

    return run
