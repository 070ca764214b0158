"""Statistics of a workload; writes nothing unless --out is given.

    python -m experiments.workloads --trace mooncake-conversation --reading chains --limit 1000
    python -m experiments.workloads --trace sharegpt --limit 5000 --out runs/workloads   # needs .[traces]
"""

from __future__ import annotations

from pathlib import Path

from experiments.common.flags import add_limit_flag, float_in_range, int_in_range
from experiments.common.inputs import InputError
from experiments.common.study import Context, Study, run_study
from experiments.workloads import READINGS, WORKLOADS, default_reading, open_workload
from experiments.workloads.mooncake import DEFAULT_VOCAB
from experiments.workloads.stats import format_summary, summarize


class Workloads(Study):
    prog = "python -m experiments.workloads"
    description = __doc__.split("\n")[0]
    folder = "optional"  # its own --out: absent, it prints and writes nothing
    replot = False

    def add_flags(self, ap) -> None:
        ap.add_argument("--trace", required=True, choices=WORKLOADS, help="the workload source")
        ap.add_argument("--reading", choices=READINGS, default=None,
                        help="Mooncake: as-given (absent: as-given) or chains; sharegpt, synthetic: chains only")
        add_limit_flag(ap, None, "requests in arrival order")
        ap.add_argument("--vocab-size", type=int_in_range(1, 2**32 - 1), default=None,
                        help=f"token id range (absent: Mooncake {DEFAULT_VOCAB}, sharegpt Qwen's ids unfolded)")
        ap.add_argument("--conversation-rate", type=float_in_range(0, lo_open=True), default=1.0,
                        help="sharegpt: conversations started per second")
        ap.add_argument("--turn-gap-s", type=float_in_range(0, lo_open=True), default=20.0,
                        help="sharegpt: seconds between a conversation's requests")
        ap.add_argument("--seed", type=int_in_range(0, 2**32 - 1), default=0,
                        help="sharegpt: seed of the conversation arrivals; synthetic: seed of the sessions")
        ap.add_argument("--out", type=Path, default=None,
                        help="write workload_<trace>_<reading>.json into this folder (absent: print only)")

    def run(self, ctx: Context) -> list[Path]:
        args = ctx.args
        reading = args.reading or default_reading(args.trace)
        options = {}
        if args.vocab_size is not None:
            options["vocab_size"] = args.vocab_size
        if args.trace == "sharegpt":
            options.update(conversation_rate=args.conversation_rate, turn_gap_s=args.turn_gap_s, seed=args.seed)
        if args.trace == "synthetic":
            options["seed"] = args.seed
        try:
            source = open_workload(args.trace, reading, **options)
            summary = summarize(source, args.limit)
        except (ValueError, ModuleNotFoundError) as err:  # a bad reading, a bad trace line, a missing extra
            raise InputError(str(err)) from None
        if summary.get("requests", 1) == 0:
            raise InputError(f"{args.trace}: no requests in it (reading {reading})")
        print(format_summary(summary))
        if args.out is None:
            return []
        from experiments.common.results_io import environment, write_json

        ctx.make_out()
        return [write_json(args.out / f"workload_{args.trace}_{reading}.json",
                           {"args": ctx.config() | {"reading": reading}, "summary": summary,
                            "environment": environment()})]


STUDY = Workloads()
parser = STUDY.parser
main = STUDY.main

if __name__ == "__main__":
    run_study(STUDY)
