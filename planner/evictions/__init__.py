"""Snapshot eviction rules: which snapshot leaves a full store (or tier), one class per rule, one file per rule.

An eviction (`base.EvictionPolicy`) picks the victim (`choose_victim`), may judge whether a new
snapshot is worth an eviction (`admits`), and hears of the store's events through hooks that do
nothing by default (`saved`, `restored`, `evicted`, `demoted`, `touched`, the requests `offered`
and `looked_up`, and `bind` once to its store); `needs_prefix` asks the store to keep each
snapshot's prefix. `registry.EVICTION_POLICIES` names the rules a run selects with `--eviction NAME`.

Files: `base` (the type, and `WrappedEviction`, a rule that delegates to another), `lru` (the
store's default), `scores` (the min-max `recency + weight * score` that FLOP-aware and seglen
share, kept per tier in arrays), `flop_aware` (Marconi's), `seglen` (SGLang's), `learned_value`
(GreedyDual with a restore chance learned online), `next_use` (Belady's MIN, for the offline
optimum: not by name), `shadow_best` (ours-plus's: the best of four rules on shadow stores);
`registry` lists them by name.

To add a rule: write `planner/evictions/<name>.py` with a subclass of `EvictionPolicy` that sets
`name`, implements `choose_victim` and overrides the hooks it needs; then add its class to the
tuple in `registry.py`. This package's `__init__` imports nothing, so the snapshot store can import
`base` and `lru` without loading the rules that build stores themselves (`shadow_best`).
"""
