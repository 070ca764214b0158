"""Multi-turn study: synthetic chat sessions through one engine, under each policy and eviction.

    python -m experiments.multiturn [--model small] [--sessions 24] [--snapshot-budget 6]
    python -m experiments.multiturn --model tiny --quick      # seconds: for tests

* `workload.py`: the workload interface (requests whose prompts extend earlier replies) and the
  seeded synthetic sessions (shared system prompt, lognormal user messages, replies generated
  by the model, branches, regenerations); every number is a flag and is written to the output.
* `run.py`: the 9 default configurations (caching off; legacy and aligned unbounded; both under
  a snapshot byte budget with LRU and FLOP-aware eviction; aligned with reply-boundary snapshots,
  unbounded and bounded), each a fresh engine that serves every request, `--concurrency` in flight.
* `report.py`: the merge of the shards' parts (checked) and the figure from the CSVs.
* `cli.py`: the command line (`__main__.py` runs it).

Per configuration: token hit rate (KV-matched prompt tokens / prompt tokens), SSM restore depth
(restore position / prompt tokens, summed), replayed prompt tokens, TTFT median and p90,
snapshot bytes held at the end and at peak, saved and evicted. The generated tokens of every
configuration must equal those of `off`, token for token (the cache never changes an output):
the run checks it and exits 1 without writing the summary if not. TTFT is from a request's
submission to its first token: it includes sharing ticks with the other requests in flight.

Output (`--out`, default results/multiturn/): `requests.csv` (one row per request and
configuration), `summary.csv` (one row per configuration), `multiturn.json` (workload
definition and distributions, config, environment), `multiturn.png` (plotted from the CSVs).
Configurations are independent (a fresh engine each), so `--shard i/n` runs every n-th of them
into `parts/multiturn.part<i>of<n>.json` and `--merge` combines the parts, checks the generated
tokens across all of them, and writes the files above (a 1/1 run merges by itself).

Every planner figure (hit rate, restore depth, replayed tokens, snapshot counts and bytes)
depends only on token counts and ticks, not on the model's numbers, so `--runner placeholder`
reproduces them exactly without the model (it uses the model's FLOP model and the same reply
lengths): a quick way to explore `--flop-alpha`, `--snapshot-budget` or `--interval`. Its TTFTs
mean nothing.
"""
