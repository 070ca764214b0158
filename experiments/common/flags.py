"""Command-line flags shared by the experiments, each checked when parsed.

Every checker here is an argparse `type=`: a bad value ends the command in argparse's usage
error (one line naming the flag and what it accepts, exit code 2) before anything is built or
written. Checks that involve two flags go through `parser.error` right after parsing, the same way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Iterable

from experiments.common.results_io import parse_shard
from model.engine.snapshot_codec import SNAPSHOT_DTYPES
from model.families import PRESETS, config_from_json_file
from model.loading import INDEX_FILE, SINGLE_FILE
from planner.policies.registry import POLICIES

Check = Callable[[str], object]


def _range_text(lo, hi) -> str:
    return f">= {lo}" if hi is None else f"in [{lo}, {hi}]"


def int_in_range(lo: int, hi: int | None = None) -> Check:
    """An integer lo <= n (<= hi)."""

    def check(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {_range_text(lo, hi)}, got {text!r}")
        return n

    return check


def float_in_range(lo: float, hi: float | None = None, lo_open: bool = False) -> Check:
    """A float lo <= x (<= hi); with lo_open, lo < x."""
    bound = ("> " if lo_open else ">= ") + f"{lo:g}" if hi is None else \
        ("in (" if lo_open else "in [") + f"{lo:g}, {hi:g}]"

    def check(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = float("nan")
        if not (x > lo if lo_open else x >= lo) or (hi is not None and not x <= hi):
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text!r}")
        return x

    return check


def int_list(lo: int, hi: int | None = None) -> Check:
    """Comma-separated integers, each lo <= n (<= hi); at least one."""
    one = int_in_range(lo, hi)

    def check(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers {_range_text(lo, hi)}, got {text!r}")
        try:
            return [one(x) for x in items]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"every item must be an integer {_range_text(lo, hi)}, got {text!r}") from None

    return check


def float_list(lo: float, hi: float | None = None, lo_open: bool = False) -> Check:
    """Comma-separated numbers, each as `float_in_range(lo, hi, lo_open)` accepts; at least one."""
    one = float_in_range(lo, hi, lo_open)

    def check(text: str) -> list[float]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
        try:
            return [one(x) for x in items]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"every item {e}") from None

    return check


def _refuse_offline(names: Iterable[str], allowed: tuple[str, ...]) -> None:
    """An offline policy (`needs_oracle`: the optimum) where this command cannot give it its oracle marks:
    refused by name, with the studies that can run it (run without them it would be a degraded policy
    under the optimum's name)."""
    for name in names:
        if name not in allowed and name in POLICIES and POLICIES[name].needs_oracle:
            raise argparse.ArgumentTypeError(
                f"{name} is offline: it needs each request's future matches (oracle marks), which only "
                f"{ORACLE_STUDIES} supply")


def name_list(allowed: Iterable[str], refuse_offline: bool = True) -> Check:
    """Comma-separated names, each one of `allowed`, no repeats; at least one. `refuse_offline`: an
    offline policy outside `allowed` gets `_refuse_offline`'s line (False: a command that runs it anyway)."""
    allowed = tuple(allowed)

    def check(text: str) -> list[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if refuse_offline:
            _refuse_offline(items, allowed)
        bad = [x for x in items if x not in allowed]
        if not items or bad or len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"expected distinct comma-separated names from {', '.join(allowed)}; "
                                             f"got {text!r}")
        return items

    return check


def shard_spec(text: str) -> tuple[int, int]:
    """`i/n` with 0 <= i < n: run the points whose index % n == i (`results_io.parse_shard`)."""
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--shard: ")) from None


def device_name(text: str) -> str:
    """`cpu`, or `cuda`/`cuda:i` when this machine has that CUDA device."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:i, got {text!r}")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has no CUDA device (torch {torch.__version__}); "
                                             "use cpu")
        if dev.index is not None and dev.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA device index must be in [0, {count - 1}]")
    return text


def backend_name(text: str) -> str:
    """`torch`, or `triton` where it can run: a CUDA device, or the interpreter (TRITON_INTERPRET=1,
    which must be set before Triton is first imported)."""
    import os

    import torch

    if text not in ("torch", "triton"):
        raise argparse.ArgumentTypeError(f"expected torch or triton, got {text!r}")
    if text == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise argparse.ArgumentTypeError("triton needs a CUDA device; on this CPU-only machine it runs only through "
                                         "the interpreter: set TRITON_INTERPRET=1 (slow: tiny shapes) or use torch")
    return text


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (one file, or the shards of its index)."""
    if (folder / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise argparse.ArgumentTypeError(f"{folder / INDEX_FILE}: not a safetensors index ({e})") from None
        return sorted({folder / f for f in weight_map.values()})
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    raise argparse.ArgumentTypeError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")


def model_name(text: str) -> str:
    """A preset name (model.config.PRESETS) or a checkpoint folder whose config and weight files open.

    Only the config and the safetensors headers are read here (milliseconds); the weights load
    later, in `experiments.common.runs.build_model`."""
    if text in PRESETS:
        return text
    folder = Path(text)
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"expected a preset ({', '.join(PRESETS)}) or a checkpoint folder, got {text!r}")
    try:
        config_from_json_file(folder / "config.json")
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{folder / 'config.json'}: {e}") from None
    from safetensors import safe_open

    for file in checkpoint_files(folder):
        try:
            with safe_open(file, framework="pt") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError, and OSError
            raise argparse.ArgumentTypeError(f"{file}: not a readable safetensors file ({e})") from None
    return text


def require_block_of_budget(ap: argparse.ArgumentParser, budget: int, block_size: int, slots: int,
                            budget_flag: str = "--budget", block_flag: str = "--block-size") -> None:
    """Each tick hands out budget + slots tokens, and the scheduler admits a prompt longer than
    that only with at least one whole block of it (`planner.scheduler`): a smaller budget never
    admits the prompt. Ends in a usage error naming both flags."""
    if budget + slots < block_size:
        ap.error(f"argument {budget_flag}: must be >= {block_flag} - {slots} = {block_size - slots} (a tick hands out "
                 f"budget + {slots} tokens and admits a prompt only with a whole block of them), got {budget}")


CHUNK_POLICIES = tuple(sorted(POLICIES))  # the planner's registry (planner.policies.registry)
# What a study without a trace's future can run: every policy but the offline ones (`needs_oracle`)
ONLINE_POLICIES = tuple(name for name in CHUNK_POLICIES if not POLICIES[name].needs_oracle)
ORACLE_STUDIES = "python -m experiments.traces and python -m experiments.traces.factorial"

# One torch thread. With 2 threads, each op's OpenMP barrier waits for whichever thread another
# process has descheduled: at load ~3.5 on the 2-core machine a 28-token warm replay took 2.5 s
# with 2 threads and 25 ms with 1. Unloaded, 2 threads are only ~15% faster on a 32K prefill.
DEFAULT_THREADS = 1
THREADS_HELP = "torch CPU threads (default 1: robust to other jobs on the cores; 0 = torch's default)"


def add_model_flags(ap: argparse.ArgumentParser, dtypes=("float32", "bfloat16"), backend: bool = True,
                    dtype_help: str = "model dtype") -> None:
    """--model, --device, --seed, --threads, and --backend/--dtype when they apply."""
    ap.add_argument("--model", type=model_name, default="small",
                    help=f"a model preset ({', '.join(PRESETS)}) or a checkpoint folder (config.json + safetensors)")
    if backend:
        ap.add_argument("--backend", default="torch", type=backend_name,
                        help="kernel backend: torch, or triton (a CUDA device; on a CPU only through the "
                             "interpreter, TRITON_INTERPRET=1: slow, for tests)")
    ap.add_argument("--device", type=device_name, default="cpu", help="torch device: cpu, cuda or cuda:i")
    if dtypes:
        ap.add_argument("--dtype", default=dtypes[0], choices=dtypes, help=dtype_help)
    ap.add_argument("--seed", type=int_in_range(0, 2**32 - 1), default=0, help="weights and prompt seed")
    ap.add_argument("--threads", type=int_in_range(0), default=DEFAULT_THREADS, help=THREADS_HELP)


def policy_name(allowed: Iterable[str] = ONLINE_POLICIES) -> Check:
    """One placement policy of `allowed` (an offline one elsewhere: refused, naming where it runs)."""
    allowed = tuple(allowed)

    def check(text: str) -> str:
        name = text.strip()
        _refuse_offline([name], allowed)
        if name not in allowed:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}; got {text!r}")
        return name

    return check


def add_policy_flag(ap: argparse.ArgumentParser, what: str, allowed: Iterable[str] = ONLINE_POLICIES) -> None:
    ap.add_argument("--policy", default="aligned", type=policy_name(allowed),
                    help=f"placement policy (planner.policies.registry: {', '.join(allowed)}) {what}")


# ------------------------------------------------------------------------------ the flag vocabulary
# One name per idea for every entry point (the README's flag table): --model, --policy (one or a
# comma list), --eviction, --budget-gb (snapshot memory), --prefill-budget (tokens per tick),
# --block-size, --dtype float32|bfloat16, --device, --threads, --seed, --out / --publish, --limit,
# --replot, and comma lists everywhere (never space-separated lists).
DTYPES = ("float32", "bfloat16")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that appends "(default: ...)" to every flag's help (not to switches,
    nor to a default of None, whose help says what absent means)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def new_parser(description: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser whose --help shows every default (no absolute machine paths in them)."""
    return argparse.ArgumentParser(description=description, formatter_class=HelpFormatter, **kwargs)


def add_policy_list_flag(ap: argparse.ArgumentParser, default: Iterable[str], allowed: Iterable[str] = ONLINE_POLICIES,
                         what: str = "placement policies") -> None:
    """`--policy` as one name or a comma list of distinct names from `allowed`."""
    default = ",".join(default)  # a string default goes through `type` too: --help shows it as typed
    ap.add_argument("--policy", type=name_list(allowed), default=default,
                    help=f"{what}: one or a comma list of {', '.join(allowed)}")


def add_dtype_flag(ap: argparse.ArgumentParser, default: str = "float32", allowed: Iterable[str] = DTYPES,
                   what: str = "model dtype") -> None:
    ap.add_argument("--dtype", default=default, choices=tuple(allowed), help=what)


def add_snapshot_dtype_flag(ap: argparse.ArgumentParser) -> None:
    """`--snapshot-dtype`: the dtype snapshots are stored in (`model.engine.snapshot_codec`); absent: the
    states' own (float32), and the run's config does not name it (records made without it stay comparable)."""
    ap.add_argument("--snapshot-dtype", choices=tuple(SNAPSHOT_DTYPES), default=None,
                    help="store snapshots in this dtype: bfloat16 (a cast) or float8_e4m3fn (a per-tensor scale) "
                         "holds ~2x / ~4x more of fp32 states under a budget, restored with their rounding error "
                         "(results/snapshot_dtype); absent: the states' own dtype, exact")


def add_prefill_budget_flag(ap: argparse.ArgumentParser, default: int) -> None:
    """`--prefill-budget`: prompt tokens the scheduler hands out per tick."""
    ap.add_argument("--prefill-budget", type=int_in_range(1), default=default,
                    help="prefill token budget per scheduler tick")


def add_limit_flag(ap: argparse.ArgumentParser, default: int | None, what: str = "requests") -> None:
    """`--limit N`: only the first N items (>= 1; absent = all)."""
    ap.add_argument("--limit", type=int_in_range(1), default=default, help=f"only the first N {what} (absent: all)")


def add_replot_flag(ap: argparse.ArgumentParser) -> None:
    """`--replot`: redraw figures and report from the data already in --out (or --publish's folder)."""
    ap.add_argument("--replot", action="store_true",
                    help="do not run: redraw the figures and report from the data in --out "
                         "(or results/ with --publish; default the newest run folder)")
