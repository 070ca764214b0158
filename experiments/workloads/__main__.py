"""Statistics of a workload; writes nothing unless --out is given.

    python -m experiments.workloads --trace mooncake-conversation --reading chains --limit 1000
    python -m experiments.workloads --trace sharegpt --limit 5000 --out /tmp/stats   # needs .[traces]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.workloads import READINGS, WORKLOADS, default_reading, open_workload
from experiments.workloads.mooncake import DEFAULT_VOCAB
from experiments.workloads.stats import format_summary, summarize


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.workloads", description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True, choices=WORKLOADS, help="the workload source")
    ap.add_argument("--reading", choices=READINGS, default=None,
                    help="Mooncake: as-given (default) or chains; sharegpt, synthetic: chains only (the default)")
    ap.add_argument("--limit", type=int, default=None, help="the first N requests in arrival order (default: all)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help=f"token id range; Mooncake default {DEFAULT_VOCAB}, sharegpt default: Qwen's ids unfolded")
    ap.add_argument("--conversation-rate", type=float, default=1.0, help="sharegpt: conversations started per second")
    ap.add_argument("--turn-gap-s", type=float, default=20.0, help="sharegpt: seconds between a conversation's requests")
    ap.add_argument("--seed", type=int, default=0,
                    help="sharegpt: seed of the conversation arrivals; synthetic: seed of the sessions")
    ap.add_argument("--out", type=Path, default=None, help="write workload_<trace>_<reading>.json into this folder")
    args = ap.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        ap.error(f"--limit: must be >= 0, got {args.limit}")

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
    except (ValueError, ModuleNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    if args.out is not None:
        from experiments.results_io import environment, write_json

        path = write_json(args.out / f"workload_{args.trace}_{reading}.json",
                          {"args": {**vars(args), "reading": reading}, "summary": summary,
                           "environment": environment()})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
